//! stdio for Wharf: newline-delimited JSON-RPC on stdin/stdout, requests served
//! concurrently, `notifications/cancelled` honoured, logs on stderr (never stdout).
//!
//! A client that opens with `initialize` gets the initialization-based era for the rest of
//! the process (2026-07-28 basic/versioning): one session, held here, whose server requests
//! (a handler's input requests) go out on stdout and whose answers come back on stdin.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use futures_util::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::codec::{Decoder, FramedRead, LinesCodec, LinesCodecError};
use tokio_util::sync::CancellationToken;
use wharf::{Answer, ErrorKind, ParsedRequest, Principal, RpcError, Scope, Server, Session};
use wharf_protocol::jsonrpc::write_error;
use wharf_protocol::{CancelledParams, Envelope, RequestId, methods};

/// Longest line accepted, in bytes, by default ([`StdioConfig::max_line_bytes`]).
pub const MAX_LINE_BYTES: usize = 4 * 1024 * 1024;
/// Deepest JSON nesting accepted, by default ([`StdioConfig::max_json_depth`]).
pub const MAX_JSON_DEPTH: usize = 64;

/// The requests running on this connection, by id: what a cancellation names. Each
/// registration has a number, so that a request ending frees its id only if a later request
/// did not take it (a client may reuse the id of a request it cancelled).
struct InFlight {
    running: Mutex<HashMap<RequestId, (u64, CancellationToken)>>,
    registrations: AtomicU64,
    /// The most requests running at once ([`StdioConfig::max_in_flight`]).
    max: usize,
}

/// Why a request could not be registered.
#[derive(Debug, PartialEq)]
enum Refused {
    /// A running request has its id.
    InUse,
    /// As many requests run as the process takes.
    Full,
}

impl InFlight {
    fn new(max: usize) -> Self {
        InFlight {
            running: Mutex::default(),
            registrations: AtomicU64::new(0),
            max,
        }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<RequestId, (u64, CancellationToken)>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `id` with a token that cancels it, unless a running request holds the id
    /// or as many run as the process takes.
    fn register(&self, id: &RequestId) -> Result<(u64, CancellationToken), Refused> {
        let mut running = self.running();
        if running.contains_key(id) {
            return Err(Refused::InUse);
        }
        if running.len() >= self.max {
            return Err(Refused::Full);
        }
        let n = self.registrations.fetch_add(1, Ordering::Relaxed);
        let token = CancellationToken::new();
        running.insert(id.clone(), (n, token.clone()));
        Ok((n, token))
    }

    /// Cancels the request `id`, if one runs, and frees its id.
    fn cancel(&self, id: &RequestId) {
        if let Some((_, token)) = self.running().remove(id) {
            token.cancel();
        }
    }

    /// Frees `id` once registration `n` ended, unless another request holds it by now.
    fn finish(&self, id: &RequestId, n: u64) {
        let mut running = self.running();
        if running.get(id).is_some_and(|(held, _)| *held == n) {
            running.remove(id);
        }
    }
}

/// A request's place in [`InFlight`]: its id and its slot, freed when this is dropped,
/// however the request's task ends (a panic included: the id would stay taken and the
/// slot full for the rest of the process).
struct Registered {
    in_flight: Arc<InFlight>,
    id: RequestId,
    n: u64,
    /// Fired by the client's `notifications/cancelled`.
    cancel: CancellationToken,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.in_flight.finish(&self.id, self.n);
    }
}

/// How long in-flight requests may run after input ends, by default.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(10);

/// How a stdio server runs: start from [`StdioConfig::default`] and set what differs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StdioConfig {
    /// Who every request acts for: stdio has no credentials, the process's user is the
    /// caller (anonymous unless told otherwise).
    pub principal: Principal,
    /// How long in-flight requests may run once input has ended; those still running after
    /// it are cancelled and get no response. What is then left to write is written as
    /// long as the client reads some of it at least this often (and at least once a
    /// second): a client that no longer reads stdout does not keep the process alive.
    pub drain: Duration,
    /// The most requests running at once, open listen streams included; beyond it a
    /// request is refused at once (-31000, retry later). Each running request holds its
    /// task and, while stdout is not read, its answer: without a bound, a client that
    /// writes and does not read would grow the process without end. Refusals wait for
    /// stdout like any answer, so such a client stops being read. 0 is taken as 1.
    pub max_in_flight: usize,
    /// The longest line taken, in bytes; a longer one is refused (-32600) and skipped.
    pub max_line_bytes: usize,
    /// The deepest JSON nesting taken; a deeper message is refused unread. At most
    /// [`MAX_DEPTH_LIMIT`](wharf_protocol::jsonrpc::MAX_DEPTH_LIMIT) applies.
    pub max_json_depth: usize,
}

