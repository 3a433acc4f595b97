//! A request of a legacy session, run to its response. It runs like a stateless request,
//! round after round: when the handler needs input, the round's `input_required` result
//! becomes server requests (`elicitation/create`, `sampling/createMessage`, `roots/list`)
//! on the call's stream, and once the client has answered each (a POST that may reach any
//! replica), the next round runs with those answers and the sealed request state, exactly as
//! a stateless client would have retried.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize as _;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use wharf_protocol::{
    ClientCapabilities, CreateMessageParams, ElicitationCapability, InputResponses, RequestId,
    methods,
};

use super::older;
use super::{REPLY_KIND, reply_key, server_request_id};
use crate::admission::Admitted;
use crate::admission::Counted;
use crate::deadline::later;
use crate::dispatch::{self, Core};
use crate::error::{ErrorKind, RpcError};
use crate::limits::Permit;
use crate::meta::capabilities_cover;
use crate::metrics::{Outcome as RequestOutcome, Throttled};
use crate::principal::Principal;
use crate::reply::error_message;
use crate::request::{self, Caller, Outbox, ParsedRequest, ProgressFloor, RequestBody};
use crate::session::{Delivery, Running, Session, Waiter};
use crate::store::{TxMode, now_millis};
use crate::trace;

/// How often a call waiting for an answer looks in the store even without a signal (one
/// can be lost while the bus reconnects).
const POLL: Duration = Duration::from_secs(1);
/// How long before its round's state expires a call stops waiting for answers (at most:
/// half a state's life when that is shorter): the next round must begin while the state
/// holds.
const STATE_MARGIN: Duration = Duration::from_secs(1);

/// An admitted request of a legacy session. Run it to one message with
/// [`LegacyCall::respond`] (which hands back the [`Rounds`] still to run if the handler
/// asks for input), or as a stream with [`LegacyCall::stream`] (when [`LegacyCall::is_stream`]:
/// the client asked for progress, or set a log level).
///
/// A client that goes away does not cancel a legacy call (2025-11-25 basic/transports):
/// `notifications/cancelled` does, on whichever replica it arrives.
#[must_use = "an admitted call holds a slot until it is run or dropped"]
pub struct LegacyCall {
    run: Run,
    req: ParsedRequest,
}

impl std::fmt::Debug for LegacyCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LegacyCall")
            .field("id", &self.req.id)
            .field("method", &self.run.method)
            .finish_non_exhaustive()
    }
}

/// What [`LegacyCall::respond`] came to.
#[derive(Debug)]
#[non_exhaustive]
pub enum Outcome {
    /// The response message.
    Done(Vec<u8>),
    /// The handler needs input from the client: the rest must run on a stream.
    Asks(Box<Rounds>),
}

/// The rest of a call whose handler needs input: run it with [`Rounds::stream`].
#[must_use = "the call waits for its rounds to run"]
pub struct Rounds {
    run: Run,
    asked: Asked,
}

impl std::fmt::Debug for Rounds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rounds")
            .field("method", &self.run.method)
            .field("asked", &self.asked.requests.len())
            .finish_non_exhaustive()
    }
}

/// What one round asked for.
struct Asked {
    requests: Map<String, Value>,
    state: Option<String>,
    /// When the round that asked returned, just after its state was sealed.
    returned: Instant,
}

enum Step {
    Done(Vec<u8>),
    Ask(Asked),
    Cancelled,
}

/// What every round of one call shares.
struct Run {
    core: Arc<Core>,
    session: Session,
    principal: Principal,
    id: RequestId,
    method: &'static str,
    /// The params as sent, for the next round (only methods whose handlers may ask).
    raw: Option<Box<RawValue>>,
    cancel: CancellationToken,
    rounds: u32,
    /// The progress the rounds sent so far: each round runs its handler again.
    progress_floor: Arc<ProgressFloor>,
    /// The call's span, which each round's span is under, and its count: once, when the
    /// last round ended.
    counted: Counted,
    _running: Running,
    _permit: Permit,
}

/// Registers a request of `session` for cancellation, from now until the registration is
/// dropped (see [`Running`]); the hub starts hearing the bus for it if it did not yet.
pub(crate) fn register(
    core: &Arc<Core>,
    session: &Session,
    id: &RequestId,
) -> Result<(CancellationToken, Running), RpcError> {
    let runtime = &core.runtime;
    // Not a child of the shutdown token: a child registers with its parent under a lock
    // every call would contend for. Shutdown drains calls as it drains stateless ones.
    let cancel = CancellationToken::new();
    if session.booked && runtime.sessions.is_shared() {
        runtime.hub.listen(&runtime.bus, &runtime.sessions);
    }
    let key = super::call_key(session.id(), id);
    // Cancellations name a call by its id: a second call under the id of one still running
    // would make them ambiguous. (Only this process's calls are known here; one under the
    // same id on another replica is not.)
    let running = runtime
        .hub
        .run(session.id(), &key, cancel.clone())
        .ok_or_else(|| {
            RpcError::new(
                ErrorKind::InvalidRequest,
                format!("Request id {id} is already in use by a running request of this session"),
            )
        })?;
    Ok((cancel, running))
}

