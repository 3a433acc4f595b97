//! Change notifications shared by every replica of a store: PostgreSQL's LISTEN/NOTIFY or
//! Redis pub/sub.
//!
//! Each process keeps one connection listening on the store's channel and fans what arrives
//! out to its own listen streams; publishing goes through the store's ordinary connections,
//! and a process hears its own events back through its listener like everyone else's.
//!
//! A connection can also die without a word (a NAT or load balancer that drops idle flows,
//! a store host that vanished): every replica publishes a heartbeat every [`HEARTBEAT`], so
//! a listener that hears nothing at all for [`SILENCE`], its own heartbeats included, takes
//! its connection as lost.
//!
//! Delivery is not replayed after an outage, so a stream that may have missed something is
//! told: when the listening connection is lost, and again whenever it is established (for
//! the streams opened before it listened), every open receiver is closed, and its listen
//! stream announces every change it subscribes to, so its client reads again, and listens on
//! from a new receiver. (A legacy session's stream ends instead, and its client reconnects.)

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::sync::broadcast;
use wharf::{BusError, ChangeEvent, NotificationBus, SessionSignal};

/// The channel every replica listens on.
pub(crate) const CHANNEL: &str = "wharf_changes";

/// Events each slow listen stream may fall behind by before it lags (and is told that
/// everything it subscribed to may have changed).
const CAPACITY: usize = 1024;

/// How often each replica says it is there.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(10);
/// How long a listener may hear nothing before it takes its connection as lost: three
/// heartbeats missed.
pub(crate) const SILENCE: Duration = Duration::from_secs(30);
/// The heartbeat's line: a session line for no session, which every version reads as
/// something to skip (earlier replicas included).
const HEARTBEAT_LINE: &str = "s 0 h";

/// What travels on the channel.
#[derive(Debug, PartialEq)]
pub(crate) enum Message {
    Event(ChangeEvent),
    /// An event too large for the channel, or one this version does not know: every stream
    /// may have missed something.
    Gap,
    /// A signal for a legacy session that this version does not know (a newer replica's,
    /// during a rolling upgrade): session signals only ever concern that session's calls
    /// and streams, and each kind is safe to miss, so it is dropped rather than ending
    /// every stream as a gap would.
    Skip,
}

/// One line per event: `t`, `p` and `r` for the tools, prompts and resources lists, `u URI`
/// for an updated resource, `o LEN PRINCIPALURI` for one private to a principal (its id's
/// length in bytes first), `s LEN SESSION` and a signal for a legacy session (`c ID` a
/// cancellation, `r KEY` a reply, `l KEY` a stream opened, `u` changed, `e` ended), `g`
/// for a gap.
pub(crate) fn encode(event: &ChangeEvent) -> String {
    match event {
        ChangeEvent::ToolsListChanged => "t".into(),
        ChangeEvent::PromptsListChanged => "p".into(),
        ChangeEvent::ResourcesListChanged => "r".into(),
        ChangeEvent::ResourceUpdated { uri } => format!("u {uri}"),
        ChangeEvent::PrivateResourceUpdated { uri, principal } => {
            format!("o {} {principal}{uri}", principal.len())
        }
        ChangeEvent::Session { session, signal } => {
            let signal = match signal {
                SessionSignal::Cancel(id) => format!("c {id}"),
                SessionSignal::Reply(key) => format!("r {key}"),
                SessionSignal::Listening(key) => format!("l {key}"),
                SessionSignal::Changed => "u".into(),
                SessionSignal::Ended => "e".into(),
                _ => return "g".into(),
            };
            format!("s {} {session}{signal}", session.len())
        }
        _ => "g".into(),
    }
}

/// The line that announces `event` on a channel that carries at most `max` bytes: the
/// event's own, or a gap when it is longer (every stream then reads afresh).
pub(crate) fn payload(backend: &str, event: &ChangeEvent, max: usize) -> String {
    let payload = encode(event);
    if payload.len() <= max {
        return payload;
    }
    tracing::warn!(
        bytes = payload.len(),
        "change notification too large for the {backend} channel; announcing a gap"
    );
    "g".into()
}

/// A session's line: `None` when it is malformed (a gap).
fn decode_session(rest: &str) -> Option<Message> {
    let (len, rest) = rest.split_once(' ')?;
    let len: usize = len.parse().ok()?;
    let session = rest.get(..len)?.to_owned();
    let signal = match rest.get(len..)? {
        "u" => SessionSignal::Changed,
        "e" => SessionSignal::Ended,
        other => match other.split_once(' ') {
            Some(("c", id)) => SessionSignal::Cancel(id.to_owned()),
            Some(("r", key)) => SessionSignal::Reply(key.to_owned()),
            Some(("l", key)) => SessionSignal::Listening(key.to_owned()),
            _ => return Some(Message::Skip),
        },
    };
    Some(Message::Event(ChangeEvent::Session { session, signal }))
}

