//! Other MCP servers for the tests to talk to: Python scripts run by the interpreters
//! scripts/test.sh installs (the Python SDK 2.x in target/pyvenv, 1.x in
//! target/pyvenv-legacy).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The Python interpreter of virtual environment `venv` under target/ (`pyvenv` holds the
/// SDK 2.x, `pyvenv-legacy` the last 1.x).
pub(crate) fn venv_python(venv: &str) -> String {
    let path = format!(
        "{}/../../target/{venv}/bin/python",
        env!("CARGO_MANIFEST_DIR")
    );
    assert!(
        std::path::Path::new(&path).exists(),
        "{path} is missing: run the tests with scripts/test.sh, which installs the Python SDKs"
    );
    path
}

/// A server script of tests/python running on a free port; killed when dropped.
pub(crate) struct PythonServer {
    child: Child,
    /// Its MCP endpoint.
    pub(crate) url: String,
}

impl PythonServer {
    /// Runs tests/python/`script` with `python`, passing a free port, and waits until it
    /// answers HTTP.
    pub(crate) fn start(python: &str, script: &str) -> Self {
        Self::start_with(python, script, &[])
    }

    /// As [`PythonServer::start`], passing `args` after the port.
    pub(crate) fn start_with(python: &str, script: &str, args: &[&str]) -> Self {
        let port = super::free_port();
        let path = format!("{}/../../tests/python/{script}", env!("CARGO_MANIFEST_DIR"));
        let mut child = Command::new(python)
            .arg(path)
            .arg(port.to_string())
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the Python server");
        // Python and its SDK take a few seconds to import; the deadline only turns a hang
        // into a failure.
        let deadline = Instant::now() + Duration::from_secs(60);
        while !super::answers_http(&format!("127.0.0.1:{port}")) {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("{script} exited ({status}) before listening");
            }
            assert!(Instant::now() < deadline, "{script} did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        PythonServer {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        }
    }
}

impl Drop for PythonServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
