//! The MCP endpoint: one POST, one JSON-RPC message, answered with JSON or SSE.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody as _};
use axum::extract::Request;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use http_body_util::{BodyExt as _, LengthLimitError, Limited};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use wharf::{Admitted, ErrorKind, ParsedRequest, Principal, RpcError};
use wharf_protocol::Envelope;

use crate::call_stream::{self, Ended, Phase, last_message};
use crate::errors::{
    count_refusal, error_response, error_with_status, json_response, reply_error, unauthorized,
};
use crate::request_headers::RequestHeaders;
use crate::sse::{event, sse};
use crate::{AppState, HttpConfig};
use crate::{guard, headers, session};

pub(crate) async fn handle_post(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let response = answer(&state, request).await;
    crate::count_response(&state, &response);
    response
}

async fn answer(state: &Arc<AppState>, request: Request) -> Response {
    // Taking the request whole moves the headers out instead of cloning them.
    let (parts, body) = request.into_parts();
    let headers = RequestHeaders::read(&parts.headers);
    if let Err(refused) = guard::check_request(&headers, &state.config) {
        return refuse_unread(&parts.headers, body, *refused, &state.config);
    }
    // Before the body is read: nothing runs for a request without a principal.
    let principal = match state.config.auth.authenticate(&parts).await {
        Ok(p) => p,
        Err(refused) => {
            count_refusal(state, &refused, &parts.headers);
            let refusal = unauthorized(&refused);
            return refuse_unread(&parts.headers, body, refusal, &state.config);
        }
    };
    let bytes = match read_body(body, &state.config).await {
        Ok(b) => b,
        Err(refused) => return refused,
    };
    serve(state, &headers, &bytes, principal).await
}

/// A refusal sent before the body was read. A body still to come closes the connection
/// after the refusal, and is read and thrown away meanwhile (see [`DRAIN_TIME`]): all of it
/// (up to [`DRAIN_BYTES`]) when it was refused for its size, so that the client reads the
/// 413; otherwise as much as a body may hold. Not when the client waits for
/// `100 Continue` before sending it: reading would tell it to go ahead.
fn refuse_unread(
    headers: &HeaderMap,
    body: Body,
    mut refusal: Response,
    config: &HttpConfig,
) -> Response {
    if body.is_end_stream() {
        return refusal;
    }
    close_after(&mut refusal);
    let waits_for_continue = headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if !waits_for_continue {
        let cap = if refusal.status() == StatusCode::PAYLOAD_TOO_LARGE {
            DRAIN_BYTES
        } else {
            config.max_body_bytes
        };
        tokio::spawn(drain(body, cap));
    }
    refusal
}

fn close_after(response: &mut Response) {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
}

/// Time a refused body is still read (and thrown away) after the refusal, and how much of
/// it: closing a socket with unread bytes makes the kernel reset the connection, and a client
/// still sending would read the reset instead of the 413.
const DRAIN_TIME: Duration = Duration::from_secs(10);
const DRAIN_BYTES: usize = 64 * 1024 * 1024;

/// Reads the request body: at most `max_body_bytes` (413 beyond), all of it within
/// `body_read_timeout` (408 after). Either refusal closes the connection.
async fn read_body(mut body: Body, config: &HttpConfig) -> Result<Bytes, Response> {
    let limit = config.max_body_bytes;
    // Limited over a borrow: a body refused as too large is still ours to drain.
    let reading = Limited::new(&mut body, limit).collect();
    let mut refusal = match tokio::time::timeout(config.body_read_timeout, reading).await {
        Ok(Ok(collected)) => return Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<LengthLimitError>() => {
            tokio::spawn(drain(body, DRAIN_BYTES));
            let e = RpcError::new(
                ErrorKind::InvalidRequest,
                format!("The body exceeds the limit of {limit} bytes"),
            );
            error_with_status(StatusCode::PAYLOAD_TOO_LARGE, None, &e)
        }
        Ok(Err(_)) => {
            let e = RpcError::new(
                ErrorKind::InvalidRequest,
                "The request body could not be read",
            );
            error_with_status(StatusCode::BAD_REQUEST, None, &e)
        }
        Err(_) => {
            let e = RpcError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "The request body did not arrive within {} s",
                    config.body_read_timeout.as_secs_f64()
                ),
            );
            error_with_status(StatusCode::REQUEST_TIMEOUT, None, &e)
        }
    };
    close_after(&mut refusal);
    Err(refusal)
}

