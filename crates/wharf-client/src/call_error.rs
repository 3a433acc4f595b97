//! Why a call did not produce a result: the error every call of the client returns.

use std::time::Duration;

use reqwest::header::HeaderMap;
use serde_json::Value;
use wharf_protocol::codes;

use crate::answer::Unanswered;
use crate::{ClientError, Reply, retry};

/// Why a call did not produce a result.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The exchange itself failed (connection, HTTP, a body that is not JSON-RPC).
    #[error(transparent)]
    Transport(#[from] ClientError),
    /// The server answered with a JSON-RPC error.
    #[error("{message} (JSON-RPC error {code}{})", http_note(*.status))]
    #[non_exhaustive]
    Rpc {
        /// The HTTP status it came with.
        status: u16,
        /// The JSON-RPC error code.
        code: i64,
        /// The server's message.
        message: String,
        /// The error's `data`, if any.
        data: Option<Value>,
        /// How long the response's `Retry-After` asked the client to wait (a busy server's
        /// 503 says when to send again).
        retry_after: Option<Duration>,
    },
    /// An input request was not answered.
    #[error(transparent)]
    Unanswered(#[from] Unanswered),
    /// The server kept asking for input beyond the limit.
    #[error("the server asked for input {0} times without finishing; giving up")]
    TooManyRounds(usize),
}

/// `, HTTP 400` for a status other than 200 (an error inside an SSE stream comes with 200).
fn http_note(status: u16) -> String {
    if status == 200 {
        String::new()
    } else {
        format!(", HTTP {status}")
    }
}

impl CallError {
    /// The result of a whole reply, or its error.
    pub(crate) fn result_of(reply: Reply) -> Result<Value, CallError> {
        let status = reply.status;
        match reply.response() {
            Some(response) => Self::from_response(status, &reply.headers, response),
            None => Err(CallError::Transport(ClientError::Protocol(format!(
                "HTTP {status} without a JSON-RPC response: {}",
                reply.body.chars().take(200).collect::<String>()
            )))),
        }
    }

    /// The result of `response`, which came with `status` and `headers`, or its error.
    pub(crate) fn from_response(
        status: u16,
        headers: &HeaderMap,
        response: &Value,
    ) -> Result<Value, CallError> {
        match (response.get("result"), response.get("error")) {
            (Some(result), _) => Ok(result.clone()),
            (None, Some(error)) => Err(CallError::Rpc {
                status,
                // A code that is not an integer is itself invalid: report it as such.
                code: error["code"]
                    .as_i64()
                    .unwrap_or(i64::from(codes::INVALID_REQUEST)),
                message: error["message"].as_str().unwrap_or("").to_owned(),
                data: error.get("data").cloned(),
                retry_after: retry::retry_after(headers),
            }),
            (None, None) => Err(CallError::Transport(ClientError::Protocol(format!(
                "a response with neither result nor error: {response}"
            )))),
        }
    }

    /// How long the server's `Retry-After` asked the client to wait before sending again.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            CallError::Transport(e) => e.retry_after(),
            CallError::Rpc { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

impl retry::Transient for CallError {
    /// A JSON-RPC error is the server's verdict, unless it came with a gateway's or a busy
    /// server's status.
    fn is_transient(&self) -> bool {
        match self {
            CallError::Transport(e) => e.is_transient(),
            CallError::Rpc { status, .. } => retry::passing_status(*status),
            _ => false,
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        CallError::retry_after(self)
    }
}
