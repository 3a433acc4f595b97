//! SQLite and PostgreSQL, through sqlx's `Any` driver: one set of portable SQL, one set of
//! migrations.
//!
//! Exactly-once writes rest on the database's own locks. An idempotent call inserts its
//! record as `running` inside the transaction that will hold the handler's writes, and marks
//! it `done` with the result in the same transaction. Nobody else ever sees a `running`
//! record: on PostgreSQL a duplicate's insert waits on the first transaction's uncommitted
//! row (bounded by `lock_timeout`), on SQLite the write lock serializes writers (bounded by
//! `busy_timeout`). When the first attempt commits, the duplicate finds the result; when it
//! dies (a crash drops the connection, the database rolls back), the duplicate runs instead.

mod pg_lock;

use async_trait::async_trait;

use crate::StoreOptions;
#[cfg(doc)]
use crate::migrations::AppMigrations;
use crate::migrations::tolerant;
use serde_json::Value;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::migrate::Migrator;
use sqlx::{Any, AnyPool, Executor, Row, Transaction as SqlxTx};
use wharf::store::{
    Begin, Claim, HandleRecord, KeyLock, Millis, Store, StoreError, Transaction, TxMode,
};

/// How long after expiry a handle stays readable, so its owner is told it expired rather
/// than that it is unknown.
pub const EXPIRED_HANDLE_GRACE_MS: i64 = 3_600_000;

/// Each database has its own migrations (SQLite stores text-keyed tables WITHOUT ROWID,
/// which PostgreSQL does not know); versions go in step, below
/// [`AppMigrations::MIN_VERSION`]. They leave the app's versions alone.
fn own_migrations(dialect: Dialect) -> Migrator {
    tolerant(match dialect {
        Dialect::Sqlite => sqlx::migrate!("./migrations/sqlite"),
        Dialect::Postgres => sqlx::migrate!("./migrations/postgres"),
    })
}

const LOAD_HANDLE_SQL: &str = "SELECT id, kind, owner, created_at, expires_at, idle_ms, last_used_at, data \
     FROM wharf_handles WHERE id = $1";

/// Claims a key: inserts the record as `running`, replacing one past its retention. One row
/// affected means the call holds the claim.
const CLAIM_SQL: &str = "INSERT INTO wharf_idempotency \
     (scope, key, digest, state, result, created_at, updated_at, expires_at) \
     VALUES ($1, $2, $3, 'running', NULL, $4, $4, $5) \
     ON CONFLICT (scope, key) DO UPDATE SET \
     digest = excluded.digest, state = excluded.state, result = NULL, \
     created_at = excluded.created_at, updated_at = excluded.updated_at, \
     expires_at = excluded.expires_at \
     WHERE wharf_idempotency.expires_at <= $4";

/// [`CLAIM_SQL`] made only when `$7` owns handle `$6`, returning whether it was made, the
/// handle, and the record as the
/// statement's snapshot saw it (a record committed while the claim waited is not in that
/// snapshot, and one past its retention does not count: [`settle`] reads it again).
const PG_CLAIM_ON_HANDLE_SQL: &str = "WITH h AS ( \
     SELECT id, kind, owner, created_at, expires_at, idle_ms, last_used_at, data \
     FROM wharf_handles WHERE id = $6), \
     claim AS ( \
     INSERT INTO wharf_idempotency \
     (scope, key, digest, state, result, created_at, updated_at, expires_at) \
     SELECT $1, $2, $3, 'running', NULL, $4, $4, $5 \
     WHERE EXISTS (SELECT 1 FROM h WHERE owner = $7) \
     ON CONFLICT (scope, key) DO UPDATE SET \
     digest = excluded.digest, state = excluded.state, result = NULL, \
     created_at = excluded.created_at, updated_at = excluded.updated_at, \
     expires_at = excluded.expires_at \
     WHERE wharf_idempotency.expires_at <= $4 \
     RETURNING 1) \
     SELECT (SELECT count(*) FROM claim), \
     h.id, h.kind, h.owner, h.created_at, h.expires_at, h.idle_ms, h.last_used_at, h.data, \
     i.digest, i.state, i.result, i.expires_at \
     FROM (SELECT 1) AS one \
     LEFT JOIN h ON true \
     LEFT JOIN wharf_idempotency i ON i.scope = $1 AND i.key = $2";

