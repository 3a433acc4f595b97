//! Clients of the initialization-based era on the same endpoint (2025-11-25
//! basic/transports): `initialize` opens a session whose id (`Mcp-Session-Id`) every later
//! POST, GET and DELETE carries. Sessions live in the server's store, so each message may
//! reach any replica.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::value::RawValue;
use tokio::sync::mpsc;
use wharf::{
    Answer, ErrorKind, ErrorReply, LegacyCall, Outcome, Principal, RpcError, Scope, Session,
    SessionError,
};
use wharf_protocol::{Envelope, RequestId, headers as mcp};

use crate::AppState;
use crate::call_stream::{self, Phase};
use crate::errors::{
    count_refusal, error_response, error_with_status, json_response, method_not_allowed,
    reply_error, unauthorized,
};
use crate::guard;
use crate::request_headers::RequestHeaders;
use crate::sse::{event, sse};

/// Answers `initialize`: the response carries the new session's id.
pub(crate) async fn initialize(
    state: &AppState,
    id: RequestId,
    params: Option<&RawValue>,
    principal: &Principal,
) -> Response {
    match state
        .server
        .sessions()
        .initialize(id, params, principal, Scope::Shared)
        .await
    {
        Ok((session, body)) => {
            let mut res = json_response(StatusCode::OK, body);
            if let Ok(v) = HeaderValue::from_str(session.id()) {
                res.headers_mut().insert(mcp::SESSION_ID, v);
            }
            res
        }
        Err(reply) => reply_error(state.config.auth.as_ref(), &reply),
    }
}

