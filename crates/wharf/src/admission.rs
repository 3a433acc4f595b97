//! The contract between a transport and the core. A transport parses a request
//! ([`Server::parse_request`](crate::Server::parse_request)), checks what only it can see
//! (headers), and hands the request with its caller to [`Server::admit`](crate::Server::admit).
//! Admission decides once, for every method, whether the request may run: the protocol
//! version, the scopes of what it reaches, the client capabilities it needs, and a slot
//! under the load caps (waiting in the queue when there is room). It answers with an
//! [`ErrorReply`] or an [`Admitted`] request, which the transport runs to one JSON body
//! ([`Admitted::respond`]) or to a stream of messages ([`Admitted::stream`]).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use wharf_protocol::RequestId;

use crate::access::{self, Denial};
use crate::dispatch::{self, Core};
use crate::error::{ErrorKind, RpcError};
use crate::limits::{Busy, Permit};
use crate::listen::Listener;
use crate::metrics::{AuthRefusal, ListenOpen, Metrics, Outcome, RequestTimer};
use crate::principal::Principal;
use crate::reply::error_message;
use crate::request::{Caller, Outbox, ParsedRequest, RequestBody};
use crate::trace;

/// An error answer of the core: the JSON-RPC error, the id it answers, and what a transport
/// needs to choose its status ([`RpcError::kind`]) and its challenge
/// ([`ErrorReply::required_scopes`]).
///
/// Boxed: errors are the cold path, and every `Result` that may carry one stays as small as
/// its success value. It is an [`Error`](std::error::Error) showing its code and message, so
/// `?` takes it into `Box<dyn Error>` (a test of a server through
/// [`Harness`](crate::testing::Harness), say).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{} ({})", .0.error.message, .0.error.code())]
pub struct ErrorReply(Box<Reply>);

#[derive(Debug, Clone, PartialEq)]
struct Reply {
    id: Option<RequestId>,
    error: RpcError,
    required_scopes: Vec<String>,
}

impl ErrorReply {
    /// An answer to `id` (none when the request's id could not be read).
    pub fn new(id: Option<RequestId>, error: RpcError) -> Self {
        ErrorReply(Box::new(Reply {
            id,
            error,
            required_scopes: Vec::new(),
        }))
    }

    /// The refusal `denial` says, counted among the credentials' refusals when a scope is
    /// missing.
    pub(crate) fn denied(metrics: Option<&Metrics>, id: RequestId, denial: Denial) -> Self {
        if let (Some(m), ErrorKind::InsufficientScope) = (metrics, denial.error.kind) {
            m.auth_refused(AuthRefusal::Forbidden);
        }
        ErrorReply(Box::new(Reply {
            id: Some(id),
            error: denial.error,
            required_scopes: denial.required_scopes,
        }))
    }

    /// The id it answers.
    pub fn id(&self) -> Option<&RequestId> {
        self.0.id.as_ref()
    }

    /// The error.
    pub fn error(&self) -> &RpcError {
        &self.0.error
    }

    /// Every scope the request needs, when missing scopes are why it was refused (an HTTP
    /// transport names them in its `insufficient_scope` challenge); empty otherwise.
    pub fn required_scopes(&self) -> &[String] {
        &self.0.required_scopes
    }

    /// The JSON-RPC error response message.
    pub fn to_message(&self) -> Vec<u8> {
        error_message(self.0.id.as_ref(), &self.0.error)
    }
}

/// A request admission let through, holding its slot under the load caps until it ends.
#[must_use = "an admitted request holds a slot until it is run or dropped"]
pub struct Admitted {
    core: Arc<Core>,
    req: ParsedRequest,
    principal: Principal,
    _permit: Permit,
    /// The request's span, from admission to the answer.
    span: tracing::Span,
    /// Counts the request when it ends, when the server counts.
    timer: Option<RequestTimer>,
}

impl std::fmt::Debug for Admitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admitted")
            .field("id", &self.req.id)
            .field("method", &self.req.body.method())
            .finish_non_exhaustive()
    }
}

