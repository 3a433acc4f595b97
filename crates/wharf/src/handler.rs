//! What every handler (tool, prompt, resource, completer) returns when it does not produce
//! its result: one error type for all of them, so an app writes no adapters between them.

use std::future::Future;
use std::pin::Pin;

use crate::error::RpcError;
use crate::mrtr::Ask;
use crate::store::StoreError;

/// A boxed, sendable future: what the core keeps of a handler's work.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Why a handler did not produce its result.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandlerError {
    /// A failure the model can read and act on. A tool's is sent as a result with
    /// `isError: true`; for other methods, which have no such result, it is a JSON-RPC
    /// error (`-32603`) that carries the message.
    #[error("{0}")]
    Execution(String),
    /// A protocol error, sent as a JSON-RPC error.
    #[error(transparent)]
    Protocol(#[from] RpcError),
    /// Not a failure: the handler needs input from the client first (MRTR). The core answers
    /// with an `input_required` result; see [`Context::ask`](crate::Context::ask).
    #[error("input required")]
    InputRequired(Box<Ask>),
}

impl HandlerError {
    /// A failure the model can act on.
    pub fn execution(message: impl Into<String>) -> Self {
        HandlerError::Execution(message.into())
    }

    /// A server failure: logged with its detail, sent as a bare `-32603`.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        HandlerError::Protocol(RpcError::internal(detail))
    }
}

impl From<Ask> for HandlerError {
    fn from(ask: Ask) -> Self {
        HandlerError::InputRequired(Box::new(ask))
    }
}

/// A store failure: a busy store asks for a retry (`RetryLater`), anything else is internal.
impl From<StoreError> for HandlerError {
    fn from(e: StoreError) -> Self {
        HandlerError::Protocol(e.into())
    }
}
