//! Routes what a legacy client sends about a running call to the replica running it: a
//! `notifications/cancelled`, or its answer to a server request, may be POSTed to any
//! replica. Every replica publishes what it receives on the bus; each process's hub hears
//! everything and hands each signal to the call it concerns, if that call runs here.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use super::Book;
use crate::bus::{ChangeEvent, NotificationBus, SessionSignal};
use crate::store::now_millis;

/// How an answer reached this process.
#[derive(Debug)]
pub(crate) enum Delivery {
    /// The answer itself (it arrived here, on a session only this process holds).
    Local(Value),
    /// A signal that the answer waits in the store.
    Stored,
}

type RunKey = (Box<str>, Box<str>);

/// The calls of legacy sessions running in this process, and the answers they wait for.
#[derive(Default)]
pub(crate) struct Hub {
    /// Each running call's token, by session and call key, with the number of its
    /// registration: one live call per key, so that a cancellation names one call. A
    /// cancelled call's key is free at once (its client may reuse the id), so the first
    /// call's end must not remove the second's entry.
    running: Mutex<HashMap<RunKey, (u64, CancellationToken)>>,
    registrations: std::sync::atomic::AtomicU64,
    waiting: Mutex<HashMap<Box<str>, mpsc::Sender<Delivery>>>,
    /// Sessions whose end was heard lately, and when: a call that registers just after
    /// (it read its session from a copy, or from the store, before the end) is cancelled
    /// as it starts rather than run for a session nobody holds.
    ended: Mutex<HashMap<Box<str>, std::time::Instant>>,
    /// Cancellations each session sent on to the other replicas in the current window, and
    /// when the window began ([`Hub::may_send_cancel`]).
    cancels_sent: Mutex<HashMap<Box<str>, (std::time::Instant, u32)>>,
    listening: OnceLock<()>,
    /// Cancelled when the hub goes (with its server): its task stops hearing the bus then,
    /// and not before. A draining server's calls still run, and still hear their
    /// cancellations and session ends, until the drain's deadline.
    dropped: CancellationToken,
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.dropped.cancel();
    }
}

/// How long a session's end is remembered: longer than a copy of a session is trusted
/// (`Book`'s `CACHE_TTL`) plus a store read.
const ENDED_REMEMBERED: Duration = Duration::from_secs(10);
/// Most session ends remembered at once (a flood of DELETEs aside, a handful).
const MAX_ENDED: usize = 10_000;
/// Cancellations of calls not running here one session may send on to the other replicas
/// per [`CANCEL_WINDOW`]: one per call it started is all a client sends, and few enough
/// that a client naming made-up ids cannot keep every replica busy.
const CANCELS_PER_WINDOW: u32 = 256;
const CANCEL_WINDOW: Duration = Duration::from_secs(10);
/// Sessions whose windows are kept at once; past it, the expired ones go, then all.
const MAX_CANCELLING: usize = 10_000;

