//! Load shedding: caps on requests in flight (for the server, per principal, per tool) and a
//! bounded wait queue. A request beyond caps plus queue is refused at once with
//! [`crate::error::RETRY_LATER`] (HTTP 503 with `Retry-After`), so the server stays healthy
//! under any load; so is a queued one that waited as long as it may run. A queued request
//! that is cancelled leaves the queue and never runs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::deadline::later;
use crate::error::{ErrorKind, RpcError};
use crate::metrics::Shed;
use crate::store::human;

/// How much a server takes on at once. By default requests are not capped, and
/// `subscriptions/listen` streams are: they live long and cost a subscription each. A cap
/// (`Some(n)`) of 0 fails [`ServerBuilder::build`](crate::ServerBuilder::build): nothing
/// under it would ever run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Requests running at once, server-wide (`None`: no cap).
    pub max_in_flight: Option<usize>,
    /// Requests waiting for a slot, beyond which new ones are refused at once.
    pub max_queue: usize,
    /// Requests running at once per principal; beyond it, refused at once. Anonymous
    /// requests are not held to it: they all have one id, so it would be a server-wide
    /// cap (the others still bound them).
    pub per_principal: Option<usize>,
    /// Listen streams open at once, server-wide; beyond it, a new one is refused at once
    /// (`None`: no cap). Default 10,000.
    pub max_listen_streams: Option<usize>,
    /// Listen streams one principal may hold open at once; beyond it, refused at once.
    /// Default 32. Not applied to anonymous streams, for the reason given at
    /// [`Limits::per_principal`]: `max_listen_streams` bounds them.
    pub listen_per_principal: Option<usize>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_in_flight: None,
            max_queue: 0,
            per_principal: None,
            max_listen_streams: Some(10_000),
            listen_per_principal: Some(32),
        }
    }
}

/// Held while a request runs; dropping it frees its slots.
#[derive(Debug, Default)]
pub(crate) struct Permit {
    _slots: Vec<OwnedSemaphorePermit>,
}

/// The shared state of the caps.
pub(crate) struct Gate {
    limits: Limits,
    /// Whether some tool has its own cap.
    any_tool_cap: bool,
    global: Option<Arc<Semaphore>>,
    waiting: AtomicUsize,
    principals: Mutex<HashMap<String, Arc<Semaphore>>>,
    listen_total: Option<Arc<Semaphore>>,
    listeners: Mutex<HashMap<String, Arc<Semaphore>>>,
}

/// Principals tracked before idle ones are forgotten.
const PRINCIPALS_KEPT: usize = 4096;

impl Gate {
    pub(crate) fn new(limits: Limits, any_tool_cap: bool) -> Self {
        Gate {
            global: limits.max_in_flight.map(|n| Arc::new(Semaphore::new(n))),
            limits,
            any_tool_cap,
            waiting: AtomicUsize::new(0),
            principals: Mutex::new(HashMap::new()),
            listen_total: limits
                .max_listen_streams
                .map(|n| Arc::new(Semaphore::new(n))),
            listeners: Mutex::new(HashMap::new()),
        }
    }

