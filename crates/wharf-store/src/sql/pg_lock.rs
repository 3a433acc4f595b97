//! Mutation locks on PostgreSQL: session-level advisory locks, one connection per held or
//! waiting key.
//!
//! PostgreSQL queues the waiters of a lock in arrival order, so the line is first come first
//! served across every replica. A lock lasts as long as its session: a process that dies
//! closes its connections and PostgreSQL releases what they held, so no lease is needed.
//! The locks live in their own pool, without `lock_timeout`, so waiting for a key never
//! takes a connection from the calls' transactions (nor deadlocks against them); the core
//! bounds the wait by the call's own time limit.

use async_trait::async_trait;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyPool, Row};
use wharf::state::{Fence, KeyLock, StoreError};

use super::db_error;

/// Mutation keys are hashed with this seed, so they never meet the handle locks (seed 0).
const TRY_LOCK: &str = "SELECT pg_try_advisory_lock(hashtextextended($1, 1)), pg_backend_pid()";
const LOCK: &str = "SELECT pg_advisory_lock(hashtextextended($1, 1))::text";
const UNLOCK: &str = "SELECT pg_advisory_unlock(hashtextextended($1, 1))";

/// The lock pool of one store.
pub(super) struct PgLocks {
    pool: AnyPool,
}

impl PgLocks {
    /// Connects lazily: a deployment without mutating tools never opens a lock connection.
    pub(super) fn new(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let pool = AnyPoolOptions::new()
            .max_connections(max_connections)
            .min_connections(0)
            .connect_lazy(url)
            .map_err(db_error)?;
        Ok(PgLocks { pool })
    }

    /// Waits for `key`, first come first served. Dropped while it waits, the wait is
    /// cancelled in PostgreSQL and its connection closed, so the key is never held.
    pub(super) async fn lock(&self, key: &str) -> Result<Box<dyn KeyLock>, StoreError> {
        let conn = self.pool.acquire().await.map_err(db_error)?;
        let mut waiting = Waiting {
            conn: Some(conn),
            pid: None,
            pool: self.pool.clone(),
        };
        let Some(conn) = waiting.conn.as_mut() else {
            return Err(StoreError::Backend("lock connection missing".into()));
        };
        let row: AnyRow = sqlx::query(TRY_LOCK)
            .bind(key)
            .fetch_one(&mut **conn)
            .await
            .map_err(db_error)?;
        let held: bool = row.try_get(0).map_err(corrupt)?;
        waiting.pid = Some(row.try_get(1).map_err(corrupt)?);
        if !held {
            sqlx::query(LOCK)
                .bind(key)
                .fetch_one(&mut **conn)
                .await
                .map_err(db_error)?;
        }
        Ok(Box::new(PgKeyLock {
            conn: waiting.conn.take(),
            key: key.to_owned(),
        }))
    }
}

fn corrupt(e: sqlx::Error) -> StoreError {
    StoreError::Corrupt(format!("advisory lock row: {e}"))
}

/// A connection that is (or may be) waiting for a lock. Dropped before it holds the lock,
/// it cancels the wait and closes its session, so a lock granted meanwhile goes at once.
struct Waiting {
    conn: Option<PoolConnection<Any>>,
    pid: Option<i32>,
    pool: AnyPool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        // Closing the session ends whatever it holds or waits for; it never goes back to
        // the pool with a lock taken.
        drop(conn.detach());
        if let (Some(pid), Ok(rt)) = (self.pid, tokio::runtime::Handle::try_current()) {
            // A backend blocked on a lock notices a closed socket only once granted: cancel
            // its wait so the waiters behind it move on now.
            let pool = self.pool.clone();
            rt.spawn(async move {
                let cancelled = sqlx::query("SELECT pg_cancel_backend($1)")
                    .bind(pid)
                    .execute(&pool)
                    .await;
                if let Err(e) = cancelled {
                    tracing::warn!(error = %e, "could not cancel an abandoned lock wait");
                }
            });
        }
    }
}

/// A held advisory lock and the session that holds it.
struct PgKeyLock {
    conn: Option<PoolConnection<Any>>,
    key: String,
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
        None
    }

    async fn release(mut self: Box<Self>) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        match sqlx::query(UNLOCK)
            .bind(&self.key)
            .execute(&mut *conn)
            .await
        {
            // Back to the pool, holding nothing.
            Ok(_) => drop(conn),
            Err(e) => {
                tracing::warn!(error = %e, "could not release a mutation lock; closing its session");
                drop(conn.detach());
            }
        }
    }
}
