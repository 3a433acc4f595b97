//! Mutation locks: tools that mutate the same key run one at a time, first come first
//! served, on every replica that shares the store.
//!
//! The core keeps one line per key inside the process (so at most one call per key and
//! process waits on the store); a store whose backend is shared between processes adds its
//! own lock behind that line ([`Store::lock_key`](super::Store::lock_key)).

use async_trait::async_trait;

/// A held mutation lock of a shared store. Dropped without [`KeyLock::release`], it is
/// released in the background.
#[async_trait]
pub trait KeyLock: Send {
    /// The proof a transaction checks again at commit, for locks that can end while their
    /// holder still runs (a Redis lease, a PostgreSQL session); `None` for locks that last
    /// as long as their holder's process.
    fn fence(&self) -> Option<Fence>;

    /// Releases the lock; the next waiter in line takes it.
    async fn release(self: Box<Self>);
}

/// What a lock that can end under its holder hands to the transactions written under it:
/// the key and the holder's token, new with every holder of the key (never one an earlier
/// holder had). A commit whose token is no longer the holder's applies nothing ([`StoreError::LeaseLost`](super::StoreError::LeaseLost)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The mutation key.
    pub key: String,
    /// The holder's token.
    pub token: u64,
}
