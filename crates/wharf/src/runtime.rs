//! What running requests share besides the definitions: the configuration, the store, the
//! keys, the bus, the caps and the shutdown signal. A handler's [`Context`](crate::Context)
//! holds this, never the whole server.

use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;
use wharf_protocol::{ResultMeta, ServerInfo};

use crate::bus::{ChangeEvent, NotificationBus};
use crate::config::ServerConfig;
use crate::error::RpcError;
use crate::fair_share::FairShare;
use crate::keys::KeyRing;
use crate::limits::Gate;
use crate::metrics::{Metrics, StoreOp};
use crate::mutation::MutationQueue;
use crate::session::{Book, Hub};
use crate::store::Store;
use crate::trace;

/// The shared state of a running server.
pub(crate) struct Runtime {
    /// Who the server is, for the `_meta` of every result.
    pub(crate) info: ServerInfo,
    pub(crate) config: ServerConfig,
    /// The cursor and request-state keys.
    pub(crate) keys: Arc<KeyRing>,
    pub(crate) bus: Arc<dyn NotificationBus>,
    /// Whether `bus` is the store's own, so that a commit may carry what the call
    /// announces ([`crate::store::Transaction::announce_with_commit`]).
    pub(crate) bus_in_store: bool,
    pub(crate) store: Option<Arc<dyn Store>>,
    /// The caps on requests in flight.
    pub(crate) gate: Gate,
    /// The per-key queues of mutating calls.
    pub(crate) mutations: Arc<MutationQueue>,
    /// The claims writes in steps may hold at once, where each keeps one of the store's
    /// connections ([`Store::step_claims`]).
    pub(crate) step_claims: Option<Arc<FairShare>>,
    pub(crate) shutdown: CancellationToken,
    /// Cancelled when the server starts draining (and at shutdown).
    pub(crate) draining: CancellationToken,
    /// Where legacy sessions live.
    pub(crate) sessions: Arc<Book>,
    /// The legacy calls running here and the answers they wait for.
    pub(crate) hub: Arc<Hub>,
    /// What is counted, when the server counts ([`crate::ServerBuilder::metrics`]).
    pub(crate) metrics: Option<Arc<Metrics>>,
}

impl Runtime {
    /// The `_meta` of a result: who answered.
    pub(crate) fn result_meta(&self) -> ResultMeta {
        ResultMeta::server(self.info.clone())
    }

    /// When a long-lived stream opened now ends: when the drain begins, for a stream opened
    /// before it; at shutdown, for one opened during it. A stream opened before the drain
    /// went out without `Connection: close`, so a proxy keeps its connection once it ends;
    /// ended while the server still serves, that connection's next request is answered (and
    /// closed). Ended only at shutdown, the connection would close as the proxy might be
    /// writing a request on it, which it could not retry. Streams opened during the drain
    /// close their connections, and hold the client until the server stops.
    pub(crate) fn stream_end(&self) -> CancellationToken {
        if self.draining.is_cancelled() {
            self.shutdown.clone()
        } else {
            self.draining.clone()
        }
    }

    /// The store, which a call that reached this point needs.
    pub(crate) fn require_store(&self) -> Result<&Arc<dyn Store>, RpcError> {
        self.store
            .as_ref()
            .ok_or_else(|| RpcError::internal("a call needs a store but none is configured"))
    }

    /// Runs `work`, one operation of the store, inside a span of its own and timed for the
    /// metrics, cut short or not ([`Timed`]): a claim behind a duplicate, a pool with no
    /// connection free.
    pub(crate) async fn store_op<F: Future>(&self, op: StoreOp, work: F) -> F::Output {
        self.timed_store_op(op, work, Cut::Timed).await
    }

    /// [`Runtime::store_op`] for an operation raced against what makes it moot (a replay
    /// lookup beside the turn it waits for): dropped unfinished, it is not timed, as it was
    /// no wait of the call's.
    pub(crate) async fn store_op_raced<F: Future>(&self, op: StoreOp, work: F) -> F::Output {
        self.timed_store_op(op, work, Cut::Moot).await
    }

