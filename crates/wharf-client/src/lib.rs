//! A client for stateless MCP servers (revision 2026-07-28): every request carries its
//! `_meta` and the headers that mirror it; responses are read as JSON or SSE.
//! [`LegacySession`] speaks the initialization-based era (2025-11-25 and earlier), and
//! [`Client`] speaks whichever of the two a server serves: tool calls with progress, input
//! rounds answered by an [`Answerer`], retries under one idempotency key, cached lists.

mod answer;
mod call;
mod call_error;
mod client;
mod http;
mod legacy;
mod retry;
mod sse;
mod stdio;

/// The wire types (input requests, results) an [`Answerer`] reads and writes.
pub use wharf_protocol as protocol;

pub use answer::{Answerer, Prepared, Refuse, Unanswered, describe};
pub use call::{Event, IDEMPOTENCY_KEY, ToolCall, new_idempotency_key};
pub use call_error::CallError;
pub use client::Client;
pub use http::{HttpClient, Incoming, Reply};
pub use legacy::{Connection, LegacySession};
pub use retry::LONGEST_WAIT;
pub use sse::SseParser;
pub use stdio::StdioClient;

use std::time::Duration;

use serde_json::{Value, json};
use wharf_protocol::{meta, version};

/// Why a request failed at the transport level.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The HTTP exchange failed.
    #[error("HTTP: {}", with_causes(.0))]
    Http(#[from] reqwest::Error),
    /// Talking to a child process failed.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The server (or a proxy in front of it) answered an error status without JSON-RPC.
    #[error("HTTP {status}: {body}")]
    #[non_exhaustive]
    Status {
        /// The HTTP status.
        status: u16,
        /// The start of the body.
        body: String,
        /// How long the response's `Retry-After` asked the client to wait.
        retry_after: Option<Duration>,
    },
    /// The response ended (the connection closed cleanly, say, when a replica drains)
    /// before its result arrived.
    #[error("HTTP {0}: the response ended before its result")]
    Incomplete(u16),
    /// The answer was not JSON-RPC.
    #[error("the server sent something that is not JSON-RPC: {0}")]
    Protocol(String),
}

impl ClientError {
    /// Whether sending again may work: a connection that failed or ended early, a server
    /// (or proxy) in trouble, or a rate limit, may recover; a refusal, or an answer that is
    /// no JSON-RPC, stays as it is.
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Http(_) | ClientError::Io(_) | ClientError::Incomplete(_) => true,
            ClientError::Status { status, .. } => *status >= 500 || *status == 429,
            ClientError::Protocol(_) => false,
        }
    }

    /// How long the response's `Retry-After` asked the client to wait before sending again.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ClientError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

impl retry::Transient for ClientError {
    /// Narrower than [`ClientError::is_retryable`]: a 500 is a server's own failure, which
    /// an automatic retry would only repeat.
    fn is_transient(&self) -> bool {
        match self {
            ClientError::Http(_) | ClientError::Io(_) | ClientError::Incomplete(_) => true,
            ClientError::Status { status, .. } => retry::passing_status(*status),
            ClientError::Protocol(_) => false,
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        ClientError::retry_after(self)
    }
}

/// `error` and what caused it, `: `-separated (reqwest's own message leaves the cause out:
/// "error sending request" says nothing of a refused connection).
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        source = cause.source();
    }
    text
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