/// Reads and throws away what is left of a refused body, `cap` bytes at most (see
/// [`DRAIN_TIME`]).
async fn drain(mut body: Body, cap: usize) {
    let deadline = tokio::time::Instant::now() + DRAIN_TIME;
    let mut read = 0usize;
    while read < cap {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                read += frame.data_ref().map_or(0, bytes::Buf::remaining);
            }
            _ => break,
        }
    }
}

async fn serve(
    state: &Arc<AppState>,
    headers: &RequestHeaders<'_>,
    bytes: &Bytes,
    principal: Principal,
) -> Response {
    let server = &state.server;
    let auth = state.config.auth.as_ref();
    // A legacy session's message goes the long way, to its session. A stateless request
    // (its version header names a modern revision) is served as one even if it carries a
    // session id: stateless servers ignore that header, as does a server that opens no
    // legacy sessions.
    let legacy = headers.session_id.first().is_some()
        && !headers::is_modern(headers)
        && server.sessions().enabled();
    let read = if legacy {
        None
    } else {
        server.read_request(bytes, state.config.max_json_depth)
    };
    let (mut req, principal) = match read {
        Some(req) => (req, principal),
        // Boxed: the rare way (a legacy session's message, `initialize`, a refusal) is not
        // part of the state every request's future carries.
        None => match Box::pin(read_long_way(state, headers, bytes, principal, legacy)).await {
            Ok(read) => read,
            Err(answered) => return answered,
        },
    };
    // W3C trace context travels in `_meta`; a client (or a proxy) that sets only the HTTP
    // headers still has its trace joined.
    req.info.adopt_trace(headers.trace());
    if let Err(e) = headers::validate(headers, &req, server) {
        return error_response(Some(&req.id), &e);
    }
    // Before anything is answered: a refusal keeps its status, and a client that goes away
    // while queued drops this future and leaves the queue.
    let admitted = match server.admit(req, principal).await {
        Ok(a) => a,
        Err(reply) => return reply_error(auth, &reply),
    };
    if admitted.is_stream() {
        // Boxed: its waits are not part of the state every request's future carries.
        return Box::pin(stream(state, admitted)).await;
    }
    // Boxed so the handler future axum boxes and moves stays small.
    match Box::pin(admitted.respond()).await {
        Ok(body) => json_response(StatusCode::OK, body),
        Err(reply) => reply_error(auth, &reply),
    }
}