pub(crate) fn decode(payload: &str) -> Message {
    match payload {
        "t" => Message::Event(ChangeEvent::ToolsListChanged),
        "p" => Message::Event(ChangeEvent::PromptsListChanged),
        "r" => Message::Event(ChangeEvent::ResourcesListChanged),
        _ => {
            if let Some(uri) = payload.strip_prefix("u ") {
                return Message::Event(ChangeEvent::ResourceUpdated {
                    uri: uri.to_owned(),
                });
            }
            let private = payload.strip_prefix("o ").and_then(|rest| {
                let (len, rest) = rest.split_once(' ')?;
                let len: usize = len.parse().ok()?;
                let principal = rest.get(..len)?;
                let uri = rest.get(len..)?;
                Some(ChangeEvent::PrivateResourceUpdated {
                    uri: uri.to_owned(),
                    principal: principal.to_owned(),
                })
            });
            if let Some(private) = private {
                return Message::Event(private);
            }
            payload
                .strip_prefix("s ")
                .and_then(decode_session)
                .unwrap_or(Message::Gap)
        }
    }
}

/// The receivers of one process, and whether its listening connection is up.
pub(crate) struct Fanout {
    tx: Mutex<broadcast::Sender<ChangeEvent>>,
    connected: AtomicBool,
    /// A gap other replicas were not told of (the store refused it): the heartbeat sends it
    /// in its place until the store takes it.
    owed_gap: AtomicBool,
    /// Times a lost connection was listened on again.
    reconnects: AtomicU64,
}

impl Fanout {
    fn new() -> Self {
        Fanout {
            tx: Mutex::new(broadcast::channel(CAPACITY).0),
            connected: AtomicBool::new(false),
            owed_gap: AtomicBool::new(false),
            reconnects: AtomicU64::new(0),
        }
    }

    fn sender(&self) -> std::sync::MutexGuard<'_, broadcast::Sender<ChangeEvent>> {
        self.tx.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn deliver(&self, event: ChangeEvent) {
        // Nobody listening is not an error.
        let _ = self.sender().send(event);
    }

    /// Ends every open receiver (after what it has buffered): each may have missed events.
    fn gap(&self) {
        *self.sender() = broadcast::channel(CAPACITY).0;
    }

    fn subscribe(&self) -> broadcast::Receiver<ChangeEvent> {
        self.sender().subscribe()
    }
}

/// Opens a listening connection: a stream of payloads that ends when the connection is lost.
pub(crate) type Connect = Box<
    dyn Fn() -> Pin<
            Box<
                dyn Future<Output = Result<Pin<Box<dyn Stream<Item = String> + Send>>, String>>
                    + Send,
            >,
        > + Send
        + Sync,
>;

/// Publishes one payload through the store's ordinary connections.
pub(crate) type Publish =
    Box<dyn Fn(String) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// Publishes what replicas left unpublished (PostgreSQL's announcements table): run by each
/// replica at the heartbeat's pace; how many it published.
pub(crate) type Sweep =
    Box<dyn Fn() -> Pin<Box<dyn Future<Output = Result<u64, String>> + Send>> + Send + Sync>;

/// What a PostgreSQL bus runs beside publishing its calls' changes.
pub(crate) struct Upkeep {
    /// Publishes the heartbeat (and a gap owed with it), on a connection calls never take:
    /// replicas whose calls hold every connection of their pools (long handlers in their
    /// transactions) would otherwise fall silent together, and every listener would take
    /// the bus for lost (every listen stream announcing a gap at once, its client reading
    /// everything again while the store is busiest).
    pub(crate) heartbeat: Publish,
    /// Publishes what replicas left unpublished.
    pub(crate) sweep: Sweep,
}

/// A [`NotificationBus`] over a store's channel.
pub(crate) struct StoreBus {
    backend: &'static str,
    fanout: Arc<Fanout>,
    /// Taken by the listening task when it starts, on first use inside a Tokio runtime.
    connect: Mutex<Option<Connect>>,
    started: OnceLock<()>,
    /// Shared with the heartbeat task when there is no upkeep.
    publish: Arc<Publish>,
    /// Taken by the heartbeat and sweeping tasks when they start.
    upkeep: Mutex<Option<Upkeep>>,
    /// Longest payload the channel carries; longer events go out as a gap.
    max_payload: usize,
}

impl StoreBus {
    /// A bus that listens through `connect` (from a task started on first use, which stops
    /// when the bus is dropped) and publishes through `publish`, its heartbeats too unless
    /// `upkeep` has a way of their own; `upkeep`'s sweep runs when it starts and every
    /// heartbeat interval after.
    pub(crate) fn new(
        backend: &'static str,
        connect: Connect,
        publish: Publish,
        upkeep: Option<Upkeep>,
        max_payload: usize,
    ) -> Arc<Self> {
        Arc::new(StoreBus {
            backend,
            fanout: Arc::new(Fanout::new()),
            connect: Mutex::new(Some(connect)),
            started: OnceLock::new(),
            publish: Arc::new(publish),
            upkeep: Mutex::new(upkeep),
            max_payload,
        })
    }

    /// A change that reached nobody, this replica's streams included (they hear changes
    /// only through the channel): they are told of a gap, as after a lost connection, and
    /// their clients read afresh. Other replicas are told the same with a gap, if the store
    /// takes that much; otherwise by the next heartbeat.
    pub(crate) async fn missed(&self) {
        self.fanout.gap();
        if let Err(again) = (self.publish)("g".into()).await {
            self.fanout.owed_gap.store(true, Ordering::Release);
            tracing::error!(
                error = %again,
                "{} change bus: a change went unannounced and other replicas could not be told yet; the next heartbeat tells them",
                self.backend
            );
        }
    }

