//! The MCP endpoint: one POST, one JSON-RPC message, answered with JSON or SSE.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::Request;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use wharf::{ErrorKind, ParsedRequest, Permit, Principal, RpcError, Scope};
use wharf_protocol::{Envelope, RequestId};

use crate::AppState;
use crate::errors::{error_response, error_with_status, json_response, refusal, unauthorized};
use crate::{guard, headers};

/// GET and DELETE: there is no session stream to open or close.
pub(crate) async fn method_not_allowed() -> Response {
    let mut res = StatusCode::METHOD_NOT_ALLOWED.into_response();
    res.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST"));
    res
}

pub(crate) async fn handle_post(State(state): State<Arc<AppState>>, request: Request) -> Response {
    // Taking the request whole moves the headers out instead of cloning them.
    let (parts, body) = request.into_parts();
    let headers = parts.headers;
    if let Err(refused) = guard::check_request(&headers, &state.config) {
        return *refused;
    }
    // Before the body is read: nothing runs for a request without a principal. A token in
    // the URL is refused whatever the mode: it would end up in logs.
    if wharf_auth::token_in_query(parts.uri.query()) {
        return unauthorized(&state.config.auth, &wharf_auth::AuthError::TokenInQuery);
    }
    let principal = match state.config.auth.authenticate(&headers).await {
        Ok(p) => p,
        Err(refused) => return unauthorized(&state.config.auth, &refused),
    };
    let limit = state.config.max_body_bytes;
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(e) => {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            return if too_large {
                let e = RpcError::new(
                    ErrorKind::InvalidRequest,
                    format!("The body exceeds the limit of {limit} bytes"),
                );
                error_with_status(StatusCode::PAYLOAD_TOO_LARGE, None, &e)
            } else {
                let e = RpcError::new(
                    ErrorKind::InvalidRequest,
                    "The request body could not be read",
                );
                error_with_status(StatusCode::BAD_REQUEST, None, &e)
            };
        }
    };
    serve(&state, &headers, &bytes, principal).await
}

async fn serve(
    state: &Arc<AppState>,
    headers: &HeaderMap,
    bytes: &Bytes,
    principal: Principal,
) -> Response {
    let envelope = match Envelope::parse(bytes, state.config.max_json_depth) {
        Ok(env) => env,
        Err(failure) => {
            return error_response(failure.id.as_ref(), &RpcError::from(&failure.error));
        }
    };
    let Some(method) = envelope.method.as_deref() else {
        let e = RpcError::new(
            ErrorKind::InvalidRequest,
            "Invalid request: clients must not send responses to the server",
        );
        return error_response(envelope.id.as_ref(), &e);
    };
    let Some(id) = envelope.id else {
        // A notification: nothing to answer. This revision defines none over HTTP.
        return StatusCode::ACCEPTED.into_response();
    };
    let server = &state.server;
    let req = match server.parse_request(id, method, envelope.params) {
        Ok(r) => r,
        Err((e, id)) => return error_response(Some(&id), &e),
    };
    if let Err(e) = headers::validate(headers, &req, server) {
        return error_response(Some(&req.id), &e);
    }
    if req.is_listen() {
        if let Err(e) = server.admit(&req, &principal) {
            return refusal(&state.config.auth, Some(&req.id), &e);
        }
        return listen(state, req);
    }
    // A slot to run in, before anything is answered: a refusal keeps its 503, and a client
    // that goes away while queued drops this future and leaves the queue.
    let permit = match server.enter(&req, &principal).await {
        Ok(p) => p,
        Err(e) => return error_response(Some(&req.id), &e),
    };
    if req.info.wants_stream() {
        // Refusals must keep their status: check before committing to a 200 stream.
        if let Err(e) = server.admit(&req, &principal) {
            return refusal(&state.config.auth, Some(&req.id), &e);
        }
        return stream(state, req, principal, permit);
    }
    let id = req.id.clone();
    // Boxed so the handler future axum boxes and moves stays small.
    let work = Box::pin(server.execute(
        req,
        Scope {
            principal,
            cancel: None,
            outbox: None,
        },
    ));
    let out = work.await;
    drop(permit);
    match out {
        Ok(body) => json_response(StatusCode::OK, body),
        Err(e) => refusal(&state.config.auth, Some(&id), &e),
    }
}

fn sse_headers(mut res: Response) -> Response {
    res.headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    res
}

fn event(message: Vec<u8>) -> Result<Event, Infallible> {
    // serde_json writes UTF-8 without raw newlines, so one message is one `data:` line.
    Ok(Event::default().data(String::from_utf8(message).unwrap_or_default()))
}

/// Runs the request on its own task and streams its notifications, then its response. When
/// the client closes the stream, the guard cancels the request.
fn stream(
    state: &Arc<AppState>,
    req: ParsedRequest,
    principal: Principal,
    permit: Permit,
) -> Response {
    let (tx, rx) = mpsc::channel::<Vec<u8>>(32);
    let cancel = CancellationToken::new();
    let guard = cancel.clone().drop_guard();
    let server = state.server.clone();
    tokio::spawn(async move {
        let _permit = permit;
        if let Some(last) = server
            .execute_streamed(req, principal, cancel, tx.clone())
            .await
        {
            let _ = tx.send(last).await;
        }
    });
    let events = ReceiverStream::new(rx).map(move |m| {
        let _keep = &guard;
        event(m)
    });
    sse_headers(Sse::new(events).into_response())
}

/// A `subscriptions/listen` stream with keep-alive comments.
fn listen(state: &Arc<AppState>, req: ParsedRequest) -> Response {
    let id: RequestId = req.id.clone();
    let listener = match state.server.listen(req) {
        Ok(l) => l,
        Err(e) => return error_response(Some(&id), &e),
    };
    let messages =
        futures_util::stream::unfold(
            listener,
            |mut l| async move { l.next().await.map(|m| (m, l)) },
        );
    let events = messages.map(event);
    sse_headers(
        Sse::new(events)
            .keep_alive(KeepAlive::new().interval(state.config.keep_alive).text(""))
            .into_response(),
    )
}