    /// Requests waiting in the queue now.
    pub(crate) fn queued(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Whether nothing is capped at all, server-wide or per principal (tools may still cap
    /// themselves: see admission).
    pub(crate) fn is_open(&self) -> bool {
        self.global.is_none() && self.limits.per_principal.is_none() && !self.any_tool_cap
    }

    /// Takes the slots a request needs: its principal's (at once or refused), its tool's
    /// and the server's (waiting in the queue if there is room, refused otherwise, and
    /// refused once it waited `patience` in all: as long as the request may run, past
    /// which its client has most likely given up). The future may be dropped while it
    /// waits: the request then leaves the queue.
    pub(crate) async fn enter(
        &self,
        principal: Option<&str>,
        tool: Option<&Arc<Semaphore>>,
        patience: Duration,
    ) -> Result<Permit, Busy> {
        // No allocation unless a cap applies: the uncapped hot path stays free.
        let mut slots = Vec::new();
        if let (Some(cap), Some(principal)) = (self.limits.per_principal, principal) {
            let sem = principal_semaphore(&self.principals, principal, cap);
            let slot = sem.try_acquire_owned().map_err(|_| {
                busy(
                    Shed::PrincipalCap,
                    &format!("this principal already has {cap} requests running"),
                )
            })?;
            slots.push(slot);
        }
        // Computed only once a wait begins: the uncapped and free paths read no clock.
        let mut until = None;
        for sem in tool.into_iter().chain(self.global.as_ref()) {
            let slot = match Arc::clone(sem).try_acquire_owned() {
                Ok(slot) => slot,
                Err(_) => {
                    let until = *until.get_or_insert_with(|| later(Instant::now(), patience));
                    self.wait(sem, until, patience).await?
                }
            };
            slots.push(slot);
        }
        Ok(Permit { _slots: slots })
    }

    async fn wait(
        &self,
        sem: &Arc<Semaphore>,
        until: Instant,
        patience: Duration,
    ) -> Result<OwnedSemaphorePermit, Busy> {
        let queued = self.waiting.fetch_add(1, Ordering::AcqRel);
        let mut leave = Leave {
            waiting: &self.waiting,
            in_queue: false,
        };
        if queued >= self.limits.max_queue {
            return Err(busy(
                Shed::QueueFull,
                "the server is at capacity and its queue is full",
            ));
        }
        // Operators see queueing at debug level; the tests wait for these lines too.
        tracing::debug!(queued = queued + 1, "request queued for a slot");
        leave.in_queue = true;
        let slot = tokio::time::timeout_at(until, Arc::clone(sem).acquire_owned()).await;
        leave.in_queue = false;
        match slot {
            Ok(slot) => slot.map_err(|_| busy(Shed::ShuttingDown, "the server is shutting down")),
            Err(_) => Err(busy(
                Shed::QueueTimeout,
                &format!(
                    "no slot came free within {}, as long as the request may run",
                    human(patience)
                ),
            )),
        }
    }

    /// Takes the slots a listen stream holds while it is open: its principal's and the
    /// server's, at once or refused (a stream waits for events, never for a slot).
    pub(crate) fn enter_listen(&self, principal: Option<&str>) -> Result<Permit, Busy> {
        let mut slots = Vec::new();
        if let (Some(cap), Some(principal)) = (self.limits.listen_per_principal, principal) {
            let sem = principal_semaphore(&self.listeners, principal, cap);
            slots.push(sem.try_acquire_owned().map_err(|_| {
                busy(Shed::ListenCap, &format!(
                    "this principal already has {cap} subscriptions/listen streams open; close one first"
                ))
            })?);
        }
        if let Some(total) = &self.listen_total {
            slots.push(Arc::clone(total).try_acquire_owned().map_err(|_| {
                busy(
                    Shed::ListenCap,
                    "the server has as many subscriptions/listen streams open as it takes",
                )
            })?);
        }
        Ok(Permit { _slots: slots })
    }
}

/// The semaphore of `principal` in `map`, made with `cap` slots the first time.
fn principal_semaphore(
    map: &Mutex<HashMap<String, Arc<Semaphore>>>,
    principal: &str,
    cap: usize,
) -> Arc<Semaphore> {
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    if map.len() >= PRINCIPALS_KEPT && !map.contains_key(principal) {
        // Forget principals with nothing running.
        map.retain(|_, s| s.available_permits() < cap);
    }
    Arc::clone(
        map.entry(principal.to_owned())
            .or_insert_with(|| Arc::new(Semaphore::new(cap))),
    )
}

#[cfg(test)]
impl Gate {
    fn new_for_test(limits: Limits) -> Self {
        Gate::new(limits, false)
    }
}

/// Leaves the queue count when the wait ends, however it ends (granted, refused, dropped).
struct Leave<'a> {
    waiting: &'a AtomicUsize,
    /// Still waiting when dropped: the request was cancelled in the queue.
    in_queue: bool,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        if self.in_queue {
            tracing::debug!("queued request cancelled; it left the queue without running");
        }
    }
}

/// A request shed under load: why (for the metrics) and the error that says so.
#[derive(Debug)]
pub(crate) struct Busy {
    pub(crate) why: Shed,
    pub(crate) error: RpcError,
}

