//! The applications `wharf serve` runs: the import service (the default), the demo tools
//! (small tools the benchmark and transport tests use) and the conformance profile (exactly
//! the fixture set the official conformance suite calls).

pub mod conformance;
#[cfg(feature = "import")]
pub mod data;
pub mod demo;
#[cfg(feature = "import")]
pub mod import;
#[cfg(feature = "import")]
pub mod report;

use wharf::ServerBuilder;
use wharf_protocol::Implementation;

/// The identity the reference server reports.
pub fn implementation() -> Implementation {
    let mut info = Implementation::new("wharf", env!("CARGO_PKG_VERSION"));
    info.title = Some("Wharf reference server".into());
    info
}

/// Which set of tools a reference server exposes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// The import service and reports on its datasets (feature `import`).
    #[cfg(feature = "import")]
    Default,
    /// Small stateless tools: echo, a slow counter, structured output, a resource, a prompt.
    Demo,
    /// The conformance suite's fixtures.
    Conformance,
}

impl Profile {
    /// Registers the profile's definitions on `builder`.
    pub fn register(self, builder: ServerBuilder) -> ServerBuilder {
        match self {
            #[cfg(feature = "import")]
            Profile::Default => report::register(import::register(builder)),
            Profile::Demo => demo::register(builder),
            Profile::Conformance => conformance::register(builder),
        }
    }

    /// Whether the profile keeps state, and so needs a store.
    pub fn needs_store(self) -> bool {
        match self {
            #[cfg(feature = "import")]
            Profile::Default => true,
            Profile::Demo | Profile::Conformance => false,
        }
    }
}
