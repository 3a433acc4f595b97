//! State that outlives a call: the store traits the core runs handles and idempotent writes
//! over. Backends live in `wharf-store`; the core only knows these traits.
//!
//! A store holds three things:
//! - **handles**: server-minted ids with an owner and an expiry ([`Handle`], [`HandleRecord`]);
//! - **idempotency records**: the first result of a write, kept per handle (or per
//!   principal and tool) under the caller's key ([`Claim`]);
//! - **shared keys**: the secrets every replica signs cursors and seals request states with
//!   ([`SharedKey`]);
//! - **records**: expiring values under a namespace and a key, written on a condition
//!   ([`Record`], [`Write`]), for components that keep state outside handles;
//! - **app data**: the app's own tables or keys, written through [`Transaction::backend_tx`]
//!   in the same transaction as the idempotency record, so an effect and its record commit
//!   together or not at all (on Redis, which cannot undo a write, a command it refuses
//!   part-way keeps the writes before it, and the record keeps that failure:
//!   [`StoreError::PartlyApplied`]).

mod handle;
mod idempotency;
mod lock;
mod record;
mod shared_key;

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;

use crate::bus::{ChangeEvent, NotificationBus};
pub use handle::{Expiry, Handle, HandleKind, HandleRecord, human, is_handle_id};
pub(crate) use handle::{SCHEMA_KEYWORD, reading_input};
pub use idempotency::{Claim, Digest, MAX_KEY_LEN};
pub(crate) use idempotency::{KEY_ARGUMENT, REPLAY_META, key_schema};
pub use lock::{Fence, KeyLock};
pub use record::{
    MAX_NAMESPACE_LEN, MAX_RECORD_KEY_LEN, NewRecord, Record, Write, check_key, fresh_version,
    is_live,
};
pub use shared_key::{SHARED_KEY_LEN, SharedKey};

/// Milliseconds since the Unix epoch; every timestamp in a store.
pub type Millis = i64;

/// The latest time anything a store keeps lives to (2^53 - 1 ms, some 285,000 years from
/// 1970): what a lifetime of `Duration::MAX` comes to. Every store holds it exactly, and
/// sums of it with a timestamp neither overflow PostgreSQL's `bigint` nor lose precision in
/// Redis's Lua scripts, whose numbers are doubles.
pub const FOREVER: Millis = (1 << 53) - 1;

/// `d` in milliseconds, at most [`FOREVER`]: how a store implementation (or an app's own
/// records) should turn a configured duration into [`Millis`].
pub fn millis(d: std::time::Duration) -> Millis {
    Millis::try_from(d.as_millis()).map_or(FOREVER, |ms| ms.min(FOREVER))
}

/// `d` after `now`, at most [`FOREVER`]: an expiry every store can hold.
pub fn after(now: Millis, d: std::time::Duration) -> Millis {
    now.saturating_add(millis(d)).min(FOREVER)
}

/// The current time in [`Millis`].
pub fn now_millis() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Another call holds what this one needs for longer than the store waits (a duplicate
    /// write still running, a lock), or the store cannot be reached for now. Retrying later
    /// is safe: nothing was applied, or (a keyed write whose answer was lost) the retry finds
    /// its record.
    #[error("the store is busy: {0}")]
    Busy(String),
    /// The store answered with an error, or lost the answer to a write that may have been
    /// applied.
    #[error("store failure: {0}")]
    Backend(String),
    /// Something in the store is not what this version wrote.
    #[error("corrupt record in the store: {0}")]
    Corrupt(String),
    /// The transaction lost its claim on an idempotency record (another attempt took over
    /// after this one was presumed dead); nothing it wrote was applied.
    #[error("the write lost its idempotency claim; nothing was applied")]
    ClaimLost,
    /// Another call changed, first, data this one expected unchanged (Redis, which finds out
    /// at commit); nothing was applied.
    #[error("a concurrent call changed the same data first; nothing was applied")]
    Conflict,
    /// A handle the transaction held was retired before it committed (Redis, which checks at
    /// commit); nothing it wrote was applied.
    #[error("the handle was retired while the call ran; nothing was applied")]
    HandleGone,
    /// The call lost its mutation lock before it committed (a lease its holder outlived, a
    /// lock session that ended); another call may hold the key now, so nothing it wrote was
    /// applied.
    #[error("the call's lock on its key ran out before it committed; nothing was applied")]
    LeaseLost,
    /// A request no store accepts (a record key past its length limit); the caller's
    /// mistake, refused before any backend saw it.
    #[error("invalid store request: {0}")]
    Invalid(String),
    /// The commit applied only part of its writes: the store refused one after those before
    /// it were applied, and cannot undo them (Redis). Its claim, if it held one, was recorded
    /// done with this failure as its result (a tool result with `isError`, holding this
    /// message), so a retry answers that instead of applying the writes again; without a
    /// claim nothing was recorded.
    #[error("{0}")]
    PartlyApplied(String),
}

