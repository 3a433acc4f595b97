//! Typed protocol errors. Transports map [`ErrorKind`] to their own status codes once, at
//! the edge.

use serde_json::{Value, json};
use wharf_protocol::{ClientCapabilities, ErrorObject, codes, version};

/// What went wrong, in terms a transport can map to a status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The body is not JSON (`-32700`).
    Parse,
    /// The body is JSON but not a valid JSON-RPC request (`-32600`).
    InvalidRequest,
    /// The method does not exist or is not offered (`-32601`).
    MethodNotFound,
    /// A required `_meta` field is missing or malformed (`-32602`, rejected before dispatch).
    MalformedMeta,
    /// The params are invalid: unknown tool/prompt, a prompt's bad arguments, bad cursor
    /// (`-32602`); a tool's bad arguments are an execution error instead.
    InvalidParams,
    /// The resource does not exist (`-32602`, as 2026-07-28 has it; a legacy session's
    /// answer carries 2025-11-25's `-32002`).
    ResourceNotFound,
    /// A mirrored header is missing, malformed or disagrees with the body (`-32020`).
    HeaderMismatch,
    /// The request needs a client capability that was not declared (`-32021`).
    MissingCapability,
    /// The protocol version is not supported (`-32022`).
    UnsupportedVersion,
    /// The server failed (`-32603`); the message never carries internal details.
    Internal,
    /// The server is too busy for this request right now; retrying later is safe
    /// ([`RETRY_LATER`]).
    RetryLater,
    /// The request carries no credentials this server accepts ([`UNAUTHORIZED`]).
    Unauthorized,
    /// The call ran longer than its time limit and was stopped ([`TIMED_OUT`]).
    TimedOut,
    /// The principal's token lacks a scope this request needs ([`FORBIDDEN`], HTTP 403).
    InsufficientScope,
    /// The legacy session the request names ended while the request was served (`-32600`,
    /// HTTP 404: the client initializes a new one, as 2025-11-25's transport has a server
    /// answer every request of an ended session).
    SessionEnded,
    /// An application-defined code, outside the reserved range (or, in a legacy session's
    /// answers, a code of 2025-11-25's own: see [`RpcError::in_2025`]).
    Application(i32),
}

/// The target of the log events that carry an internal error's detail (a handler's panic
/// message, a store's error, an output-schema breach): it may hold anything a request
/// carried, so it belongs in the server's log and not in what is exported further (a
/// tracing backend's span events).
pub const DETAIL_TARGET: &str = "wharf::detail";

/// Wharf's own JSON-RPC code for "busy, retry later": outside the range JSON-RPC reserves
/// (-32768 to -32000), which MCP uses for its own codes.
pub const RETRY_LATER: i32 = -31000;

/// Wharf's own JSON-RPC code for a request without acceptable credentials (sent with
/// HTTP 401, or 400 when they came in a form the server does not take).
pub const UNAUTHORIZED: i32 = -31001;

/// Wharf's own JSON-RPC code for a call stopped at its time limit (sent with HTTP 504).
pub const TIMED_OUT: i32 = -31002;

/// Wharf's own JSON-RPC code for a request whose token lacks a needed scope (sent with HTTP
/// 403 and an `insufficient_scope` challenge).
pub const FORBIDDEN: i32 = -31003;

impl ErrorKind {
    /// The JSON-RPC code.
    pub fn code(self) -> i32 {
        match self {
            ErrorKind::Parse => codes::PARSE_ERROR,
            ErrorKind::InvalidRequest | ErrorKind::SessionEnded => codes::INVALID_REQUEST,
            ErrorKind::MethodNotFound => codes::METHOD_NOT_FOUND,
            ErrorKind::MalformedMeta | ErrorKind::InvalidParams | ErrorKind::ResourceNotFound => {
                codes::INVALID_PARAMS
            }
            ErrorKind::HeaderMismatch => codes::HEADER_MISMATCH,
            ErrorKind::MissingCapability => codes::MISSING_REQUIRED_CLIENT_CAPABILITY,
            ErrorKind::UnsupportedVersion => codes::UNSUPPORTED_PROTOCOL_VERSION,
            ErrorKind::Internal => codes::INTERNAL_ERROR,
            ErrorKind::RetryLater => RETRY_LATER,
            ErrorKind::Unauthorized => UNAUTHORIZED,
            ErrorKind::TimedOut => TIMED_OUT,
            ErrorKind::InsufficientScope => FORBIDDEN,
            ErrorKind::Application(code) => code,
        }
    }
}