/// Requests running at once, by default.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1_024;

impl Default for StdioConfig {
    fn default() -> Self {
        StdioConfig {
            principal: Principal::anonymous(),
            drain: DEFAULT_DRAIN,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            max_line_bytes: MAX_LINE_BYTES,
            max_json_depth: MAX_JSON_DEPTH,
        }
    }
}

/// Serves `server` until `input` ends, then lets in-flight requests finish (at most
/// [`DEFAULT_DRAIN`]), ends open subscriptions gracefully, and returns.
///
/// The end of input shuts `server` down ([`Server::shutdown`]): a stdio server is its
/// process's one connection, and its listen streams end as a server's do when it stops.
/// Serve each connection of a socket with a server of its own.
///
/// When `output` fails (the client closed its end), reading stops, the requests still
/// running are cancelled, and the write's error is returned: nothing they did could reach
/// the client.
pub async fn serve<R, W>(server: Server, input: R, output: W) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    serve_with(server, input, output, StdioConfig::default()).await
}

/// [`serve`] with explicit settings.
pub async fn serve_with<R, W>(
    server: Server,
    input: R,
    output: W,
    config: StdioConfig,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(256);
    // Bytes written so far: how the end of the session tells a slow reader from none.
    let written = Arc::new(AtomicU64::new(0));
    // Cancelled once the session is over: what is queued is still written, and a sender a
    // handler's task kept adds nothing after it.
    let closing = CancellationToken::new();
    // Cancelled when the writer ends: before the input, only because `output` failed.
    let output_ended = CancellationToken::new();
    let writer = tokio::spawn({
        let (written, closing) = (Arc::clone(&written), closing.clone());
        let ended = output_ended.clone();
        async move {
            let _ended = ended.drop_guard();
            let mut output = output;
            loop {
                let line = tokio::select! {
                    // Closed first: what is buffered then still comes, nothing sent after.
                    biased;
                    () = closing.cancelled(), if !rx.is_closed() => {
                        rx.close();
                        continue;
                    }
                    line = rx.recv() => line,
                };
                let Some(mut line) = line else { break };
                line.push(b'\n');
                // Written as `write_all` would, counting each write's bytes.
                let mut rest = &line[..];
                while !rest.is_empty() {
                    let n = output.write(rest).await?;
                    if n == 0 {
                        return Err(std::io::ErrorKind::WriteZero.into());
                    }
                    written.fetch_add(n as u64, Ordering::Relaxed);
                    rest = &rest[n..];
                }
                output.flush().await?;
            }
            Ok::<_, std::io::Error>(())
        }
    });
    let in_flight = Arc::new(InFlight::new(config.max_in_flight.max(1)));
    let mut tasks = JoinSet::new();
    let mut legacy = Legacy::default();
    let max_line = config.max_line_bytes;
    let mut lines = FramedRead::new(input, Lines(LinesCodec::new_with_max_length(max_line)));
    loop {
        let line = tokio::select! {
            biased;
            () = output_ended.cancelled() => break,
            line = lines.next() => match line {
                Some(line) => line,
                None => break,
            },
        };
        match line {
            Ok(Line::Text(line)) if line.trim().is_empty() => {}
            Ok(Line::Text(line)) => {
                let link = Link {
                    server: &server,
                    principal: &config.principal,
                    tx: &tx,
                    in_flight: &in_flight,
                    max_depth: config.max_json_depth,
                };
                handle_line(&link, &line, &mut tasks, &mut legacy).await
            }
            Ok(Line::TooLong) => {
                let e = RpcError::new(
                    ErrorKind::InvalidRequest,
                    format!("Message longer than {max_line} bytes"),
                );
                refuse_unread(&tx, &legacy, &e).await;
            }
            Ok(Line::NotUtf8) => {
                let e = RpcError::new(ErrorKind::Parse, "Parse error: the line is not UTF-8");
                refuse_unread(&tx, &legacy, &e).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "stdin failed");
                break;
            }
        }
        while tasks.try_join_next().is_some() {}
    }
    if output_ended.is_cancelled() {
        // Nothing more can reach the client: what runs is cut short (its handlers' cleanup
        // runs), and the write's error says why.
        tracing::warn!("stdout failed; cancelling the requests still running");
        legacy.stop_stream();
        server.shutdown();
        tasks.shutdown().await;
        return match writer.await {
            Ok(Err(e)) => Err(e),
            Ok(Ok(())) => Err(std::io::ErrorKind::BrokenPipe.into()),
            Err(e) => Err(std::io::Error::other(e)),
        };
    }
    // Input closed: finish what was asked, end subscriptions, flush.
    legacy.stop_stream();
    server.shutdown();
    let finished = tokio::time::timeout(config.drain, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if finished.is_err() {
        tracing::warn!(
            seconds = config.drain.as_secs(),
            "drain deadline passed; cancelling the requests still running"
        );
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
    drop(tx);
    closing.cancel();
    // What is left is written as long as the client reads it: a client that stopped
    // reading stdout must not keep the process from ending.
    let mut writer = writer;
    let period = config.drain.max(MIN_WRITE_STALL);
    let mut seen = written.load(Ordering::Relaxed);
    loop {
        match tokio::time::timeout(period, &mut writer).await {
            Ok(ended) => return ended.unwrap_or_else(|e| Err(std::io::Error::other(e))),
            Err(_) if written.load(Ordering::Relaxed) != seen => {
                seen = written.load(Ordering::Relaxed);
            }
            Err(_) => {
                writer.abort();
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "stdout was not read for {} s after input ended; what was left to write was dropped",
                        period.as_secs_f32()
                    ),
                ));
            }
        }
    }
}