/// SQLite: a handle and the idempotency record under a key, in one statement.
const SQLITE_LOOKUP_SQL: &str = "SELECT \
     h.id, h.kind, h.owner, h.created_at, h.expires_at, h.idle_ms, h.last_used_at, h.data, \
     i.digest, i.state, i.result, i.expires_at \
     FROM (SELECT 1) AS one \
     LEFT JOIN wharf_handles h ON h.id = ?1 \
     LEFT JOIN wharf_idempotency i ON i.scope = ?2 AND i.key = ?3";

/// SQLite runs one writer at a time, and a write transaction takes the lock first
/// (`BEGIN IMMEDIATE`): no duplicate can run beside this one, so the claim needs no
/// `running` record. The record is looked up here and written, done, with the result
/// ([`SqlTx::complete_claim`]); a crash in between rolls back both.
async fn sqlite_lookup(
    tx: &mut SqlxTx<'static, Any>,
    claim: &Claim,
    handle: Option<&str>,
    now: Millis,
) -> Result<(Option<HandleRecord>, Option<Seen>), StoreError> {
    let row = sqlx::query(SQLITE_LOOKUP_SQL)
        .bind(handle)
        .bind(&claim.scope)
        .bind(&claim.key)
        .fetch_one(&mut **tx)
        .await
        .map_err(db_error)?;
    handle_and_record(&row, 0, now)
}

/// A handle (the columns of [`LOAD_HANDLE_SQL`] from `at`, all null when there is none)
/// followed by an idempotency record's digest, state, result and expiry; a record past its
/// retention counts as absent.
fn handle_and_record(
    row: &AnyRow,
    at: usize,
    now: Millis,
) -> Result<(Option<HandleRecord>, Option<Seen>), StoreError> {
    let get = |e: sqlx::Error| StoreError::Corrupt(format!("lookup row: {e}"));
    let record = match row.try_get::<Option<String>, _>(at).map_err(get)? {
        Some(_) => Some(handle_from_row_at(row, at)?),
        None => None,
    };
    let expires_at: Option<i64> = row.try_get(at + 11).map_err(get)?;
    let seen = match row.try_get::<Option<String>, _>(at + 8).map_err(get)? {
        Some(digest) if expires_at.is_some_and(|e| e > now) => Some(Seen {
            digest,
            state: row.try_get(at + 9).map_err(get)?,
            result: row.try_get(at + 10).map_err(get)?,
        }),
        _ => None,
    };
    Ok((record, seen))
}

/// The outcome of a SQLite lookup: run (the claim is written with the result), or what
/// the record says.
async fn settle_sqlite(
    tx: SqlxTx<'static, Any>,
    claim: &Claim,
    seen: Option<Seen>,
) -> Result<Begin, StoreError> {
    match seen {
        None => Ok(Begin::Run(Box::new(SqlTx {
            tx,
            dialect: Dialect::Sqlite,
            claim_written: false,
        }))),
        Some(seen) => settle(tx, claim, false, Some(seen), Dialect::Sqlite).await,
    }
}

/// An idempotency record as read.
struct Seen {
    digest: String,
    state: String,
    result: Option<String>,
}