/// Reads what the single pass did not (see [`wharf::Server::read_request`]): refuses what is
/// malformed by name, and answers a legacy session's message, `initialize`, a notification.
/// `Ok` is a request still to run; `Err` the response already made, refusal or answer.
async fn read_long_way(
    state: &Arc<AppState>,
    headers: &RequestHeaders<'_>,
    bytes: &Bytes,
    principal: Principal,
    legacy: bool,
) -> Result<(ParsedRequest, Principal), Response> {
    if legacy && bytes.trim_ascii_start().first() == Some(&b'[') {
        return Err(session::batch(state, headers, bytes.clone(), principal).await);
    }
    let envelope = match Envelope::parse(bytes, state.config.max_json_depth) {
        Ok(env) => env,
        Err(failure) => {
            return Err(error_response(
                failure.id.as_ref(),
                &RpcError::from(&failure.error),
            ));
        }
    };
    if legacy {
        return Err(session::post(state, headers, envelope, principal).await);
    }
    // What is answered here without a method of this revision (`initialize`, a
    // notification) is still refused when an `Mcp-Method` it was sent with names another
    // method: a gateway may have routed on it. Before anything is opened. (A request goes
    // on to `parse_request`, where an unknown method is answered as that, after a version
    // its header names that this server does not speak.)
    let answered_here = |method: &str| match &envelope.id {
        Some(_) => state
            .server
            .sessions()
            .opens_session(method, envelope.params),
        None => true,
    };
    if let Some(method) = envelope.method.as_deref().filter(|m| answered_here(m)) {
        // A notification of this revision (its version header names it) must carry
        // `Mcp-Method` as a request does; one without may be a legacy client's.
        let strict = envelope.id.is_none() && headers::is_modern(headers);
        if let Err(e) = headers::method_mirrored(headers, method, strict) {
            return Err(error_response(envelope.id.as_ref(), &e));
        }
        if let Some(id) = &envelope.id {
            let id = id.clone();
            return Err(session::initialize(state, id, envelope.params, &principal).await);
        }
    }
    let Some(method) = envelope.method.as_deref() else {
        let e = RpcError::new(
            ErrorKind::InvalidRequest,
            "Invalid request: clients must not send responses to the server",
        );
        // Without the response's id: the error answers no request of the client's, and a
        // client must not take it for the answer to one it sent under that id.
        return Err(error_response(None, &e));
    };
    let Some(id) = envelope.id else {
        // A notification: nothing to answer. This revision defines none over HTTP.
        return Err(StatusCode::ACCEPTED.into_response());
    };
    match state.server.parse_request(id, method, envelope.params) {
        Ok(req) => Ok((req, principal)),
        Err(reply) => {
            // A method this server has, refused for its params: a header that disagrees
            // with the body is what the transport answers first (400), not the method's
            // own refusal (200). A method it lacks: a version it does not speak first.
            let refused = if reply.error().kind == ErrorKind::MethodNotFound {
                // Then the method header a request of this revision must carry.
                headers::version_before_method(headers, envelope.params, &state.server).and_then(
                    |()| headers::method_mirrored(headers, method, headers::is_modern(headers)),
                )
            } else {
                headers::validate_unread(headers, method, envelope.params, &state.server)
            };
            if let Err(e) = refused {
                return Err(error_response(reply.id(), &e));
            }
            Err(reply_error(state.config.auth.as_ref(), &reply))
        }
    }
}

/// Streams the request's messages with keep-alive comments between them (a listen stream
/// may be quiet for long). A listen stream is pulled straight from its subscription as the
/// response is written; any other request runs on its own task, and when the client closes
/// the stream the guard cancels it.
///
/// The head of a call's stream waits a moment ([`HEAD_WAIT`]) for the first thing the
/// stream would carry. A call that ends in that moment without a notification is answered
/// alone, so a refusal raised early while it ran (-32021 when its handler asks for a
/// capability the client lacks, 503 for a busy store) keeps the status it calls for instead
/// of travelling inside a 200 stream.
async fn stream(state: &Arc<AppState>, admitted: Admitted) -> Response {
    if admitted.request().is_listen() {
        return sse(state, admitted.listen_stream().map(event));
    }
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(32);
    let cancel = CancellationToken::new();
    let guard = cancel.clone().drop_guard();
    // A panic in the call, inside its handler or out, is answered by the core, with the
    // request's id.
    let mut task = tokio::spawn(admitted.stream_then(tx, cancel));
    let start = tokio::select! {
        biased;
        Some(first) = rx.recv() => Phase::Running(task, Some(first)),
        ended = &mut task => match rx.try_recv() {
            Ok(first) => Phase::Ending(last_message(ended), Some(first)),
            Err(_) => return alone(state, ended),
        },
        () = tokio::time::sleep(HEAD_WAIT) => Phase::Running(task, None),
    };
    let messages = call_stream::messages(start, rx);
    sse(
        state,
        messages.map(move |m| {
            let _keep = &guard;
            event(m)
        }),
    )
}

/// How long the head of a call's stream waits for its first message (see [`stream`]).
const HEAD_WAIT: Duration = Duration::from_millis(500);

/// The answer of a streamed call that ended before it sent anything: its response as the
/// stream's one event, or its refusal as JSON with the refusal's status.
fn alone(state: &Arc<AppState>, ended: Ended) -> Response {
    match ended {
        Ok(Some(Ok(response))) => sse(state, futures_util::stream::once(async { event(response) })),
        Ok(Some(Err(reply))) => reply_error(state.config.auth.as_ref(), &reply),
        // Nothing cancels the call while this waits; a task that failed answered nothing.
        Ok(None) | Err(_) => {
            let e = RpcError::internal("the call ended without a response");
            error_response(None, &e)
        }
    }
}