/// The shortest time the last messages may wait for a client to read some of them.
const MIN_WRITE_STALL: Duration = Duration::from_secs(1);

/// One line of input.
enum Line {
    Text(String),
    /// A line over [`StdioConfig::max_line_bytes`], skipped up to its end.
    TooLong,
    /// A line that is not UTF-8 (so not JSON), already taken off the input.
    NotUtf8,
}

/// Newline-delimited lines, where a line over the limit or not in UTF-8 is an item rather
/// than an error: a framed reader ends at its first error, and one bad message must not end
/// the session. `LinesCodec` skips the rest of an over-long line by itself.
struct Lines(LinesCodec);

impl Decoder for Lines {
    type Item = Line;
    type Error = std::io::Error;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Line>, std::io::Error> {
        lift(self.0.decode(src))
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Line>, std::io::Error> {
        lift(self.0.decode_eof(src))
    }
}

fn lift(r: Result<Option<String>, LinesCodecError>) -> Result<Option<Line>, std::io::Error> {
    match r {
        Ok(line) => Ok(line.map(Line::Text)),
        Err(LinesCodecError::MaxLineLengthExceeded) => Ok(Some(Line::TooLong)),
        // The codec reports a line that is not UTF-8 as invalid data, once it has taken the
        // line off the buffer: the next line reads as usual.
        Err(LinesCodecError::Io(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
            Ok(Some(Line::NotUtf8))
        }
        Err(LinesCodecError::Io(e)) => Err(e),
    }
}

async fn send_error(tx: &mpsc::Sender<Vec<u8>>, id: Option<&RequestId>, e: &RpcError) {
    let mut buf = Vec::with_capacity(128);
    let _ = write_error(&mut buf, id, &e.to_object());
    let _ = tx.send(buf).await;
}

/// Refuses a line whose id could not be read: with an error without one, unless the
/// session's revision requires an id in every error (before 2025-11-25 `JSONRPCError.id`
/// is required), where no message it reads could carry this one: it is logged instead.
async fn refuse_unread(tx: &mpsc::Sender<Vec<u8>>, legacy: &Legacy, e: &RpcError) {
    match &legacy.session {
        Some(session) if session.version() < "2025-11-25" => {
            tracing::warn!(error = %e.message, version = session.version(), "a line was refused unanswered: this session's revision has no error without an id");
        }
        _ => send_error(tx, None, e).await,
    }
}

/// What a line's handling needs from the session loop.
struct Link<'a> {
    server: &'a Server,
    principal: &'a Principal,
    tx: &'a mpsc::Sender<Vec<u8>>,
    in_flight: &'a Arc<InFlight>,
    /// [`StdioConfig::max_json_depth`].
    max_depth: usize,
}

/// The process's legacy session, once a client opened one, and the task that writes its
/// list changes and resource updates.
#[derive(Default)]
struct Legacy {
    session: Option<Session>,
    stream: Option<StreamTask>,
}

/// The task writing a session's stream, and what tells it that a newer one took over.
struct StreamTask {
    task: tokio::task::JoinHandle<()>,
    retired: CancellationToken,
}

impl Legacy {
    /// (Re)starts writing the session's list changes and resource updates, for the
    /// subscriptions it holds now.
    ///
    /// The new stream is opened, and announced, before the old one stops: it hears the bus
    /// from then on, and the old one goes on until it hears the new one's announcement,
    /// which comes after its own (every listener hears the bus in one order, and each
    /// stream was announced as it opened), so no change falls between the two; one heard
    /// by both goes out twice, which a client takes as it takes any repeated notification.
    /// Only when the new one cannot open (the listen caps are full, the bus is down) is the
    /// old one stopped at once, to free its place.
    async fn restart_stream(
        &mut self,
        server: &Server,
        tx: &mpsc::Sender<Vec<u8>>,
        principal: &Principal,
    ) {
        let Some(session) = &self.session else { return };
        // Retired before the new one is announced: the old one may hear the announcement
        // before the bus says it took it, and must not open again then.
        let old = self.stream.take();
        if let Some(old) = &old {
            old.retired.cancel();
        }
        let opened = server.sessions().stream(session, principal).await;
        if let (Some(old), Err(_)) = (old, &opened) {
            old.task.abort();
        }
        let (server, session, out) = (server.clone(), session.clone(), tx.clone());
        let principal = principal.clone();
        let retired = CancellationToken::new();
        let task = tokio::spawn(write_stream(
            server,
            session,
            principal,
            out,
            opened,
            retired.clone(),
        ));
        self.stream = Some(StreamTask { task, retired });
    }