    /// Starts listening, once, when called inside a Tokio runtime.
    fn start(&self) {
        if self.started.get().is_some() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        self.started.get_or_init(|| {
            let connect = self
                .connect
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            let upkeep = self.upkeep.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(connect) = connect {
                runtime.spawn(listen(self.backend, Arc::downgrade(&self.fanout), connect));
                let (beat, sweep) = match upkeep {
                    Some(Upkeep { heartbeat, sweep }) => (Arc::new(heartbeat), Some(sweep)),
                    None => (Arc::clone(&self.publish), None),
                };
                runtime.spawn(heartbeat(self.backend, Arc::downgrade(&self.fanout), beat));
                if let Some(sweep) = sweep {
                    runtime.spawn(sweeper(self.backend, Arc::downgrade(&self.fanout), sweep));
                }
            }
        });
    }
}

impl NotificationBus for StoreBus {
    fn publish(
        &self,
        event: ChangeEvent,
    ) -> Pin<Box<dyn Future<Output = Result<(), BusError>> + Send + '_>> {
        let payload = payload(self.backend, &event, self.max_payload);
        self.start();
        Box::pin(async move {
            let Err(e) = (self.publish)(payload).await else {
                return Ok(());
            };
            self.missed().await;
            Err(BusError(format!("{}: {e}", self.backend)))
        })
    }

    fn subscribe(&self) -> broadcast::Receiver<ChangeEvent> {
        self.start();
        self.fanout.subscribe()
    }

    fn is_connected(&self) -> bool {
        self.start();
        self.fanout.connected.load(Ordering::Acquire)
    }

    fn reconnects(&self) -> u64 {
        self.fanout.reconnects.load(Ordering::Relaxed)
    }
}

/// Keeps a listening connection open, reconnecting with capped exponential backoff, until
/// the bus is dropped.
async fn listen(backend: &'static str, fanout: Weak<Fanout>, connect: Connect) {
    let mut backoff = Backoff::default();
    let mut lost = false;
    loop {
        if fanout.strong_count() == 0 {
            return;
        }
        // A server that takes the connection and never answers (a stalled one, a failover
        // address that swallows packets) is given up on, as a silent connection is.
        let connected = tokio::time::timeout(SILENCE, connect()).await;
        let mut payloads = match connected {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "{backend} change bus: cannot listen; retrying");
                tokio::time::sleep(backoff.next()).await;
                continue;
            }
            Err(_) => {
                tracing::warn!("{backend} change bus: no answer while connecting; retrying");
                tokio::time::sleep(backoff.next()).await;
                continue;
            }
        };
        {
            let Some(fanout) = fanout.upgrade() else {
                return;
            };
            // Streams opened before the connection listened may have missed events. Marked
            // connected first: a stream told of this gap announces what it may have missed
            // only while the bus is connected (the gap at the next connection would say it
            // again otherwise).
            fanout.connected.store(true, Ordering::Release);
            fanout.gap();
            if std::mem::take(&mut lost) {
                fanout.reconnects.fetch_add(1, Ordering::Relaxed);
            }
            tracing::debug!("{backend} change bus: listening");
        }
        let mut heard = false;
        let why = loop {
            let payload = match tokio::time::timeout(SILENCE, payloads.next()).await {
                Ok(Some(payload)) => payload,
                Ok(None) => break "connection lost",
                Err(_) => break "nothing heard for as long as three heartbeats take",
            };
            // Only a connection that carried something counts as working: one that is
            // taken and dropped at once keeps backing off (each reconnect is a gap every
            // listen stream announces).
            if !heard {
                heard = true;
                backoff = Backoff::default();
            }
            let Some(fanout) = fanout.upgrade() else {
                return;
            };
            match decode(&payload) {
                Message::Event(event) => fanout.deliver(event),
                Message::Gap => fanout.gap(),
                Message::Skip => {}
            }
        };
        drop(payloads);
        let Some(fanout) = fanout.upgrade() else {
            return;
        };
        fanout.connected.store(false, Ordering::Release);
        lost = true;
        fanout.gap();
        tracing::warn!(
            "{backend} change bus: {why}; open listen streams are told of a gap; reconnecting"
        );
        drop(fanout);
        tokio::time::sleep(backoff.next()).await;
    }
}

/// Runs `sweep` at once and then every [`HEARTBEAT`] until the bus is dropped; on a task of
/// its own, so that a sweep waiting for a connection never holds the heartbeat back.
async fn sweeper(backend: &'static str, fanout: Weak<Fanout>, sweep: Sweep) {
    let mut round = tokio::time::interval(HEARTBEAT);
    round.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        round.tick().await;
        if fanout.strong_count() == 0 {
            return;
        }
        match sweep().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                "{backend} change bus: published {n} announcements a replica left unpublished"
            ),
            Err(e) => tracing::warn!(
                error = %e,
                "{backend} change bus: announcements left unpublished could not be published yet"
            ),
        }
    }
}