/// Admits `req` for `principal`, or says why not. Dropping the future while it waits in the
/// queue takes the request out of the queue: it never runs.
pub(crate) async fn admit(
    core: &Arc<Core>,
    req: ParsedRequest,
    principal: Principal,
) -> Result<Admitted, ErrorReply> {
    let registry = &core.registry;
    // A tool or prompt the server has names the span; a name the client made up, or a
    // resource URI, would give traces a span name per request. Looked up only for a span
    // that is built.
    let known = || match &req.body {
        RequestBody::CallTool(p) => registry.tool(&p.name).map(|_| p.name.as_str()),
        RequestBody::GetPrompt(p) => registry.prompt(&p.name).map(|_| p.name.as_str()),
        _ => None,
    };
    let span = trace::request(&req, &principal, known);
    // Dropped while it waits (the client went away), the request counts as cancelled.
    let timer = core.runtime.metrics.as_ref().map(|m| {
        let tool = match &req.body {
            RequestBody::CallTool(p) => registry.tool_position(&p.name),
            _ => None,
        };
        RequestTimer::start(m, req.body.method(), tool)
    });
    if let Err(denial) = access::check(registry, &req, &principal) {
        Counted::new(span, timer).ended(Outcome::Error, Some(&denial.error));
        return Err(ErrorReply::denied(
            core.runtime.metrics.as_deref(),
            req.id,
            denial,
        ));
    }
    // Shared keys load on the first request (a no-op afterwards): every request that runs
    // has the keys to open and seal cursors and request states.
    if let Err(e) = core.runtime.keys.ready().await {
        let e = RpcError::from(e);
        Counted::new(span, timer).ended(Outcome::Error, Some(&e));
        return Err(ErrorReply::new(Some(req.id), e));
    }
    let gate = &core.runtime.gate;
    // The caps per principal hold for principals someone authenticated (see `Limits`).
    let capped = (!principal.is_anonymous()).then(|| principal.id());
    // Listen streams live long by design: they are not requests in flight, and have caps of
    // their own. With no caps at all there is nothing to take.
    let entered = if req.is_listen() {
        gate.enter_listen(capped)
    } else if gate.is_open() {
        Ok(Permit::default())
    } else {
        let max = core.runtime.config.max_call_duration;
        let (tool, patience) = match &req.body {
            RequestBody::CallTool(params) => match registry.tool(&params.name) {
                Some(t) => (t.limit.as_ref(), t.time_limit(max)),
                None => (None, max),
            },
            _ => (None, max),
        };
        use tracing::Instrument as _;
        gate.enter(capped, tool, patience)
            .instrument(trace::admission(&span))
            .await
    };
    match entered {
        Ok(permit) => Ok(Admitted {
            core: Arc::clone(core),
            req,
            principal,
            _permit: permit,
            span,
            timer,
        }),
        Err(Busy { why, error }) => {
            if let Some(m) = &core.runtime.metrics {
                m.shed(why);
            }
            Counted::new(span, timer).ended(Outcome::Error, Some(&error));
            Err(ErrorReply::new(Some(req.id), error))
        }
    }
}

impl Admitted {
    /// What a legacy call runs its rounds with.
    pub(crate) fn into_parts(self) -> (Arc<Core>, ParsedRequest, Principal, Permit, Counted) {
        let counted = Counted::new(self.span, self.timer);
        (self.core, self.req, self.principal, self._permit, counted)
    }

    /// The request.
    pub fn request(&self) -> &ParsedRequest {
        &self.req
    }

    /// Whether the answer must be a stream: a `subscriptions/listen`, or a request whose
    /// client asked for progress or log messages.
    pub fn is_stream(&self) -> bool {
        self.req.is_listen() || self.req.info.wants_stream()
    }