    /// Stops writing the session's stream.
    fn stop_stream(&mut self) {
        if let Some(old) = self.stream.take() {
            old.task.abort();
        }
    }
}

/// Writes a session's stream to `out`, opening it again when it ends, until the server
/// drains or a newer stream takes over (`retired`). `opened` is the first opening.
async fn write_stream(
    server: Server,
    session: Session,
    principal: Principal,
    out: mpsc::Sender<Vec<u8>>,
    mut opened: Result<wharf::SessionStream, wharf::RpcError>,
    retired: CancellationToken,
) {
    // Whether the last opening failed: a failure is told once, not at every try.
    let mut failing = false;
    loop {
        let mut said = false;
        let mut stream = match opened {
            Ok(stream) => {
                if std::mem::take(&mut failing) {
                    tracing::info!("the session's stream opened");
                }
                stream.boxed()
            }
            // The listen caps are full, or the bus did not take the stream's announcement:
            // tried again after the pause.
            Err(e) => {
                if !std::mem::replace(&mut failing, true) {
                    tracing::warn!(error = %e.message, "the session's stream could not open; trying again every second");
                }
                futures_util::stream::empty().boxed()
            }
        };
        while let Some(m) = stream.next().await {
            said = true;
            if out.send(m).await.is_err() {
                return;
            }
        }
        // A session's stream ends when its changes may have been missed (the bus lagged or
        // reconnected; it said "everything changed" first) and when a newer stream of the
        // session took over. Over HTTP the client listens again; here nobody else would, so
        // this does at once, and after a pause only when the stream ended without a word,
        // which keeps one that cannot open from spinning. Not once the server drains, nor
        // once a newer stream writes instead: then the stream ends for good.
        if server.is_draining() || retired.is_cancelled() {
            return;
        }
        if !said {
            tokio::select! {
                () = tokio::time::sleep(REOPEN_PAUSE) => {}
                () = retired.cancelled() => return,
            }
        }
        opened = server.sessions().stream(&session, &principal).await;
    }
}

/// Whether `line` is a JSON-RPC response: an object with `result` or `error` and no
/// `method`.
fn is_response(line: &str) -> bool {
    serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(line).is_ok_and(|m| {
        !m.contains_key("method") && (m.contains_key("result") || m.contains_key("error"))
    })
}

/// The pause before a legacy session's stream is opened again (see [`write_stream`]).
const REOPEN_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);