/// Publishes the heartbeat every [`HEARTBEAT`] until the bus is dropped. A heartbeat the
/// store refuses is only logged: the listeners that miss it long enough reconnect.
async fn heartbeat(backend: &'static str, fanout: Weak<Fanout>, publish: Arc<Publish>) {
    let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + HEARTBEAT, HEARTBEAT);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        beat.tick().await;
        let Some(owed) = fanout
            .upgrade()
            .map(|f| f.owed_gap.swap(false, Ordering::AcqRel))
        else {
            return;
        };
        // A gap the store refused goes out in the heartbeat's place: it keeps other
        // replicas' listeners alive as well, and tells their streams what they missed.
        let line = if owed { "g" } else { HEARTBEAT_LINE };
        if let Err(e) = publish(line.to_owned()).await {
            tracing::debug!(error = %e, "{backend} change bus: heartbeat not published");
            if let Some(fanout) = fanout.upgrade().filter(|_| owed) {
                fanout.owed_gap.store(true, Ordering::Release);
            }
        }
    }
}

/// 100 ms doubling to 5 s, with jitter so replicas do not reconnect in step.
#[derive(Default)]
struct Backoff {
    attempt: u32,
}

impl Backoff {
    fn next(&mut self) -> Duration {
        let base = 100u64.saturating_mul(1 << self.attempt.min(6)).min(5_000);
        self.attempt = self.attempt.saturating_add(1);
        Duration::from_millis(base / 2 + rand::random::<u64>() % (base / 2 + 1))
    }
}

/// The longest payload published on PostgreSQL, whose limit is 8000 bytes with the
/// channel name's share.
#[cfg(feature = "postgres")]
pub(crate) const PG_MAX_PAYLOAD: usize = 7900;

/// The longest payload published on Redis: a longer change goes out as a gap rather than
/// to every replica's listener whole.
#[cfg(feature = "redis")]
pub(crate) const REDIS_MAX_PAYLOAD: usize = 64 * 1024;

/// PostgreSQL: `LISTEN wharf_changes` on a connection of its own, `pg_notify` to publish
/// (payloads under 8000 bytes) through the calls' `pool`, heartbeats through `heartbeat`,
/// on a connection the calls do not take (see [`Upkeep::heartbeat`]).
#[cfg(feature = "postgres")]
pub(crate) fn postgres(pool: sqlx::PgPool, heartbeat: Publish) -> Arc<StoreBus> {
    // Each listening connection has a pool of its own, as sqlx's `PgListener::connect`
    // makes: one that waited for the store's connections (all taken by a load spike) would
    // take the bus down with the store's pool, and a connection left stalled (its `UNLISTEN`
    // sent to a server that vanished, until the kernel gives up) would keep the next one
    // from being made.
    let options = pool.connect_options();
    let connect: Connect = Box::new(move || {
        let pool = sqlx::pool::PoolOptions::<sqlx::Postgres>::new()
            .max_connections(1)
            .connect_lazy_with((*options).clone());
        Box::pin(async move {
            let mut listener = sqlx::postgres::PgListener::connect_with(&pool)
                .await
                .map_err(|e| e.to_string())?;
            listener.listen(CHANNEL).await.map_err(|e| e.to_string())?;
            // `try_recv` answers `Ok(None)` when the connection was lost: the stream ends
            // there rather than reconnecting quietly past what it missed.
            let stream = futures_util::stream::unfold(listener, |mut l| async move {
                match l.try_recv().await {
                    Ok(Some(n)) => Some((n.payload().to_owned(), l)),
                    Ok(None) | Err(_) => None,
                }
            });
            Ok(Box::pin(stream) as Pin<Box<dyn Stream<Item = String> + Send>>)
        })
    });
    let publish = pg_notify_on(pool.clone());
    let sweep: Sweep = Box::new(move || {
        let pool = pool.clone();
        Box::pin(async move {
            let orphaned = i64::try_from(ORPHANED.as_millis()).unwrap_or(i64::MAX);
            sqlx::query(PUBLISH_ORPHANS_SQL)
                .bind(CHANNEL)
                .bind(orphaned)
                .execute(&pool)
                .await
                .map(|done| done.rows_affected())
                .map_err(|e| e.to_string())
        })
    });
    let upkeep = Upkeep { heartbeat, sweep };
    StoreBus::new("postgres", connect, publish, Some(upkeep), PG_MAX_PAYLOAD)
}

/// Publishes with `pg_notify` on a connection of `pool`.
#[cfg(feature = "postgres")]
fn pg_notify_on(pool: sqlx::PgPool) -> Publish {
    Box::new(move |payload| {
        let pool = pool.clone();
        Box::pin(async move {
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(CHANNEL)
                .bind(payload)
                .execute(&pool)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        })
    })
}

/// How old a row of `wharf_announcements` is before any replica publishes it: its own
/// replica publishes it as soon as its commit answered, so one this old was left behind (the
/// replica died, or could not publish).
#[cfg(feature = "postgres")]
pub(crate) const ORPHANED: Duration = Duration::from_secs(5);