    /// Runs the request to its one response message. Nothing can cancel it and it sends no
    /// notifications; a `subscriptions/listen` is refused (it needs [`Admitted::stream`]).
    pub async fn respond(self) -> Result<Vec<u8>, ErrorReply> {
        let id = self.req.id.clone();
        let mut counted = Counted::new(self.span, self.timer);
        if self.req.is_listen() {
            let e = RpcError::new(
                ErrorKind::InvalidRequest,
                "subscriptions/listen needs a streaming response",
            );
            counted.ended(Outcome::Error, Some(&e));
            return Err(ErrorReply::new(Some(id), e));
        }
        let caller = Caller {
            principal: self.principal,
            cancel: None,
            outbox: None,
            outcome: None,
            progress_floor: None,
        };
        counted
            .run(&self.core, self.req, caller)
            .await
            .map_err(|e| ErrorReply::new(Some(id), e))
    }

    /// A `subscriptions/listen` request as the stream of its messages, which the transport
    /// pulls as it writes them: the acknowledgment, the notifications, and the final response
    /// when the server drains or shuts down ([`Server::drain`](crate::Server::drain)). Nothing runs between two messages and dropping the stream
    /// ends the subscription, so an idle stream costs only its subscription. Any other
    /// request is refused (its one message is the error): run those with
    /// [`Admitted::stream`].
    pub fn listen_stream(self) -> ListenStream {
        let Admitted {
            core,
            req,
            principal,
            _permit: permit,
            span,
            timer,
        } = self;
        let id = req.id.clone();
        let opened = Listener::open(&core.registry, &core.runtime, req, &principal);
        // Counted once as a request, when it opens; then as open while it lives.
        let mut counted = Counted::new(span, timer);
        let open = match &opened {
            Ok(_) => {
                counted.ended(Outcome::Ok, None);
                core.runtime
                    .metrics
                    .as_ref()
                    .map(|m| ListenOpen::new(Arc::clone(m)))
            }
            Err(e) => {
                counted.ended(Outcome::Error, Some(e));
                None
            }
        };
        drop(counted);
        let opened = opened.map_err(|e| error_message(Some(&id), &e));
        let permit = (permit, open);
        // The stream holds its slots under the listen caps until it ends or is dropped.
        let messages =
            futures_util::stream::unfold((Some(opened), permit), |(state, permit)| async move {
                match state? {
                    Ok(mut listener) => {
                        let next = listener.next().await?;
                        Some((next, (Some(Ok(listener)), permit)))
                    }
                    // A refusal is the stream's one message.
                    Err(refusal) => Some((refusal, (None, permit))),
                }
            });
        ListenStream(Box::pin(messages))
    }

    /// Runs the request as a stream: its messages go to `outbox` in order (notifications,
    /// then the response, which ends it; a listen stream's acknowledgment, its
    /// notifications, and its final response when the server drains or shuts down). Once `cancel`
    /// fires the work stops at its next await and nothing more is sent.
    pub async fn stream(self, outbox: Outbox, cancel: CancellationToken) {
        let last = outbox.clone();
        if let Some(response) = self.stream_then(outbox, cancel).await {
            let _ = last.send(response.unwrap_or_else(|e| e.to_message())).await;
        }
    }

    /// [`stream`](Self::stream), except that the response is returned rather than sent,
    /// once every notification is: a transport that has not begun its answer yet can then
    /// still give a refusal the status it calls for (an HTTP 400 for -32021, say). `None`
    /// when `cancel` fired, and for a listen stream, whose messages all go to `outbox`.
    pub async fn stream_then(
        self,
        outbox: Outbox,
        cancel: CancellationToken,
    ) -> Option<Result<Vec<u8>, ErrorReply>> {
        if self.req.is_listen() {
            let mut messages = self.listen_stream();
            use futures_util::StreamExt as _;
            loop {
                tokio::select! {
                    biased;
                    () = cancel.cancelled() => return None,
                    next = messages.next() => match next {
                        // The receiver is gone only when the stream closed.
                        Some(m) => if outbox.send(m).await.is_err() { return None },
                        None => return None,
                    },
                }
            }
        }
        let id = self.req.id.clone();
        let caller = Caller {
            principal: self.principal,
            cancel: Some(cancel.clone()),
            outbox: Some(outbox),
            outcome: None,
            progress_floor: None,
        };
        let counted = Counted::new(self.span, self.timer);
        let outcome = counted.run_catching(&self.core, self.req, caller).await;
        if cancel.is_cancelled() {
            return None;
        }
        Some(outcome.map_err(|e| ErrorReply::new(Some(id), e)))
    }
}