/// How a transaction will be used; SQLite takes its write lock up front for writes, so a
/// write never fails half-way on a lock it could not upgrade.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxMode {
    /// Reads only.
    Read,
    /// Reads and writes.
    Write,
}

/// What [`Store::begin_idempotent`] found under a key.
pub enum Begin {
    /// First attempt (or the earlier one died before committing): run the write in this
    /// transaction, which holds the claim.
    Run(Box<dyn Transaction>),
    /// The write already happened: its first result, as stored.
    Replay(String),
    /// The key was used before with other arguments.
    Mismatch,
}

/// A shared store for handles, idempotency records and app data. One per process, shared by
/// every request; every replica of a deployment points at the same one.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// The backend's name, for logs and `/readyz`.
    fn backend(&self) -> &'static str;

    /// Checks that the store answers.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Reads a handle, expired or not; `None` when it does not exist (or was swept).
    async fn load_handle(&self, id: &str) -> Result<Option<HandleRecord>, StoreError>;

    /// Records a use of a handle, pushing back its idle expiry.
    async fn touch_handle(&self, id: &str, now: Millis) -> Result<(), StoreError>;

    /// Opens a transaction for app reads and writes.
    async fn begin(&self, mode: TxMode) -> Result<Box<dyn Transaction>, StoreError>;

    /// Claims `claim` for a write, waiting a bounded time for a duplicate still running.
    /// Records older than their retention count as absent.
    async fn begin_idempotent(&self, claim: &Claim, now: Millis) -> Result<Begin, StoreError>;

    /// The first result of a write completed under `claim` (the same scope, key and
    /// digest) by `claim.owner`, while its record is kept: what a retry gets once the
    /// write's handle is gone (a commit, an abort). Never a record of another principal's.
    async fn replay_of(&self, claim: &Claim, now: Millis) -> Result<Option<String>, StoreError>;

    /// Loads handle `handle` and, when `owner` owns it, claims `claim` (as
    /// [`Store::begin_idempotent`]), in as few round trips as the backend allows. Returns the
    /// handle as stored (for the core to judge before it looks at the claim) and the claim's
    /// outcome, `None` when the handle is not `owner`'s (nothing is claimed then). A `Run`
    /// transaction already holds the handle (see [`Transaction::hold_handle`]). Dropping the
    /// outcome rolls the claim back.
    async fn claim_on_handle(
        &self,
        claim: &Claim,
        handle: &str,
        owner: &str,
        now: Millis,
    ) -> Result<(Option<HandleRecord>, Option<Begin>), StoreError> {
        let record = self.load_handle(handle).await?;
        if record.as_ref().is_none_or(|r| r.owner != owner) {
            return Ok((record, None));
        }
        let mut begun = self.begin_idempotent(claim, now).await?;
        if let Begin::Run(tx) = &mut begun {
            if !tx.hold_handle(handle, None).await? {
                return Ok((None, None));
            }
        }
        Ok((record, Some(begun)))
    }

    /// Whether [`Store::lock_key`] takes a lock shared between processes (each one costs the
    /// backend a session or a lease).
    fn shares_locks(&self) -> bool {
        false
    }

    /// How many of [`Store::lock_key`]'s locks this process can hold at once, when each costs
    /// a session from a bounded pool (PostgreSQL); `None` when they are not bounded so (Redis
    /// leases) or not shared. The core shares them out fairly between principals.
    fn lock_sessions(&self) -> Option<usize> {
        None
    }

    /// How many claims this process may hold at once while their handlers commit steps of
    /// their own (writes in steps), when each held claim keeps a connection from the pool
    /// those steps take too (PostgreSQL). The core lets no more than that hold theirs, and
    /// the store leaves enough connections beside them for their steps (each server built on
    /// the store counts its own: serve one per store, or divide the pool): writes in steps
    /// alone never take the whole pool while each waits for another connection (a handler
    /// that holds its call's transaction while it opens a step, or any call that holds one
    /// connection while it asks for a second, still can: sqlx's acquire timeout then
    /// answers "busy"). `Some(0)`: no write in steps can run (a server with one refuses to
    /// build). `None` when a held claim keeps no connection (Redis's leases) or none is held
    /// (SQLite, whose one writer the core's line serves instead).
    fn step_claims(&self) -> Option<usize> {
        None
    }

    /// Takes the lock on mutation key `key` shared by every process on this store, first
    /// come first served, waiting as long as it takes (the caller bounds the wait). Dropping
    /// the future while it waits leaves the line without ever holding the lock. `Ok(None)`
    /// when the backend is not shared between hosts (SQLite): the core's in-process line is
    /// the lock there.
    async fn lock_key(&self, key: &str) -> Result<Option<Box<dyn KeyLock>>, StoreError> {
        let _ = key;
        Ok(None)
    }

    /// The bus that carries change notifications between the processes on this store
    /// (PostgreSQL LISTEN/NOTIFY, Redis pub/sub); `None` for a store one process uses at a
    /// time, whose processes keep to the in-process bus.
    fn bus(&self) -> Option<Arc<dyn NotificationBus>> {
        None
    }

    /// Every shared key the store holds (expired ones may be among them until swept).
    async fn shared_keys(&self) -> Result<Vec<SharedKey>, StoreError>;

    /// Adds `key` unless a key with its id exists: of two replicas adding the same id at
    /// once, the first write wins and both then read the same key. A key with its id that
    /// expires earlier than `key` is kept (its secret and start unchanged) and lives until
    /// `key.expires_at`: a replica configured for longer-lived states or cursors (a rolling
    /// change of `max_age`) extends the keys the others wrote, rather than seeing what it
    /// seals become unopenable before its own expiry.
    async fn add_shared_key(&self, key: &SharedKey) -> Result<(), StoreError>;

    /// The live record under `namespace` and `key` at `now`.
    async fn read_record(
        &self,
        namespace: &str,
        key: &str,
        now: Millis,
    ) -> Result<Option<Record>, StoreError>;

    /// Writes `record` when `write`'s condition holds at `now` (an expired record counts as
    /// absent): its new version, or `None` when the condition failed and nothing changed.
    async fn write_record(
        &self,
        record: &NewRecord<'_>,
        write: Write,
        now: Millis,
    ) -> Result<Option<u64>, StoreError>;

    /// Deletes the record under `namespace` and `key`, only if it is at `version` when one
    /// is given; whether a record went.
    async fn delete_record(
        &self,
        namespace: &str,
        key: &str,
        version: Option<u64>,
    ) -> Result<bool, StoreError>;

    /// Up to `limit` live records of `owner` under `namespace`, by key.
    async fn records_of(
        &self,
        namespace: &str,
        owner: &str,
        now: Millis,
        limit: u32,
    ) -> Result<Vec<(String, Record)>, StoreError>;

    /// Removes at most `batch` each of expired handles (with the app data filed under them),
    /// expired idempotency records, expired shared keys and expired records; returns how
    /// many went.
    async fn sweep(&self, now: Millis, batch: u32) -> Result<u64, StoreError>;
}

