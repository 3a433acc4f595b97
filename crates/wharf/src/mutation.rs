//! The mutation serializer: calls of tools declared with
//! `ToolBuilder::mutates` run one at a time per key,
//! first come first served. Inside a process a FIFO line per key; behind it, the store's
//! own lock when the store is shared between replicas. Store locks cost the store a session
//! each (PostgreSQL), so one principal holds at most a few of them at once per process, and
//! where the sessions are few ([`Store::lock_sessions`]) they are shared out fairly: a
//! quarter of them stays for principals that hold none.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::{OwnedMutexGuard, OwnedSemaphorePermit, Semaphore};

use crate::fair_share::{FairShare, Share};

use crate::store::{Fence, KeyLock, Store, StoreError};

/// Lines kept before idle ones are forgotten on the next insert.
const LINES_KEPT: usize = 1024;

/// Principals whose store-lock caps are kept before idle ones are forgotten.
const PRINCIPALS_KEPT: usize = 4096;

/// One FIFO line per key (tokio's mutex queues its waiters in order).
pub(crate) struct MutationQueue {
    map: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Store locks one principal may hold or wait for at once in this process.
    per_principal: usize,
    principals: Mutex<HashMap<String, Arc<Semaphore>>>,
    /// The store's lock sessions, once the first shared lock is taken.
    sessions: OnceLock<Option<Arc<FairShare>>>,
}

impl MutationQueue {
    pub(crate) fn new(per_principal: usize) -> Self {
        MutationQueue {
            map: Mutex::new(HashMap::new()),
            // At least 1 by `ServerBuilder::build`.
            per_principal,
            principals: Mutex::new(HashMap::new()),
            sessions: OnceLock::new(),
        }
    }

    /// A slot among the principal's store locks, waiting in turn for one.
    async fn principal_slot(&self, principal: &str) -> Option<OwnedSemaphorePermit> {
        let sem = {
            let mut map = self.principals.lock().unwrap_or_else(|p| p.into_inner());
            if map.len() >= PRINCIPALS_KEPT && !map.contains_key(principal) {
                let cap = self.per_principal;
                map.retain(|_, s| s.available_permits() < cap);
            }
            Arc::clone(
                map.entry(principal.to_owned())
                    .or_insert_with(|| Arc::new(Semaphore::new(self.per_principal))),
            )
        };
        sem.acquire_owned().await.ok()
    }
}

/// A call's turn on its key: the process's line and, on a shared store, the store's lock.
/// Dropping it hands the key to the next waiter.
pub(crate) struct KeyTurn {
    lock: Option<Box<dyn KeyLock>>,
    // Dropped after the lock: the session goes back once the lock is let go.
    _session: Option<Share>,
    _slot: Option<OwnedSemaphorePermit>,
    _line: InLine,
}

impl KeyTurn {
    /// What the call's transaction must check at commit, where the lock can end under it.
    pub(crate) fn fence(&self) -> Option<Fence> {
        self.lock.as_ref().and_then(|l| l.fence())
    }

    /// Ends the turn once the call's writes are committed.
    pub(crate) async fn end(mut self) {
        if let Some(lock) = self.lock.take() {
            lock.release().await;
        }
    }
}

/// A place in a process line; leaving it (however the wait ends) forgets the line when
/// nobody else is in it.
struct InLine {
    lines: Arc<MutationQueue>,
    key: String,
    guard: Option<OwnedMutexGuard<()>>,
}

impl Drop for InLine {
    fn drop(&mut self) {
        if self.guard.take().is_none() {
            tracing::debug!("call cancelled while waiting for its turn; it never ran");
        }
        let mut map = self.lines.map.lock().unwrap_or_else(|p| p.into_inner());
        if map
            .get(&self.key)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            map.remove(&self.key);
        }
    }
}