/// A POST of a session: a request, a notification, or the client's answer to a server
/// request.
pub(crate) async fn post(
    state: &AppState,
    headers: &RequestHeaders<'_>,
    envelope: Envelope<'_>,
    principal: Principal,
) -> Response {
    // That era defines no mirrored headers, but one that is sent must match the body (a
    // gateway may route on it), for the methods answered at once too; checked before the
    // session is resumed, since only a request that may go on keeps it alive.
    if let Some(method) = envelope.method.as_deref() {
        if let Err(e) = crate::headers::method_mirrored(headers, method, false) {
            return error_with_status(StatusCode::BAD_REQUEST, envelope.id.as_ref(), &e);
        }
    }
    let mut session = match resume(state, headers.map, envelope.id.as_ref(), &principal).await {
        Ok(s) => s,
        Err(refused) => return *refused,
    };
    let sessions = state.server.sessions();
    let Some(method) = envelope.method.as_deref() else {
        // A response: the client's answer to one of the server's requests.
        let Some(id) = envelope.id.as_ref() else {
            return bad_request(
                None,
                "a response must carry the id of the request it answers",
            );
        };
        return match sessions
            .answer(&session, id, envelope.result, envelope.error)
            .await
        {
            Ok(()) => StatusCode::ACCEPTED.into_response(),
            Err(e) => not_taken(&e),
        };
    };
    let Some(id) = envelope.id else {
        return match sessions.notify(&session, method, envelope.params).await {
            Ok(()) => StatusCode::ACCEPTED.into_response(),
            Err(e) => not_taken(&e),
        };
    };
    match sessions
        .request(
            &mut session,
            id,
            method,
            envelope.params,
            principal,
            headers.trace(),
        )
        .await
    {
        Ok(Answer::Message(body)) => json_response(StatusCode::OK, body),
        Ok(Answer::Call(call)) => {
            if let Err(e) = crate::headers::validate_present(headers, call.request(), &state.server)
            {
                return error_with_status(StatusCode::BAD_REQUEST, Some(&call.request().id), &e);
            }
            run(state, *call).await
        }
        Err(reply) => refused(state, &reply),
        Ok(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// A batch of a session (a JSON array of messages), which only 2025-03-26 sessions may send:
/// each message taken as if it came alone, in order; a batch of only notifications and
/// answers gets 202, one with requests an SSE stream of their answers. Each call starts as
/// soon as it is admitted, on a task of its own: one waiting for a slot never waits on a
/// call of its own batch. A client that goes away cancels no call that runs (as with a
/// single call); those still waiting for a slot leave the queue, as a single request does. A batch refused before any of it is taken: one with a message that cannot be
/// read (400, naming which: within a stream an error without an id is not a message of that
/// revision), one longer than [`LegacyConfig::max_batch`](wharf::LegacyConfig), one sent
/// with headers that mirror a single message (`Mcp-Method`, `Mcp-Name`, `Mcp-Param-*`: one
/// value cannot mirror an array, and a gateway may route on it). A refusal of access to a
/// request is that request's error on the stream, with the scopes it needs in its data.
/// (2025-03-26 basic/transports, "Sending Messages to the Server".)
pub(crate) async fn batch(
    state: &AppState,
    headers: &RequestHeaders<'_>,
    body: Bytes,
    principal: Principal,
) -> Response {
    let refuse = |message: String| {
        let e = RpcError::new(
            ErrorKind::InvalidRequest,
            format!("Invalid request: {message}"),
        );
        error_with_status(StatusCode::BAD_REQUEST, None, &e)
    };
    let mirrors = headers.method.first().is_some()
        || headers.name.first().is_some()
        || headers
            .map
            .keys()
            .any(|k| k.as_str().starts_with(mcp::PARAM_PREFIX));
    if mirrors {
        return refuse(
            "a batch carries no Mcp-Method, Mcp-Name or Mcp-Param-* header (they mirror one message)".into(),
        );
    }
    let session = match resume(state, headers.map, None, &principal).await {
        Ok(s) => s,
        Err(refused) => return *refused,
    };
    if !wharf_protocol::version::has_batches(session.version()) {
        let e = RpcError::from(&wharf_protocol::EnvelopeError::Batch);
        return error_with_status(StatusCode::BAD_REQUEST, None, &e);
    }
    let depth = state.config.max_json_depth;
    let messages = match wharf_protocol::jsonrpc::parse_batch(&body, depth) {
        Ok(messages) => messages,
        Err(failure) => {
            return error_with_status(StatusCode::BAD_REQUEST, None, &(&failure.error).into());
        }
    };
    let most = state.server.sessions().max_batch();
    if messages.len() > most {
        return refuse(format!(
            "a batch of {} messages; this server takes at most {most} in one",
            messages.len()
        ));
    }
    let mut requests = 0;
    for (n, message) in messages.iter().enumerate() {
        let read = Envelope::parse(message.get().as_bytes(), depth)
            .map_err(|failure| (failure.id, RpcError::from(&failure.error)));
        let (id, e) = match read {
            Ok(envelope) if envelope.method.is_none() && envelope.id.is_none() => (
                None,
                RpcError::new(
                    ErrorKind::InvalidRequest,
                    "Invalid request: a response must carry the id of the request it answers",
                ),
            ),
            Ok(envelope) => {
                requests += usize::from(envelope.method.is_some() && envelope.id.is_some());
                continue;
            }
            Err(failed) => failed,
        };
        let e = RpcError::new(
            e.kind,
            format!("{} (message {} of the batch)", e.message, n + 1),
        );
        return error_with_status(StatusCode::BAD_REQUEST, id.as_ref(), &e);
    }
    // The notifications and answers first, each in turn, before any request runs: the first
    // the server did not take is answered as it would be alone, and then none of the batch's
    // requests runs, so that the client, told to send it again, gets each request's answer
    // once (once a stream had begun nothing could say so, and the message was lost).
    let sessions = state.server.sessions();
    let mut first_refused = None;
    for message in &messages {
        let Ok(envelope) = Envelope::parse(message.get().as_bytes(), depth) else {
            continue;
        };
        if envelope.method.is_some() && envelope.id.is_some() {
            continue;
        }
        if let Err(e) = take(sessions, &session, envelope).await {
            first_refused.get_or_insert(e);
        }
    }
    if let Some(e) = first_refused {
        return not_taken(&e);
    }
    if requests == 0 {
        return StatusCode::ACCEPTED.into_response();
    }
    let (tx, rx) = mpsc::channel::<Vec<u8>>(32);
    let server = state.server.clone();
    // The stream ends with this task: after every message's answer, each call's response
    // last of its own.
    // Every request of the batch joins the trace its headers carry.
    let trace = headers.trace();
    let trace = (
        trace.traceparent.map(str::to_owned),
        trace.tracestate.map(str::to_owned),
    );
    let task = tokio::spawn(async move {
        let trace = wharf::TraceContext {
            traceparent: trace.0.as_deref(),
            tracestate: trace.1.as_deref(),
        };
        run_batch(&server, session, principal, &body, depth, trace, tx).await;
        None
    });
    sse(
        state,
        call_stream::messages(Phase::Running(task, None), rx).map(event),
    )
}

/// Answers the requests of a batch (read already, its other messages taken) in turn, on
/// `tx`; the calls run side by side, each from the moment it is admitted. Returns once
/// every call has ended.
async fn run_batch(
    server: &wharf::Server,
    mut session: Session,
    principal: Principal,
    body: &[u8],
    depth: usize,
    trace: wharf::TraceContext<'_>,
    tx: mpsc::Sender<Vec<u8>>,
) {
    let sessions = server.sessions();
    let Ok(messages) = wharf_protocol::jsonrpc::parse_batch(body, depth) else {
        return;
    };
    let mut calls = tokio::task::JoinSet::new();
    for message in messages {
        let Ok(envelope) = Envelope::parse(message.get().as_bytes(), depth) else {
            continue;
        };
        let (Some(method), Some(id)) = (envelope.method.as_deref(), envelope.id.clone()) else {
            continue;
        };
        let answer = if method == wharf_protocol::methods::INITIALIZE {
            let e = RpcError::new(
                ErrorKind::InvalidRequest,
                "Invalid request: initialize must not be part of a batch",
            );
            ErrorReply::new(Some(id), e).to_message()
        } else {
            // A client that went away leaves: what it asked and was not admitted yet is
            // dropped (it leaves the queue), as a single request of a client gone is; what
            // runs already runs on.
            if tx.is_closed() {
                continue;
            }
            let asked = tokio::select! {
                () = tx.closed() => continue,
                asked = sessions.request(&mut session, id, method, envelope.params, principal.clone(), trace) => asked,
            };
            match asked {
                Ok(Answer::Message(body)) => body,
                Ok(Answer::Call(call)) => {
                    calls.spawn(call.stream(tx.clone()));
                    continue;
                }
                Ok(_) => continue,
                Err(reply) => reply.to_message(),
            }
        };
        let _ = tx.send(answer).await;
    }
    drop(tx);
    while calls.join_next().await.is_some() {}
}

/// Takes a notification, or the client's answer to one of the server's requests.
async fn take(
    sessions: wharf::Sessions<'_>,
    session: &Session,
    envelope: Envelope<'_>,
) -> Result<(), RpcError> {
    match (envelope.method.as_deref(), envelope.id.as_ref()) {
        (None, Some(id)) => {
            sessions
                .answer(session, id, envelope.result, envelope.error)
                .await
        }
        (Some(method), None) => sessions.notify(session, method, envelope.params).await,
        _ => Ok(()),
    }
}

/// A notification or an answer the server did not take: 400 for what is wrong with it; a
/// store or bus that failed is not the client's fault (503 with Retry-After, or 500), and
/// the client sends it again.
fn not_taken(e: &RpcError) -> Response {
    match e.kind {
        ErrorKind::RetryLater | ErrorKind::Internal => error_response(None, e),
        _ => error_with_status(StatusCode::BAD_REQUEST, None, e),
    }
}

/// Runs a call: one JSON body when it needs no stream, else an SSE stream. A call that asks
/// the client for input switches to a stream when it asks. The call runs on its own task
/// once streaming: a client that goes away does not cancel it (its cancellation is
/// `notifications/cancelled`). The stream ends with the call's task, after what the call
/// sent (its response last), though a task the handler left running still holds a sender.
async fn run(state: &AppState, call: LegacyCall) -> Response {
    let (tx, rx) = mpsc::channel::<Vec<u8>>(32);
    let task = if call.is_stream() {
        tokio::spawn(async move {
            call.stream(tx).await;
            None
        })
    } else {
        match Detached(Some(Box::pin(call.respond()))).await {
            Outcome::Done(body) => return json_response(StatusCode::OK, body),
            Outcome::Asks(rounds) => tokio::spawn(async move {
                rounds.stream(tx).await;
                None
            }),
            _ => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        }
    };
    sse(
        state,
        call_stream::messages(Phase::Running(task, None), rx).map(event),
    )
}

/// A call's first round, run in the request's own task while the client waits; dropped
/// unfinished (the client went away), it finishes on a task of its own: a dropped
/// connection does not cancel a legacy call. (Spawning every call instead cost a sixth of
/// the legacy echo throughput.)
struct Detached(Option<Pin<Box<dyn Future<Output = Outcome> + Send>>>);

impl Future for Detached {
    type Output = Outcome;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Outcome> {
        let Some(round) = self.0.as_mut() else {
            return Poll::Pending;
        };
        let out = round.as_mut().poll(cx);
        if out.is_ready() {
            self.0 = None;
        }
        out
    }
}

impl Drop for Detached {
    fn drop(&mut self) {
        if let (Some(round), Ok(runtime)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            runtime.spawn(round);
        }
    }
}

/// GET with a session: its stream of list changes and resource updates.
pub(crate) async fn get(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let response = open_stream(&state, request).await;
    crate::count_response(&state, &response);
    response
}

async fn open_stream(state: &Arc<AppState>, request: Request) -> Response {
    let (session, principal) = match checked(state, request).await {
        Ok(s) => s,
        Err(refused) => return *refused,
    };
    let stream = match state.server.sessions().stream(&session, &principal).await {
        Ok(stream) => stream,
        Err(e) => return error_response(None, &e),
    };
    sse(state, stream.map(event))
}

/// HEAD: refused, never a stream opened. axum would run GET's handler for it, which opens
/// the session's stream and so ends the one its client holds, on whichever replica.
pub(crate) async fn head(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    // A forbidden Host or Origin gets 403 on every request, as on the other methods.
    if let Err(refused) = guard::check_headers(&headers, &state.config) {
        return *refused;
    }
    let allow = if state.server.sessions().enabled() {
        "GET, POST, DELETE"
    } else {
        "POST"
    };
    let mut res = StatusCode::METHOD_NOT_ALLOWED.into_response();
    res.headers_mut()
        .insert(axum::http::header::ALLOW, HeaderValue::from_static(allow));
    res
}

/// DELETE with a session: ends it.
pub(crate) async fn delete(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let response = match checked(&state, request).await {
        Ok((session, _)) => match state.server.sessions().end(&session).await {
            Ok(()) => StatusCode::OK.into_response(),
            Err(e) => session_error(None, e),
        },
        Err(refused) => *refused,
    };
    crate::count_response(&state, &response);
    response
}

/// The session a GET or DELETE names, after the Host/Origin and credential checks; without
/// `Mcp-Session-Id`, or on a server that opens no legacy sessions, the method is not
/// allowed (a stateless server has nothing to open or end).
async fn checked(
    state: &AppState,
    request: Request,
) -> Result<(Session, Principal), Box<Response>> {
    let (parts, _) = request.into_parts();
    // Host and Origin first, whatever the method finds: a forbidden origin gets 403 on
    // every request (streamable HTTP, "Security").
    guard::check_headers(&parts.headers, &state.config)?;
    if !parts.headers.contains_key(mcp::SESSION_ID) || !state.server.sessions().enabled() {
        return Err(Box::new(method_not_allowed().await));
    }
    let principal = match state.config.auth.authenticate(&parts).await {
        Ok(p) => p,
        Err(refusal) => {
            count_refusal(state, &refusal, &parts.headers);
            return Err(Box::new(unauthorized(&refusal)));
        }
    };
    let session = resume(state, &parts.headers, None, &principal).await?;
    Ok((session, principal))
}

/// The session the request names, if its principal opened it and it lives; the version
/// header, when sent, must be the session's.
async fn resume(
    state: &AppState,
    headers: &HeaderMap,
    id: Option<&RequestId>,
    principal: &Principal,
) -> Result<Session, Box<Response>> {
    let Some(value) = headers.get(mcp::SESSION_ID).and_then(|v| v.to_str().ok()) else {
        return Err(Box::new(bad_request(
            id,
            "the Mcp-Session-Id header is not visible ASCII",
        )));
    };
    let version = headers
        .get(mcp::PROTOCOL_VERSION)
        .map(|v| String::from_utf8_lossy(v.as_bytes()));
    let sessions = state.server.sessions();
    match sessions.resume(value, principal, version.as_deref()).await {
        Ok(session) => Ok(session),
        Err(SessionError::OtherVersion { sent, session }) => {
            let message = format!(
                "the MCP-Protocol-Version header {sent:?} is not the session's version {session:?}"
            );
            Err(Box::new(bad_request(id, &message)))
        }
        Err(e) => Err(Box::new(session_error(id, e))),
    }
}

/// 404 for a session that is gone (the client initializes again), 503 when the store
/// failed.
fn session_error(id: Option<&RequestId>, e: SessionError) -> Response {
    match e {
        SessionError::Unknown => error_with_status(
            StatusCode::NOT_FOUND,
            id,
            &RpcError::new(ErrorKind::InvalidRequest, e.to_string()),
        ),
        SessionError::Store(e) => {
            tracing::warn!(error = %e, "could not read a session from the store");
            let e = RpcError::new(
                ErrorKind::RetryLater,
                "Busy: the session store did not answer; retry",
            );
            // 503 with `Retry-After`, as every other answer of a store that did not answer.
            error_response(id, &e)
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

fn bad_request(id: Option<&RequestId>, message: &str) -> Response {
    let e = RpcError::new(ErrorKind::InvalidRequest, format!("Bad request: {message}"));
    error_with_status(StatusCode::BAD_REQUEST, id, &e)
}

/// A session's request the core refused: a JSON-RPC error over 200 (the HTTP exchange
/// worked; 2025-era clients read the error from the body), except what authorization
/// refused, which keeps its status and challenge, and a session that ended meanwhile: 404,
/// which has the client initialize again.
fn refused(state: &AppState, reply: &ErrorReply) -> Response {
    match reply.error().kind {
        ErrorKind::Unauthorized | ErrorKind::InsufficientScope => {
            reply_error(state.config.auth.as_ref(), reply)
        }
        ErrorKind::SessionEnded => json_response(StatusCode::NOT_FOUND, reply.to_message()),
        _ => json_response(StatusCode::OK, reply.to_message()),
    }
}
