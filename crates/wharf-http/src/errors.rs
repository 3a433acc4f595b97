//! The one place where protocol errors become HTTP responses.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use wharf::metrics::AuthRefusal;
use wharf::{ErrorKind, ErrorReply, RpcError};

use crate::AppState;
use crate::authenticate::{Authenticate, Refusal};
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
        ErrorKind::MethodNotFound | ErrorKind::SessionEnded => StatusCode::NOT_FOUND,
        // The request was well-formed and reached its method: the HTTP exchange succeeded,
        // the JSON-RPC error says what was wrong with the params.
        ErrorKind::InvalidParams | ErrorKind::ResourceNotFound | ErrorKind::Application(_) => {
            StatusCode::OK
        }
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorKind::Unauthorized => StatusCode::UNAUTHORIZED,
        ErrorKind::RetryLater => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::TimedOut => StatusCode::GATEWAY_TIMEOUT,
        ErrorKind::InsufficientScope => StatusCode::FORBIDDEN,
        // Kinds added later are server-side until they are given a status of their own.
        _ => StatusCode::INTERNAL_SERVER_ERROR,
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

/// A request its authentication refused: 401 or 400 (malformed) with its challenge, 403,
/// or 503 with `Retry-After` when the credentials could not be checked.
pub(crate) fn unauthorized(refusal: &Refusal) -> Response {
    let kind = match refusal.status {
        StatusCode::FORBIDDEN => ErrorKind::InsufficientScope,
        StatusCode::SERVICE_UNAVAILABLE => ErrorKind::RetryLater,
        _ => ErrorKind::Unauthorized,
    };
    let e = RpcError::new(kind, refusal.message.clone());
    let mut res = error_with_status(refusal.status, None, &e);
    if refusal.status == StatusCode::SERVICE_UNAVAILABLE {
        res.headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    } else if let Some(v) = refusal
        .challenge
        .as_deref()
        .and_then(|c| header::HeaderValue::from_str(c).ok())
    {
        res.headers_mut().insert(header::WWW_AUTHENTICATE, v);
    }
    res
}

/// An error answer of the core; a request refused for missing scopes also gets its
/// `insufficient_scope` challenge.
pub(crate) fn reply_error(auth: &dyn Authenticate, reply: &ErrorReply) -> Response {
    let mut res = error_response(reply.id(), reply.error());
    if reply.error().kind == ErrorKind::InsufficientScope {
        let challenge = auth.forbidden_challenge(reply.required_scopes());
        if let Some(v) = challenge.and_then(|c| header::HeaderValue::from_str(&c).ok()) {
            res.headers_mut().insert(header::WWW_AUTHENTICATE, v);
        }
    }
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

/// GET and DELETE without a session: a stateless server has no stream to open or close.
pub(crate) async fn method_not_allowed() -> Response {
    let mut res = StatusCode::METHOD_NOT_ALLOWED.into_response();
    res.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST"));
    res
}

/// Counts a request authentication refused, by why, when the server counts.
pub(crate) fn count_refusal(state: &AppState, refused: &Refusal, headers: &HeaderMap) {
    if let Some(m) = state.server.metrics() {
        m.auth_refused(refusal_reason(refused, headers));
    }
}

fn refusal_reason(refused: &Refusal, headers: &HeaderMap) -> AuthRefusal {
    match refused.status {
        StatusCode::FORBIDDEN => AuthRefusal::Forbidden,
        StatusCode::SERVICE_UNAVAILABLE => AuthRefusal::Unavailable,
        StatusCode::BAD_REQUEST => AuthRefusal::Invalid,
        // A credential of another scheme (a browser's Basic) is no token: none was sent.
        _ if headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.as_bytes().get(..7))
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case(b"bearer ")) =>
        {
            AuthRefusal::Invalid
        }
        _ => AuthRefusal::Missing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_bearer_credential_refused_counts_as_invalid() {
        let refused = Refusal::unauthorized("no", None);
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
            refusal_reason(&refused, &headers)
        };
        assert_eq!(with("Bearer junk"), AuthRefusal::Invalid);
        assert_eq!(with("bearer junk"), AuthRefusal::Invalid);
        // A browser's (or a proxy's) credential of another scheme is no token at all.
        assert_eq!(with("Basic YWxpY2U6cHc="), AuthRefusal::Missing);
        assert_eq!(
            refusal_reason(&refused, &HeaderMap::new()),
            AuthRefusal::Missing
        );
    }
}