/// A request's span and its count, from admission until it ends: [`Counted::ended`] says
/// how (a legacy call, after its last round); dropped before, it counts as cancelled.
pub(crate) struct Counted {
    span: tracing::Span,
    timer: Option<RequestTimer>,
    ended: bool,
}

impl Drop for Counted {
    fn drop(&mut self) {
        if !self.ended {
            self.ended(Outcome::Cancelled, None);
        }
    }
}

impl Counted {
    fn new(span: tracing::Span, timer: Option<RequestTimer>) -> Self {
        Counted {
            span,
            timer,
            ended: false,
        }
    }

    /// The span rounds and stages go under.
    pub(crate) fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// Whether the request is counted (the server has metrics).
    pub(crate) fn is_counted(&self) -> bool {
        self.timer.is_some()
    }

    /// Leaves `waited` out of the request's duration: time the server spent waiting for
    /// the client (a legacy call's answers to its input requests) is not the server's, as
    /// it is not in a stateless call, whose rounds are requests of their own.
    pub(crate) fn exclude(&mut self, waited: std::time::Duration) {
        if let Some(timer) = &mut self.timer {
            timer.exclude(waited);
        }
    }

    /// Counts the request as ended with `outcome`, and says so on its span.
    pub(crate) fn ended(&mut self, outcome: Outcome, error: Option<&RpcError>) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        if let Some(timer) = self.timer.take() {
            timer.finish(outcome);
        }
        if !self.span.is_disabled() {
            trace::finish(&self.span, outcome, error);
        }
    }

    /// Runs the request to its response and counts it.
    async fn run(
        mut self,
        core: &Arc<Core>,
        req: ParsedRequest,
        caller: Caller,
    ) -> Result<Vec<u8>, RpcError> {
        let (out, outcome) =
            dispatch::execute(core, req, caller, &self.span, self.timer.is_some()).await;
        self.executed(outcome);
        out
    }

    /// [`run`](Self::run) for a streamed call: a panic outside the handler answers it
    /// -32603 (`dispatch::execute_catching`), and the transport's task (and what it holds
    /// for the id) ends as usual.
    async fn run_catching(
        mut self,
        core: &Arc<Core>,
        req: ParsedRequest,
        caller: Caller,
    ) -> Result<Vec<u8>, RpcError> {
        let counted = self.timer.is_some();
        let (out, outcome) =
            dispatch::execute_catching(core, req, caller, &self.span, counted, "a streamed call")
                .await;
        self.executed(outcome);
        out
    }

    /// Counts a request `dispatch::execute` ran, which said how on the span already.
    fn executed(&mut self, outcome: Outcome) {
        self.ended = true;
        if let Some(timer) = self.timer.take() {
            timer.finish(outcome);
        }
    }
}

/// The messages of a `subscriptions/listen` request (see [`Admitted::listen_stream`]).
#[must_use = "a listen stream sends nothing unless polled"]
pub struct ListenStream(std::pin::Pin<Box<dyn futures_util::Stream<Item = Vec<u8>> + Send>>);

impl std::fmt::Debug for ListenStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ListenStream")
    }
}

impl futures_util::Stream for ListenStream {
    type Item = Vec<u8>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Vec<u8>>> {
        self.0.as_mut().poll_next(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refusal reaches a test's `Box<dyn Error>` (or anyhow) through `?`, showing what the
    /// client would read.
    #[test]
    fn an_error_reply_is_an_error_naming_its_message_and_code() {
        fn refused() -> Result<(), ErrorReply> {
            Err(ErrorReply::new(
                Some(RequestId::Int(7)),
                RpcError::new(ErrorKind::InvalidParams, "unknown tool: nope"),
            ))
        }
        fn through_question_mark() -> Result<(), Box<dyn std::error::Error>> {
            refused()?;
            Ok(())
        }
        let err = through_question_mark().unwrap_err();
        assert_eq!(err.to_string(), "unknown tool: nope (-32602)");
    }
}