/// The outcome of a claim: the transaction holding it, or what the record says.
async fn settle(
    mut tx: SqlxTx<'static, Any>,
    claim: &Claim,
    claimed: bool,
    seen: Option<Seen>,
    dialect: Dialect,
) -> Result<Begin, StoreError> {
    if claimed {
        return Ok(Begin::Run(Box::new(SqlTx {
            tx,
            dialect,
            claim_written: true,
        })));
    }
    let seen = match seen {
        Some(s) if s.state == "done" => s,
        _ => {
            // A statement that waited for another attempt started before it committed; a new
            // statement sees the committed record.
            let row = sqlx::query(
                "SELECT digest, state, result FROM wharf_idempotency WHERE scope = $1 AND key = $2",
            )
            .bind(&claim.scope)
            .bind(&claim.key)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db_error)?
            .ok_or_else(|| {
                StoreError::Busy("the idempotency record changed under this call".into())
            })?;
            Seen {
                digest: row.try_get(0).map_err(db_error)?,
                state: row.try_get(1).map_err(db_error)?,
                result: row.try_get(2).map_err(db_error)?,
            }
        }
    };
    if seen.digest != claim.digest.as_str() {
        return Ok(Begin::Mismatch);
    }
    match (seen.state.as_str(), seen.result) {
        ("done", Some(result)) => Ok(Begin::Replay(result)),
        (state, _) => Err(StoreError::Corrupt(format!(
            "idempotency record in state {state:?} without a result"
        ))),
    }
}

/// Which SQL database a [`SqlStore`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// SQLite (feature `sqlite`).
    Sqlite,
    /// PostgreSQL (feature `postgres`).
    Postgres,
}

/// A store in SQLite or PostgreSQL.
pub struct SqlStore {
    pool: AnyPool,
    dialect: Dialect,
    /// PostgreSQL's mutation locks; SQLite lives on one host, where the core's line is enough.
    locks: Option<pg_lock::PgLocks>,
}

impl SqlStore {
    /// Connects, applies pending migrations (the store's, then the app's) and returns the
    /// store. [`StoreOptions::lock_wait`] bounds how long a write waits for a duplicate still
    /// running (or any other lock) before it is answered "busy, retry".
    pub async fn connect(
        url: &str,
        dialect: Dialect,
        options: &StoreOptions,
    ) -> Result<Self, StoreError> {
        let (max_connections, lock_wait) = (options.max_connections, options.lock_wait);
        let app = match &options.app_migrations {
            Some(app) => app.for_dialect(dialect)?,
            None => None,
        };
        let built = match dialect {
            Dialect::Sqlite => cfg!(feature = "sqlite"),
            Dialect::Postgres => cfg!(feature = "postgres"),
        };
        if !built {
            return Err(StoreError::Backend(format!(
                "this build has no {dialect:?} driver: enable wharf-store's feature for it"
            )));
        }
        sqlx::any::install_default_drivers();
        let wait_ms = lock_wait.as_millis();
        let pool = AnyPoolOptions::new()
            .max_connections(max_connections)
            // A SQLite connection is a file handle in this process: pinging it before each
            // use (a round trip to its thread) cannot find anything wrong.
            .test_before_acquire(dialect == Dialect::Postgres)
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    match dialect {
                        Dialect::Sqlite => {
                            // WAL lets readers run beside the one writer; NORMAL sync is
                            // durable at every commit in WAL mode except across power loss.
                            conn.execute("PRAGMA journal_mode = WAL").await?;
                            conn.execute("PRAGMA synchronous = NORMAL").await?;
                            conn.execute("PRAGMA foreign_keys = ON").await?;
                            conn.execute(&*format!("PRAGMA busy_timeout = {wait_ms}"))
                                .await?;
                        }
                        Dialect::Postgres => {
                            conn.execute(&*format!("SET lock_timeout = {wait_ms}"))
                                .await?;
                        }
                    }
                    Ok(())
                })
            })
            .connect(url)
            .await
            .map_err(|e| StoreError::Backend(format!("cannot open {}: {e}", redact(url))))?;
        migrate(&own_migrations(dialect), &pool, dialect).await?;
        if let Some(app) = app {
            migrate(app, &pool, dialect).await?;
        }
        let locks = match dialect {
            Dialect::Postgres => Some(pg_lock::PgLocks::new(url, max_connections)?),
            Dialect::Sqlite => None,
        };
        Ok(SqlStore {
            pool,
            dialect,
            locks,
        })
    }

    /// PostgreSQL's claim on a handle: BEGIN with a shared advisory lock on the handle (see
    /// `lock_handle`), then the handle, the claim (made only for the owner) and the record as
    /// the statement found it, in one statement.
    async fn pg_claim_on_handle(
        &self,
        claim: &Claim,
        handle: &str,
        owner: &str,
        now: Millis,
    ) -> Result<(Option<HandleRecord>, Option<Begin>), StoreError> {
        // BEGIN takes no parameters, so the id is a literal there: only ids made of letters,
        // digits and '_' (every handle's) get that far.
        if handle.is_empty()
            || !handle
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return Ok((None, None));
        }
        let begin = format!(
            "BEGIN; SELECT pg_advisory_xact_lock_shared(hashtextextended('{handle}', 0))::text"
        );
        let mut tx = self.pool.begin_with(begin).await.map_err(db_error)?;
        let row = sqlx::query(PG_CLAIM_ON_HANDLE_SQL)
            .bind(&claim.scope)
            .bind(&claim.key)
            .bind(claim.digest.as_str())
            .bind(now)
            .bind(claim.expires_at)
            .bind(handle)
            .bind(owner)
            .fetch_one(&mut *tx)
            .await
            .map_err(db_error)?;
        let get = |e: sqlx::Error| StoreError::Corrupt(format!("claim row: {e}"));
        let claimed: i64 = row.try_get(0).map_err(get)?;
        let (record, seen) = handle_and_record(&row, 1, now)?;
        if record.as_ref().is_none_or(|r| r.owner != owner) {
            return Ok((record, None));
        }
        Ok((
            record,
            Some(settle(tx, claim, claimed == 1, seen, self.dialect).await?),
        ))
    }

    /// The connection pool, for apps that keep their own tables next to Wharf's.
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    async fn begin_tx(&self, mode: TxMode) -> Result<SqlxTx<'static, Any>, StoreError> {
        let tx = match (self.dialect, mode) {
            // Taking SQLite's write lock up front: a deferred transaction that read first
            // could fail half-way when it upgrades.
            (Dialect::Sqlite, TxMode::Write) => self.pool.begin_with("BEGIN IMMEDIATE").await,
            _ => self.pool.begin().await,
        };
        tx.map_err(db_error)
    }
}

