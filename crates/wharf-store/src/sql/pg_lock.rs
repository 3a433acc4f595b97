//! Mutation locks on PostgreSQL: session-level advisory locks, one connection per held or
//! waiting key.
//!
//! PostgreSQL queues the waiters of a lock in arrival order, so the line is first come first
//! served across every replica. A lock lasts as long as its session: a process that dies
//! closes its connections and PostgreSQL releases what they held, so no lease is needed.
//! The locks live in their own pool, without `lock_timeout`, so waiting for a key never
//! takes a connection from the calls' transactions (nor deadlocks against them); the core
//! bounds the wait by the call's own time limit. Two round trips per call: lock, unlock.
//!
//! A session can also end while its process lives on (a network cut, a server restart,
//! `idle_session_timeout`, an administrator's `pg_terminate_backend`), and with it the
//! lock, while the call that took it still runs. So every lock is fenced: taking it writes
//! a new token (random, 63 bits, so never one seen before) under the key in
//! `wharf_lock_fences`, in the same statement, and a transaction written under the lock
//! checks at commit, holding that row, that the token is still its own
//! ([`check_fence`]; a claimed write checks it in the statement that records its result,
//! [`complete_fenced`], and holds the row from there). A holder that lost its session
//! commits nothing once the next one took the key; and the next one cannot take it while
//! such a commit holds the row, so their writes never interleave. That costs a fenced
//! commit without a claim a statement, and ties the lock to a row lock a transaction of
//! the main pool holds until it commits: a commit whose connection is cut before its
//! `COMMIT` keeps the key's next holder waiting (within its call's limit) until PostgreSQL
//! ends the orphaned transaction (the TCP keepalives every store session sets, about a
//! minute, when the peer is gone; or `idle_in_transaction_session_timeout`, which
//! deployments may set, longer than the longest call: a call's transaction,
//! which holds its idempotency claim, sits idle while its handler works, and ended early it
//! frees the claim for a retry while the first attempt still runs).
//!
//! Replicas older than the fences take the advisory lock without writing a token: during a
//! rolling upgrade to them, a lost session is fenced only against holders that write one.
//!
//! A wait that is abandoned (the call was cancelled or timed out) closes its session. With
//! `client_connection_check_interval` (PostgreSQL 14 and later, set on these sessions)
//! the waiting backend notices within 100 ms and leaves the queue; on older servers it
//! leaves when the lock reaches it, releasing it at once. Either way the call never runs.

use async_trait::async_trait;
use sqlx::pool::{PoolConnection, PoolOptions};
use sqlx::{Executor, PgPool, Postgres};
use wharf::store::{Claim, Fence, KeyLock, StoreError};

use super::db_error;

/// Mutation keys are hashed with this seed, so they never meet the handle locks (seed 0).
/// The lock is taken first (the insert reads its row), then its new token (`$3`) written.
/// The token is drawn by the replica, not from the database's sequence
/// (`wharf_lock_tokens`, which replicas of earlier releases still use): a lock session
/// commits without flushing the log (below), and a sequence rewinds in a crash to its last
/// flushed value, so after a restart it would hand out again the token of a holder whose
/// lock the crash took, and whose call still runs on its replica. That holder's next commit
/// would then pass the fence while the key's new holder runs. A random token is never
/// handed out twice, whatever the database lost.
/// `locked_at` is the database's clock, which the sweep reads too: replicas' clocks never
/// decide whose fence is forgotten. It is moved on only once it is `$2` ms old: it is
/// indexed (for the sweep), and a row whose indexed columns keep their values is updated in
/// place (a HOT update), where changing one writes a new entry into both indexes on every
/// lock, and bloats them.
const LOCK: &str = "WITH held AS (SELECT pg_advisory_lock(hashtextextended($1, 1))) \
     INSERT INTO wharf_lock_fences (lock, token, locked_at) \
     SELECT hashtextextended($1, 1), $3, \
     (extract(epoch FROM clock_timestamp()) * 1000)::bigint FROM held \
     ON CONFLICT (lock) DO UPDATE SET token = EXCLUDED.token, \
     locked_at = CASE WHEN wharf_lock_fences.locked_at <= EXCLUDED.locked_at - $2 \
     THEN EXCLUDED.locked_at ELSE wharf_lock_fences.locked_at END \
     RETURNING token";