    async fn timed_store_op<F: Future>(&self, op: StoreOp, work: F, cut: Cut) -> F::Output {
        let backend = self.store.as_ref().map_or("none", |s| s.backend());
        let span = trace::store(op.as_str(), backend);
        let Some(metrics) = &self.metrics else {
            return work.instrument(span).await;
        };
        let mut timed = Timed::start(metrics, Timing::Store(op), cut);
        let out = work.instrument(span).await;
        timed.finished();
        out
    }

    /// Announces a change to every listen stream that opted into it.
    pub(crate) async fn announce(&self, event: ChangeEvent) {
        if let Err(e) = self.bus.publish(event).await {
            tracing::warn!(error = %e, "could not publish a change notification");
        }
    }
}

/// What a [`Timed`] times.
#[derive(Clone, Copy)]
pub(crate) enum Timing {
    /// One operation of the store.
    Store(StoreOp),
    /// A call's wait for its turn on what it mutates.
    LockWait,
}

/// Whether a wait dropped unfinished counts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cut {
    /// It does: the call's deadline or its client's going ended it, as the waits that
    /// matter most are ended.
    Timed,
    /// It does not: it was raced against what made it moot.
    Moot,
}

/// Times a wait until it is dropped: when it ended, or when it was cut short, as `cut`
/// says.
pub(crate) struct Timed<'a> {
    metrics: &'a Metrics,
    what: Timing,
    cut: Cut,
    finished: bool,
    started: Instant,
}

impl<'a> Timed<'a> {
    /// Starts timing `what` for `metrics`.
    pub(crate) fn start(metrics: &'a Metrics, what: Timing, cut: Cut) -> Self {
        Timed {
            metrics,
            what,
            cut,
            finished: false,
            started: Instant::now(),
        }
    }

    /// Marks the wait as ended, not cut short.
    pub(crate) fn finished(&mut self) {
        self.finished = true;
    }
}

impl Drop for Timed<'_> {
    fn drop(&mut self) {
        if !self.finished && self.cut == Cut::Moot {
            return;
        }
        let took = self.started.elapsed();
        match self.what {
            Timing::Store(op) => self.metrics.store_op(op, took),
            Timing::LockWait => self.metrics.lock_waited(took),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use wharf_protocol::Implementation;

    use crate::metrics::StoreOp;
    use crate::server::Server;

    /// A store operation the call's deadline cut short is timed too, for as long as it
    /// waited (on the real clock, which the metrics read).
    #[tokio::test]
    async fn a_store_operation_cut_short_is_timed() {
        let server = Server::builder(Implementation::new("t", "1"))
            .metrics(true)
            .build()
            .unwrap();
        let runtime = &server.core.runtime;
        let cut = Duration::from_millis(100);
        let waits = runtime.store_op(StoreOp::Begin, std::future::pending::<()>());
        assert!(tokio::time::timeout(cut, waits).await.is_err());
        runtime.store_op(StoreOp::Commit, async {}).await;
        // A lookup raced against what made it moot counts only once it answered.
        let moot = runtime.store_op_raced(StoreOp::Replay, std::future::pending::<()>());
        assert!(tokio::time::timeout(cut, moot).await.is_err());
        runtime.store_op_raced(StoreOp::Replay, async {}).await;
        let text = server.encode_metrics().unwrap();
        let series = |op: &str, what: &str| {
            let name =
                format!("wharf_store_operation_duration_seconds_{what}{{operation=\"{op}\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(name.as_str()))
                .unwrap_or_else(|| panic!("no {name} in {text}"))
                .to_owned()
        };
        assert_eq!(series("begin", "count"), "1");
        let waited: f64 = series("begin", "sum").parse().unwrap();
        // Timed from just after the timeout's own start.
        assert!(waited >= 0.09, "{waited}");
        assert_eq!(series("commit", "count"), "1");
        assert_eq!(series("replay_lookup", "count"), "1");
    }
}
