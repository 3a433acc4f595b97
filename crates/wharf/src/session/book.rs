//! Where sessions live: in the shared store, so that any replica serves any request of a
//! session, or in this process when the server has no store (one replica only).
//!
//! Reading a session from the store on every request would cost each legacy call a round
//! trip (measured: a third of the throughput on SQLite, a sixth on PostgreSQL), so each
//! process keeps the sessions it served recently. What another replica changes reaches that
//! copy through the bus: the replica that changed or ended a session announces it, and the
//! hub drops the copy ([`Book::forget`]); when the bus loses events, every copy goes. A copy
//! is trusted for [`CACHE_TTL`] at most, which bounds how stale it can be should an
//! announcement be missed before the hub listens.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Session, SessionKind, SessionState};
use crate::mutation::{KeyTurn, MutationQueue};
use crate::store::{HandleKind, HandleRecord, Millis, Store, StoreError, TxMode};

/// Sessions a server without a store keeps at most (the expired ones go first); also the
/// most sessions one process keeps copies of.
const CAP: usize = 10_000;

/// How many live sessions one owner may hold, and what opening one more does.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SessionCap {
    /// An authenticated principal's cap: its least recently used sessions end to make room
    /// (a client whose session ended hears 404 and opens another, 2025-11-25 transports),
    /// so that sessions its clients abandoned without a DELETE never lock it out.
    Evicting(u64),
    /// Anonymous callers' cap, all of them together: past it the book is busy for them
    /// (ending one stranger's session for another's would let one caller end them all).
    Refusing(u64),
}

/// Sessions one opening ends at most: a cap lowered under sessions opened before shrinks
/// the owner's share over several openings, each a bounded write.
const MAX_ENDED_PER_OPENING: u64 = 16;

impl SessionCap {
    /// How many of the `held` live sessions must end before one more opens; `Busy` when
    /// none may.
    fn excess(self, held: u64) -> Result<u64, StoreError> {
        match self {
            SessionCap::Evicting(max) => Ok(held
                .saturating_add(1)
                .saturating_sub(max.max(1))
                .min(MAX_ENDED_PER_OPENING)),
            SessionCap::Refusing(max) if held >= max => Err(StoreError::Busy(format!(
                "{max} sessions are open for anonymous callers already"
            ))),
            SessionCap::Refusing(_) => Ok(0),
        }
    }
}

/// How long a copy of a stored session is used without reading it again.
pub(crate) const CACHE_TTL: Duration = Duration::from_secs(2);

/// Longest a change of a session waits for its turn (its lock, the owner's share of the
/// store's lock sessions) before it is answered busy.
const TURN_WAIT: Duration = Duration::from_secs(10);

/// The session book of one server.
pub(crate) enum Book {
    /// In the store, as handles, with this process's copies of the ones it served lately.
    Store {
        store: Arc<dyn Store>,
        copies: Mutex<HashMap<String, (Session, Instant)>>,
    },
    /// In this process.
    Local(Mutex<HashMap<String, Session>>),
}

impl Book {
    pub(crate) fn new(store: Option<&Arc<dyn Store>>) -> Self {
        match store {
            Some(s) => Book::Store {
                store: Arc::clone(s),
                copies: Mutex::default(),
            },
            None => Book::Local(Mutex::default()),
        }
    }

    /// Whether sessions are shared with other processes on the same store.
    pub(crate) fn is_shared(&self) -> bool {
        matches!(self, Book::Store { .. })
    }

    /// The session `id`, whoever owns it and whether it expired or not (the caller judges);
    /// `fresh` reads the store even when this process holds a recent copy.
    pub(crate) async fn session(
        &self,
        id: &str,
        fresh: bool,
    ) -> Result<Option<Session>, StoreError> {
        match self {
            Book::Local(map) => Ok(lock(map).get(id).cloned()),
            Book::Store { store, copies } => {
                if !fresh {
                    if let Some((s, at)) = lock(copies).get(id) {
                        if at.elapsed() < CACHE_TTL {
                            return Ok(Some(s.clone()));
                        }
                    }
                }
                let Some(record) = store.load_handle(id).await? else {
                    lock(copies).remove(id);
                    return Ok(None);
                };
                if record.kind != <super::SessionKind as HandleKind>::KIND {
                    return Ok(None);
                }
                let Some(session) = self.readable(record) else {
                    return Ok(None);
                };
                self.keep(&session);
                Ok(Some(session))
            }
        }
    }