/// How stale a key's `locked_at` may grow before a lock moves it on: far below the week the
/// sweep keeps an idle key's fence (`LOCK_FENCES_KEPT_MS`), so no key in use is forgotten.
const LOCKED_AT_REFRESH_MS: i64 = 60 * 60 * 1000;
/// The token of the key's holder, its row held until the transaction ends.
const FENCE: &str =
    "SELECT token FROM wharf_lock_fences WHERE lock = hashtextextended($1, 1) FOR UPDATE";
const UNLOCK: &str = "SELECT pg_advisory_unlock(hashtextextended($1, 1))";
/// A claimed write's result recorded and its fence checked in one statement: the key's row
/// is locked as [`FENCE`] locks it (so held until the transaction ends), and the record is
/// written only if the token is still the holder's. Answers the holder's token and whether
/// the record was written, to tell a lost lock from a lost claim.
const DONE_FENCED: &str = "WITH fence AS (SELECT token FROM wharf_lock_fences \
     WHERE lock = hashtextextended($6, 1) FOR UPDATE), \
     done AS (UPDATE wharf_idempotency SET state = 'done', result = $3, updated_at = $4, \
     owner = $5 WHERE scope = $1 AND key = $2 AND state = 'running' \
     AND (SELECT token FROM fence) = $7 RETURNING 1) \
     SELECT (SELECT token FROM fence), (SELECT count(*) FROM done)";

/// The lock pool of one store.
pub(super) struct PgLocks {
    pool: PgPool,
    sessions: u32,
}

impl PgLocks {
    /// Connects lazily: a deployment without mutating tools never opens a lock connection.
    pub(super) fn new(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let pool = PoolOptions::<Postgres>::new()
            .max_connections(max_connections)
            .min_connections(0)
            // A broken session fails its lock query, which is answered "retry"; a ping
            // before every lock would cost a round trip per call.
            .test_before_acquire(false)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    // PostgreSQL 14+: notice a closed client while waiting for a lock. Older
                    // servers refuse the setting, which only makes abandoned waits slower
                    // to leave.
                    let _ = conn
                        .execute("SET client_connection_check_interval = 100")
                        .await;
                    // A token need not reach the disk before its holder runs: whatever the
                    // holder commits under it is flushed with the token before it (the log
                    // is written in order), and a token lost in a crash fences its holder
                    // off all the same (the key's row holds another token after the
                    // restart, never this one again: tokens are random). So taking a lock
                    // costs no flush of the log.
                    conn.execute("SET synchronous_commit = off").await?;
                    super::session_settings(conn).await
                })
            })
            .connect_lazy(url)
            .map_err(db_error)?;
        Ok(PgLocks {
            pool,
            sessions: max_connections,
        })
    }

    /// The sessions of the pool: the locks this process can hold at once.
    pub(super) fn sessions(&self) -> usize {
        self.sessions as usize
    }

    /// Waits for `key`, first come first served. Dropped while it waits, its session is
    /// closed, so the key is never held for it.
    pub(super) async fn lock(&self, key: &str) -> Result<Box<dyn KeyLock>, StoreError> {
        let conn = self.pool.acquire().await.map_err(db_error)?;
        let mut waiting = Waiting(Some(conn));
        let Some(conn) = waiting.0.as_mut() else {
            return Err(StoreError::Backend("lock connection missing".into()));
        };
        let token: i64 = sqlx::query_scalar(LOCK)
            .bind(key)
            .bind(LOCKED_AT_REFRESH_MS)
            .bind(rand::random_range(1..=i64::MAX))
            .fetch_one(&mut **conn)
            .await
            .map_err(db_error)?;
        // Read before the session leaves its guard: on an error it is closed, lock and all.
        let token =
            u64::try_from(token).map_err(|_| StoreError::Corrupt(format!("lock token {token}")))?;
        Ok(Box::new(PgKeyLock {
            conn: waiting.0.take(),
            fence: Fence {
                key: key.to_owned(),
                token,
            },
        }))
    }
}