/// Deletes the rows `$2` (ids) of `wharf_announcements` and publishes them on `$1`, in the
/// order they were written; a row another replica deleted already is published by it. A
/// transaction of its own: a notification queue that cannot take them fails it, and the rows
/// stay for the sweeps.
#[cfg(feature = "postgres")]
const PUBLISH_ANNOUNCEMENTS_SQL: &str = "WITH gone AS (DELETE FROM wharf_announcements \
     WHERE id = ANY($2) RETURNING id, payload) \
     SELECT pg_notify($1, payload) FROM (SELECT id, payload FROM gone ORDER BY id) AS g";

/// [`PUBLISH_ANNOUNCEMENTS_SQL`] for the rows older than `$2` milliseconds, up to 1,000 at a
/// time; rows another replica's sweep or publish holds are skipped, not waited for.
#[cfg(feature = "postgres")]
const PUBLISH_ORPHANS_SQL: &str = "WITH due AS (SELECT id FROM wharf_announcements \
     WHERE at < clock_timestamp() - $2 * interval '1 millisecond' \
     ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED), \
     gone AS (DELETE FROM wharf_announcements AS a USING due WHERE a.id = due.id \
     RETURNING a.id, a.payload) \
     SELECT pg_notify($1, payload) FROM (SELECT id, payload FROM gone ORDER BY id) AS g";

/// What PostgreSQL transactions announce with their commits (see
/// `wharf::store::Transaction::announce_with_commit`): written to `wharf_announcements` in
/// the transaction, so they stand or fall with its writes, then published and deleted by
/// the replica once its commit answered. Rows it leaves (it died just after the commit, or
/// the publish failed) are published by the next sweep of any replica (one every
/// [`HEARTBEAT`]), [`ORPHANED`] after they were written at the soonest, so none is lost
/// with a replica; the writes never wait for, nor fail on, the notification queue.
#[cfg(feature = "postgres")]
pub(crate) struct PgOutbox {
    /// To the replica's one publishing task, in commit order.
    queue: tokio::sync::mpsc::Sender<Vec<i64>>,
    bus: Arc<StoreBus>,
    /// A gap is being told for commits the queue could not take: one at a time is enough.
    telling: Arc<AtomicBool>,
}

/// Commits whose announcements may wait to be published before the replica leaves the
/// next ones to the sweeps.
#[cfg(feature = "postgres")]
const OUTBOX_QUEUE: usize = 4096;