    /// A stored session, or `None` when this build cannot read its record (another version
    /// wrote it): such a session is gone for this replica, its copy dropped, and its client
    /// hears 404 and opens another (2025-11-25 transports: a server MAY end a session at any
    /// time), where a 503 would have it retry the same one until it expires.
    fn readable(&self, record: HandleRecord) -> Option<Session> {
        let id = record.id.clone();
        match Session::from_record(record) {
            Ok(session) => Some(session),
            Err(e) => {
                tracing::warn!(error = %e, "a stored legacy session cannot be read: answered as ended");
                self.forget(&id);
                None
            }
        }
    }

    /// Keeps a copy of a stored session.
    fn keep(&self, session: &Session) {
        if let Book::Store { copies, .. } = self {
            let mut copies = lock(copies);
            if copies.len() >= CAP {
                copies.clear();
            }
            copies.insert(session.id().to_owned(), (session.clone(), Instant::now()));
        }
    }

    /// Drops this process's copy of session `id` (another replica changed or ended it).
    pub(crate) fn forget(&self, id: &str) {
        if let Book::Store { copies, .. } = self {
            lock(copies).remove(id);
        }
    }

    /// Drops every copy (the bus may have lost what would have dropped some).
    pub(crate) fn forget_all(&self) {
        if let Book::Store { copies, .. } = self {
            lock(copies).clear();
        }
    }

    /// Stores a new session within `cap`, and returns the ids of the sessions it ended to
    /// make room (an authenticated owner's least recently used ones). An owner's openings
    /// that evict take turns (through `turns`, as [`Book::update`] does): two at once would
    /// count the same sessions, end the same least recently used ones, and each add its
    /// own, so that a client opening many at once would grow its share past the cap round
    /// after round. Anonymous openings, which refuse past their cap, do not: one turn for
    /// every anonymous caller would queue them all, and those in flight together can only
    /// pass the cap by their number.
    pub(crate) async fn insert(
        &self,
        session: &Session,
        turns: &Arc<MutationQueue>,
        now: Millis,
        cap: SessionCap,
    ) -> Result<Vec<String>, StoreError> {
        let owner = session.owner();
        let kind = <SessionKind as HandleKind>::KIND;
        match self {
            Book::Store { store, .. } => {
                let turn = match cap {
                    SessionCap::Evicting(_) => {
                        Some(turn(turns, format!("sessions-of:{owner}"), owner, store).await?)
                    }
                    SessionCap::Refusing(_) => None,
                };
                let mut tx = store.begin(TxMode::Write).await?;
                if let Some(fence) = turn.as_ref().and_then(KeyTurn::fence) {
                    tx.fence(&fence);
                }
                let held = tx.live_handles(owner, kind, now).await?;
                let excess = cap.excess(held)?;
                let ended = match excess {
                    0 => Vec::new(),
                    n => tx.least_recently_used_handles(owner, kind, now, n).await?,
                };
                for id in &ended {
                    tx.retire_handle(id).await?;
                }
                tx.create_handle(&session.to_record()).await?;
                tx.commit().await?;
                if let Some(turn) = turn {
                    turn.end().await;
                }
                for id in &ended {
                    self.forget(id);
                }
                self.keep(session);
                Ok(ended)
            }
            Book::Local(map) => {
                let mut map = lock(map);
                if map.len() >= CAP {
                    map.retain(|_, s| s.record.expired(now).is_none());
                }
                if map.len() >= CAP {
                    return Err(StoreError::Busy(format!(
                        "this process holds {CAP} live sessions already"
                    )));
                }
                let mut held: Vec<(Millis, &str)> = map
                    .values()
                    .filter(|s| s.owner() == owner && s.record.expired(now).is_none())
                    .map(|s| (s.record.last_used_at, s.id()))
                    .collect();
                let excess = cap.excess(held.len() as u64)?;
                held.sort_unstable();
                let ended: Vec<String> = held
                    .iter()
                    .take(usize::try_from(excess).unwrap_or(usize::MAX))
                    .map(|(_, id)| (*id).to_owned())
                    .collect();
                for id in &ended {
                    map.remove(id);
                }
                map.insert(session.id().to_owned(), session.clone());
                Ok(ended)
            }
        }
    }