/// Reads what the single pass did not (see [`Server::read_request`]): refuses what is
/// malformed by name, and handles a legacy session's message, `initialize`, a notification.
/// `None` when nothing is left to run.
async fn read_long_way(
    link: &Link<'_>,
    line: &str,
    tasks: &mut JoinSet<()>,
    legacy: &mut Legacy,
) -> Option<ParsedRequest> {
    let (server, tx) = (link.server, link.tx);
    let batches = legacy
        .session
        .as_ref()
        .is_some_and(|s| wharf_protocol::version::has_batches(s.version()));
    if batches && line.trim_start().starts_with('[') {
        batch(link, line, legacy, tasks).await;
        return None;
    }
    let envelope = match Envelope::parse(line.as_bytes(), link.max_depth) {
        Ok(env) => env,
        Err(failure) if is_response(line) => {
            // A response is never answered, even one this server cannot take (the client's
            // error about a message it could not read carries a null id, JSON-RPC 2.0 §5).
            tracing::warn!(error = %failure.error, "a response from the client was not understood");
            return None;
        }
        Err(failure) => {
            let e = RpcError::from(&failure.error);
            match failure.id.as_ref() {
                Some(id) => send_error(tx, Some(id), &e).await,
                None => refuse_unread(tx, legacy, &e).await,
            }
            return None;
        }
    };
    let sessions = server.sessions();
    if legacy.session.is_some() {
        in_session(link, envelope, legacy, tasks).await;
        return None;
    }
    let Some(method) = envelope.method.as_deref() else {
        // A response from the client: without a legacy session, nothing asked for one.
        return None;
    };
    if let Some(id) = &envelope.id {
        if sessions.opens_session(method, envelope.params) {
            // Answered at once, so never registered; still refused under the id of a running
            // request, whose client would get two responses with one id.
            if link.in_flight.running().contains_key(id) {
                send_error(tx, Some(id), &id_in_use(id)).await;
                return None;
            }
            let opened = sessions
                .initialize(id.clone(), envelope.params, link.principal, Scope::Process)
                .await;
            match opened {
                Ok((session, message)) => {
                    let _ = tx.send(message).await;
                    legacy.session = Some(session);
                    legacy.restart_stream(server, tx, link.principal).await;
                }
                Err(reply) => {
                    let _ = tx.send(reply.to_message()).await;
                }
            }
            return None;
        }
    }
    let Some(id) = envelope.id else {
        if method == methods::NOTIFICATION_CANCELLED {
            if let Some(p) = cancelled(envelope.params) {
                link.in_flight.cancel(&p.request_id);
            }
        }
        return None;
    };
    match server.parse_request(id, method, envelope.params) {
        Ok(req) => Some(req),
        Err(reply) => {
            let _ = tx.send(reply.to_message()).await;
            None
        }
    }
}

async fn handle_line(link: &Link<'_>, line: &str, tasks: &mut JoinSet<()>, legacy: &mut Legacy) {
    let Link {
        server,
        principal,
        tx,
        ..
    } = *link;
    let read = match &legacy.session {
        None => server.read_request(line.as_bytes(), link.max_depth),
        Some(_) => None,
    };
    let req = match read {
        Some(req) => req,
        None => match read_long_way(link, line, tasks, legacy).await {
            Some(req) => req,
            None => return,
        },
    };
    let Some(registered) = register(link, &req.id).await else {
        return;
    };
    let (server, principal) = (server.clone(), principal.clone());
    let kind = match req.is_listen() {
        true => Relayed::Listen(req.id.clone()),
        false => Relayed::Request,
    };
    tasks.spawn(answering_panics(
        registered,
        tx.clone(),
        kind,
        |cancel, tx| async move {
            // Admitted first (a slot under the caps); cancelled while queued, it never runs, and
            // a cancelled request gets no response.
            let admitted = tokio::select! {
                () = cancel.cancelled() => None,
                admitted = server.admit(req, principal) => Some(admitted),
            };
            match admitted {
                None => {}
                Some(Err(reply)) => {
                    let _ = tx.send(reply.to_message()).await;
                }
                Some(Ok(admitted)) => admitted.stream(tx, cancel).await,
            }
        },
    ));
}