impl Hub {
    /// Starts hearing the bus, once per process (the first legacy request does it), and
    /// drops `book`'s copies of the sessions other replicas change or end.
    pub(crate) fn listen(self: &Arc<Self>, bus: &Arc<dyn NotificationBus>, book: &Arc<Book>) {
        if self.listening.set(()).is_err() {
            return;
        }
        let (hub, bus, stop) = (Arc::downgrade(self), Arc::clone(bus), self.dropped.clone());
        let book = Arc::downgrade(book);
        tokio::spawn(async move {
            loop {
                let mut rx = bus.subscribe();
                if rx.is_closed() {
                    // The bus has no channel to give yet: listen again in a moment.
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(Duration::from_millis(100)) => continue,
                    }
                }
                loop {
                    let event = tokio::select! {
                        () = stop.cancelled() => return,
                        e = rx.recv() => e,
                    };
                    let (Some(hub), Some(book)) = (hub.upgrade(), book.upgrade()) else {
                        return;
                    };
                    match event {
                        Ok(ChangeEvent::Session { session, signal }) => {
                            if matches!(signal, SessionSignal::Changed | SessionSignal::Ended) {
                                book.forget(&session);
                            }
                            hub.route(&session, signal);
                        }
                        Ok(_) => {}
                        // Missed signals: waiting calls also look in the store on their own,
                        // and no copy of a session can be trusted.
                        Err(broadcast::error::RecvError::Lagged(_)) => {
                            book.forget_all();
                            hub.wake_all();
                            tokio::spawn(async move { hub.recheck_ended(&book).await });
                        }
                        Err(broadcast::error::RecvError::Closed) => {
                            book.forget_all();
                            hub.wake_all();
                            tokio::spawn(async move { hub.recheck_ended(&book).await });
                            break;
                        }
                    }
                }
                // A gap: the bus put a new channel in place of the closed one, listened to
                // at once (a cancellation announced meanwhile would be missed).
            }
        });
    }

    /// Cancels `call` of `session` if it runs here; whether a live call was cancelled now
    /// (not one cancelled before, whose key is free for another call, maybe elsewhere).
    pub(crate) fn cancel_here(&self, session: &str, call: &str) -> bool {
        let key: RunKey = (session.into(), call.into());
        lock(&self.running)
            .get(&key)
            .filter(|(_, token)| !token.is_cancelled())
            .map(|(_, token)| token.cancel())
            .is_some()
    }

    /// Whether `session` may send one more cancellation on to the other replicas: each
    /// wakes every replica (and a burst past the bus's channel makes every listen stream
    /// start over), so each session has [`CANCELS_PER_WINDOW`] per [`CANCEL_WINDOW`].
    pub(crate) fn may_send_cancel(&self, session: &str) -> bool {
        self.may_send_cancel_at(session, std::time::Instant::now())
    }

    fn may_send_cancel_at(&self, session: &str, now: std::time::Instant) -> bool {
        let mut sent = lock(&self.cancels_sent);
        if sent.len() >= MAX_CANCELLING && !sent.contains_key(session) {
            sent.retain(|_, (since, _)| now.duration_since(*since) < CANCEL_WINDOW);
            if sent.len() >= MAX_CANCELLING {
                sent.clear();
            }
        }
        let (since, count) = sent.entry(session.into()).or_insert((now, 0));
        if now.duration_since(*since) >= CANCEL_WINDOW {
            (*since, *count) = (now, 0);
        }
        *count = count.saturating_add(1);
        *count <= CANCELS_PER_WINDOW
    }

    /// Hands `signal` to the call of `session` it concerns, if that runs here.
    pub(crate) fn route(&self, session: &str, signal: SessionSignal) {
        match signal {
            SessionSignal::Cancel(call) => {
                self.cancel_here(session, &call);
            }
            SessionSignal::Reply(key) => self.deliver(&key, Delivery::Stored),
            // Nobody is left to answer the session's calls or to read what they send: a
            // call waiting for input would otherwise hold its slot until its input timeout.
            SessionSignal::Ended => {
                {
                    let mut ended = lock(&self.ended);
                    ended.retain(|_, at| at.elapsed() < ENDED_REMEMBERED);
                    // Full (a flood of ends): the oldest goes, not this one.
                    if ended.len() >= MAX_ENDED {
                        let oldest = ended
                            .iter()
                            .min_by_key(|(_, at)| **at)
                            .map(|(s, _)| s.clone());
                        if let Some(oldest) = oldest {
                            ended.remove(&oldest);
                        }
                    }
                    ended.insert(session.into(), std::time::Instant::now());
                }
                for ((of, _), (_, token)) in lock(&self.running).iter() {
                    if **of == *session {
                        token.cancel();
                    }
                }
            }
            SessionSignal::Changed | SessionSignal::Listening(_) => {}
        }
    }

    /// After a gap (the bus may have lost events), ends the calls of the sessions running
    /// here that ended meanwhile, as their end would have: one lost with the gap would leave
    /// a call waiting for input until its timeout, holding its slot and turns. Each session
    /// is read afresh.
    async fn recheck_ended(&self, book: &Book) {
        let sessions: std::collections::BTreeSet<Box<str>> =
            lock(&self.running).keys().map(|(s, _)| s.clone()).collect();
        for id in sessions {
            let gone = match book.session(&id, true).await {
                Ok(None) => true,
                Ok(Some(s)) => s.record.expired(now_millis()).is_some(),
                // Unknown for now: the call's own waits end it at the latest.
                Err(_) => false,
            };
            if gone {
                self.route(&id, SessionSignal::Ended);
            }
        }
    }

    fn wake_all(&self) {
        for tx in lock(&self.waiting).values() {
            let _ = tx.try_send(Delivery::Stored);
        }
    }

    /// Hands an answer to the call waiting for `key`, if it waits in this process.
    pub(crate) fn deliver(&self, key: &str, delivery: Delivery) {
        if let Some(tx) = lock(&self.waiting).get(key) {
            let _ = tx.try_send(delivery);
        }
    }

    /// Registers a call of `session` under `key` (see `legacy::call_key`): a cancellation
    /// naming that key, or the session's end, cancels `token` until the registration is
    /// dropped; a session whose end was heard lately cancels it at once. `None` while another call of this process, not cancelled, runs under the
    /// same key.
    pub(crate) fn run(
        self: &Arc<Self>,
        session: &str,
        call: &str,
        token: CancellationToken,
    ) -> Option<Running> {
        let key: RunKey = (session.into(), call.into());
        let n = self
            .registrations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut running = lock(&self.running);
        if running
            .get(&key)
            .is_some_and(|(_, live)| !live.is_cancelled())
        {
            return None;
        }
        if self.ended_lately(session) {
            token.cancel();
        }
        running.insert(key.clone(), (n, token));
        Some(Running {
            hub: Arc::clone(self),
            key,
            n,
        })
    }

    /// Whether the end of `session` was heard in the last [`ENDED_REMEMBERED`].
    pub(crate) fn ended_lately(&self, session: &str) -> bool {
        lock(&self.ended)
            .get(session)
            .is_some_and(|at| at.elapsed() < ENDED_REMEMBERED)
    }

    /// Waits for the answer filed under `key` from now on, until the waiter is dropped.
    pub(crate) fn wait(self: &Arc<Self>, key: &str) -> Waiter {
        let (tx, rx) = mpsc::channel(4);
        lock(&self.waiting).insert(key.into(), tx);
        Waiter {
            hub: Arc::clone(self),
            key: key.into(),
            rx,
        }
    }
}