#[cfg(feature = "postgres")]
impl PgOutbox {
    /// The outbox of the store whose connections are `pool` and whose bus is `bus`, with
    /// its publishing task (which ends with the outbox). Inside a Tokio runtime.
    pub(crate) fn new(pool: sqlx::PgPool, bus: Arc<StoreBus>) -> Self {
        let (queue, committed) = tokio::sync::mpsc::channel(OUTBOX_QUEUE);
        tokio::spawn(publisher(pool, Arc::clone(&bus), committed));
        PgOutbox {
            queue,
            bus,
            telling: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The payloads of `events`, as the channel carries them. One PostgreSQL cannot store
    /// (a NUL in a URI a tool built from its arguments) goes as a gap: the writes must not
    /// fail on their announcement.
    pub(crate) fn payloads(events: &[ChangeEvent]) -> impl Iterator<Item = String> + '_ {
        events.iter().map(|event| {
            let line = payload("postgres", event, PG_MAX_PAYLOAD);
            if line.contains('\0') {
                tracing::warn!("change notification with a NUL character; announcing a gap");
                return "g".to_owned();
            }
            line
        })
    }

    /// Writes `payloads` in the transaction on `conn`; their rows' ids, in order.
    pub(crate) async fn write(
        conn: &mut sqlx::PgConnection,
        payloads: &[String],
    ) -> Result<Vec<i64>, sqlx::Error> {
        sqlx::query_scalar(
            "INSERT INTO wharf_announcements (payload) \
             SELECT p FROM unnest($1::text[]) WITH ORDINALITY AS t(p, n) ORDER BY n \
             RETURNING id",
        )
        .bind(payloads)
        .fetch_all(conn)
        .await
        .map(|mut ids: Vec<i64>| {
            ids.sort_unstable();
            ids
        })
    }

    /// Hands the rows `ids`, whose transaction committed, to the publishing task: the call
    /// (and the keys it holds) waits for no connection to publish them, and one replica's
    /// commits are published in their order. A queue too long (or a task gone) leaves them
    /// to the sweeps, and tells of a gap.
    pub(crate) fn publish(&self, ids: Vec<i64>) {
        let Err(refused) = self.queue.try_send(ids) else {
            return;
        };
        match refused {
            tokio::sync::mpsc::error::TrySendError::Full(_) => tracing::warn!(
                "postgres change bus: too many commits' announcements waiting; they wait for a sweep"
            ),
            tokio::sync::mpsc::error::TrySendError::Closed(_) => tracing::error!(
                "postgres change bus: the task that publishes announcements is gone; they wait for a sweep"
            ),
        }
        if !self.telling.swap(true, Ordering::AcqRel) {
            let (bus, telling) = (Arc::clone(&self.bus), Arc::clone(&self.telling));
            tokio::spawn(async move {
                bus.missed().await;
                telling.store(false, Ordering::Release);
            });
        }
    }
}

/// Publishes each commit's rows as they come, until the outbox is dropped. When publishing
/// fails, this replica's streams are told of a gap (others hear of one too), and the rows
/// stay for the sweeps, which publish them late rather than never.
#[cfg(feature = "postgres")]
async fn publisher(
    pool: sqlx::PgPool,
    bus: Arc<StoreBus>,
    mut committed: tokio::sync::mpsc::Receiver<Vec<i64>>,
) {
    while let Some(ids) = committed.recv().await {
        if let Err(e) = publish_rows(&pool, &ids).await {
            tracing::warn!(error = %e, "postgres change bus: a commit's announcements wait for a sweep");
            bus.missed().await;
        }
    }
}

/// Deletes and publishes the rows `ids` of `wharf_announcements` ([`PUBLISH_ANNOUNCEMENTS_SQL`]).
#[cfg(feature = "postgres")]
async fn publish_rows(pool: &sqlx::PgPool, ids: &[i64]) -> Result<(), sqlx::Error> {
    sqlx::query(PUBLISH_ANNOUNCEMENTS_SQL)
        .bind(CHANNEL)
        .bind(ids)
        .execute(pool)
        .await
        .map(drop)
}

/// The channel of the deployment on Redis database `db`: Redis's publish/subscribe ignores
/// the database number, so two deployments kept apart by it would hear each other's changes
/// (and their gaps) on one channel. Database 0 keeps the plain name.
#[cfg(feature = "redis")]
pub(crate) fn redis_channel(db: i64) -> String {
    match db {
        0 => CHANNEL.to_owned(),
        db => format!("{CHANNEL}:{db}"),
    }
}

/// Redis: `SUBSCRIBE wharf_changes` (`wharf_changes:N` on database N) on a connection of its
/// own, `PUBLISH` through the store's connection.
#[cfg(feature = "redis")]
pub(crate) fn redis(client: redis::Client, conn: redis::aio::ConnectionManager) -> Arc<StoreBus> {
    let channel = redis_channel(client.get_connection_info().redis.db);
    let subscribed = channel.clone();
    let connect: Connect = Box::new(move || {
        let client = client.clone();
        let channel = subscribed.clone();
        Box::pin(async move {
            let mut pubsub = client.get_async_pubsub().await.map_err(|e| e.to_string())?;
            pubsub
                .subscribe(&channel)
                .await
                .map_err(|e| e.to_string())?;
            let stream = pubsub
                .into_on_message()
                .filter_map(|m| async move { m.get_payload::<String>().ok() });
            Ok(Box::pin(stream) as Pin<Box<dyn Stream<Item = String> + Send>>)
        })
    });
    let publish: Publish = Box::new(move |payload| {
        let mut conn = conn.clone();
        let channel = channel.clone();
        Box::pin(async move {
            redis::cmd("PUBLISH")
                .arg(&channel)
                .arg(payload)
                .query_async::<i64>(&mut conn)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        })
    });
    StoreBus::new("redis", connect, publish, None, REDIS_MAX_PAYLOAD)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection attempt that never answers is given up on after `SILENCE`, and the
    /// next one listens (time is paused).
    #[tokio::test(start_paused = true)]
    async fn a_connection_that_never_answers_is_tried_again() {
        let attempts = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&attempts);
        let connect: Connect = Box::new(move || {
            let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
            Box::pin(async move {
                if first {
                    std::future::pending::<()>().await;
                }
                let heard = futures_util::stream::pending::<String>();
                Ok(Box::pin(heard) as Pin<Box<dyn Stream<Item = String> + Send>>)
            })
        });
        let fanout = Arc::new(Fanout::new());
        let listening = tokio::spawn(listen("test", Arc::downgrade(&fanout), connect));
        tokio::time::sleep(SILENCE + Duration::from_secs(6)).await;
        assert_eq!(attempts.load(Ordering::SeqCst), 2);
        assert!(fanout.connected.load(Ordering::Acquire), "listening again");
        listening.abort();
    }