impl MutationQueue {
    /// Waits for the turn on `key`: first in this process's line, then for the store's lock.
    /// Dropping the future leaves both lines without ever holding the key.
    pub(crate) async fn wait_turn(
        self: &Arc<Self>,
        key: String,
        principal: &str,
        store: Option<&Arc<dyn Store>>,
    ) -> Result<KeyTurn, StoreError> {
        let line = {
            let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
            if map.len() >= LINES_KEPT && !map.contains_key(&key) {
                map.retain(|_, m| Arc::strong_count(m) > 1);
            }
            Arc::clone(map.entry(key.clone()).or_default())
        };
        let mut place = InLine {
            lines: Arc::clone(self),
            key,
            guard: None,
        };
        place.guard = Some(match Arc::clone(&line).try_lock_owned() {
            Ok(guard) => guard,
            Err(_) => {
                // Operators see calls waiting on one another at debug level; tests wait for
                // these lines too.
                tracing::debug!("call waits for its turn on its key");
                line.lock_owned().await
            }
        });
        let shared = store.filter(|s| s.shares_locks());
        let slot = match shared {
            Some(_) => self.principal_slot(principal).await,
            None => None,
        };
        let gate = shared.and_then(|store| {
            self.sessions
                .get_or_init(|| store.lock_sessions().map(|n| Arc::new(FairShare::new(n))))
                .clone()
        });
        let session = match gate {
            Some(gate) => Some(gate.enter(principal).await),
            None => None,
        };
        let lock = match shared {
            Some(store) => store.lock_key(&place.key).await?,
            None => None,
        };
        Ok(KeyTurn {
            lock,
            _session: session,
            _slot: slot,
            _line: place,
        })
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().map(|m| m.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    // Time is paused in these tests: a sleep ends only once every other task waits, so "each
    // waiter queues before the next one arrives" holds whatever the machine's speed.
    #[tokio::test(start_paused = true)]
    async fn one_call_per_key_in_arrival_order_and_other_keys_in_parallel() {
        let lines = Arc::new(MutationQueue::new(8));
        let first = lines.wait_turn("a".into(), "p", None).await.unwrap();
        // Another key is not held up.
        let other = lines.wait_turn("b".into(), "p", None).await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..5 {
            let (lines, order) = (Arc::clone(&lines), Arc::clone(&order));
            waiters.push(tokio::spawn(async move {
                let turn = lines.wait_turn("a".into(), "p", None).await.unwrap();
                order.lock().unwrap().push(i);
                tokio::task::yield_now().await;
                turn.end().await;
            }));
            // Each waiter queues before the next one arrives.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            order.lock().unwrap().is_empty(),
            "nobody runs while a holds"
        );
        first.end().await;
        for w in waiters {
            w.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
        other.end().await;
        assert_eq!(lines.len(), 0, "idle lines are forgotten");
    }

    #[tokio::test(start_paused = true)]
    async fn one_principal_holds_at_most_its_share_of_store_locks() {
        let lines = Arc::new(MutationQueue::new(2));
        let (a, b) = (
            lines.principal_slot("p").await.unwrap(),
            lines.principal_slot("p").await.unwrap(),
        );
        // A third waits for one of them; another principal does not.
        let third =
            tokio::time::timeout(Duration::from_millis(50), lines.principal_slot("p")).await;
        assert!(third.is_err(), "the principal's share is taken");
        let other = lines.principal_slot("q").await;
        assert!(other.is_some());
        drop(a);
        assert!(lines.principal_slot("p").await.is_some());
        drop(b);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_waiter_leaves_the_line_and_the_key_goes_past_it() {
        let lines = Arc::new(MutationQueue::new(8));
        let first = lines.wait_turn("k".into(), "p", None).await.unwrap();
        let waiter = |lines: &Arc<MutationQueue>| {
            let lines = Arc::clone(lines);
            tokio::spawn(async move { lines.wait_turn("k".into(), "p", None).await.unwrap() })
        };
        // In line: the one to be cancelled, then the next caller behind it.
        let cancelled = waiter(&lines);
        tokio::time::sleep(Duration::from_millis(1)).await;
        let next = waiter(&lines);
        tokio::time::sleep(Duration::from_millis(1)).await;
        cancelled.abort();
        assert!(cancelled.await.is_err_and(|e| e.is_cancelled()));
        first.end().await;
        // Had the cancelled waiter kept its place, it would hold the key now and the next
        // caller would wait for ever (paused time makes that timeout fire at once).
        let turn = tokio::time::timeout(Duration::from_secs(60), next)
            .await
            .expect("the key went past the cancelled waiter")
            .unwrap();
        assert_eq!(lines.len(), 1, "only the holder's line is left");
        turn.end().await;
        assert_eq!(lines.len(), 0, "idle lines are forgotten");
    }
}