/// A call registered for cancellation; dropping it unregisters the call.
pub(crate) struct Running {
    hub: Arc<Hub>,
    key: RunKey,
    n: u64,
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut running = lock(&self.hub.running);
        if running.get(&self.key).is_some_and(|(n, _)| *n == self.n) {
            running.remove(&self.key);
        }
    }
}

/// A call waiting for one answer; dropping it stops the wait.
pub(crate) struct Waiter {
    hub: Arc<Hub>,
    key: Box<str>,
    rx: mpsc::Receiver<Delivery>,
}

impl Waiter {
    /// The key the answer is filed under.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// The next delivery, or `None` after `poll`, when it is time to look in the store
    /// anyway (a signal can be lost while the bus reconnects).
    pub(crate) async fn next(&mut self, poll: Duration) -> Option<Delivery> {
        tokio::time::timeout(poll, self.rx.recv())
            .await
            .ok()
            .flatten()
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        lock(&self.hub.waiting).remove(&self.key);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each session sends on its budget of cancellations per window, whatever another one
    /// does; a new window starts a new budget; the windows kept stay bounded.
    #[test]
    fn each_session_sends_on_a_bounded_number_of_cancellations() {
        let hub = Hub::default();
        let start = std::time::Instant::now();
        for _ in 0..CANCELS_PER_WINDOW {
            assert!(hub.may_send_cancel_at("s", start));
        }
        assert!(!hub.may_send_cancel_at("s", start + Duration::from_secs(1)));
        assert!(
            hub.may_send_cancel_at("t", start),
            "another session's budget"
        );
        assert!(
            hub.may_send_cancel_at("s", start + CANCEL_WINDOW),
            "a new window"
        );
        for n in 0..MAX_CANCELLING * 2 {
            hub.may_send_cancel_at(&format!("session-{n}"), start + CANCEL_WINDOW);
        }
        assert!(lock(&hub.cancels_sent).len() <= MAX_CANCELLING);
    }

    /// A cancellation reaches a live call here once; a call cancelled before frees its key
    /// (its id may run elsewhere now), so it does not count as running here.
    #[test]
    fn only_a_live_call_is_cancelled_here() {
        let hub = Arc::new(Hub::default());
        let token = CancellationToken::new();
        let _running = hub.run("s", "k", token.clone()).expect("free");
        assert!(!hub.cancel_here("s", "other"));
        assert!(hub.cancel_here("s", "k"));
        assert!(token.is_cancelled());
        assert!(!hub.cancel_here("s", "k"), "already cancelled");
    }

    /// One live call per key: a second is refused while the first runs, and takes the key
    /// once the first is cancelled; the first one's end then leaves the second registered.
    #[test]
    fn a_key_names_one_live_call() {
        let hub = Arc::new(Hub::default());
        let (first, second) = (CancellationToken::new(), CancellationToken::new());
        let running = hub.run("s", "k", first.clone()).expect("free");
        assert!(hub.run("s", "k", second.clone()).is_none(), "taken");
        assert!(hub.run("other", "k", CancellationToken::new()).is_some());
        hub.route("s", SessionSignal::Cancel("k".into()));
        assert!(first.is_cancelled());
        let again = hub
            .run("s", "k", second.clone())
            .expect("freed by the cancellation");
        drop(running);
        hub.route("s", SessionSignal::Cancel("k".into()));
        assert!(
            second.is_cancelled(),
            "the first call's end unregistered the second"
        );
        drop(again);
        assert!(lock(&hub.running).get(&("s".into(), "k".into())).is_none());
    }

    /// The hub hears the bus for as long as it exists, whatever the server's state (a
    /// draining server's calls still hear their cancellations), and its task ends with it.
    #[tokio::test]
    async fn the_hub_hears_the_bus_until_it_goes() {
        let bus: Arc<dyn NotificationBus> = Arc::new(crate::bus::InProcessBus::default());
        let hub = Arc::new(Hub::default());
        let book = Arc::new(Book::new(None));
        hub.listen(&bus, &book);
        let token = CancellationToken::new();
        let call = hub.run("s", "k", token.clone()).unwrap();
        let cancel = ChangeEvent::Session {
            session: "s".into(),
            signal: SessionSignal::Cancel("k".into()),
        };
        // Announced until heard: the hub's task subscribes once it first runs.
        tokio::time::timeout(Duration::from_secs(30), async {
            while !token.is_cancelled() {
                bus.publish(cancel.clone()).await.unwrap();
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the hub heard the cancellation");
        assert_eq!(Arc::strong_count(&bus), 2, "the hub's task holds the bus");
        drop(call);
        drop(hub);
        tokio::time::timeout(Duration::from_secs(30), async {
            while Arc::strong_count(&bus) > 1 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the hub's task ended with the hub");
    }

    /// After a gap, the calls of a session that ended meanwhile (its end lost with the gap)
    /// are cancelled as its end would have; those of a session still open run on.
    #[tokio::test]
    async fn a_gap_ends_the_calls_of_sessions_that_ended_in_it() {
        use crate::session::{Session, SessionCap, SessionKind, SessionState};
        use crate::store::HandleRecord;
        let book = Arc::new(Book::new(None));
        let kept = Session {
            record: Arc::new(HandleRecord::mint::<SessionKind>(
                &crate::Principal::anonymous(),
                now_millis(),
            )),
            state: Arc::new(SessionState {
                version: "2025-11-25".into(),
                capabilities: Default::default(),
                client_info: wharf_protocol::Implementation::new("c", "1"),
                log_level: None,
                subscriptions: Default::default(),
            }),
            booked: false,
        };
        let turns = Arc::new(crate::mutation::MutationQueue::new(1));
        book.insert(&kept, &turns, now_millis(), SessionCap::Refusing(10))
            .await
            .unwrap();
        let hub = Arc::new(Hub::default());
        let (gone, open) = (CancellationToken::new(), CancellationToken::new());
        let _gone = hub.run("gone", "1", gone.clone()).unwrap();
        let _open = hub.run(kept.id(), "1", open.clone()).unwrap();
        // A bus that keeps one event per listener: a burst makes the hub's listener lag,
        // a gap. Sent until heard: the hub's task subscribes once it first runs.
        let bus: Arc<dyn NotificationBus> = Arc::new(crate::bus::InProcessBus::new(1));
        hub.listen(&bus, &book);
        tokio::time::timeout(Duration::from_secs(30), async {
            while !gone.is_cancelled() {
                for _ in 0..4 {
                    bus.publish(ChangeEvent::ToolsListChanged).await.unwrap();
                }
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the ended session's call was cancelled after the gap");
        // A session still open is not ended by a recheck.
        hub.recheck_ended(&book).await;
        assert!(!open.is_cancelled(), "the open session's call");
    }

    /// A session's end cancels every call of it running here, and no other.
    #[test]
    fn a_sessions_end_cancels_its_calls() {
        let hub = Arc::new(Hub::default());
        let tokens: Vec<_> = (0..3).map(|_| CancellationToken::new()).collect();
        let _a = hub.run("s", "1", tokens[0].clone()).unwrap();
        let _b = hub.run("s", "2", tokens[1].clone()).unwrap();
        let _c = hub.run("t", "1", tokens[2].clone()).unwrap();
        hub.route("s", SessionSignal::Ended);
        let cancelled: Vec<bool> = tokens.iter().map(CancellationToken::is_cancelled).collect();
        assert_eq!(cancelled, [true, true, false]);
    }

    /// A call that registers just after its session's end was heard (it read the session
    /// before the end) is cancelled as it starts; another session's call is not.
    #[test]
    fn a_call_of_a_session_that_just_ended_is_cancelled_as_it_starts() {
        let hub = Arc::new(Hub::default());
        hub.route("s", SessionSignal::Ended);
        let late = CancellationToken::new();
        let _late = hub.run("s", "1", late.clone()).unwrap();
        assert!(late.is_cancelled());
        let other = CancellationToken::new();
        let _other = hub.run("t", "1", other.clone()).unwrap();
        assert!(!other.is_cancelled());
    }
}