/// One transaction on a store. Dropped without [`Transaction::commit`], it rolls back.
#[async_trait]
pub trait Transaction: Send {
    /// Stores a new handle.
    async fn create_handle(&mut self, record: &HandleRecord) -> Result<(), StoreError>;

    /// Deletes a handle and the app data filed under it.
    async fn retire_handle(&mut self, id: &str) -> Result<(), StoreError>;

    /// How many handles of `kind` `owner` holds that are alive at `now` (neither expired nor
    /// retired): what [`HandleKind::MAX_PER_OWNER`] counts. Read through this transaction,
    /// so that a call holding one needs no second connection for it (a pool of `n` would
    /// otherwise stall under `n` such calls at once); SQL stores count the transaction's
    /// own new handles too, Redis (whose writes wait for the commit) only committed ones.
    async fn live_handles(
        &mut self,
        owner: &str,
        kind: &str,
        now: Millis,
    ) -> Result<u64, StoreError>;

    /// The ids of the `n` live handles of `kind` that `owner` used least recently (earliest
    /// `last_used_at` first, then by id), fewer when it holds fewer: the ones to end when
    /// new ones would take the owner past a cap. Alive, and read, as for
    /// [`Transaction::live_handles`].
    async fn least_recently_used_handles(
        &mut self,
        owner: &str,
        kind: &str,
        now: Millis,
        n: u64,
    ) -> Result<Vec<String>, StoreError>;