/// A session that is (or may be) waiting for a lock. Dropped before it holds the lock, it
/// closes the session: it never goes back to the pool with a lock taken or pending.
struct Waiting(Option<PoolConnection<Postgres>>);

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            drop(conn.detach());
        }
    }
}

/// A held advisory lock, the session that holds it, and its token.
struct PgKeyLock {
    conn: Option<PoolConnection<Postgres>>,
    fence: Fence,
}

impl Drop for PgKeyLock {
    fn drop(&mut self) {
        // Not released in order (the call's future was dropped): end the session instead.
        if let Some(conn) = self.conn.take() {
            drop(conn.detach());
        }
    }
}

#[async_trait]
impl KeyLock for PgKeyLock {
    fn fence(&self) -> Option<Fence> {
        Some(self.fence.clone())
    }

    async fn release(mut self: Box<Self>) {
        // Until the unlock is confirmed the session stays behind a guard: if this future is
        // dropped half-way, the session is closed rather than pooled with the lock held.
        let mut guard = Waiting(self.conn.take());
        let Some(conn) = guard.0.as_mut() else {
            return;
        };
        match sqlx::query(UNLOCK)
            .bind(&self.fence.key)
            .execute(&mut **conn)
            .await
        {
            // Back to the pool, holding nothing.
            Ok(_) => drop(guard.0.take()),
            Err(e) => {
                tracing::warn!(error = %e, "could not release a mutation lock; closing its session");
            }
        }
    }
}

/// Records a claimed write's `result` (its record written as `running` when claimed) and
/// checks `fence` in the same round trip, as [`check_fence`] would at commit: fails with
/// [`StoreError::LeaseLost`] when another holder took the key, with
/// [`StoreError::ClaimLost`] when the claim is no longer this call's.
pub(super) async fn complete_fenced(
    tx: &mut sqlx::Transaction<'static, Postgres>,
    claim: &Claim,
    result: &str,
    fence: &Fence,
) -> Result<(), StoreError> {
    // A token that does not fit PostgreSQL's bigint was never one of its own: nothing holds it.
    let token = i64::try_from(fence.token).unwrap_or(-1);
    let (holder, done): (Option<i64>, i64) = sqlx::query_as(DONE_FENCED)
        .bind(&claim.scope)
        .bind(&claim.key)
        .bind(result)
        .bind(wharf::store::now_millis())
        .bind(&claim.owner)
        .bind(&fence.key)
        .bind(token)
        .fetch_one(&mut **tx)
        .await
        .map_err(db_error)?;
    if holder != Some(token) {
        return Err(StoreError::LeaseLost);
    }
    if done == 1 {
        Ok(())
    } else {
        Err(StoreError::ClaimLost)
    }
}

/// Fails with [`StoreError::LeaseLost`] unless `fence` is still its key's holder, and keeps
/// the key's row locked until `tx` ends, so that no next holder takes the key before this
/// commit lands.
pub(super) async fn check_fence(
    tx: &mut sqlx::Transaction<'static, Postgres>,
    fence: &Fence,
) -> Result<(), StoreError> {
    let holder: Option<i64> = sqlx::query_scalar(FENCE)
        .bind(&fence.key)
        .fetch_optional(&mut **tx)
        .await
        .map_err(db_error)?;
    match holder {
        Some(token) if u64::try_from(token).ok() == Some(fence.token) => Ok(()),
        _ => Err(StoreError::LeaseLost),
    }
}
