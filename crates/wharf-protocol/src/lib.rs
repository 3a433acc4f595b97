//! Wire types of the Model Context Protocol, revision 2026-07-28.
//!
//! This crate is pure data and pure functions: the JSON-RPC envelope, every message a
//! stateless server receives or sends, the error codes, the `_meta` keys and the rules for
//! the `Mcp-*` HTTP headers. It performs no I/O and knows nothing of async.

// The wire types mirror the schema field for field, and most fields are documented there
// (`../shared/spec/`); documenting each one here is still to do.
#![allow(missing_docs)]

pub mod codes;
pub mod headers;
pub mod jsonrpc;
pub mod methods;
pub mod one_pass;
pub mod types;
pub mod version;

pub use jsonrpc::{Envelope, EnvelopeError, ErrorObject, RequestId};
pub use jsonrpc::{ErrorResponse, Notification, Request, Response};
pub use types::meta;
pub use types::meta::RequestMeta;
pub use types::*;