/// A JSON-RPC error on its way to the client.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct RpcError {
    /// What went wrong, for the transport's status.
    pub kind: ErrorKind,
    /// What the client is told.
    pub message: String,
    /// Structured detail for the client (`error.data`).
    pub data: Option<Value>,
}

impl RpcError {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        RpcError {
            kind,
            message: message.into(),
            data: None,
        }
    }

    /// Adds `data`.
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }

    /// `-32602` for bad params.
    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidParams, message)
    }

    /// `-32601` naming the method.
    pub fn method_not_found(method: &str) -> Self {
        if method == wharf_protocol::methods::INITIALIZE {
            // Sent by a client of an earlier revision (or one that thinks it is): it learns
            // what this path speaks, which may be all it can show its user.
            return Self::new(
                ErrorKind::MethodNotFound,
                format!(
                    "Method not found: initialize; requests of protocol versions {:?} carry their version in _meta and need no initialization",
                    version::SUPPORTED
                ),
            )
            .with_data(json!({ "supported": version::SUPPORTED }));
        }
        Self::new(
            ErrorKind::MethodNotFound,
            format!("Method not found: {method}"),
        )
    }

    /// `-32020` with a message naming the header.
    pub fn header_mismatch(message: impl Into<String>) -> Self {
        Self::new(
            ErrorKind::HeaderMismatch,
            format!("Header mismatch: {}", message.into()),
        )
    }

    /// `-32022` naming what was asked for and what is `supported` (the server's
    /// [`Server::supported_versions`](crate::Server::supported_versions)). A legacy version
    /// among them is refused only outside a session (without `initialize`): that is `-32600`
    /// saying so, not a refusal that lists the version it refuses.
    pub fn unsupported_version(requested: &str, supported: &[&str]) -> Self {
        if supported.contains(&requested) && version::is_legacy(requested) {
            return Self::new(
                ErrorKind::InvalidRequest,
                format!(
                    "Invalid request: protocol version {requested:?} is served in a session: \
                     send initialize first, then each request in the session it opens"
                ),
            );
        }
        Self::new(
            ErrorKind::UnsupportedVersion,
            format!(
                "Unsupported protocol version {requested:?}; this server supports {supported:?}"
            ),
        )
        .with_data(json!({ "supported": supported, "requested": requested }))
    }

    /// `-32602` for a resource that does not exist, with its URI in `data` (`-32002` in a
    /// legacy session).
    pub fn resource_not_found(uri: &str) -> Self {
        Self::new(
            ErrorKind::ResourceNotFound,
            format!("Resource not found: {uri}"),
        )
        .with_data(json!({ "uri": uri }))
    }

    /// The error as a 2025-11-25 session answers it: a resource that does not exist carries
    /// that revision's `-32002`, which its clients look for; everything else is unchanged.
    pub fn in_2025(mut self) -> Self {
        if self.kind == ErrorKind::ResourceNotFound {
            self.kind = ErrorKind::Application(codes::RESOURCE_NOT_FOUND_2025);
        }
        self
    }

    /// `-32021` listing the capabilities the request needs.
    pub fn missing_capability(required: &ClientCapabilities, what: &str) -> Self {
        Self::new(
            ErrorKind::MissingCapability,
            format!(
                "Missing required client capability: {what} needs {}",
                serde_json::to_string(required).unwrap_or_default()
            ),
        )
        .with_data(json!({ "requiredCapabilities": required }))
    }

    /// [`FORBIDDEN`] naming what needs which scopes; `data.requiredScopes` lists every scope
    /// of `what`, not only the missing ones (the scopes every request needs are the HTTP
    /// challenge's to name).
    pub fn insufficient_scope(what: &str, required: &[String], missing: &[&str]) -> Self {
        Self::new(
            ErrorKind::InsufficientScope,
            format!(
                "Forbidden: {what} needs the scopes {}; the token lacks {}",
                required.join(" "),
                missing.join(" ")
            ),
        )
        .with_data(json!({ "requiredScopes": required }))
    }

    /// The error as a handler may send it. The codes MCP defines mean what the core sends
    /// them for, with the data their schemas require, and the rest of the range JSON-RPC
    /// and MCP reserve must not be sent at all: a handler's refusal of the message itself
    /// (its JSON, envelope, method, `_meta`, headers or version, which reached the handler
    /// whole), a capability refusal without `requiredCapabilities`, or an application code
    /// inside `-32768..=-32000` goes out as `-32603`, what it said logged.
    pub(crate) fn sendable_from_handler(self) -> Self {
        let sendable = match self.kind {
            ErrorKind::Parse
            | ErrorKind::InvalidRequest
            | ErrorKind::MethodNotFound
            | ErrorKind::MalformedMeta
            | ErrorKind::HeaderMismatch
            | ErrorKind::UnsupportedVersion
            | ErrorKind::SessionEnded => false,
            ErrorKind::MissingCapability => self
                .data
                .as_ref()
                .is_some_and(|d| d.get("requiredCapabilities").is_some_and(Value::is_object)),
            ErrorKind::Application(code) => !codes::is_reserved(code),
            _ => true,
        };
        if sendable {
            return self;
        }
        Self::internal(format_args!(
            "a handler answered with code {}, which only the protocol may send as it was: {}",
            self.code(),
            self.message
        ))
    }

    /// `-32603`. The detail is logged (under [`DETAIL_TARGET`]), never sent.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        tracing::error!(target: DETAIL_TARGET, %detail, "internal error");
        Self::new(ErrorKind::Internal, "Internal error")
    }

    /// `-32603` for work that panicked (a transport's catch of a request's task): what the
    /// panic said goes to the log only (it may hold anything), after `what` (who panicked).
    pub fn panicked(what: &str, payload: &(dyn std::any::Any + Send)) -> Self {
        let said = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(not a string)");
        Self::internal(format_args!("{what} panicked: {said}"))
    }

    /// The JSON-RPC code.
    pub fn code(&self) -> i32 {
        self.kind.code()
    }

    /// The `error` member to send.
    pub fn to_object(&self) -> ErrorObject {
        ErrorObject {
            code: self.code(),
            message: self.message.clone(),
            data: self.data.clone(),
        }
    }
}