    /// Applies `change` to `session`'s state as the book holds it now, and returns the
    /// session changed; `None` when it ended meanwhile. A `change` that answers `false`
    /// changed nothing (or refused to): then nothing is written, and the session comes back
    /// as it is now, its last use left as it was. Writers of one session take turns
    /// (through `turns`, as the owner's mutating calls do: the store's lock on the session
    /// where it has one shared by processes, taken within the owner's fair share of the
    /// store's lock sessions; on PostgreSQL the handle's lock too, on SQLite the write
    /// transaction): each changes what the last one wrote, so two subscriptions made at once
    /// on two replicas both stay.
    pub(crate) async fn update(
        &self,
        session: &Session,
        turns: &Arc<MutationQueue>,
        now: Millis,
        change: impl FnOnce(&mut SessionState) -> bool,
    ) -> Result<Option<Session>, StoreError> {
        let id = session.id();
        match self {
            Book::Store { store, .. } => {
                // Redis has no lock a transaction can take: its mutation lock orders the
                // writers, and its fence voids a commit made after the lease ran out.
                let turn = turn(turns, format!("session:{id}"), session.owner(), store).await?;
                // Read before the transaction begins, so that the change never holds one
                // connection while it waits for a second. Every other change of the session
                // waits for this turn; its end does not, but then the hold below finds it
                // gone. Held exclusively (a use is recorded), nothing else commits on it
                // until this transaction does.
                let Some(record) = store.load_handle(id).await? else {
                    self.forget(id);
                    turn.end().await;
                    return Ok(None);
                };
                let Some(mut changed) = self.readable(record) else {
                    turn.end().await;
                    return Ok(None);
                };
                if !change(changed.state_mut()) {
                    turn.end().await;
                    self.keep(&changed);
                    return Ok(Some(changed));
                }
                let mut tx = store.begin(TxMode::Write).await?;
                if let Some(fence) = turn.fence() {
                    tx.fence(&fence);
                }
                if !tx.hold_handle(id, Some(now)).await? {
                    self.forget(id);
                    drop(tx);
                    turn.end().await;
                    return Ok(None);
                }
                changed.touched(now);
                tx.retire_handle(id).await?;
                tx.create_handle(&changed.to_record()).await?;
                tx.commit().await?;
                turn.end().await;
                self.keep(&changed);
                Ok(Some(changed))
            }
            Book::Local(map) => Ok(lock(map).get_mut(id).map(|s| {
                if change(s.state_mut()) {
                    s.touched(now);
                }
                s.clone()
            })),
        }
    }

    /// Records a use at `now`, pushing back the idle expiry.
    pub(crate) async fn touch(&self, session: &mut Session, now: Millis) -> Result<(), StoreError> {
        session.touched(now);
        match self {
            Book::Store { store, copies } => {
                store.touch_handle(session.id(), now).await?;
                // The copy keeps its age: a use is no news of the session.
                if let Some((copy, _)) = lock(copies).get_mut(session.id()) {
                    copy.touched(now);
                }
            }
            Book::Local(map) => {
                if let Some(s) = lock(map).get_mut(session.id()) {
                    s.touched(now);
                }
            }
        }
        Ok(())
    }

    /// Ends a session; `false` when there was none. Two ends at once may both say it
    /// ended.
    pub(crate) async fn remove(&self, id: &str) -> Result<bool, StoreError> {
        match self {
            Book::Store { store, .. } => {
                self.forget(id);
                if store.load_handle(id).await?.is_none() {
                    return Ok(false);
                }
                // Retired without holding it first: on PostgreSQL a transaction that holds
                // the handle (shared) and then retires it (exclusive) deadlocks with another
                // doing the same, and one of two ends sent at once was answered "busy". Nor
                // does an end wait for the session's turn: it never waits behind the owner's
                // calls. A change under way (which holds the handle) commits first, and the
                // end retires what it wrote.
                let mut tx = store.begin(TxMode::Write).await?;
                tx.retire_handle(id).await?;
                tx.commit().await?;
                Ok(true)
            }
            Book::Local(map) => Ok(lock(map).remove(id).is_some()),
        }
    }

    /// The store sessions are kept in, if they are.
    pub(crate) fn store(&self) -> Option<&Arc<dyn Store>> {
        match self {
            Book::Store { store, .. } => Some(store),
            Book::Local(_) => None,
        }
    }
}

/// The turn on `key` of a session's writers, within `owner`'s share of the store's lock
/// sessions; bounded as a tool call's wait is: behind the owner's long calls, busy. (No
/// mutation key of a tool starts like the book's: theirs start with a length.)
async fn turn(
    turns: &Arc<MutationQueue>,
    key: String,
    owner: &str,
    store: &Arc<dyn Store>,
) -> Result<KeyTurn, StoreError> {
    let wait = turns.wait_turn(key, owner, Some(store));
    tokio::time::timeout(TURN_WAIT, wait).await.map_err(|_| {
        StoreError::Busy(format!(
            "a session's change waited {}s for its turn",
            TURN_WAIT.as_secs()
        ))
    })?
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding this lock cannot leave a map half-updated.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
