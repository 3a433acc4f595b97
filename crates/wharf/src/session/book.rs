//! Where sessions live: in the shared store, so that any replica serves any request of a
//! session, or in this process when the server has no store (one replica only).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::store::{HandleRecord, Millis, Store, StoreError, TxMode};

/// Sessions a server without a store keeps at most (the oldest expired ones go first).
const LOCAL_CAP: usize = 10_000;

/// The session book of one server.
pub(crate) enum Book {
    /// In the store, as handles.
    Store(Arc<dyn Store>),
    /// In this process.
    Local(Mutex<HashMap<String, HandleRecord>>),
}

impl Book {
    pub(crate) fn new(store: Option<&Arc<dyn Store>>) -> Self {
        match store {
            Some(s) => Book::Store(Arc::clone(s)),
            None => Book::Local(Mutex::new(HashMap::new())),
        }
    }

    /// Whether sessions are shared with other processes on the same store.
    pub(crate) fn is_shared(&self) -> bool {
        matches!(self, Book::Store(_))
    }

    pub(crate) async fn load(&self, id: &str) -> Result<Option<HandleRecord>, StoreError> {
        match self {
            Book::Store(store) => store.load_handle(id).await,
            Book::Local(map) => Ok(lock(map).get(id).cloned()),
        }
    }

    /// Stores a new session.
    pub(crate) async fn insert(
        &self,
        record: &HandleRecord,
        now: Millis,
    ) -> Result<(), StoreError> {
        match self {
            Book::Store(store) => {
                let mut tx = store.begin(TxMode::Write).await?;
                tx.create_handle(record).await?;
                tx.commit().await
            }
            Book::Local(map) => {
                let mut map = lock(map);
                if map.len() >= LOCAL_CAP {
                    map.retain(|_, r| r.expired(now).is_none());
                }
                if map.len() >= LOCAL_CAP {
                    return Err(StoreError::Busy(format!(
                        "this process holds {LOCAL_CAP} live sessions already"
                    )));
                }
                map.insert(record.id.clone(), record.clone());
                Ok(())
            }
        }
    }

    /// Replaces a session's record (its state changed), unless the session ended meanwhile.
    pub(crate) async fn update(&self, record: &HandleRecord) -> Result<bool, StoreError> {
        match self {
            Book::Store(store) => {
                let mut tx = store.begin(TxMode::Write).await?;
                // Held, so a concurrent DELETE waits for this write or wins before it.
                if !tx.hold_handle(&record.id, None).await? {
                    return Ok(false);
                }
                tx.retire_handle(&record.id).await?;
                tx.create_handle(record).await?;
                tx.commit().await?;
                Ok(true)
            }
            Book::Local(map) => Ok(lock(map)
                .get_mut(&record.id)
                .map(|r| *r = record.clone())
                .is_some()),
        }
    }

    /// Records a use, pushing back the idle expiry.
    pub(crate) async fn touch(&self, id: &str, now: Millis) -> Result<(), StoreError> {
        match self {
            Book::Store(store) => store.touch_handle(id, now).await,
            Book::Local(map) => {
                if let Some(r) = lock(map).get_mut(id) {
                    r.last_used_at = r.last_used_at.max(now);
                }
                Ok(())
            }
        }
    }

    /// Ends a session; `false` when there was none.
    pub(crate) async fn remove(&self, id: &str) -> Result<bool, StoreError> {
        match self {
            Book::Store(store) => {
                let mut tx = store.begin(TxMode::Write).await?;
                if !tx.hold_handle(id, None).await? {
                    return Ok(false);
                }
                tx.retire_handle(id).await?;
                tx.commit().await?;
                Ok(true)
            }
            Book::Local(map) => Ok(lock(map).remove(id).is_some()),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding this lock cannot leave a map half-updated.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
