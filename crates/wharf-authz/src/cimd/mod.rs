//! Client ID Metadata Documents (draft-ietf-oauth-client-id-metadata-document, as the
//! 2026-07-28 client-registration page requires): a client with no prior relationship to
//! the server names itself by an `https` URL, and the server fetches the JSON document there
//! to learn its name, redirect URIs and keys.
//!
//! Fetching a URL a stranger chose is a server-side request forgery waiting to happen, so
//! each rule has its module: [`ClientIdUrl`] for the URL, [`special_use`] for addresses
//! never connected to, [`Fetcher`] for the fetch itself (no redirects, 200 and JSON only, a
//! size cap, time limits, the address vetted where the connection is made), [`freshness`] for
//! how long a success may be reused, and [`ClientMetadata`] for the document.

mod client_id;
mod document;
mod fetch;
mod freshness;
mod netguard;

pub use client_id::{ClientIdError, ClientIdUrl};
pub use document::{ClientAuth, ClientMetadata, DocumentError, KeySource};
pub use fetch::{FetchError, Fetched, Fetcher, FetcherBuilder, Lookup, SystemLookup};
pub use freshness::{MAX_FRESHNESS, freshness};
pub use netguard::{SpecialUse, special_use};
