//! Change notifications and the bus they travel on.
//!
//! A subscription stream listens to its replica's bus. The in-process bus reaches the
//! streams of one process; a shared store brings its own (`Store::bus`), which fans
//! events out across replicas.

use std::future::Future;
use std::pin::Pin;

use tokio::sync::broadcast;

/// Something changed that listeners may want to hear about.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChangeEvent {
    /// The list of tools changed.
    ToolsListChanged,
    /// The list of prompts changed.
    PromptsListChanged,
    /// The list of resources or templates changed.
    ResourcesListChanged,
    /// The resource at `uri` changed.
    ResourceUpdated {
        /// The resource's URI.
        uri: String,
    },
    /// The resource at `uri` as `principal` sees it changed (a URI that names something of
    /// each principal's own): only that principal's listen streams hear of it.
    PrivateResourceUpdated {
        /// The resource's URI.
        uri: String,
        /// The id of the principal it belongs to.
        principal: String,
    },
    /// A message for a legacy session whose requests may run on any replica (listen
    /// streams ignore it).
    Session {
        /// The session's id.
        session: String,
        /// What happened.
        signal: SessionSignal,
    },
}

/// What one replica tells the others about a legacy session.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SessionSignal {
    /// The client cancelled the request of the session this key names (a digest of the
    /// session and the request id, of fixed size whatever id the client chose).
    Cancel(String),
    /// The client answered a server request; the answer waits in the store under this key.
    Reply(String),
    /// The session's record changed (its subscriptions or log level).
    Changed,
    /// A stream of the session opened, named by this key: the session's streams that
    /// announced themselves before it end, since no message may go out on two.
    Listening(String),
    /// The session ended.
    Ended,
}

/// Why an event could not be published.
#[derive(Debug, thiserror::Error)]
#[error("notification bus: {0}")]
pub struct BusError(pub String);

/// Carries [`ChangeEvent`]s from whoever announces them to every listen stream.
pub trait NotificationBus: Send + Sync + 'static {
    /// Announces `event` to every subscriber (on every replica, for shared backends).
    fn publish(
        &self,
        event: ChangeEvent,
    ) -> Pin<Box<dyn Future<Output = Result<(), BusError>> + Send + '_>>;
    /// A receiver of the events published from now on. A bus that can no longer promise a
    /// receiver every event (its connection was lost) closes it: the listen stream then
    /// announces every change it subscribes to (the client reads again) and goes on from a
    /// new receiver; a new receiver that is closed already ends it with its final result.
    fn subscribe(&self) -> broadcast::Receiver<ChangeEvent>;

    /// Whether events published elsewhere reach this process now (a shared bus whose
    /// listening connection is down answers `false`; `/readyz` reports it). A listen stream
    /// whose receiver closes while this is `false` waits for the next gap to announce what
    /// it may have missed: a bus that reconnects answers `true` before it closes the
    /// receivers for the gap of its new connection.
    fn is_connected(&self) -> bool {
        true
    }

    /// How many times the bus lost its connection and reconnected (0 for a bus with no
    /// connection to lose), for the metrics.
    fn reconnects(&self) -> u64 {
        0
    }
}

/// The bus of a single process.
#[derive(Debug)]
pub struct InProcessBus {
    tx: broadcast::Sender<ChangeEvent>,
}

impl InProcessBus {
    /// A bus that buffers up to `capacity` events per slow subscriber before it lags.
    pub fn new(capacity: usize) -> Self {
        InProcessBus {
            tx: broadcast::channel(capacity.max(1)).0,
        }
    }
}

impl Default for InProcessBus {
    fn default() -> Self {
        Self::new(256)
    }
}

impl NotificationBus for InProcessBus {
    fn publish(
        &self,
        event: ChangeEvent,
    ) -> Pin<Box<dyn Future<Output = Result<(), BusError>> + Send + '_>> {
        // No subscriber is not an error: nobody is listening right now.
        let _ = self.tx.send(event);
        Box::pin(async { Ok(()) })
    }

    fn subscribe(&self) -> broadcast::Receiver<ChangeEvent> {
        self.tx.subscribe()
    }
}