/// What a call cancelled by its client gets, when something must be sent (a plain JSON
/// response).
pub(crate) fn cancelled_error() -> RpcError {
    RpcError::new(ErrorKind::Internal, "Request cancelled by the client")
}

impl LegacyCall {
    pub(crate) fn new(
        admitted: Admitted,
        session: Session,
        params: Option<&RawValue>,
        (cancel, running): (CancellationToken, Running),
    ) -> Self {
        let (core, req, principal, permit, counted) = admitted.into_parts();
        let method = req.body.method();
        let may_ask = matches!(
            method,
            methods::TOOLS_CALL | methods::PROMPTS_GET | methods::RESOURCES_READ
        );
        LegacyCall {
            run: Run {
                raw: params.filter(|_| may_ask).map(ToOwned::to_owned),
                core: Arc::clone(&core),
                session,
                principal,
                id: req.id.clone(),
                method,
                cancel,
                rounds: 0,
                progress_floor: Arc::default(),
                counted,
                _running: running,
                _permit: permit,
            },
            req,
        }
    }

    /// The request.
    pub fn request(&self) -> &ParsedRequest {
        &self.req
    }

    /// Whether the answer must be a stream: the client asked for progress, or set a log
    /// level for the session.
    pub fn is_stream(&self) -> bool {
        self.req.info.wants_stream()
    }

    /// Runs the first round: its response, or the rounds still to run on a stream.
    pub async fn respond(self) -> Outcome {
        let LegacyCall { mut run, req } = self;
        match run.round(req, None).await {
            Step::Done(m) => Outcome::Done(m),
            Step::Cancelled => Outcome::Done(run.cancelled()),
            Step::Ask(asked) => Outcome::Asks(Box::new(Rounds { run, asked })),
        }
    }

    /// Runs the call as a stream: its notifications, server requests and response go to
    /// `outbox`, the response last. Nothing is sent after a cancellation.
    pub async fn stream(self, outbox: Outbox) {
        self.run.drive(Next::Request(self.req), &outbox).await;
    }
}

impl Rounds {
    /// Sends the input requests of the round that asked, then runs the rounds after it as
    /// [`LegacyCall::stream`] does.
    pub async fn stream(self, outbox: Outbox) {
        self.run.drive(Next::Ask(self.asked), &outbox).await;
    }
}

enum Next {
    Request(ParsedRequest),
    Ask(Asked),
}

impl Run {
    async fn drive(mut self, mut next: Next, outbox: &Outbox) {
        loop {
            let asked = match next {
                Next::Request(req) => match self.round(req, Some(outbox)).await {
                    Step::Done(m) => {
                        self.send(outbox, m).await;
                        return;
                    }
                    Step::Cancelled => return,
                    Step::Ask(asked) => asked,
                },
                Next::Ask(asked) => asked,
            };
            let asking = Instant::now();
            let answered = self.ask(asked, outbox).await;
            self.counted.exclude(asking.elapsed());
            let e = match answered {
                Ok(req) => {
                    next = Next::Request(req);
                    continue;
                }
                Err(Stop::Cancelled) => return,
                Err(Stop::Refused(why)) if self.method == methods::TOOLS_CALL => {
                    // As the session's version has a tool's result (no 2026-07-28 fields).
                    let result = wharf_protocol::CallToolResult::error(why);
                    match crate::reply::respond(&self.id, &result) {
                        Ok(m) => {
                            if let Step::Done(m) =
                                classify(m, Instant::now(), self.session.version())
                            {
                                self.counted.ended(RequestOutcome::ToolError, None);
                                self.send(outbox, m).await;
                                return;
                            }
                            RpcError::internal("a tool error read as a round of input")
                        }
                        Err(e) => e,
                    }
                }
                Err(Stop::Refused(why)) => RpcError::new(ErrorKind::Internal, why),
                Err(Stop::Failed(e)) => e,
            };
            let e = e.in_2025();
            self.counted.ended(RequestOutcome::Error, Some(&e));
            self.send(outbox, error_message(Some(&self.id), &e)).await;
            return;
        }
    }

    /// Sends `message` on the call's stream; `false` when it did not go: the stream is
    /// gone, or the call was cancelled (by its client, or its session's end) while the
    /// stream was full. A client that keeps its stream open without reading it must not
    /// hold the call, and its slot, past its cancellation; nothing is sent after one. A
    /// drain does not cut the send short: the answer of a call that finished in time still
    /// goes, and at the drain's end the stream itself is closed.
    async fn send(&self, outbox: &Outbox, message: Vec<u8>) -> bool {
        tokio::select! {
            biased;
            () = self.cancel.cancelled() => false,
            sent = outbox.send(message) => sent.is_ok(),
        }
    }

