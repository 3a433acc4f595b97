//! The one place where protocol errors become HTTP responses.

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::Response;
use wharf::{ErrorKind, RpcError};
use wharf_protocol::RequestId;
use wharf_protocol::jsonrpc::write_error;

/// The HTTP status for an error of `kind`.
pub(crate) fn status_for(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::Parse
        | ErrorKind::InvalidRequest
        | ErrorKind::MalformedMeta
        | ErrorKind::HeaderMismatch
        | ErrorKind::MissingCapability
        | ErrorKind::UnsupportedVersion => StatusCode::BAD_REQUEST,
        ErrorKind::MethodNotFound => StatusCode::NOT_FOUND,
        // The request was well-formed and reached its method: the HTTP exchange succeeded,
        // the JSON-RPC error says what was wrong with the params.
        ErrorKind::InvalidParams | ErrorKind::Application(_) => StatusCode::OK,
        ErrorKind::Internal | ErrorKind::InputRequired => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorKind::Unauthorized => StatusCode::UNAUTHORIZED,
        ErrorKind::RetryLater => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::TimedOut => StatusCode::GATEWAY_TIMEOUT,
    }
}

/// A JSON-RPC error response with the status of its kind.
pub(crate) fn error_response(id: Option<&RequestId>, error: &RpcError) -> Response {
    let mut res = error_with_status(status_for(error.kind), id, error);
    if error.kind == ErrorKind::RetryLater {
        res.headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    res
}

/// 401 with its `WWW-Authenticate` challenge.
pub(crate) fn unauthorized(refusal: &wharf_auth::AuthError) -> Response {
    let e = RpcError::new(ErrorKind::Unauthorized, refusal.to_string());
    let mut res = error_with_status(StatusCode::UNAUTHORIZED, None, &e);
    res.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static(refusal.challenge()),
    );
    res
}

/// A JSON-RPC error response with an explicit status (403, 413, 415, 431…).
pub(crate) fn error_with_status(
    status: StatusCode,
    id: Option<&RequestId>,
    error: &RpcError,
) -> Response {
    let mut buf = Vec::with_capacity(128);
    let _ = write_error(&mut buf, id, &error.to_object());
    json_response(status, buf)
}

pub(crate) fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    let mut res = Response::new(Body::from(body));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    res
}
