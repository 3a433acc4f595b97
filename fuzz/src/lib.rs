//! What the fuzz targets share: the conformance server (its cursors, request states and URI
//! templates are the ones a client can send back), called in-process as a transport would.

use serde_json::Value;
use wharf::Server;
use wharf::testing::Harness;

/// A harness over the conformance profile's server, and a runtime to drive it.
pub struct Target {
    harness: Harness,
    runtime: tokio::runtime::Runtime,
}

impl Target {
    /// Builds the server once; every input then runs against it.
    pub fn new() -> Self {
        let builder = Server::builder(wharf_reference::implementation());
        let server = wharf_reference::Profile::Conformance
            .register(builder)
            .build()
            .expect("the conformance profile builds");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        Target {
            harness: Harness::new(server),
            runtime,
        }
    }

    /// Calls `method`: any answer is fine, an error included; a panic is the finding.
    pub fn call(&self, method: &str, params: Value) {
        let _ = self.runtime.block_on(self.harness.call(method, params));
    }
}

impl Default for Target {
    fn default() -> Self {
        Self::new()
    }
}

/// The input as text, as a client's JSON string would carry it.
pub fn text(data: &[u8]) -> String {
    String::from_utf8_lossy(data).into_owned()
}