    async fn round(&mut self, req: ParsedRequest, outbox: Option<&Outbox>) -> Step {
        self.rounds += 1;
        let caller = Caller {
            principal: self.principal.clone(),
            cancel: Some(self.cancel.clone()),
            outbox: outbox.cloned(),
            outcome: None,
            progress_floor: Some(Arc::clone(&self.progress_floor)),
        };
        let span = trace::round(self.counted.span(), self.rounds);
        let counted = self.counted.is_counted();
        let (out, outcome) =
            dispatch::execute_catching(&self.core, req, caller, &span, counted, "a legacy call")
                .await;
        let returned = Instant::now();
        match out {
            Err(_) if self.cancel.is_cancelled() => {
                self.counted.ended(RequestOutcome::Cancelled, None);
                Step::Cancelled
            }
            Err(e) => {
                let e = e.in_2025();
                self.counted.ended(RequestOutcome::Error, Some(&e));
                Step::Done(error_message(Some(&self.id), &e))
            }
            Ok(m) => match classify(m, returned, self.session.version()) {
                // The call goes on: the client answers, and the next round runs.
                Step::Ask(asked) => Step::Ask(asked),
                step => {
                    self.counted.ended(outcome, None);
                    step
                }
            },
        }
    }

    /// The answer to a cancelled call when one must be sent (a plain JSON response).
    fn cancelled(&self) -> Vec<u8> {
        error_message(Some(&self.id), &cancelled_error())
    }

    /// Sends the round's input requests, waits for every answer, and builds the next
    /// round's request. `Err(None)`: cancelled, or the client is gone; nothing to send.
    async fn ask(&mut self, asked: Asked, outbox: &Outbox) -> Result<ParsedRequest, Stop> {
        let runtime = &self.core.runtime;
        let max = runtime.config.request_state.max_rounds;
        if self.rounds > max {
            return Err(Stop::Failed(RpcError::new(
                ErrorKind::InvalidRequest,
                format!("The call asked for input more than {max} times; it was stopped"),
            )));
        }
        // Every request of the round is checked before any is sent: one the client cannot
        // answer must not leave the others open.
        let mut round = Vec::with_capacity(asked.requests.len());
        for (key, request) in &asked.requests {
            let method = request
                .get("method")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let params = request.get("params");
            let version = self.session.version();
            let required =
                required_capability(method, params).map(|caps| older::required(version, caps));
            let required = required.ok_or_else(|| {
                Stop::Failed(RpcError::internal(format!(
                    "input request {key:?} has an unknown method {method:?}"
                )))
            })?;
            if !capabilities_cover(self.session.client_capabilities(), &required) {
                let what = format!("input request {key:?} ({method})");
                return Err(Stop::Failed(RpcError::missing_capability(&required, &what)));
            }
            let params = older::input_params(version, method, params).map_err(|what| {
                // The server's own doing, named (nothing secret in what a handler asks).
                Stop::Failed(RpcError::new(
                    ErrorKind::Internal,
                    format!(
                        "Input request {key:?} asks for {what}, which a {version} client \
                         cannot read"
                    ),
                ))
            })?;
            round.push((key, method, params));
        }
        let nonce: u64 = rand::random();
        let mut waiting = Vec::with_capacity(round.len());
        let mut open = Open {
            outbox: outbox.clone(),
            ids: Vec::with_capacity(round.len()),
        };
        for (n, (key, method, params)) in round.into_iter().enumerate() {
            // Stamped as it goes out: the call's wait for its answer starts after the sends.
            let id = server_request_id(runtime, self.session.id(), nonce, n, now_millis());
            // Waiting before sending: the answer cannot arrive before anyone listens.
            let waiter = runtime.hub.wait(&reply_key(self.session.id(), &id));
            let message = server_request(&id, method, params.as_deref());
            let bytes =
                serde_json::to_vec(&message).map_err(|e| Stop::Failed(RpcError::internal(e)))?;
            if !self.send(outbox, bytes).await {
                // The stream is gone (nobody is there to answer), or the call was cancelled.
                return Err(Stop::Cancelled);
            }
            open.ids.push(id);
            waiting.push((key.clone(), method, waiter));
        }
        // The answers are taken only while the round's state holds: one that came after it
        // expired would fail the next round with an error about a `requestState` a 2025
        // client never saw. A moment (a second, or half a short state's life) is left for
        // the next round to begin, and covers the instant between the seal and the return.
        let sent = Instant::now();
        let state_lasts = runtime.config.request_state.max_age;
        let margin = STATE_MARGIN.min(state_lasts / 2);
        let state_holds = later(asked.returned, state_lasts.saturating_sub(margin));
        let deadline = later(sent, runtime.config.legacy.input_timeout).min(state_holds);
        let allowed = deadline.saturating_duration_since(sent);
        let mut responses = InputResponses::new();
        for (key, method, mut waiter) in waiting {
            let answer = self.answer_of(&mut waiter, deadline, allowed, &key).await?;
            open.ids.remove(0);
            match answer {
                Answer::Result(r) => {
                    responses.insert(key, r);
                }
                Answer::Error(e) => {
                    let message = e
                        .get("message")
                        .and_then(Value::as_str)
                        .unwrap_or("no message");
                    return Err(Stop::Refused(format!(
                        "The client answered input request {key:?} ({method}) with an error: {message}"
                    )));
                }
            }
        }
        let caps = &self.core.registry.capabilities;
        let mut req = request::parse_in_session(
            caps,
            &self.session,
            self.id.clone(),
            self.method,
            self.raw.as_deref(),
            // The round's span is under the call's, which joined the caller's trace.
            crate::meta::TraceContext::default(),
        )
        .map_err(Stop::Failed)?;
        match &mut req.body {
            RequestBody::CallTool(p) => {
                p.input_responses = Some(responses);
                p.request_state = asked.state;
            }
            RequestBody::GetPrompt(p) => {
                p.input_responses = Some(responses);
                p.request_state = asked.state;
            }
            RequestBody::ReadResource(p) => {
                p.input_responses = Some(responses);
                p.request_state = asked.state;
            }
            _ => {
                return Err(Stop::Failed(RpcError::internal(
                    "only tools, prompts and resources ask for input",
                )));
            }
        }
        Ok(req)
    }

