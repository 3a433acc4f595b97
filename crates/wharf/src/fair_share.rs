//! Places a process holds few of (a store's lock sessions, its pool's connections held for
//! a whole call), shared out fairly between principals so that a few busy ones cannot take
//! them all.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// A fixed number of places (store sessions or connections), shared out fairly. A principal
/// that holds none may take any free place; one that holds some only while more than a
/// quarter of them are free. However many calls a few principals queue, that quarter stays for the others (with
/// one or two principals busy, it stays idle: the price of a newcomer never waiting on
/// another's long calls). Waiters are served in arrival order, each as soon as the rule lets
/// it: one that may not take the reserve does not hold up a newcomer behind it.
pub(crate) struct FairShare {
    capacity: usize,
    reserve: usize,
    state: Mutex<Holders>,
}

#[derive(Default)]
struct Holders {
    in_use: usize,
    /// Places held per principal; only principals holding some are kept.
    held: HashMap<String, usize>,
    waiting: VecDeque<Waiter>,
}

struct Waiter {
    principal: String,
    grant: oneshot::Sender<Share>,
}

impl FairShare {
    /// `capacity` places (at least one).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        FairShare {
            capacity,
            reserve: capacity / 4,
            state: Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Holders> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits in line until `principal` may take a place (see the type's docs). Dropping the
    /// future leaves the line without taking one.
    pub(crate) async fn enter(self: &Arc<Self>, principal: &str) -> Share {
        loop {
            let granted = {
                let mut s = self.state();
                let (grant, granted) = oneshot::channel();
                s.waiting.push_back(Waiter {
                    principal: principal.to_owned(),
                    grant,
                });
                self.dispatch(&mut s);
                granted
            };
            // A waiter that leaves (its call dropped) drops this receiver: a place sent to
            // it meanwhile is dropped with the channel, which gives it back.
            if let Ok(share) = granted.await {
                return share;
            }
        }
    }

    /// Grants places to the waiters the rule lets in, in arrival order. Called with the
    /// state locked, whenever a waiter arrives or a place comes back.
    fn dispatch(self: &Arc<Self>, s: &mut Holders) {
        let mut i = 0;
        while i < s.waiting.len() {
            if s.waiting[i].grant.is_closed() {
                s.waiting.remove(i);
                continue;
            }
            let free = self.capacity.saturating_sub(s.in_use);
            let holds = s.held.get(&s.waiting[i].principal).copied().unwrap_or(0);
            let may = free > 0 && (holds == 0 || free > self.reserve);
            let Some(waiter) = may.then(|| s.waiting.remove(i)).flatten() else {
                i += 1;
                continue;
            };
            s.in_use += 1;
            *s.held.entry(waiter.principal.clone()).or_default() += 1;
            let share = Share {
                gate: Some(Arc::clone(self)),
                principal: waiter.principal,
            };
            if let Err(mut refused) = waiter.grant.send(share) {
                // Its waiter just left: take the place back here, the state being locked.
                refused.gate = None;
                Self::give_back(s, &refused.principal);
            }
        }
    }

    fn give_back(s: &mut Holders, principal: &str) {
        s.in_use = s.in_use.saturating_sub(1);
        if let Some(n) = s.held.get_mut(principal) {
            *n -= 1;
            if *n == 0 {
                s.held.remove(principal);
            }
        }
    }
}

/// A place taken from a [`FairShare`]; dropping it gives it back to the next in line.
pub(crate) struct Share {
    /// `None` once given back by other means.
    gate: Option<Arc<FairShare>>,
    principal: String,
}

impl Drop for Share {
    fn drop(&mut self) {
        if let Some(gate) = self.gate.take() {
            let mut s = gate.state();
            FairShare::give_back(&mut s, &self.principal);
            gate.dispatch(&mut s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    // Time is paused: a sleep ends only once every other task waits.
    /// Two principals queueing many calls cannot take every place: a quarter stays for
    /// principals holding none, and each of those gets one at once.
    #[tokio::test(start_paused = true)]
    async fn a_few_principals_cannot_take_every_place() {
        let gate = Arc::new(FairShare::new(8));
        let enter = |p: &'static str| {
            let gate = Arc::clone(&gate);
            tokio::spawn(async move { gate.enter(p).await })
        };
        let mut held = Vec::new();
        // "a" takes places until only the reserve of 2 is free; its seventh waits.
        for _ in 0..6 {
            held.push(gate.enter("a").await);
        }
        let a_more = enter("a");
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!a_more.is_finished(), "a may not take the reserve");
        // "b", holding none, gets one; its second waits like a's.
        held.push(gate.enter("b").await);
        let b_more = enter("b");
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!b_more.is_finished(), "b may not take the reserve either");
        // "c" and then "d", holding none, still get one each: the reserve was theirs.
        held.push(gate.enter("c").await);
        let d = enter("d");
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!d.is_finished(), "every place is taken");
        // A place given back goes to a waiter, and in the end every waiter is served.
        drop(held.remove(0));
        held.push(d.await.unwrap());
        held.truncate(2);
        let _ = a_more.await.unwrap();
        let _ = b_more.await.unwrap();
    }

    /// Waiters are served in arrival order, and one that leaves the line takes nothing.
    #[tokio::test(start_paused = true)]
    async fn places_go_to_waiters_in_arrival_order() {
        let gate = Arc::new(FairShare::new(2));
        let (first, second) = (gate.enter("p").await, gate.enter("p").await);
        let enter = |who: &'static str| {
            let gate = Arc::clone(&gate);
            tokio::spawn(async move { gate.enter(who).await })
        };
        let q = enter("q");
        tokio::time::sleep(Duration::from_millis(1)).await;
        let gone = enter("gone");
        tokio::time::sleep(Duration::from_millis(1)).await;
        let r = enter("r");
        tokio::time::sleep(Duration::from_millis(1)).await;
        gone.abort();
        let _ = gone.await;
        drop(first);
        let q = q.await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!r.is_finished(), "r came after q");
        drop(second);
        let r = r.await.unwrap();
        assert_eq!(gate.state().in_use, 2, "the waiter that left holds nothing");
        drop((q, r));
        assert_eq!(gate.state().in_use, 0);
        assert!(gate.state().held.is_empty());
    }
}