/// Applies pending migrations. PostgreSQL's migrator locks the database while it works;
/// SQLite's does not, so two processes opening a new file at once both apply the first
/// migration and the later one fails on the other's tables. Each migration commits with its
/// record, so reading the applied ones again and going on is safe: a SQLite store retries,
/// at most once per migration.
async fn migrate(migrator: &Migrator, pool: &AnyPool, dialect: Dialect) -> Result<(), StoreError> {
    let mut retries = match dialect {
        Dialect::Sqlite => migrator.iter().count(),
        Dialect::Postgres => 0,
    };
    loop {
        match migrator.run(pool).await {
            Ok(()) => return Ok(()),
            Err(e) if retries > 0 => {
                retries -= 1;
                tracing::debug!(error = %e, "a migration failed; reading the applied ones again");
            }
            Err(e) => return Err(StoreError::Backend(format!("migrations failed: {e}"))),
        }
    }
}

/// The URL without its password (in the authority or as a `password=` parameter), for
/// messages.
fn redact(url: &str) -> String {
    if let Some((base, query)) = url.split_once('?') {
        let query: Vec<String> = query
            .split('&')
            .map(|p| match p.split_once('=') {
                Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                _ => p.to_owned(),
            })
            .collect();
        return format!("{}?{}", redact(base), query.join("&"));
    }
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.find(':') {
                Some(c) => format!("{}{}:***{}", &url[..s + 3], &creds[..c], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// Maps a database error: lock waits that ran out become [`StoreError::Busy`].
pub(crate) fn db_error(e: sqlx::Error) -> StoreError {
    if let sqlx::Error::Database(db) = &e {
        let code = db.code();
        let busy = matches!(
            code.as_deref(),
            // PostgreSQL: lock_not_available, serialization_failure, deadlock_detected.
            Some("55P03" | "40001" | "40P01")
                // SQLite: SQLITE_BUSY and its extended codes, SQLITE_LOCKED.
                | Some("5" | "6" | "261" | "517" | "773")
        );
        if busy {
            return StoreError::Busy(format!("a lock was held too long ({})", db.message()));
        }
    }
    if matches!(e, sqlx::Error::PoolTimedOut) {
        return StoreError::Busy("no database connection was free in time".into());
    }
    StoreError::Backend(e.to_string())
}

pub(crate) fn read_json(text: &str) -> Result<Value, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("stored JSON: {e}")))
}