    /// Waits for the answer `waiter` expects: handed over in this process, or filed in the
    /// store by the replica the client POSTed it to.
    async fn answer_of(
        &self,
        waiter: &mut Waiter,
        deadline: Instant,
        allowed: Duration,
        key: &str,
    ) -> Result<Answer, Stop> {
        let runtime = &self.core.runtime;
        loop {
            let delivery = tokio::select! {
                biased;
                () = self.cancel.cancelled() => return Err(Stop::Cancelled),
                // At shutdown the wait ends before the process does: the call is answered
                // (a stream that just ended would leave the client without a response),
                // and retried it goes to a replica that stays. On stdio, whose input ended,
                // the answer finds nobody and is dropped.
                () = runtime.shutdown.cancelled() => {
                    return Err(Stop::Failed(RpcError::new(
                        ErrorKind::RetryLater,
                        format!("Busy: the server is shutting down while input request {key:?} waited for its answer; send the request again"),
                    )));
                }
                () = tokio::time::sleep_until(deadline) => {
                    // Rounded: the wait ends a moment before the state does.
                    let secs = (allowed + Duration::from_millis(500)).as_secs();
                    return Err(Stop::Failed(RpcError::new(
                        ErrorKind::TimedOut,
                        format!("The client did not answer input request {key:?} within {secs} s"),
                    )));
                }
                d = waiter.next(POLL) => d,
            };
            if let Some(Delivery::Local(v)) = delivery {
                return Ok(Answer::from(v));
            }
            let Some(store) = runtime.sessions.store().filter(|_| self.session.booked) else {
                continue;
            };
            match store.load_handle(waiter.key()).await {
                Ok(Some(record))
                    if record.kind == REPLY_KIND && record.owner == self.session.owner() =>
                {
                    // Taken once: a late duplicate finds nothing to take.
                    if let Ok(mut tx) = store.begin(TxMode::Write).await {
                        if tx.retire_handle(&record.id).await.is_ok() {
                            let _ = tx.commit().await;
                        }
                    }
                    if let Some(v) = record.data {
                        return Ok(Answer::from(v));
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    // Every waiting call asks each second: one line for all of them.
                    static FAILING: Throttled = Throttled::new(Duration::from_secs(10));
                    if let Some(held_back) = FAILING.ready() {
                        tracing::warn!(
                            error = %e,
                            held_back,
                            "could not look for a client's answer in the store"
                        );
                    }
                }
            }
        }
    }
}

/// Why a call's round of input requests did not lead to its next round.
enum Stop {
    /// The call was cancelled: nothing more is sent.
    Cancelled,
    /// The call fails with this error.
    Failed(RpcError),
    /// The client refused one of the requests with a JSON-RPC error (its user declined a
    /// sampling request, say): a tool call ends with a tool error saying so, which its model
    /// reads (as when a tool's own request fails); any other call with an error.
    Refused(String),
}

enum Answer {
    Result(Value),
    Error(Value),
}

impl From<Value> for Answer {
    fn from(mut v: Value) -> Self {
        match v.get_mut("error").map(Value::take) {
            Some(e) => Answer::Error(e),
            None => Answer::Result(v.get_mut("result").map(Value::take).unwrap_or(Value::Null)),
        }
    }
}

/// What the client must have declared to be sent a request of `method`.
fn required_capability(method: &str, params: Option<&Value>) -> Option<ClientCapabilities> {
    let mut caps = ClientCapabilities::default();
    match method {
        methods::ELICITATION_CREATE => {
            let url = params.and_then(|p| p.get("mode")).and_then(Value::as_str) == Some("url");
            caps.elicitation = Some(if url {
                ElicitationCapability {
                    form: None,
                    url: Some(Map::new()),
                }
            } else {
                ElicitationCapability {
                    form: Some(Map::new()),
                    url: None,
                }
            });
        }
        methods::SAMPLING_CREATE_MESSAGE => {
            let asked = params.and_then(|p| CreateMessageParams::deserialize(p).ok());
            caps.sampling = Some(asked.map(|p| p.required_sampling()).unwrap_or_default());
        }
        methods::ROOTS_LIST => caps.roots = Some(Map::new()),
        _ => return None,
    }
    Some(caps)
}

/// The server's requests of a round still waiting for the client's answer. Whatever ends
/// the wait early (the call cancelled or timed out, another request of the round answered
/// with an error) drops this, and the client is told each is cancelled (2025-11-25
/// basic/utilities/cancellation), so that it stops asking its user. Best effort: a stream
/// that is full or gone is not waited for.
struct Open {
    outbox: Outbox,
    ids: Vec<RequestId>,
}

impl Drop for Open {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            let message = json!({
                "jsonrpc": "2.0",
                "method": methods::NOTIFICATION_CANCELLED,
                "params": { "requestId": id, "reason": "the call no longer waits for this answer" },
            });
            if let Ok(bytes) = serde_json::to_vec(&message) {
                let _ = self.outbox.try_send(bytes);
            }
        }
    }
}

