//! What an operator counts: requests by method, tool and outcome, their latency, where they
//! waited (queue, mutation lock, store), what was shed, replayed or refused, and the state
//! of listen streams and the change bus. Plain atomics in fixed arrays (one slot per method
//! and per tool, fixed histogram buckets), so counting a request costs a few uncontended
//! increments and no allocation or lock. [`Server::collect_metrics`](crate::Server::collect_metrics)
//! reads them into a [`Snapshot`] for an exporter (an OTLP push, say);
//! [`Server::encode_metrics`](crate::Server::encode_metrics) renders them in the Prometheus
//! text format.
//!
//! Off unless the server is built with [`ServerBuilder::metrics`](crate::ServerBuilder::metrics):
//! the core then holds no `Metrics` and counts nothing.

mod family;
mod prometheus;
mod throttle;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use wharf_protocol::methods;

pub use family::{Buckets, Family, Point, Points, Snapshot};
pub use throttle::Throttled;

/// Upper bounds of the latency buckets, in seconds: 0.5 ms to 10 s, as an operator's
/// dashboards and alerts slice an MCP call's time.
const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The methods counted apart; a method not listed is counted as `other`.
const METHODS: [&str; 10] = [
    methods::DISCOVER,
    methods::TOOLS_LIST,
    methods::TOOLS_CALL,
    methods::RESOURCES_LIST,
    methods::RESOURCES_TEMPLATES_LIST,
    methods::RESOURCES_READ,
    methods::PROMPTS_LIST,
    methods::PROMPTS_GET,
    methods::COMPLETION_COMPLETE,
    methods::SUBSCRIPTIONS_LISTEN,
];

/// How a request ended, as the `outcome` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// A result.
    Ok,
    /// A tool result with `isError`: the tool failed in a way the model reads.
    ToolError,
    /// An `input_required` result: one MRTR round asked the client for input.
    InputRequired,
    /// A JSON-RPC error, admission's refusals included.
    Error,
    /// The client went away or cancelled before the answer.
    Cancelled,
}

impl Outcome {
    const ALL: [Outcome; 5] = [
        Outcome::Ok,
        Outcome::ToolError,
        Outcome::InputRequired,
        Outcome::Error,
        Outcome::Cancelled,
    ];

    /// The label value, also recorded on the request's span.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ToolError => "tool_error",
            Outcome::InputRequired => "input_required",
            Outcome::Error => "error",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// Why admission shed a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shed {
    /// The principal had as many requests running as it may.
    PrincipalCap,
    /// The server (or the tool) was at capacity and its queue full.
    QueueFull,
    /// The request waited in the queue as long as it may run.
    QueueTimeout,
    /// The server was shutting down while the request waited.
    ShuttingDown,
    /// A listen stream beyond the principal's or the server's cap on streams.
    ListenCap,
}

impl Shed {
    const ALL: [Shed; 5] = [
        Shed::PrincipalCap,
        Shed::QueueFull,
        Shed::QueueTimeout,
        Shed::ShuttingDown,
        Shed::ListenCap,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Shed::PrincipalCap => "principal_cap",
            Shed::QueueFull => "queue_full",
            Shed::QueueTimeout => "queue_timeout",
            Shed::ShuttingDown => "shutting_down",
            Shed::ListenCap => "listen_cap",
        }
    }
}

/// Why a transport refused to authenticate a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AuthRefusal {
    /// No credentials at all.
    Missing,
    /// Credentials the server does not accept (unknown, expired, malformed).
    Invalid,
    /// Credentials that do not reach what the request asks for (a missing scope).
    Forbidden,
    /// The credentials could not be checked right now (the issuer was unreachable).
    Unavailable,
}

impl AuthRefusal {
    const ALL: [AuthRefusal; 4] = [
        AuthRefusal::Missing,
        AuthRefusal::Invalid,
        AuthRefusal::Forbidden,
        AuthRefusal::Unavailable,
    ];

    fn as_str(self) -> &'static str {
        match self {
            AuthRefusal::Missing => "missing",
            AuthRefusal::Invalid => "invalid",
            AuthRefusal::Forbidden => "forbidden",
            AuthRefusal::Unavailable => "unavailable",
        }
    }
}

/// The HTTP statuses counted one by one in `wharf_http_responses_total`: those the MCP
/// endpoint answers with. Any other is counted as `other`.
const HTTP_STATUSES: [u16; 16] = [
    200, 202, 400, 401, 403, 404, 405, 406, 408, 413, 415, 429, 431, 500, 503, 504,
];