fn handle_from_row(row: &AnyRow) -> Result<HandleRecord, StoreError> {
    handle_from_row_at(row, 0)
}

/// A handle from the columns of [`LOAD_HANDLE_SQL`], starting at column `at`.
fn handle_from_row_at(row: &AnyRow, at: usize) -> Result<HandleRecord, StoreError> {
    let get = |e: sqlx::Error| StoreError::Corrupt(format!("handle row: {e}"));
    Ok(HandleRecord {
        id: row.try_get(at).map_err(get)?,
        kind: row.try_get(at + 1).map_err(get)?,
        owner: row.try_get(at + 2).map_err(get)?,
        created_at: row.try_get(at + 3).map_err(get)?,
        expires_at: row.try_get(at + 4).map_err(get)?,
        idle_ms: row.try_get(at + 5).map_err(get)?,
        last_used_at: row.try_get(at + 6).map_err(get)?,
        data: row
            .try_get::<Option<String>, _>(at + 7)
            .map_err(get)?
            .as_deref()
            .map(read_json)
            .transpose()?,
    })
}

/// The bounds of the collections filed under a handle: `id/` up to (not including) `id0`,
/// `0` being the character after `/`.
fn owned_range(handle: &str) -> (String, String) {
    (format!("{handle}/"), format!("{handle}0"))
}

#[async_trait]
impl Store for SqlStore {
    fn backend(&self) -> &'static str {
        match self.dialect {
            Dialect::Sqlite => "sqlite",
            Dialect::Postgres => "postgres",
        }
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map(drop)
            .map_err(db_error)
    }

    async fn load_handle(&self, id: &str) -> Result<Option<HandleRecord>, StoreError> {
        let row = sqlx::query(LOAD_HANDLE_SQL)
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)?;
        row.as_ref().map(handle_from_row).transpose()
    }

    async fn touch_handle(&self, id: &str, now: Millis) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE wharf_handles SET last_used_at = $2 WHERE id = $1 AND last_used_at < $2",
        )
        .bind(id)
        .bind(now)
        .execute(&self.pool)
        .await
        .map(drop)
        .map_err(db_error)
    }

    async fn begin(&self, mode: TxMode) -> Result<Box<dyn Transaction>, StoreError> {
        Ok(Box::new(SqlTx {
            tx: self.begin_tx(mode).await?,
            dialect: self.dialect,
            claim_written: false,
        }))
    }

    async fn begin_idempotent(&self, claim: &Claim, now: Millis) -> Result<Begin, StoreError> {
        let mut tx = self.begin_tx(TxMode::Write).await?;
        if self.dialect == Dialect::Sqlite {
            let (_, seen) = sqlite_lookup(&mut tx, claim, None, now).await?;
            return settle_sqlite(tx, claim, seen).await;
        }
        let claimed = sqlx::query(CLAIM_SQL)
            .bind(&claim.scope)
            .bind(&claim.key)
            .bind(claim.digest.as_str())
            .bind(now)
            .bind(claim.expires_at)
            .execute(&mut *tx)
            .await
            .map_err(db_error)?
            .rows_affected()
            == 1;
        settle(tx, claim, claimed, None, self.dialect).await
    }

    async fn claim_on_handle(
        &self,
        claim: &Claim,
        handle: &str,
        owner: &str,
        now: Millis,
    ) -> Result<(Option<HandleRecord>, Option<Begin>), StoreError> {
        if self.dialect == Dialect::Postgres {
            return self.pg_claim_on_handle(claim, handle, owner, now).await;
        }
        let mut tx = self.begin_tx(TxMode::Write).await?;
        let (record, seen) = sqlite_lookup(&mut tx, claim, Some(handle), now).await?;
        if record.as_ref().is_none_or(|r| r.owner != owner) {
            return Ok((record, None));
        }
        Ok((record, Some(settle_sqlite(tx, claim, seen).await?)))
    }

    fn shares_locks(&self) -> bool {
        self.locks.is_some()
    }

    async fn lock_key(&self, key: &str) -> Result<Option<Box<dyn KeyLock>>, StoreError> {
        match &self.locks {
            Some(locks) => locks.lock(key).await.map(Some),
            None => Ok(None),
        }
    }

    async fn sweep(&self, now: Millis, batch: u32) -> Result<u64, StoreError> {
        let cutoff = now.saturating_sub(EXPIRED_HANDLE_GRACE_MS);
        let mut tx = self.begin_tx(TxMode::Write).await?;
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM wharf_handles \
             WHERE expires_at < $1 OR (idle_ms IS NOT NULL AND last_used_at + idle_ms < $1) \
             LIMIT $2",
        )
        .bind(cutoff)
        .bind(i64::from(batch))
        .fetch_all(&mut *tx)
        .await
        .map_err(db_error)?;
        let mut removed = 0;
        for id in &ids {
            retire(&mut tx, id, self.dialect).await?;
            removed += 1;
        }
        removed += sqlx::query(
            "DELETE FROM wharf_idempotency WHERE (scope, key) IN \
             (SELECT scope, key FROM wharf_idempotency WHERE expires_at <= $1 LIMIT $2)",
        )
        .bind(now)
        .bind(i64::from(batch))
        .execute(&mut *tx)
        .await
        .map_err(db_error)?
        .rows_affected();
        tx.commit().await.map_err(db_error)?;
        Ok(removed)
    }
}