/// Input request `method` with `params` as the server request `id` of a legacy session.
fn server_request(id: &RequestId, method: &str, params: Option<&Value>) -> Value {
    let mut message = json!({ "jsonrpc": "2.0", "id": id, "method": method });
    if let Some(p) = params {
        message["params"] = p.clone();
    }
    // 2025-11-25 names each URL elicitation (2026-07-28 ties it to its round instead): the
    // request's own id, unique on this server, serves.
    if method == methods::ELICITATION_CREATE && message["params"]["mode"] == "url" {
        message["params"]["elicitationId"] = json!(id);
    }
    message
}

/// Sorts a round's response: input required, or the response, less what only 2026-07-28
/// has (`resultType`, and the cache hints `ttlMs` and `cacheScope`). Only the result's
/// top-level members are read (the rest stays raw text), since every legacy call pays this.
fn classify(message: Vec<u8>, returned: Instant, version: &str) -> Step {
    #[derive(serde::Deserialize)]
    struct Response<'a> {
        #[serde(borrow)]
        id: &'a RawValue,
        #[serde(borrow, default)]
        result: Option<&'a RawValue>,
    }
    type Members<'a> = BTreeMap<Cow<'a, str>, &'a RawValue>;
    let Ok(response) = serde_json::from_slice::<Response<'_>>(&message) else {
        return Step::Done(message);
    };
    // An error response is the same in both eras.
    let Some(result) = response.result else {
        return Step::Done(message);
    };
    let Ok(mut members) = serde_json::from_str::<Members<'_>>(result.get()) else {
        return Step::Done(message);
    };
    if members.get("resultType").map(|v| v.get()) == Some("\"input_required\"") {
        let requests = members
            .remove("inputRequests")
            .and_then(|r| serde_json::from_str(r.get()).ok())
            .unwrap_or_default();
        let state = members
            .remove("requestState")
            .and_then(|s| serde_json::from_str(s.get()).ok());
        return Step::Ask(Asked {
            requests,
            state,
            returned,
        });
    }
    for field in ["resultType", "ttlMs", "cacheScope"] {
        members.remove(field);
    }
    members.retain(|key, value| !older::drops_member(key, value.get()));
    let meta = members
        .remove("_meta")
        .and_then(|m| older::result_meta(m.get()));
    let mut out = Vec::with_capacity(message.len());
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.extend_from_slice(response.id.get().as_bytes());
    out.extend_from_slice(b",\"result\":{");
    let written = members.iter().map(|(key, value)| {
        (
            key.as_ref(),
            older::result_member(version, key, value.get()),
        )
    });
    for (i, (key, value)) in written.chain(meta.map(|m| ("_meta", m))).enumerate() {
        if i > 0 {
            out.push(b',');
        }
        // A key read from JSON writes back as JSON.
        let _ = serde_json::to_writer(&mut out, key);
        out.push(b':');
        out.extend_from_slice(value.as_bytes());
    }
    out.extend_from_slice(b"}}");
    Step::Done(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(message: &str) -> String {
        match classify(message.as_bytes().to_vec(), Instant::now(), "2025-11-25") {
            Step::Done(m) => String::from_utf8(m).unwrap(),
            _ => panic!("not done: {message}"),
        }
    }

    #[test]
    fn results_lose_only_what_2026_alone_has() {
        let modern = r#"{"jsonrpc":"2.0","id":"a\"b","result":{"resultType":"complete","ttlMs":0,"cacheScope":"private","content":[{"type":"text","text":"\"resultType\":\"complete\""}],"_meta":{"k":1,"io.modelcontextprotocol/serverInfo":{"name":"s","version":"1"}}}}"#;
        let legacy: Value = serde_json::from_str(&done(modern)).unwrap();
        assert_eq!(
            legacy,
            json!({ "jsonrpc": "2.0", "id": "a\"b", "result": {
                "content": [{ "type": "text", "text": "\"resultType\":\"complete\"" }],
                "_meta": { "k": 1 } } })
        );
        let error = r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32602,"message":"no"}}"#;
        assert_eq!(done(error), error);
        // A `_meta` that held only the server's info goes with it.
        let only = r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete","tools":[],"_meta":{"io.modelcontextprotocol/serverInfo":{"name":"s","version":"1"}}}}"#;
        assert_eq!(
            serde_json::from_str::<Value>(&done(only)).unwrap(),
            json!({ "jsonrpc": "2.0", "id": 1, "result": { "tools": [] } })
        );
    }

    #[test]
    fn an_input_required_result_is_a_round_to_ask() {
        let asking = r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputRequests":{"k":{"method":"roots/list"}},"requestState":"s1"}}"#;
        match classify(asking.as_bytes().to_vec(), Instant::now(), "2025-11-25") {
            Step::Ask(asked) => {
                assert_eq!(asked.state.as_deref(), Some("s1"));
                assert_eq!(asked.requests["k"]["method"], "roots/list");
            }
            _ => panic!("not a round to ask"),
        }
    }

    #[test]
    fn a_url_elicitation_is_named_for_2025_clients() {
        let id = RequestId::String("wharf-1-0".into());
        let url = json!({ "mode": "url", "message": "Pay", "url": "https://pay.example/1" });
        let sent = server_request(&id, methods::ELICITATION_CREATE, Some(&url));
        assert_eq!(
            sent,
            json!({ "jsonrpc": "2.0", "id": "wharf-1-0", "method": "elicitation/create",
                "params": { "mode": "url", "message": "Pay", "url": "https://pay.example/1",
                    "elicitationId": "wharf-1-0" } })
        );
        let form = json!({ "message": "Name?", "requestedSchema": { "type": "object" } });
        let sent = server_request(&id, methods::ELICITATION_CREATE, Some(&form));
        assert_eq!(sent["params"], form);
        assert!(
            server_request(&id, methods::ROOTS_LIST, None)
                .get("params")
                .is_none()
        );
    }

    /// A session keeps the revision its `initialize` settled on: a 2025-03-26 client reads a
    /// tool's resource link as text, and a 2025-06-18 client is sent no form with a multiple
    /// choice (the call fails, naming the field) while a 2025-11-25 client is.
    #[tokio::test]
    async fn what_an_older_session_cannot_read_is_rewritten_or_refused() {
        use crate::{Context, FormSchema, HandlerError, NoArgs, Server, tool};
        use wharf_protocol::{Content, ResourceLink};

        let link = ResourceLink {
            uri: "file:///r.txt".into(),
            name: "r.txt".into(),
            title: None,
            description: None,
            mime_type: None,
            size: None,
            icons: None,
            annotations: None,
            meta: None,
        };
        let server = Server::builder(wharf_protocol::Implementation::new("t", "1"))
            .tool(tool("linked").handler(move |_cx: Context, _: NoArgs| {
                let link = Content::ResourceLink(link.clone());
                async move { vec![link] }
            }))
            .tool(tool("tags").handler(|cx: Context, _: NoArgs| async move {
                let form =
                    FormSchema::new().multi_choice("tags", "Tags", &["x", "y"], (None, None), true);
                Err::<String, _>(HandlerError::from(cx.ask().elicit("t", "Tags?", form)))
            }))
            .build()
            .unwrap();
        // The first message the call sends in a session of `version`.
        let first = async |version: &str, tool: &str| -> Value {
            let (_, mut sent, running) = call_in(&server, version, tool).await;
            let message = serde_json::from_slice(&sent.recv().await.unwrap()).unwrap();
            running.abort();
            message
        };
        let old = first("2025-03-26", "linked").await;
        assert_eq!(
            old["result"]["content"][0],
            json!({ "type": "text", "text": "r.txt (file:///r.txt)" }),
            "{old}"
        );
        let new = first("2025-06-18", "linked").await;
        assert_eq!(
            new["result"]["content"][0]["type"], "resource_link",
            "{new}"
        );

        let refused = first("2025-06-18", "tags").await;
        assert_error(&refused, -32603, "field \"tags\" as a multiple choice");
        let asked = first("2025-11-25", "tags").await;
        assert_eq!(asked["method"], "elicitation/create", "{asked}");
    }

    /// A server whose tool `confirm` works for `think` before it asks the client to
    /// confirm, then answers "done".
    fn confirming(config: crate::config::ServerConfig, think: Duration) -> crate::Server {
        use crate::{Context, Elicited, FormSchema, HandlerError, Server, tool};

        Server::builder(wharf_protocol::Implementation::new("t", "1"))
            .config(config)
            .tool(
                tool("confirm").handler(move |cx: Context, _: crate::NoArgs| async move {
                    let form = FormSchema::new().boolean("ok", "OK", true);
                    match cx.elicited::<Value>("ok", &form) {
                        Some(Elicited::Accepted(_)) => Ok("done".to_owned()),
                        _ => {
                            tokio::time::sleep(think).await;
                            Err(HandlerError::from(cx.ask().elicit("ok", "Go on?", form)))
                        }
                    }
                }),
            )
            .metrics(true)
            .build()
            .unwrap()
    }

    /// Opens a session of `version` of `server` for alice's client, which can answer
    /// elicitations, and calls `tool` in it as request 7 on a stream: the session, the
    /// stream's messages, and the call's task.
    async fn call_in(
        server: &crate::Server,
        version: &str,
        tool: &str,
    ) -> (
        Session,
        tokio::sync::mpsc::Receiver<Vec<u8>>,
        tokio::task::JoinHandle<()>,
    ) {
        use crate::legacy::{Answer, Scope};

        let sessions = server.sessions();
        let alice = Principal::new("alice").unwrap();
        let init = format!(
            r#"{{"protocolVersion":"{version}","capabilities":{{"elicitation":{{}}}},"clientInfo":{{"name":"c","version":"1"}}}}"#
        );
        let init = RawValue::from_string(init).unwrap();
        let (mut session, _) = sessions
            .initialize(RequestId::Int(0), Some(&init), &alice, Scope::Shared)
            .await
            .unwrap();
        let params =
            RawValue::from_string(format!(r#"{{"name":"{tool}","arguments":{{}}}}"#)).unwrap();
        let Ok(Answer::Call(call)) = sessions
            .request(
                &mut session,
                RequestId::Int(7),
                "tools/call",
                Some(&params),
                alice,
                crate::meta::TraceContext::default(),
            )
            .await
        else {
            panic!("the call was not admitted");
        };
        let (outbox, sent) = tokio::sync::mpsc::channel(8);
        let running = tokio::spawn(call.stream(outbox));
        (session, sent, running)
    }

    /// [`call_in`] of `confirm` in a 2025-11-25 session, once the elicitation request was
    /// read off the stream (with its id).
    async fn confirm_call(
        server: &crate::Server,
    ) -> (
        Session,
        tokio::sync::mpsc::Receiver<Vec<u8>>,
        RequestId,
        tokio::task::JoinHandle<()>,
    ) {
        let (session, mut sent, running) = call_in(server, "2025-11-25", "confirm").await;
        let asked: Value = serde_json::from_slice(&sent.recv().await.unwrap()).unwrap();
        assert_eq!(asked["method"], "elicitation/create", "{asked}");
        let asked_id = serde_json::from_value(asked["id"].clone()).unwrap();
        (session, sent, asked_id, running)
    }

    /// The response to request 7 among what the stream sends until it ends.
    async fn response(mut sent: tokio::sync::mpsc::Receiver<Vec<u8>>) -> Value {
        let mut answer = None;
        while let Some(m) = sent.recv().await {
            let m: Value = serde_json::from_slice(&m).unwrap();
            if m["id"] == 7 {
                answer = Some(m);
            }
        }
        answer.expect("the call was never answered")
    }

    /// A config whose request states last `max_age` and whose legacy calls wait a minute
    /// for input.
    fn lasting(max_age: Duration) -> crate::config::ServerConfig {
        let mut config = crate::config::ServerConfig::default();
        config.request_state.max_age = max_age;
        config.legacy.input_timeout = Duration::from_secs(60);
        config
    }

    /// Answers the elicitation `asked` of `session` (alice's): accepted.
    async fn accept(
        server: &crate::Server,
        session: &Session,
        asked: &RequestId,
    ) -> Result<(), RpcError> {
        let ok =
            RawValue::from_string(r#"{"action":"accept","content":{"ok":true}}"#.into()).unwrap();
        server
            .sessions()
            .answer(session, asked, Some(&ok), None)
            .await
    }

    /// [`confirm_call`], its elicitation accepted after `wait`: the call's response.
    async fn confirmed_after(server: &crate::Server, wait: Duration) -> Value {
        let (session, sent, asked_id, running) = confirm_call(server).await;
        tokio::time::sleep(wait).await;
        accept(server, &session, &asked_id).await.unwrap();
        let answer = response(sent).await;
        running.await.unwrap();
        answer
    }

    /// Asserts that `answer` is an error with `code` whose message contains `says`.
    fn assert_error(answer: &Value, code: i32, says: &str) {
        assert_eq!(answer["error"]["code"], code, "{answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(says)),
            "{answer}"
        );
    }

    /// A call whose input request is still unanswered when the server shuts down is
    /// answered, not dropped with its stream: the client is told to send it again.
    #[tokio::test]
    async fn a_call_waiting_for_input_at_shutdown_is_answered() {
        let server = confirming(Default::default(), Duration::ZERO);
        let (_session, sent, _, running) = confirm_call(&server).await;
        server.shutdown();
        let answer = response(sent).await;
        running.await.unwrap();
        assert_error(&answer, crate::RETRY_LATER, "shutting down");
    }

    /// A call waits for its answers only while the state of the round that asked holds (a
    /// second less): an answer taken later would fail the next round over a `requestState`
    /// the client never saw. Here the state lasts 3 s and the input timeout 60: an answer
    /// sent after 5 s is too late, and the call says so by the time it allowed.
    #[tokio::test(start_paused = true)]
    async fn a_call_waits_for_input_no_longer_than_its_state_holds() {
        let server = confirming(lasting(Duration::from_secs(3)), Duration::ZERO);
        let (session, sent, asked_id, running) = confirm_call(&server).await;
        let answering = {
            let server = server.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(5)).await;
                // Too late, nothing waits for it any more: whether it is refused or filed
                // does not matter here.
                let _ = accept(&server, &session, &asked_id).await;
            })
        };
        let answer = response(sent).await;
        running.await.unwrap();
        answering.await.unwrap();
        assert_error(&answer, crate::TIMED_OUT, "within 2 s");
    }

    /// The wait is counted from when the round that asked returned, not from when it began:
    /// a handler that works for most of a state's life before it asks still leaves the
    /// client the rest of it (here 9 s of work, a state of 12 s, an answer after 5 s).
    #[tokio::test(start_paused = true)]
    async fn a_handler_that_works_before_it_asks_leaves_the_client_its_time() {
        let server = confirming(lasting(Duration::from_secs(12)), Duration::from_secs(9));
        let answer = confirmed_after(&server, Duration::from_secs(5)).await;
        assert_eq!(answer["result"]["content"][0]["text"], "done", "{answer}");
    }

    /// A call's duration is the server's time: the wait for its client's answers is left
    /// out, as it is from a stateless call, whose rounds are requests of their own. Here
    /// the handler works 2 s and the client answers after 30 s.
    #[tokio::test(start_paused = true)]
    async fn a_calls_duration_leaves_out_the_wait_for_its_client() {
        let server = confirming(lasting(Duration::from_secs(120)), Duration::from_secs(2));
        let answer = confirmed_after(&server, Duration::from_secs(30)).await;
        assert_eq!(answer["result"]["content"][0]["text"], "done", "{answer}");
        let text = server.encode_metrics().unwrap();
        let series = r#"wharf_request_duration_seconds_sum{method="tools/call",tool="confirm"} "#;
        let took: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix(series)?.parse().ok())
            .unwrap_or_else(|| panic!("no {series}in {text}"));
        assert!((2.0..3.0).contains(&took), "{took} s counted");
    }

    #[test]
    fn input_requests_need_their_capability() {
        let form =
            required_capability("elicitation/create", Some(&json!({ "message": "m" }))).unwrap();
        assert!(form.elicitation.unwrap().form.is_some());
        let url =
            required_capability("elicitation/create", Some(&json!({ "mode": "url" }))).unwrap();
        assert!(url.elicitation.unwrap().url.is_some());
        assert!(
            required_capability("sampling/createMessage", None)
                .unwrap()
                .sampling
                .is_some()
        );
        let with_tools =
            json!({ "messages": [], "maxTokens": 9, "toolChoice": { "mode": "auto" } });
        let sampling = required_capability("sampling/createMessage", Some(&with_tools))
            .unwrap()
            .sampling
            .unwrap();
        assert!(sampling.tools.is_some() && sampling.context.is_none());
        assert!(
            required_capability("roots/list", None)
                .unwrap()
                .roots
                .is_some()
        );
        assert!(required_capability("tasks/get", None).is_none());
    }
}