    /// Keeps handle `id` from being retired by another call until this transaction ends, and
    /// records a use at `touch_at` when given. `false` when the handle is gone (retired since
    /// it was checked): the call must not write under it.
    async fn hold_handle(&mut self, id: &str, touch_at: Option<Millis>)
    -> Result<bool, StoreError>;

    /// For a transaction a handler opened itself (a step of a write in steps): whether
    /// handle `id` still exists, found without waiting for any lock on it: the call's own
    /// transaction may be retiring it, and commits only when the handler returns. A store
    /// whose hold waits (PostgreSQL's lock) only checks; one whose hold never waits (Redis's
    /// check at commit) holds. `false` when the handle is gone. By default
    /// [`Transaction::hold_handle`] without a use.
    async fn check_handle(&mut self, id: &str) -> Result<bool, StoreError> {
        self.hold_handle(id, None).await
    }

    /// Makes the commit apply nothing unless `fence` still holds its key (see [`Fence`]);
    /// stores whose locks cannot run out ignore it.
    fn fence(&mut self, fence: &Fence) {
        let _ = fence;
    }

    /// Takes `events` to announce on the store's own bus ([`Store::bus`]) with the commit
    /// itself, once every write applied (Redis: in the script that applies them;
    /// PostgreSQL: written with the writes, published once the commit answered, and by
    /// another replica if this one could not). So a process that dies just after its commit
    /// loses none. A store that could not publish them after
    /// applying the writes must tell every stream of a gap, as its bus does when a publish
    /// fails, and still commit: the writes never depend on the announcement. `false`, the
    /// default, when the store does not: the core announces them once the commit answered.
    ///
    /// The core calls this only when the server's bus is the one the store gave, just
    /// before [`Transaction::commit`]. When that commit fails, the core announces them
    /// itself: a commit whose answer was lost may have applied, and a listener told of a
    /// change that did not happen only reads again.
    fn announce_with_commit(&mut self, events: &[ChangeEvent]) -> bool {
        let _ = events;
        false
    }

    /// Records `claim` as used, in this transaction, unless a live record holds its key
    /// already: `false` then. What a one-time step (a confirmation redeemed once) records
    /// with the call's own writes, so the two commit together or not at all. Another
    /// transaction's `record_once` of the same key, before this one ends, must not answer
    /// `true`: what it unlocks may be an effect outside the store (SQL stores make it wait
    /// for this transaction's end; Redis, whose writes wait for the commit, reserves the
    /// record at once and gives it back if this transaction ends without a commit).
    async fn record_once(&mut self, claim: &Claim) -> Result<bool, StoreError>;

    /// Marks the claimed idempotency record done with the write's first result. Called by
    /// the core, in this transaction, just before [`Transaction::commit`].
    async fn complete_claim(&mut self, claim: &Claim, result: &str) -> Result<(), StoreError>;

    /// Commits everything written in this transaction, atomically (on Redis, except for a
    /// write it refuses part-way: [`StoreError::PartlyApplied`]).
    async fn commit(self: Box<Self>) -> Result<(), StoreError>;

    /// The store's own transaction, for code that knows the backend and writes its own data
    /// in the call's transaction (downcast it: `wharf_store::SqlTx` for the SQL stores,
    /// `wharf_store::redis::RedisTx` and its command buffer for Redis).
    fn backend_tx(&mut self) -> &mut dyn Any;
}