fn busy(why: Shed, message: &str) -> Busy {
    let error = RpcError::new(
        ErrorKind::RetryLater,
        format!("Busy: {message}; retry after the time Retry-After gives"),
    );
    Busy { why, error }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATIENCE: Duration = Duration::from_secs(300);

    /// A request queued longer than it may run is refused (busy), and leaves the queue; one
    /// that waited less takes the slot as it comes free.
    #[tokio::test(start_paused = true)]
    async fn a_queued_request_waits_no_longer_than_it_may_run() {
        let gate = Arc::new(Gate::new_for_test(Limits {
            max_in_flight: Some(1),
            max_queue: 2,
            per_principal: None,
            ..Limits::default()
        }));
        let first = gate.enter(Some("a"), None, PATIENCE).await.unwrap();
        let queued = |patience| {
            let gate = Arc::clone(&gate);
            tokio::spawn(async move { gate.enter(Some("a"), None, patience).await.map(drop) })
        };
        let (short, long) = (
            queued(Duration::from_secs(5)),
            queued(Duration::from_secs(60)),
        );
        let refused = short.await.unwrap().unwrap_err();
        assert_eq!(refused.why, Shed::QueueTimeout);
        assert_eq!(refused.error.kind, ErrorKind::RetryLater);
        assert!(
            refused.error.message.contains("within 5 s"),
            "{}",
            refused.error.message
        );
        assert_eq!(gate.queued(), 1, "the refused request left the queue");
        drop(first);
        long.await.unwrap().unwrap();
        assert_eq!(gate.queued(), 0);
    }

    #[tokio::test]
    async fn beyond_caps_and_queue_requests_are_refused_at_once() {
        let gate = Gate::new_for_test(Limits {
            max_in_flight: Some(1),
            max_queue: 1,
            per_principal: None,
            ..Limits::default()
        });
        let first = gate.enter(Some("a"), None, PATIENCE).await.unwrap();
        let gate = Arc::new(gate);
        let queued = {
            let gate = Arc::clone(&gate);
            tokio::spawn(async move { gate.enter(Some("a"), None, PATIENCE).await.map(drop) })
        };
        tokio::task::yield_now().await;
        while gate.waiting.load(Ordering::Acquire) == 0 {
            tokio::task::yield_now().await;
        }
        let refused = gate.enter(Some("a"), None, PATIENCE).await.unwrap_err();
        assert_eq!(refused.why, Shed::QueueFull);
        assert_eq!(refused.error.kind, ErrorKind::RetryLater);
        drop(first);
        queued.await.unwrap().unwrap();
        assert_eq!(gate.waiting.load(Ordering::Acquire), 0);
    }

    #[tokio::test]
    async fn a_cancelled_waiter_leaves_the_queue() {
        let gate = Arc::new(Gate::new_for_test(Limits {
            max_in_flight: Some(1),
            max_queue: 1,
            per_principal: None,
            ..Limits::default()
        }));
        let first = gate.enter(Some("a"), None, PATIENCE).await.unwrap();
        let waiter = {
            let gate = Arc::clone(&gate);
            tokio::spawn(async move { gate.enter(Some("a"), None, PATIENCE).await.map(drop) })
        };
        while gate.waiting.load(Ordering::Acquire) == 0 {
            tokio::task::yield_now().await;
        }
        waiter.abort();
        let _ = waiter.await;
        assert_eq!(
            gate.waiting.load(Ordering::Acquire),
            0,
            "the queue slot is free again"
        );
        drop(first);
        // The slot it would have taken is there for the next request.
        drop(gate.enter(Some("a"), None, PATIENCE).await.unwrap());
    }

    #[tokio::test]
    async fn each_principal_has_its_own_cap() {
        let gate = Gate::new_for_test(Limits {
            max_in_flight: None,
            max_queue: 0,
            per_principal: Some(1),
            ..Limits::default()
        });
        let a = gate.enter(Some("a"), None, PATIENCE).await.unwrap();
        let refused = gate.enter(Some("a"), None, PATIENCE).await.unwrap_err();
        assert_eq!(refused.why, Shed::PrincipalCap);
        let b = gate.enter(Some("b"), None, PATIENCE).await.unwrap();
        drop((a, b));
        assert!(gate.enter(Some("a"), None, PATIENCE).await.is_ok());
    }

    #[test]
    fn listen_streams_are_capped_per_principal_and_in_total() {
        let gate = Gate::new_for_test(Limits {
            max_listen_streams: Some(3),
            listen_per_principal: Some(2),
            ..Limits::default()
        });
        let a1 = gate.enter_listen(Some("a")).unwrap();
        let _a2 = gate.enter_listen(Some("a")).unwrap();
        let refused = gate.enter_listen(Some("a")).unwrap_err();
        assert_eq!(refused.why, Shed::ListenCap);
        let refused = refused.error;
        assert_eq!(refused.kind, ErrorKind::RetryLater);
        assert!(
            refused.message.contains("2 subscriptions/listen streams"),
            "{}",
            refused.message
        );
        // Another principal has its own share, up to the server's total.
        let _b1 = gate.enter_listen(Some("b")).unwrap();
        let full = gate.enter_listen(Some("b")).unwrap_err().error;
        assert!(full.message.contains("the server has"), "{}", full.message);
        // A closed stream frees its slots.
        drop(a1);
        gate.enter_listen(Some("a")).unwrap();
    }
}