/// Runs a registered request's `work` (given the token its cancellation fires, and the
/// request's own channel), answering it -32603 if the work panics before it answered (a
/// bug in the core's own code: the core catches its handler's and its middleware's), unless it was
/// cancelled; its id and slot are freed however it ends, and its token fired, so that what
/// a handler left running (a task waiting on `Context::cancelled`) stops, as it does over
/// HTTP.
///
/// What the work sends goes to `out` (stdout) through [`relay`], as `kind` says: nothing of
/// the request's reaches stdout after its response, even from a `Context` a handler kept.
async fn answering_panics<F: Future<Output = ()>>(
    registered: Registered,
    out: mpsc::Sender<Vec<u8>>,
    kind: Relayed,
    work: impl FnOnce(CancellationToken, mpsc::Sender<Vec<u8>>) -> F,
) {
    use futures_util::FutureExt as _;
    let (own, requests) = mpsc::channel(REQUEST_BUFFER);
    let run = std::panic::AssertUnwindSafe(work(registered.cancel.clone(), own)).catch_unwind();
    let ended = relay(requests, &out, &registered.cancel, &kind, run).await;
    if let Some(Err(panic)) = ended {
        if !registered.cancel.is_cancelled() {
            let e = RpcError::panicked("a stdio request", &*panic);
            send_error(&out, Some(&registered.id), &e).await;
        }
    }
    registered.cancel.cancel();
}

/// What a request's messages are, for [`relay`].
enum Relayed {
    /// A 2026-07-28 request: once cancelled, nothing more of it goes out (stdio: "MUST NOT
    /// send any further messages for it").
    Request,
    /// A `subscriptions/listen` request: as a request, and one the server ends is
    /// announced with `notifications/cancelled` before its result (2026-07-28
    /// basic/patterns/cancellation: a server MUST send it when it tears a subscription
    /// stream down).
    Listen(RequestId),
    /// A legacy session's call: cancelled, it still tells the client which of its own
    /// requests it withdraws, as its work is dropped (2025-11-25 has no such rule against
    /// it, and the client would otherwise keep asking its user).
    LegacyCall,
}

/// Messages one request may have waiting for stdout before its handler waits (as an HTTP
/// call's stream holds).
const REQUEST_BUFFER: usize = 32;

/// Runs `work`, copying what it puts on `requests` to `out` in order, until it ended and
/// everything it sent before is out; then the channel is closed, so later sends fail.
/// `None` once `cancel` fires, after which only a legacy call's last words are copied
/// (see [`Relayed`]). The work is polled while a message waits for room on stdout: a
/// client that stops reading holds the handler back no more than its own channel's room
/// does (its time limit still runs, and a log message still gives up, as over HTTP).
async fn relay<T>(
    mut requests: mpsc::Receiver<Vec<u8>>,
    out: &mpsc::Sender<Vec<u8>>,
    cancel: &CancellationToken,
    kind: &Relayed,
    work: impl Future<Output = T>,
) -> Option<T> {
    let mut work = Box::pin(work);
    let mut ended = None;
    // Taken from the request's channel, waiting for room on stdout (a listen's result is
    // preceded by its `notifications/cancelled`).
    let mut waiting: std::collections::VecDeque<Vec<u8>> = std::collections::VecDeque::new();
    let mut drained = false;
    loop {
        tokio::select! {
            biased;
            () = cancel.cancelled() => {
                drop(work);
                if let Relayed::LegacyCall = kind {
                    requests.close();
                    while let Some(message) = waiting.pop_front() {
                        if out.send(message).await.is_err() {
                            return None;
                        }
                    }
                    while let Some(message) = requests.recv().await {
                        if out.send(message).await.is_err() {
                            break;
                        }
                    }
                }
                return None;
            }
            done = &mut work, if ended.is_none() => {
                ended = Some(done);
                requests.close();
            }
            permit = out.reserve(), if !waiting.is_empty() => match permit {
                Ok(permit) => permit.send(waiting.pop_front().unwrap_or_default()),
                // stdout is gone: nobody reads what is left.
                Err(_) => return None,
            },
            message = requests.recv(), if waiting.is_empty() && !drained => match message {
                Some(message) => {
                    if let Relayed::Listen(id) = kind {
                        if ends_a_stream(&message) {
                            let cancelled = serde_json::json!({
                                "jsonrpc": "2.0",
                                "method": methods::NOTIFICATION_CANCELLED,
                                "params": { "requestId": id, "reason": "the server ended the subscription" },
                            });
                            waiting.push_back(cancelled.to_string().into_bytes());
                        }
                    }
                    waiting.push_back(message);
                }
                // Every sender is gone: the work ended, or ends without sending more.
                None => drained = true,
            },
        }
        if drained && waiting.is_empty() {
            // Nothing more can come: the work's end is all that is left.
            return match ended.take() {
                Some(done) => Some(done),
                None => tokio::select! {
                    biased;
                    () = cancel.cancelled() => None,
                    done = &mut work => Some(done),
                },
            };
        }
    }
}

