//! Serialized JSON-RPC responses, written straight into their output buffer.

use serde::Serialize;
use wharf_protocol::RequestId;
use wharf_protocol::jsonrpc::{write_error, write_result};

use crate::error::RpcError;

/// The response carrying `result`.
pub(crate) fn respond<T: Serialize>(id: &RequestId, result: &T) -> Result<Vec<u8>, RpcError> {
    let mut buf = Vec::with_capacity(512);
    write_result(&mut buf, id, result).map_err(RpcError::internal)?;
    Ok(buf)
}

/// The response carrying `error`.
pub(crate) fn error_message(id: Option<&RequestId>, error: &RpcError) -> Vec<u8> {
    let mut buf = Vec::with_capacity(128);
    // An error object of a string, a number and a JSON value always serializes.
    let _ = write_error(&mut buf, id, &error.to_object());
    buf
}