impl From<crate::store::StoreError> for RpcError {
    fn from(e: crate::store::StoreError) -> Self {
        match e {
            crate::store::StoreError::Busy(why) => RpcError::new(
                ErrorKind::RetryLater,
                format!("Busy: {why}; retry the same call later"),
            ),
            crate::store::StoreError::Conflict => RpcError::new(
                ErrorKind::RetryLater,
                "Busy: a concurrent call changed the same data first and nothing was applied; retry",
            ),
            crate::store::StoreError::HandleGone => RpcError::new(
                ErrorKind::RetryLater,
                "Busy: the handle was retired while this call ran and nothing was applied; retry to see its state",
            ),
            crate::store::StoreError::ClaimLost => RpcError::new(
                ErrorKind::RetryLater,
                "Busy: another attempt of this write took over; retry the same call to get its result",
            ),
            crate::store::StoreError::LeaseLost => RpcError::new(
                ErrorKind::RetryLater,
                "Busy: this call lost its lock on its key before it committed (its lease ran out or its lock session ended) and nothing was applied; retry",
            ),
            // Nothing to hide: what was refused, and that the earlier writes were kept.
            crate::store::StoreError::PartlyApplied(what) => {
                tracing::warn!(%what, "a commit was refused part-way");
                RpcError::new(ErrorKind::Internal, what)
            }
            other => RpcError::internal(other),
        }
    }
}

impl From<&wharf_protocol::EnvelopeError> for RpcError {
    fn from(e: &wharf_protocol::EnvelopeError) -> Self {
        let kind = if e.code() == codes::PARSE_ERROR {
            ErrorKind::Parse
        } else {
            ErrorKind::InvalidRequest
        };
        RpcError::new(kind, e.to_string())
    }
}