/// A transaction on a [`SqlStore`]: what [`Transaction::backend_tx`] of a SQL store gives,
/// for code that writes its own tables in the call's transaction ([`SqlTx::sqlx`]).
pub struct SqlTx {
    tx: SqlxTx<'static, Any>,
    dialect: Dialect,
    /// Whether the claim's record was written as `running` when it was claimed (PostgreSQL);
    /// on SQLite it is written only on completion.
    claim_written: bool,
}

/// Takes the advisory lock that stands for handle `id` until the transaction ends: shared
/// for writing under it, exclusive for changing or retiring it.
async fn lock_handle(
    tx: &mut SqlxTx<'static, Any>,
    id: &str,
    exclusive: bool,
) -> Result<(), StoreError> {
    let sql = if exclusive {
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))::text"
    } else {
        "SELECT pg_advisory_xact_lock_shared(hashtextextended($1, 0))::text"
    };
    sqlx::query(sql)
        .bind(id)
        .execute(&mut **tx)
        .await
        .map(drop)
        .map_err(db_error)
}

async fn retire(
    tx: &mut SqlxTx<'static, Any>,
    id: &str,
    dialect: Dialect,
) -> Result<(), StoreError> {
    if dialect == Dialect::Postgres {
        // Calls still writing under the handle finish first; later ones find it gone.
        lock_handle(tx, id, true).await?;
    }
    sqlx::query("DELETE FROM wharf_handles WHERE id = $1")
        .bind(id)
        .execute(&mut **tx)
        .await
        .map_err(db_error)?;
    let (lo, hi) = owned_range(id);
    for table in [
        "DELETE FROM wharf_rows WHERE collection >= $1 AND collection < $2",
        "DELETE FROM wharf_docs WHERE collection >= $1 AND collection < $2",
        "DELETE FROM wharf_collections WHERE name >= $1 AND name < $2",
    ] {
        sqlx::query(table)
            .bind(&lo)
            .bind(&hi)
            .execute(&mut **tx)
            .await
            .map_err(db_error)?;
    }
    Ok(())
}

impl SqlTx {
    /// The underlying sqlx transaction: statements run in it commit with the call (and its
    /// idempotency record), or not at all.
    pub fn sqlx(&mut self) -> &mut SqlxTx<'static, Any> {
        &mut self.tx
    }

    /// The database it talks to.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    async fn handle_exists(&mut self, id: &str) -> Result<bool, StoreError> {
        let row = sqlx::query("SELECT 1 FROM wharf_handles WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut *self.tx)
            .await
            .map_err(db_error)?;
        Ok(row.is_some())
    }
}

