//! A session's stream of messages unrelated to any request (HTTP GET, 2025-11-25
//! basic/transports): list changes of what the server offers and updates of the resources
//! the session subscribed to, heard on the bus from every replica.

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::Stream;
use serde_json::json;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use wharf_protocol::methods;

use crate::bus::{BusError, ChangeEvent, SessionSignal};
use crate::dispatch::Core;
use crate::limits::Permit;
use crate::session::Session;
use crate::store::now_millis;

/// The notifications of one session, pulled as they are written. It ends when the session
/// ends or expires, when the server drains or stops (see
/// [`Server::drain`](crate::Server::drain)), when the session opens a newer stream (on
/// any replica: a message goes out on one stream only), and when the bus could not promise
/// every event (after saying that every list and subscribed resource may have changed; the
/// client opens it again).
#[must_use = "a session stream sends nothing unless polled"]
pub struct SessionStream(Pin<Box<dyn Stream<Item = Vec<u8>> + Send>>);

impl std::fmt::Debug for SessionStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionStream")
    }
}

struct State {
    core: Arc<Core>,
    /// Ends the stream ([`Runtime::stream_end`](crate::runtime::Runtime::stream_end)).
    end: CancellationToken,
    id: String,
    owner: String,
    subscriptions: BTreeSet<String>,
    booked: bool,
    rx: broadcast::Receiver<ChangeEvent>,
    /// Messages due before the next event (after a lag: everything may have changed).
    backlog: Vec<Vec<u8>>,
    /// When to look at the session again: an open stream does not keep it alive, and the
    /// sweeper removes an expired one without a word on the bus.
    recheck_at: tokio::time::Instant,
    /// This stream's name among the session's streams (see [`SessionSignal::Listening`]),
    /// announced when it opened, and whether that announcement came back: every listener of
    /// the bus hears announcements in one order, so a stream that hears another's after its
    /// own is the older one, whatever the replicas' clocks say.
    key: String,
    heard_own: bool,
    /// Ends once the backlog is sent (after a lag).
    ending: bool,
    /// When the credentials it was opened with expire: it ends then, as a listen stream
    /// does (a token not renewed hears no more).
    until: Option<tokio::time::Instant>,
    /// Its slots under the listen caps, held while it is open: a session's stream lives as
    /// long as a listen stream does.
    _permit: Permit,
}

/// The longest a stream outlives its session's expiry.
const RECHECK: Duration = Duration::from_secs(30);

/// How often a stream looks at its session: every 30 s, or twice per idle lifetime when that
/// is shorter, but never more than once a second (a read of the store each time).
fn recheck_every(core: &Core) -> Duration {
    RECHECK
        .min(core.runtime.config.legacy.session_idle / 2)
        .max(Duration::from_secs(1))
}

impl SessionStream {
    /// Opens the stream and announces it on the bus before it is handed out, so streams
    /// opened one after the other are announced in that order: the one opened last is the
    /// newer one, which every older stream of the session hears, and ends for. Subscribed
    /// first, it hears a newer stream's announcement however soon that comes. `Err` when
    /// the bus did not take the announcement: unannounced, a stream could not tell whether
    /// a newer one opened, and might outlive it. The subscriptions are read afresh once it
    /// listens: `session` may be a copy older than a subscription another replica made,
    /// whose announcement came before the stream listened.
    pub(crate) async fn open(
        core: &Arc<Core>,
        session: &Session,
        until: Option<tokio::time::Instant>,
        permit: Permit,
    ) -> Result<Self, BusError> {
        let mut state = State {
            end: core.runtime.stream_end(),
            core: Arc::clone(core),
            id: session.id().to_owned(),
            owner: session.owner().to_owned(),
            subscriptions: session.subscriptions().clone(),
            booked: session.booked,
            rx: core.runtime.bus.subscribe(),
            backlog: Vec::new(),
            recheck_at: tokio::time::Instant::now() + recheck_every(core),
            key: format!("{:032x}", rand::random::<u128>()),
            heard_own: false,
            ending: false,
            until,
            _permit: permit,
        };
        // Gone meanwhile: the stream ends at once, and the client's next request hears 404.
        state.ending = !state.reload().await;
        let opened = ChangeEvent::Session {
            session: state.id.clone(),
            signal: SessionSignal::Listening(state.key.clone()),
        };
        core.runtime.bus.publish(opened).await?;
        Ok(SessionStream(Box::pin(futures_util::stream::unfold(
            state,
            |mut s| async move {
                let next = s.next().await?;
                Some((next, s))
            },
        ))))
    }
}

impl Stream for SessionStream {
    type Item = Vec<u8>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Vec<u8>>> {
        self.0.as_mut().poll_next(cx)
    }
}