/// Whether `message` is a listen stream's result (no refusal: a stream refused never
/// opened).
fn ends_a_stream(message: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(message)
        .is_ok_and(|m| !m.contains_key("method") && m.contains_key("result"))
}

/// A `notifications/cancelled`'s params; `None` for invalid ones, which are ignored, as the
/// specification asks.
fn cancelled(params: Option<&serde_json::value::RawValue>) -> Option<CancelledParams> {
    serde_json::from_str(params?.get()).ok()
}

/// Registers a request by id, or answers that the id is taken: cancellation and responses
/// are matched by id, so a second live request with the same id would make both ambiguous.
async fn register(link: &Link<'_>, id: &RequestId) -> Option<Registered> {
    let e = match link.in_flight.register(id) {
        Ok((n, cancel)) => {
            return Some(Registered {
                in_flight: Arc::clone(link.in_flight),
                id: id.clone(),
                n,
                cancel,
            });
        }
        Err(Refused::InUse) => id_in_use(id),
        Err(Refused::Full) => RpcError::new(
            ErrorKind::RetryLater,
            format!(
                "Busy: {} requests are running, as many as this server takes; retry once one has ended",
                link.in_flight.max
            ),
        ),
    };
    send_error(link.tx, Some(id), &e).await;
    None
}

fn id_in_use(id: &RequestId) -> RpcError {
    RpcError::new(
        ErrorKind::InvalidRequest,
        format!("Request id {id} is already in use by a running request"),
    )
}

/// A batch of a 2025-03-26 session (a JSON array of messages on one line): each message
/// taken in order as if it came on a line of its own, each answer on a line of its own.
async fn batch(link: &Link<'_>, line: &str, legacy: &mut Legacy, tasks: &mut JoinSet<()>) {
    let messages = match wharf_protocol::jsonrpc::parse_batch(line.as_bytes(), link.max_depth) {
        Ok(messages) => messages,
        Err(failure) => {
            refuse_unread(link.tx, legacy, &RpcError::from(&failure.error)).await;
            return;
        }
    };
    let most = link.server.sessions().max_batch();
    if messages.len() > most {
        // Refused whole: each request told why, under its id.
        let e = RpcError::new(
            ErrorKind::InvalidRequest,
            format!(
                "Invalid request: a batch of {} messages; this server takes at most {most} in one",
                messages.len()
            ),
        );
        for message in messages {
            if let Ok(Envelope {
                id: Some(id),
                method: Some(_),
                ..
            }) = Envelope::parse(message.get().as_bytes(), link.max_depth)
            {
                send_error(link.tx, Some(&id), &e).await;
            }
        }
        refuse_unread(link.tx, legacy, &e).await;
        return;
    }
    for message in messages {
        match Envelope::parse(message.get().as_bytes(), link.max_depth) {
            Ok(envelope) => in_session(link, envelope, legacy, tasks).await,
            Err(failure) if is_response(message.get()) => {
                tracing::warn!(error = %failure.error, "a response from the client was not understood");
            }
            Err(failure) => {
                let e = RpcError::from(&failure.error);
                match failure.id.as_ref() {
                    Some(id) => send_error(link.tx, Some(id), &e).await,
                    None => refuse_unread(link.tx, legacy, &e).await,
                }
            }
        }
    }
}