/// What a call asks of the store, as the `operation` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreOp {
    /// Opening a call's transaction (claiming its idempotency key, holding its handles).
    Begin,
    /// Committing a call's writes with its recorded result.
    Commit,
    /// Looking up the recorded result of an earlier attempt.
    Replay,
    /// Reading a handle.
    LoadHandle,
    /// Extending a handle's life.
    TouchHandle,
}

impl StoreOp {
    const ALL: [StoreOp; 5] = [
        StoreOp::Begin,
        StoreOp::Commit,
        StoreOp::Replay,
        StoreOp::LoadHandle,
        StoreOp::TouchHandle,
    ];

    /// The label value, also the store span's `db.operation.name`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            StoreOp::Begin => "begin",
            StoreOp::Commit => "commit",
            StoreOp::Replay => "replay_lookup",
            StoreOp::LoadHandle => "load_handle",
            StoreOp::TouchHandle => "touch_handle",
        }
    }
}

/// A latency histogram with fixed buckets: each observation is two increments and an add.
#[derive(Default)]
struct Histogram {
    /// Observations at or below each bound of [`BUCKETS`] (not cumulative: summed when
    /// rendered), and one more past the last bound.
    buckets: [AtomicU64; BUCKETS.len() + 1],
    /// The sum of observations, in microseconds.
    sum_micros: AtomicU64,
}

impl Histogram {
    fn observe(&self, took: Duration) {
        let secs = took.as_secs_f64();
        let slot = BUCKETS
            .iter()
            .position(|&bound| secs <= bound)
            .unwrap_or(BUCKETS.len());
        self.buckets[slot].fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    fn snapshot(&self) -> Buckets {
        let counts = self.buckets.iter().map(|b| b.load(Ordering::Relaxed));
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        Buckets::new(&BUCKETS, counts.collect(), sum)
    }
}

/// The counters of one method, or of one tool.
#[derive(Default)]
struct Series {
    outcomes: [AtomicU64; Outcome::ALL.len()],
    latency: Histogram,
}

impl Series {
    fn record(&self, outcome: Outcome, took: Duration) {
        self.outcomes[outcome as usize].fetch_add(1, Ordering::Relaxed);
        self.latency.observe(took);
    }
}

/// Gauges read when the metrics are rendered, from the parts of the server that keep them.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Gauges {
    /// Requests waiting in the admission queue.
    pub(crate) queued: usize,
    /// Times the change bus lost its connection and reconnected.
    pub(crate) bus_reconnects: u64,
    /// Whether the change bus is connected.
    pub(crate) bus_connected: bool,
}

/// The counters of a running server. Shared by every request; see the module docs.
pub struct Metrics {
    /// By the index of [`METHODS`], `tools/call` aside; the last slot is `other`.
    methods: [Series; METHODS.len() + 1],
    /// `tools/call` by the registry's index of the tool; the last slot counts calls of a
    /// tool the server does not have.
    tools: Box<[Series]>,
    tool_names: Box<[String]>,
    in_flight: AtomicI64,
    shed: [AtomicU64; Shed::ALL.len()],
    auth_refusals: [AtomicU64; AuthRefusal::ALL.len()],
    /// By the index of [`HTTP_STATUSES`]; the last slot is `other`.
    http_statuses: [AtomicU64; HTTP_STATUSES.len() + 1],
    store: [Histogram; StoreOp::ALL.len()],
    lock_waits: Histogram,
    replays: AtomicU64,
    mrtr_rounds: AtomicU64,
    listen_open: AtomicI64,
    listen_missed: AtomicU64,
    started: SystemTime,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("tools", &self.tool_names)
            .finish_non_exhaustive()
    }
}

impl Metrics {
    /// Counters for a server with these tools, in the registry's order.
    pub(crate) fn new(tool_names: Vec<String>) -> Self {
        Metrics {
            methods: Default::default(),
            tools: (0..=tool_names.len()).map(|_| Series::default()).collect(),
            tool_names: tool_names.into_boxed_slice(),
            in_flight: AtomicI64::new(0),
            shed: Default::default(),
            auth_refusals: Default::default(),
            http_statuses: Default::default(),
            store: Default::default(),
            lock_waits: Histogram::default(),
            replays: AtomicU64::new(0),
            mrtr_rounds: AtomicU64::new(0),
            listen_open: AtomicI64::new(0),
            listen_missed: AtomicU64::new(0),
            started: SystemTime::now(),
        }
    }