impl State {
    /// Whether `uri` is a subscribed resource (subscriptions are kept normalized).
    fn subscribed(&self, uri: &str) -> bool {
        self.subscriptions
            .contains(crate::uri_template::normalized(uri).as_ref())
    }

    async fn next(&mut self) -> Option<Vec<u8>> {
        loop {
            if let Some(m) = self.backlog.pop() {
                return Some(m);
            }
            if self.ending {
                return None;
            }
            let received = tokio::select! {
                () = self.end.cancelled() => return None,
                () = crate::deadline::reached(self.until) => return None,
                () = tokio::time::sleep_until(self.recheck_at) => {
                    if !self.reload().await {
                        return None;
                    }
                    self.recheck_at = tokio::time::Instant::now() + recheck_every(&self.core);
                    continue;
                }
                received = self.rx.recv() => received,
            };
            match received {
                Ok(event) => {
                    if let Some(m) = self.render(event).await? {
                        return Some(m);
                    }
                }
                // Missed events (lagged behind, or the bus lost its channel: a failed
                // publish, a reconnection): everything may have changed, and a newer stream
                // of the session may have opened unheard. It says the first, then ends; the
                // client opens it again.
                Err(
                    broadcast::error::RecvError::Lagged(_) | broadcast::error::RecvError::Closed,
                ) => {
                    self.backlog = self.everything();
                    self.ending = true;
                }
            }
        }
    }

    /// The message for `event`, if this session wants it; `None` when the stream ends.
    async fn render(&mut self, event: ChangeEvent) -> Option<Option<Vec<u8>>> {
        match event {
            ChangeEvent::Session { session, signal } if session == self.id => match signal {
                SessionSignal::Ended => None,
                SessionSignal::Listening(key) if key == self.key => {
                    self.heard_own = true;
                    Some(None)
                }
                // Announced after this stream's: a newer stream took over.
                SessionSignal::Listening(_) if self.heard_own => None,
                SessionSignal::Changed => self.reload().await.then_some(None),
                _ => Some(None),
            },
            other => Some(self.message(&other)),
        }
    }

    /// The notification for a change, if this session wants it.
    fn message(&self, event: &ChangeEvent) -> Option<Vec<u8>> {
        let caps = &self.core.registry.capabilities;
        let listed = |c: Option<bool>| c == Some(true);
        let (method, uri) = match event {
            ChangeEvent::ToolsListChanged
                if caps.tools.as_ref().is_some_and(|t| listed(t.list_changed)) =>
            {
                (methods::NOTIFICATION_TOOLS_LIST_CHANGED, None)
            }
            ChangeEvent::PromptsListChanged
                if caps
                    .prompts
                    .as_ref()
                    .is_some_and(|p| listed(p.list_changed)) =>
            {
                (methods::NOTIFICATION_PROMPTS_LIST_CHANGED, None)
            }
            ChangeEvent::ResourcesListChanged
                if caps
                    .resources
                    .as_ref()
                    .is_some_and(|r| listed(r.list_changed)) =>
            {
                (methods::NOTIFICATION_RESOURCES_LIST_CHANGED, None)
            }
            ChangeEvent::ResourceUpdated { uri } if self.subscribed(uri) => {
                (methods::NOTIFICATION_RESOURCE_UPDATED, Some(uri))
            }
            ChangeEvent::PrivateResourceUpdated { uri, principal }
                if *principal == self.owner && self.subscribed(uri) =>
            {
                (methods::NOTIFICATION_RESOURCE_UPDATED, Some(uri))
            }
            _ => return None,
        };
        let message = match uri {
            Some(uri) => json!({ "jsonrpc": "2.0", "method": method, "params": { "uri": uri } }),
            None => json!({ "jsonrpc": "2.0", "method": method }),
        };
        serde_json::to_vec(&message).ok()
    }

    /// Reads the session's subscriptions again (another replica changed them); `false`
    /// when the session is gone or expired, which ends the stream.
    async fn reload(&mut self) -> bool {
        if !self.booked {
            return true;
        }
        match self.core.runtime.sessions.session(&self.id, true).await {
            Ok(Some(s)) if s.record.expired(now_millis()).is_none() => {
                self.subscriptions = s.subscriptions().clone();
                true
            }
            Ok(_) => false,
            Err(e) => {
                tracing::warn!(error = %e, "could not read a session");
                true
            }
        }
    }

    /// What to send after missing events: every list, every subscribed resource.
    fn everything(&self) -> Vec<Vec<u8>> {
        let lists = [
            ChangeEvent::ToolsListChanged,
            ChangeEvent::PromptsListChanged,
            ChangeEvent::ResourcesListChanged,
        ];
        let updates = self
            .subscriptions
            .iter()
            .map(|uri| ChangeEvent::ResourceUpdated { uri: uri.clone() });
        lists
            .into_iter()
            .chain(updates)
            .filter_map(|e| self.message(&e))
            .collect()
    }
}
