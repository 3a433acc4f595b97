//! The applications `wharf serve` runs: the default reference tools and the conformance
//! profile (exactly the fixture set the official conformance suite calls).

pub mod conformance;
pub mod demo;

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
    /// The reference tools.
    Default,
    /// The conformance suite's fixtures.
    Conformance,
}

impl Profile {
    /// Registers the profile's definitions on `builder`.
    pub fn register(self, builder: ServerBuilder) -> ServerBuilder {
        match self {
            Profile::Default => demo::register(builder),
            Profile::Conformance => conformance::register(builder),
        }
    }
}
