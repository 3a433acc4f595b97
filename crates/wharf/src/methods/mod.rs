//! One module per method family. Each takes the registry, the runtime and a parsed request
//! (its scopes, capabilities and caps already admitted) and returns the whole response.

pub(crate) mod completion;
pub(crate) mod lists;
pub(crate) mod prompts;
pub(crate) mod resources;
pub(crate) mod tools;