    /// A connection taken and lost without a word heard on it keeps backing off: the
    /// attempts space out instead of coming every tenth of a second.
    #[tokio::test(start_paused = true)]
    async fn connections_lost_at_once_back_off() {
        let attempts = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&attempts);
        let connect: Connect = Box::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            Box::pin(async {
                let lost = futures_util::stream::empty::<String>();
                Ok(Box::pin(lost) as Pin<Box<dyn Stream<Item = String> + Send>>)
            })
        });
        let fanout = Arc::new(Fanout::new());
        let listening = tokio::spawn(listen("test", Arc::downgrade(&fanout), connect));
        tokio::time::sleep(Duration::from_secs(60)).await;
        // Backing off to 5 s apart (2.5 s at least): about 20 in a minute, where resetting
        // at each connection made it 600 or more.
        let made = attempts.load(Ordering::SeqCst);
        assert!(made < 40, "{made} attempts in a minute");
        listening.abort();
    }

    #[test]
    fn events_travel_as_short_lines_and_unknown_lines_are_gaps() {
        for event in [
            ChangeEvent::ToolsListChanged,
            ChangeEvent::PromptsListChanged,
            ChangeEvent::ResourcesListChanged,
            ChangeEvent::ResourceUpdated {
                uri: "dataset://a b/ü".into(),
            },
            ChangeEvent::PrivateResourceUpdated {
                uri: "dataset://x y".into(),
                principal: "ann 1".into(),
            },
            ChangeEvent::PrivateResourceUpdated {
                uri: String::new(),
                principal: "ü".into(),
            },
            ChangeEvent::Session {
                session: "mcs_1 2".into(),
                signal: SessionSignal::Cancel("\"a b\"".into()),
            },
            ChangeEvent::Session {
                session: "mcs_1".into(),
                signal: SessionSignal::Reply("rpl_ab".into()),
            },
            ChangeEvent::Session {
                session: "mcs_1".into(),
                signal: SessionSignal::Changed,
            },
            ChangeEvent::Session {
                session: "mcs_1".into(),
                signal: SessionSignal::Listening("0000019aeb1c2d3e9f8e7d6c5b4a3928".into()),
            },
            ChangeEvent::Session {
                session: "m".into(),
                signal: SessionSignal::Ended,
            },
        ] {
            assert_eq!(decode(&encode(&event)), Message::Event(event));
        }
        assert_eq!(decode("g"), Message::Gap);
        assert_eq!(decode(HEARTBEAT_LINE), Message::Skip);
        // A session signal of a later version is dropped; a malformed session line is a gap.
        assert_eq!(decode("s 5 mcs_1z later"), Message::Skip);
        assert_eq!(decode("s 5 mcs_1w"), Message::Skip);
        assert_eq!(decode("s 9 mcs_1"), Message::Gap);
        assert_eq!(decode("x something"), Message::Gap);
        assert_eq!(decode(""), Message::Gap);
        assert_eq!(decode("o 9 short"), Message::Gap);
        assert_eq!(decode("o x abc"), Message::Gap);
        assert_eq!(decode("s 9 abcu"), Message::Gap);
    }

    #[tokio::test]
    async fn a_gap_ends_every_open_receiver_after_what_it_buffered() {
        let fanout = Fanout::new();
        let mut open = fanout.subscribe();
        fanout.deliver(ChangeEvent::ToolsListChanged);
        fanout.gap();
        let mut later = fanout.subscribe();
        fanout.deliver(ChangeEvent::PromptsListChanged);
        assert_eq!(open.recv().await.unwrap(), ChangeEvent::ToolsListChanged);
        assert!(matches!(
            open.recv().await,
            Err(broadcast::error::RecvError::Closed)
        ));
        assert_eq!(later.recv().await.unwrap(), ChangeEvent::PromptsListChanged);
    }

    #[test]
    fn backoff_grows_to_its_cap() {
        let mut b = Backoff::default();
        let first = b.next();
        assert!(first <= Duration::from_millis(100));
        let capped = (0..20).map(|_| b.next()).last().unwrap();
        assert!(capped >= Duration::from_millis(2_500) && capped <= Duration::from_secs(5));
    }

    /// A change the store would not carry ends this replica's open streams at once, and
    /// the others' with a gap sent after it.
    #[tokio::test]
    async fn a_change_that_could_not_be_published_closes_the_open_receivers() {
        let (feed, fed) = tokio::sync::mpsc::unbounded_channel::<String>();
        let fed = std::sync::Mutex::new(Some(fed));
        let connect: Connect = Box::new(move || {
            let fed = fed.lock().unwrap().take();
            Box::pin(async move {
                let fed = fed.ok_or("connected once only")?;
                let stream = futures_util::stream::unfold(fed, |mut rx| async move {
                    rx.recv().await.map(|payload| (payload, rx))
                });
                Ok(Box::pin(stream) as Pin<Box<dyn Stream<Item = String> + Send>>)
            })
        });
        let sent = Arc::new(Mutex::new(Vec::<String>::new()));
        let publish: Publish = {
            let sent = Arc::clone(&sent);
            Box::new(move |payload| {
                let sent = Arc::clone(&sent);
                let feed = feed.clone();
                Box::pin(async move {
                    let mut sent = sent.lock().unwrap();
                    sent.push(payload.clone());
                    // The store refuses the first payload, then carries what it is given.
                    if sent.len() == 1 {
                        return Err("pool timed out".to_owned());
                    }
                    feed.send(payload).map_err(|e| e.to_string())
                })
            })
        };
        let bus = StoreBus::new("test", connect, publish, None, 100);
        let mut open = bus.subscribe();
        while !bus.is_connected() {
            tokio::task::yield_now().await;
        }
        let mut open_after_connecting = bus.subscribe();
        assert!(bus.publish(ChangeEvent::ToolsListChanged).await.is_err());
        assert_eq!(*sent.lock().unwrap(), ["t", "g"]);
        for receiver in [&mut open, &mut open_after_connecting] {
            let ended = tokio::time::timeout(Duration::from_secs(5), receiver.recv()).await;
            assert!(
                matches!(ended, Ok(Err(broadcast::error::RecvError::Closed))),
                "{ended:?}"
            );
        }
    }

    /// A listening connection that connects at once and never says anything.
    fn quiet_connection() -> Connect {
        Box::new(|| {
            Box::pin(async {
                let quiet = futures_util::stream::pending::<String>();
                Ok(Box::pin(quiet) as Pin<Box<dyn Stream<Item = String> + Send>>)
            })
        })
    }

    /// A gap the store refused too is sent in the next heartbeat's place, until the store
    /// takes it; the heartbeats after it are heartbeats again.
    #[tokio::test(start_paused = true)]
    async fn a_gap_the_store_refused_goes_out_with_the_next_heartbeat() {
        let connect = quiet_connection();
        let sent = Arc::new(Mutex::new(Vec::<String>::new()));
        let publish: Publish = {
            let sent = Arc::clone(&sent);
            Box::new(move |payload| {
                let sent = Arc::clone(&sent);
                Box::pin(async move {
                    let mut sent = sent.lock().unwrap();
                    sent.push(payload);
                    // The store refuses the event, its gap and the first heartbeat.
                    match sent.len() {
                        1..=3 => Err("pool timed out".to_owned()),
                        _ => Ok(()),
                    }
                })
            })
        };
        let bus = StoreBus::new("test", connect, publish, None, 100);
        let _open = connected(&bus).await;
        assert!(bus.publish(ChangeEvent::ToolsListChanged).await.is_err());
        tokio::time::sleep(HEARTBEAT * 3 + Duration::from_secs(1)).await;
        assert_eq!(*sent.lock().unwrap(), ["t", "g", "g", "g", HEARTBEAT_LINE]);
    }

    /// A bus with upkeep beats through the upkeep's own way out: a store whose calls hold
    /// every connection (its `publish` never answering) still says it is there, and its
    /// sweeps run.
    #[tokio::test(start_paused = true)]
    async fn heartbeats_go_out_while_the_calls_hold_every_connection() {
        let connect = quiet_connection();
        let recorder = |seen: &Arc<Mutex<Vec<String>>>, answers: bool| -> Publish {
            let seen = Arc::clone(seen);
            Box::new(move |payload| {
                seen.lock().unwrap().push(payload);
                Box::pin(async move {
                    if !answers {
                        std::future::pending::<()>().await;
                    }
                    Ok(())
                })
            })
        };
        let (published, beaten) = (Arc::default(), Arc::default());
        let sweeps = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let upkeep = Upkeep {
            heartbeat: recorder(&beaten, true),
            sweep: {
                let sweeps = Arc::clone(&sweeps);
                Box::new(move || {
                    sweeps.fetch_add(1, Ordering::SeqCst);
                    Box::pin(async { Ok(0) })
                })
            },
        };
        let bus = StoreBus::new(
            "test",
            connect,
            recorder(&published, false),
            Some(upkeep),
            100,
        );
        let _open = connected(&bus).await;
        tokio::time::sleep(HEARTBEAT * 2 + Duration::from_secs(1)).await;
        assert_eq!(*beaten.lock().unwrap(), [HEARTBEAT_LINE, HEARTBEAT_LINE]);
        assert!(published.lock().unwrap().is_empty());
        // At once, then at each heartbeat.
        assert_eq!(sweeps.load(Ordering::SeqCst), 3);
    }

    /// A bus over a channel of this process: its listener hears what it publishes when
    /// `carried`; otherwise the connection stays open and says nothing, as a dead one does.
    fn loopback(carried: bool) -> Arc<StoreBus> {
        let (feed, _) = broadcast::channel::<String>(64);
        let listened = feed.clone();
        let connect: Connect = Box::new(move || {
            let heard = listened.subscribe();
            Box::pin(async move {
                let stream = futures_util::stream::unfold(heard, move |mut rx| async move {
                    if !carried {
                        std::future::pending::<()>().await;
                    }
                    rx.recv().await.ok().map(|payload| (payload, rx))
                });
                Ok(Box::pin(stream) as Pin<Box<dyn Stream<Item = String> + Send>>)
            })
        });
        let publish: Publish = Box::new(move |payload| {
            let _ = feed.send(payload);
            Box::pin(async { Ok(()) })
        });
        StoreBus::new("test", connect, publish, None, 100)
    }

    async fn connected(bus: &StoreBus) -> broadcast::Receiver<ChangeEvent> {
        let receiver = bus.subscribe();
        while !bus.is_connected() {
            tokio::task::yield_now().await;
        }
        drop(receiver);
        bus.subscribe()
    }

    /// A connection that dies without a word is taken as lost once nothing, not even a
    /// heartbeat, came for `SILENCE`: the streams open on it end.
    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_is_taken_as_lost() {
        let bus = loopback(false);
        let mut open = connected(&bus).await;
        let began = tokio::time::Instant::now();
        let ended = tokio::time::timeout(SILENCE * 3, open.recv()).await;
        assert!(
            matches!(ended, Ok(Err(broadcast::error::RecvError::Closed))),
            "{ended:?}"
        );
        assert!(began.elapsed() >= SILENCE, "not before the silence");
        assert_eq!(bus.reconnects(), 0, "not yet listening again");
    }

    /// Heartbeats keep a quiet but live connection open, and events pass as before.
    #[tokio::test(start_paused = true)]
    async fn heartbeats_keep_a_quiet_connection_open() {
        let bus = loopback(true);
        let mut open = connected(&bus).await;
        tokio::time::sleep(SILENCE * 4).await;
        assert!(bus.is_connected());
        bus.publish(ChangeEvent::ToolsListChanged).await.unwrap();
        assert_eq!(open.recv().await.unwrap(), ChangeEvent::ToolsListChanged);
    }
}