    /// Counts a request a transport refused to authenticate.
    pub fn auth_refused(&self, why: AuthRefusal) {
        self.auth_refusals[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an HTTP response of the MCP endpoint, by its status: refusals before a request
    /// runs (a malformed body, a header that disagrees with it, a forbidden Host) are counted
    /// nowhere else.
    pub fn http_response(&self, status: u16) {
        let slot = HTTP_STATUSES
            .iter()
            .position(|s| *s == status)
            .unwrap_or(HTTP_STATUSES.len());
        self.http_statuses[slot].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn shed(&self, why: Shed) {
        self.shed[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn store_op(&self, op: StoreOp, took: Duration) {
        self.store[op as usize].observe(took);
    }

    pub(crate) fn lock_waited(&self, took: Duration) {
        self.lock_waits.observe(took);
    }

    pub(crate) fn replayed(&self) {
        self.replays.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn mrtr_round(&self) {
        self.mrtr_rounds.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn listen_missed(&self, missed: u64) {
        self.listen_missed.fetch_add(missed, Ordering::Relaxed);
    }

    /// The number of completed requests of `method`: what a test or a health probe reads
    /// without parsing the text format. For `tools/call`, `tool` names the tool (`None`: every tool's, those the server does
    /// not have included).
    pub fn requests(&self, method: &str, tool: Option<&str>) -> u64 {
        let total =
            |s: &Series| -> u64 { s.outcomes.iter().map(|o| o.load(Ordering::Relaxed)).sum() };
        if method == methods::TOOLS_CALL {
            return match tool {
                Some(name) => self
                    .tool_names
                    .iter()
                    .position(|t| t == name)
                    .map_or(0, |i| total(&self.tools[i])),
                None => self.tools.iter().map(total).sum(),
            };
        }
        METHODS
            .iter()
            .position(|m| *m == method)
            .map_or(0, |i| total(&self.methods[i]))
    }

    /// Every counter, gauge and histogram now.
    pub(crate) fn snapshot(&self, gauges: Gauges) -> Snapshot {
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
        let mut requests = Vec::new();
        let mut durations = Vec::new();
        for (method, tool, series) in self.series() {
            let labels = || vec![("method", method.to_owned()), ("tool", tool.to_owned())];
            for outcome in Outcome::ALL {
                let n = load(&series.outcomes[outcome as usize]);
                if n > 0 {
                    let mut labels = labels();
                    labels.push(("outcome", outcome.as_str().to_owned()));
                    requests.push(Point::new(labels, n));
                }
            }
            if series.latency.count() > 0 {
                durations.push(Point::new(labels(), series.latency.snapshot()));
            }
        }
        let by_reason = |reasons: Vec<(&'static str, &AtomicU64)>| {
            let point = |(why, n)| Point::new(vec![("reason", String::from(why))], load(n));
            reasons.into_iter().map(point).collect()
        };
        let store = StoreOp::ALL.map(|op| {
            let labels = vec![("operation", op.as_str().to_owned())];
            Point::new(labels, self.store[op as usize].snapshot())
        });
        let level = |n: &AtomicI64| vec![Point::unlabelled(n.load(Ordering::Relaxed))];
        let count = |n: u64| vec![Point::unlabelled(n)];
        let families = vec![
            Family::counter(
                "wharf_requests",
                "Requests answered, by method, tool and outcome.",
                requests,
            ),
            Family::seconds(
                "wharf_request_duration_seconds",
                "Time from admission to the answer (queue wait included), by method and tool.",
                durations,
            ),
            Family::gauge(
                "wharf_requests_in_flight",
                "Requests received and not yet answered, queued ones included.",
                level(&self.in_flight),
            ),
            Family::gauge(
                "wharf_requests_queued",
                "Requests waiting in the admission queue for a slot.",
                vec![Point::unlabelled(
                    i64::try_from(gauges.queued).unwrap_or(i64::MAX),
                )],
            ),
            Family::counter(
                "wharf_requests_shed",
                "Requests refused under load (503 with Retry-After), by reason.",
                by_reason(
                    Shed::ALL
                        .map(|w| (w.as_str(), &self.shed[w as usize]))
                        .into(),
                ),
            ),
            Family::counter(
                "wharf_auth_refusals",
                "Requests refused before they ran for their credentials, by reason.",
                by_reason(
                    AuthRefusal::ALL
                        .map(|w| (w.as_str(), &self.auth_refusals[w as usize]))
                        .into(),
                ),
            ),
            Family::counter(
                "wharf_http_responses",
                "Responses of the MCP endpoint, by HTTP status (refusals before a request ran \
                 included).",
                self.http_statuses
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| load(n) > 0)
                    .map(|(i, n)| {
                        let status = HTTP_STATUSES
                            .get(i)
                            .map_or_else(|| "other".to_owned(), u16::to_string);
                        Point::new(vec![("status", status)], load(n))
                    })
                    .collect(),
            ),
            Family::seconds(
                "wharf_store_operation_duration_seconds",
                "Time the store took for what a call asks of it, by operation.",
                store.into(),
            ),
            Family::seconds(
                "wharf_mutation_lock_wait_seconds",
                "Time calls waited for their turn on what they mutate.",
                vec![Point::unlabelled(self.lock_waits.snapshot())],
            ),
            Family::counter(
                "wharf_idempotent_replays",
                "Retries answered with the recorded first result of their write.",
                count(load(&self.replays)),
            ),
            Family::counter(
                "wharf_mrtr_rounds",
                "input_required answers: rounds in which a call asked its client for input.",
                count(load(&self.mrtr_rounds)),
            ),
            Family::gauge(
                "wharf_listen_streams_open",
                "subscriptions/listen streams open on this replica.",
                level(&self.listen_open),
            ),
            Family::counter(
                "wharf_listen_events_missed",
                "Change events listen streams fell too far behind to receive (bus lag); each \
                 stream re-announced everything it subscribed to instead.",
                count(load(&self.listen_missed)),
            ),
            Family::counter(
                "wharf_bus_reconnects",
                "Times the change bus lost its store connection and reconnected.",
                count(gauges.bus_reconnects),
            ),
            Family::gauge(
                "wharf_bus_connected",
                "1 when the change bus is connected, 0 while it reconnects.",
                vec![Point::unlabelled(i64::from(gauges.bus_connected))],
            ),
        ];
        Snapshot {
            started: self.started,
            taken: SystemTime::now(),
            families,
        }
    }

    /// Renders every counter in the Prometheus text exposition format (version 0.0.4).
    pub(crate) fn encode(&self, gauges: Gauges) -> String {
        prometheus::encode(&self.snapshot(gauges))
    }

    /// Every method's and tool's series with its `method` and `tool` label values.
    fn series(&self) -> impl Iterator<Item = (&str, &str, &Series)> {
        let methods = self.methods.iter().enumerate().filter_map(|(i, s)| {
            let method = METHODS.get(i).copied().unwrap_or("other");
            (method != methods::TOOLS_CALL).then_some((method, "", s))
        });
        let tools = self.tools.iter().enumerate().map(|(i, s)| {
            let tool = self.tool_names.get(i).map_or("", String::as_str);
            (methods::TOOLS_CALL, tool, s)
        });
        methods.chain(tools)
    }
}

/// Where a request is counted: a method's series, or a tool's.
#[derive(Debug, Clone, Copy)]
enum Slot {
    Method(usize),
    Tool(usize),
}

/// Times one request from admission and counts it once when it ends: with the outcome
/// given to [`RequestTimer::finish`], or as cancelled when it is dropped before (the client
/// went away while it was queued or running, and its work was dropped at an await).
pub(crate) struct RequestTimer {
    metrics: Arc<Metrics>,
    slot: Slot,
    /// Tokio's clock (the system's outside tests), so that a test on a paused clock can
    /// see how long a request took.
    started: tokio::time::Instant,
}

impl RequestTimer {
    /// Starts timing a request of `method`; for `tools/call`, `tool` is the registry's
    /// index of the tool it calls (`None`: a tool the server does not have).
    pub(crate) fn start(metrics: &Arc<Metrics>, method: &str, tool: Option<usize>) -> Self {
        let slot = if method == methods::TOOLS_CALL {
            let last = metrics.tools.len() - 1;
            Slot::Tool(tool.filter(|&i| i < last).unwrap_or(last))
        } else {
            let index = METHODS.iter().position(|m| *m == method);
            Slot::Method(index.unwrap_or(METHODS.len()))
        };
        metrics.in_flight.fetch_add(1, Ordering::Relaxed);
        RequestTimer {
            metrics: Arc::clone(metrics),
            slot,
            started: tokio::time::Instant::now(),
        }
    }

    /// Leaves `waited` out of the request's duration.
    pub(crate) fn exclude(&mut self, waited: Duration) {
        self.started = self.started.checked_add(waited).unwrap_or(self.started);
    }

    /// Counts the request with its outcome.
    pub(crate) fn finish(mut self, outcome: Outcome) {
        self.record(outcome);
        // Counted: the drop below must not count it again.
        self.slot = Slot::Method(usize::MAX);
    }

    fn record(&self, outcome: Outcome) {
        let series = match self.slot {
            Slot::Method(i) => self.metrics.methods.get(i),
            Slot::Tool(i) => self.metrics.tools.get(i),
        };
        if let Some(series) = series {
            series.record(outcome, self.started.elapsed());
            self.metrics.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for RequestTimer {
    fn drop(&mut self) {
        self.record(Outcome::Cancelled);
    }
}

/// How a request that ran to a response ended, set by the code that knows (a tool call's
/// `isError`, a handler that asked for input) and read by the code that counts it.
#[derive(Debug, Default)]
pub(crate) struct OutcomeCell(AtomicU8);

impl OutcomeCell {
    pub(crate) fn set(&self, outcome: Outcome) {
        self.0.store(outcome as u8, Ordering::Relaxed);
    }

    /// The outcome set, `ok` if none was.
    pub(crate) fn get(&self) -> Outcome {
        let value = self.0.load(Ordering::Relaxed);
        Outcome::ALL
            .into_iter()
            .find(|o| *o as u8 == value)
            .unwrap_or(Outcome::Ok)
    }
}

/// Counts a listen stream open while it lives.
pub(crate) struct ListenOpen(Arc<Metrics>);

impl ListenOpen {
    pub(crate) fn new(metrics: Arc<Metrics>) -> Self {
        metrics.listen_open.fetch_add(1, Ordering::Relaxed);
        ListenOpen(metrics)
    }
}

impl Drop for ListenOpen {
    fn drop(&mut self) {
        self.0.listen_open.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_call_is_counted_by_tool_and_outcome_and_timed() {
        let m = Arc::new(Metrics::new(vec!["echo".into(), "slow".into()]));
        let call = |tool| RequestTimer::start(&m, methods::TOOLS_CALL, tool);
        call(Some(0)).finish(Outcome::Ok);
        call(Some(0)).finish(Outcome::ToolError);
        drop(call(Some(1)));
        call(None).finish(Outcome::Error);
        let text = m.encode(Gauges::default());
        assert!(text.contains(
            "wharf_requests_total{method=\"tools/call\",tool=\"echo\",outcome=\"ok\"} 1\n"
        ));
        assert!(text.contains(
            "wharf_requests_total{method=\"tools/call\",tool=\"echo\",outcome=\"tool_error\"} 1\n"
        ));
        assert!(text.contains(
            "wharf_requests_total{method=\"tools/call\",tool=\"slow\",outcome=\"cancelled\"} 1\n"
        ));
        assert!(text.contains(
            "wharf_requests_total{method=\"tools/call\",tool=\"\",outcome=\"error\"} 1\n"
        ));
        assert!(text.contains(
            "wharf_request_duration_seconds_count{method=\"tools/call\",tool=\"echo\"} 2\n"
        ));
        assert_eq!(m.requests("tools/call", Some("echo")), 2);
        assert_eq!(m.requests("tools/call", None), 4);
        assert_eq!(m.in_flight.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn an_outcome_cell_reads_back_what_was_set_and_ok_otherwise() {
        let cell = OutcomeCell::default();
        assert_eq!(cell.get(), Outcome::Ok);
        for outcome in Outcome::ALL {
            cell.set(outcome);
            assert_eq!(cell.get(), outcome);
        }
    }

    #[test]
    fn an_observation_lands_in_the_first_bucket_whose_bound_reaches_it() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(500)); // on the first bound: inside it
        h.observe(Duration::from_micros(501));
        h.observe(Duration::from_secs(60)); // past the last bound
        let b = h.snapshot();
        assert_eq!(b.bounds(), &BUCKETS);
        assert_eq!(b.counts().len(), BUCKETS.len() + 1);
        assert_eq!((b.counts()[0], b.counts()[1]), (1, 1));
        assert_eq!(b.counts()[BUCKETS.len()], 1);
        assert_eq!(b.count(), 3);
        assert!((b.sum() - 60.001001).abs() < 1e-9, "{}", b.sum());
    }

    #[test]
    fn a_method_other_than_a_tool_call_has_its_own_series() {
        let m = Arc::new(Metrics::new(Vec::new()));
        RequestTimer::start(&m, methods::TOOLS_LIST, None).finish(Outcome::Ok);
        RequestTimer::start(&m, "no/such", None).finish(Outcome::Error);
        let text = m.encode(Gauges {
            queued: 3,
            ..Gauges::default()
        });
        assert!(
            text.contains(
                "wharf_requests_total{method=\"tools/list\",tool=\"\",outcome=\"ok\"} 1\n"
            )
        );
        assert!(
            text.contains("wharf_requests_total{method=\"other\",tool=\"\",outcome=\"error\"} 1\n")
        );
        assert!(text.contains("wharf_requests_queued 3\n"));
    }
}
