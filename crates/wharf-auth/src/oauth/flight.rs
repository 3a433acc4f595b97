//! One check per token at a time: requests that carry the same token, not yet cached, while
//! it is being checked wait for that check instead of each starting their own (a client that
//! sends a burst of calls with a new token costs one introspection, not one per call).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::OnceCell;

/// The checks under way, by key (a token's SHA-256).
#[derive(Debug)]
pub(crate) struct Flights<V> {
    map: Mutex<HashMap<[u8; 32], Arc<OnceCell<V>>>>,
}

impl<V> Default for Flights<V> {
    fn default() -> Self {
        Flights {
            map: Mutex::new(HashMap::new()),
        }
    }
}

impl<V> Flights<V> {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Arc<OnceCell<V>>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<V: Clone> Flights<V> {
    /// The outcome of the check of `key` under way, or of `check` when none is. A caller
    /// that goes away mid-check hands it to the next one waiting.
    pub(crate) async fn run<F, Fut>(&self, key: [u8; 32], check: F) -> V
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = V>,
    {
        let aboard = Aboard {
            flights: self,
            key,
            cell: Some(Arc::clone(self.lock().entry(key).or_default())),
        };
        let Some(cell) = aboard.cell.clone() else {
            return check().await;
        };
        // `cell` goes before `aboard`, which counts who is still aboard.
        cell.get_or_init(check).await.clone()
    }
}

/// A caller's place in a flight: leaving, the last one out (or any once the outcome is
/// known) takes the flight off the map.
struct Aboard<'a, V> {
    flights: &'a Flights<V>,
    key: [u8; 32],
    cell: Option<Arc<OnceCell<V>>>,
}

impl<V> Drop for Aboard<'_, V> {
    fn drop(&mut self) {
        let mut map = self.flights.lock();
        let Some(mine) = self.cell.take() else {
            return;
        };
        let done = mine.initialized();
        let listed = map.get(&self.key).is_some_and(|c| Arc::ptr_eq(c, &mine));
        // Dropped under the lock, so that of two callers leaving at once the second sees
        // the first gone.
        drop(mine);
        if listed
            && (done
                || map
                    .get(&self.key)
                    .is_some_and(|c| Arc::strong_count(c) == 1))
        {
            map.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn concurrent_callers_share_one_check_and_leave_nothing_behind() {
        let flights = Arc::new(Flights::<u32>::default());
        let checks = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::Notify::new());
        let callers: Vec<_> = (0..8)
            .map(|_| {
                let (flights, checks, gate) =
                    (Arc::clone(&flights), Arc::clone(&checks), Arc::clone(&gate));
                tokio::spawn(async move {
                    flights
                        .run([1; 32], || async move {
                            checks.fetch_add(1, Ordering::SeqCst);
                            gate.notified().await;
                            7
                        })
                        .await
                })
            })
            .collect();
        while checks.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        // Let every caller join the flight before it lands.
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        gate.notify_one();
        for caller in callers {
            assert_eq!(caller.await.unwrap(), 7);
        }
        assert_eq!(checks.load(Ordering::SeqCst), 1);
        assert!(flights.lock().is_empty());
    }

    #[tokio::test]
    async fn a_caller_that_goes_away_hands_the_check_on() {
        let flights = Arc::new(Flights::<u32>::default());
        let first = {
            let flights = Arc::clone(&flights);
            tokio::spawn(async move { flights.run([2; 32], std::future::pending).await })
        };
        while flights.lock().is_empty() {
            tokio::task::yield_now().await;
        }
        let second = {
            let flights = Arc::clone(&flights);
            tokio::spawn(async move { flights.run([2; 32], || async { 9 }).await })
        };
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        first.abort();
        assert_eq!(second.await.unwrap(), 9);
        assert!(flights.lock().is_empty());
        // Alone and gone mid-check: nothing stays on the map.
        let alone = {
            let flights = Arc::clone(&flights);
            tokio::spawn(async move { flights.run([3; 32], std::future::pending).await })
        };
        while flights.lock().is_empty() {
            tokio::task::yield_now().await;
        }
        alone.abort();
        let _ = alone.await;
        assert!(flights.lock().is_empty());
    }
}