#[async_trait]
impl Transaction for SqlTx {
    async fn create_handle(&mut self, r: &HandleRecord) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO wharf_handles \
             (id, kind, owner, created_at, expires_at, idle_ms, last_used_at, data) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&r.id)
        .bind(&r.kind)
        .bind(&r.owner)
        .bind(r.created_at)
        .bind(r.expires_at)
        .bind(r.idle_ms)
        .bind(r.last_used_at)
        .bind(r.data.as_ref().map(Value::to_string))
        .execute(&mut *self.tx)
        .await
        .map(drop)
        .map_err(db_error)
    }

    async fn retire_handle(&mut self, id: &str) -> Result<(), StoreError> {
        retire(&mut self.tx, id, self.dialect).await
    }

    async fn hold_handle(
        &mut self,
        id: &str,
        touch_at: Option<Millis>,
    ) -> Result<bool, StoreError> {
        // PostgreSQL: a transaction-scoped advisory lock on the handle, shared by the calls
        // that write under it, exclusive for one that records a use or retires it (held in
        // memory: no row is written for it). The check runs after the lock is granted, in a
        // statement of its own, so it sees a retirement that committed while it waited.
        // SQLite's write transactions hold the whole database already.
        if self.dialect == Dialect::Postgres {
            lock_handle(&mut self.tx, id, touch_at.is_some()).await?;
        }
        let found = match touch_at {
            Some(now) => {
                sqlx::query(
                    "UPDATE wharf_handles SET last_used_at = $2 \
                     WHERE id = $1 AND last_used_at <= $2",
                )
                .bind(id)
                .bind(now)
                .execute(&mut *self.tx)
                .await
                .map_err(db_error)?
                .rows_affected()
                    > 0
                    || self.handle_exists(id).await?
            }
            None => self.handle_exists(id).await?,
        };
        Ok(found)
    }

    async fn complete_claim(&mut self, claim: &Claim, result: &str) -> Result<(), StoreError> {
        let now = wharf::store::now_millis();
        let query = if self.claim_written {
            sqlx::query(
                "UPDATE wharf_idempotency SET state = 'done', result = $3, updated_at = $4 \
                 WHERE scope = $1 AND key = $2 AND state = 'running'",
            )
            .bind(&claim.scope)
            .bind(&claim.key)
            .bind(result)
            .bind(now)
        } else {
            // Replaces a record past its retention, never a live one.
            sqlx::query(
                "INSERT INTO wharf_idempotency \
                 (scope, key, digest, state, result, created_at, updated_at, expires_at) \
                 VALUES ($1, $2, $5, 'done', $3, $4, $4, $6) \
                 ON CONFLICT (scope, key) DO UPDATE SET \
                 digest = excluded.digest, state = excluded.state, result = excluded.result, \
                 created_at = excluded.created_at, updated_at = excluded.updated_at, \
                 expires_at = excluded.expires_at \
                 WHERE wharf_idempotency.expires_at <= $4",
            )
            .bind(&claim.scope)
            .bind(&claim.key)
            .bind(result)
            .bind(now)
            .bind(claim.digest.as_str())
            .bind(claim.expires_at)
        };
        let n = query
            .execute(&mut *self.tx)
            .await
            .map_err(db_error)?
            .rows_affected();
        if n == 1 {
            Ok(())
        } else {
            Err(StoreError::ClaimLost)
        }
    }

    async fn commit(self: Box<Self>) -> Result<(), StoreError> {
        self.tx.commit().await.map_err(db_error)
    }

    fn backend_tx(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/x"),
            "postgres://app:***@db:5432/x"
        );
        assert_eq!(redact("sqlite://./wharf.db"), "sqlite://./wharf.db");
        assert_eq!(
            redact("postgres://db/x?user=a&password=s3cret&sslmode=require"),
            "postgres://db/x?user=a&password=***&sslmode=require"
        );
    }
}
