//! A client for stateless MCP servers (revision 2026-07-28): every request carries its
//! `_meta` and the headers that mirror it; responses are read as JSON or SSE.
//! [`LegacySession`] speaks the initialization-based era (2025-11-25 and earlier).

mod http;
mod legacy;
mod sse;
mod stdio;

pub use http::{HttpClient, Reply};
pub use legacy::{Connection, LegacySession};
pub use sse::SseParser;
pub use stdio::StdioClient;

use serde_json::{Value, json};
use wharf_protocol::{meta, version};

/// Why a request failed at the transport level.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The HTTP exchange failed.
    #[error("HTTP: {0}")]
    Http(#[from] reqwest::Error),
    /// Talking to a child process failed.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The answer was not JSON-RPC.
    #[error("the server sent something that is not JSON-RPC: {0}")]
    Protocol(String),
}

/// The `_meta` a request carries: version, capabilities and client identity.
#[derive(Debug, Clone)]
pub struct RequestMetaBuilder {
    /// `io.modelcontextprotocol/protocolVersion`.
    pub protocol_version: String,
    /// `io.modelcontextprotocol/clientCapabilities`.
    pub capabilities: Value,
    /// `io.modelcontextprotocol/clientInfo`.
    pub client_info: Value,
}

impl Default for RequestMetaBuilder {
    fn default() -> Self {
        RequestMetaBuilder {
            protocol_version: version::LATEST.to_owned(),
            capabilities: json!({}),
            client_info: json!({ "name": "wharf-client", "version": env!("CARGO_PKG_VERSION") }),
        }
    }
}

impl RequestMetaBuilder {
    /// `params` with `_meta` filled in (keys already in `params._meta` are kept).
    pub fn apply(&self, params: Value) -> Value {
        let mut params = match params {
            Value::Object(m) => m,
            _ => serde_json::Map::new(),
        };
        let meta_obj = params.entry("_meta").or_insert_with(|| json!({}));
        if let Value::Object(m) = meta_obj {
            m.entry(meta::PROTOCOL_VERSION)
                .or_insert_with(|| json!(self.protocol_version));
            m.entry(meta::CLIENT_CAPABILITIES)
                .or_insert_with(|| self.capabilities.clone());
            m.entry(meta::CLIENT_INFO)
                .or_insert_with(|| self.client_info.clone());
        }
        Value::Object(params)
    }
}
