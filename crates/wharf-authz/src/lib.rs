//! The embedded OAuth 2.1 authorization server's rules, each in the module named for it and
//! each refusal a typed error whose message names the rule broken:
//!
//! - [`pkce`]: proof key for code exchange (RFC 7636), `S256` only as OAuth 2.1 requires.
//! - [`redirect`]: redirect URIs registered through Dynamic Client Registration (RFC 7591),
//!   checked against the client's `application_type` (OpenID Connect Registration 1.0 §2).
//! - [`cimd`]: Client ID Metadata Documents — the `client_id` URL, the document it names,
//!   and a fetcher that refuses what an authorization server must never fetch.
//!
//! [`AuthorizationServer`] puts them together: an OAuth 2.1 authorization server on the MCP
//! server's origin whose every record (clients, cached documents, codes, refresh tokens,
//! consents, sign-ins, signing keys) lives in the shared store, so any replica continues any
//! flow.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

mod attempts;
pub mod cimd;
mod client_name;
mod families;
mod keys;
pub mod pkce;
mod records;
pub mod redirect;
mod server;
mod users;

pub use keys::{KeyEncryption, KeyEncryptionKey, KeyError, ROTATION};
pub use records::RecordError;
pub use server::{AuthorizationServer, AuthzConfig, OAuthError, UpstreamConfig};
pub use users::{MIN_PASSWORD, Removed, UserError, Users};