/// A message of the process's legacy session. What changes the session (its log level,
/// its subscriptions) is handled in turn; calls run concurrently.
async fn in_session(
    link: &Link<'_>,
    envelope: Envelope<'_>,
    legacy: &mut Legacy,
    tasks: &mut JoinSet<()>,
) {
    let Some(session) = &mut legacy.session else {
        return;
    };
    let sessions = link.server.sessions();
    let Some(method) = envelope.method.as_deref() else {
        if let Some(id) = &envelope.id {
            if let Err(e) = sessions
                .answer(session, id, envelope.result, envelope.error)
                .await
            {
                tracing::warn!(error = %e.message, "a response from the client was refused");
            }
        }
        return;
    };
    let Some(id) = envelope.id else {
        // A cancelled call stops here first, whether or not the session has seen it yet
        // (it may still wait to start): nothing more is sent for it, and its id is free for
        // the client's next request.
        if method == methods::NOTIFICATION_CANCELLED {
            if let Some(p) = cancelled(envelope.params) {
                link.in_flight.cancel(&p.request_id);
            }
        }
        if let Err(e) = sessions.notify(session, method, envelope.params).await {
            tracing::debug!(error = %e.message, "an invalid notification was ignored");
        }
        return;
    };
    let stateful = matches!(
        method,
        methods::LOGGING_SET_LEVEL
            | methods::RESOURCES_SUBSCRIBE
            | methods::RESOURCES_UNSUBSCRIBE
            | methods::PING
            | methods::INITIALIZE
    );
    if stateful {
        // Answered at once, so never registered; still refused under the id of a running
        // call, whose client would get two responses with one id.
        if link.in_flight.running().contains_key(&id) {
            send_error(link.tx, Some(&id), &id_in_use(&id)).await;
            return;
        }
        let subscribed = session.subscriptions().len();
        let answer = sessions
            .request(
                session,
                id,
                method,
                envelope.params,
                link.principal.clone(),
                // Over stdio a request's trace context is in its `_meta` or nowhere.
                wharf::TraceContext::default(),
            )
            .await;
        let message = match answer {
            Ok(Answer::Message(m)) => m,
            Err(reply) => reply.to_message(),
            // These methods are answered at once.
            Ok(_) => return,
        };
        // A subscription made or dropped (each adds or removes one) changes what the
        // session's stream writes; a refused or repeated one changes nothing. The stream
        // that writes the new set opens before the answer goes: a client that hears its
        // subscription taken hears every update from then on.
        if session.subscriptions().len() != subscribed {
            legacy
                .restart_stream(link.server, link.tx, link.principal)
                .await;
        }
        let _ = link.tx.send(message).await;
        return;
    }
    let Some(registered) = register(link, &id).await else {
        return;
    };
    let server = link.server.clone();
    let (mut session, principal) = (session.clone(), link.principal.clone());
    let params = envelope.params.map(ToOwned::to_owned);
    let method = method.to_owned();
    tasks.spawn(answering_panics(
        registered,
        link.tx.clone(),
        Relayed::LegacyCall,
        |cancel, tx| async move {
            let call = async {
                let answer = server
                    .sessions()
                    .request(
                        &mut session,
                        id.clone(),
                        &method,
                        params.as_deref(),
                        principal,
                        wharf::TraceContext::default(),
                    )
                    .await;
                match answer {
                    Ok(Answer::Call(call)) => call.stream(tx).await,
                    Ok(Answer::Message(m)) => {
                        let _ = tx.send(m).await;
                    }
                    Err(reply) => {
                        let _ = tx.send(reply.to_message()).await;
                    }
                    Ok(_) => {}
                }
            };
            // Cancelled, even before the session registered the call: it stops at its next
            // await, and sends nothing more.
            tokio::select! {
                biased;
                () = cancel.cancelled() => {}
                () = call => {}
            }
        },
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request that ends after its id was cancelled and taken again by a new request
    /// leaves the new one registered: still cancellable, its id still taken.
    #[test]
    fn an_id_reused_after_a_cancellation_stays_with_the_new_request() {
        let in_flight = InFlight::new(DEFAULT_MAX_IN_FLIGHT);
        let id = RequestId::Number("1".into());
        let (first, first_token) = in_flight.register(&id).expect("free");
        assert_eq!(
            in_flight.register(&id).unwrap_err(),
            Refused::InUse,
            "taken while it runs"
        );
        in_flight.cancel(&id);
        assert!(first_token.is_cancelled());
        let (_, second_token) = in_flight.register(&id).expect("freed by the cancellation");
        in_flight.finish(&id, first);
        assert_eq!(
            in_flight.register(&id).unwrap_err(),
            Refused::InUse,
            "the first request's end freed the second's id"
        );
        in_flight.cancel(&id);
        assert!(second_token.is_cancelled());
    }

    /// Beyond the cap a request is refused whatever its id, until one ends.
    #[test]
    fn requests_beyond_the_cap_are_refused_until_one_ends() {
        let in_flight = InFlight::new(2);
        let (a, b, c) = (RequestId::Int(1), RequestId::Int(2), RequestId::Int(3));
        let (first, _) = in_flight.register(&a).unwrap();
        in_flight.register(&b).unwrap();
        assert_eq!(in_flight.register(&c).unwrap_err(), Refused::Full);
        in_flight.finish(&a, first);
        in_flight.register(&c).unwrap();
    }
}
