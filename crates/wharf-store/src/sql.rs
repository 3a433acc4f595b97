//! SQLite and PostgreSQL, each through its own sqlx driver (so an app's code in the call's
//! transaction gets the typed `sqlx::Transaction` of its database): one set of portable SQL
//! where the two agree, a migration set per database.
//!
//! Exactly-once writes rest on the database's own locks. An idempotent call inserts its
//! record as `running` inside the transaction that will hold the handler's writes, and marks
//! it `done` with the result in the same transaction. Nobody else ever sees a `running`
//! record: on PostgreSQL a duplicate's insert waits on the first transaction's uncommitted
//! row (bounded by `lock_timeout`), on SQLite the write lock serializes writers (bounded by
//! `busy_timeout`). When the first attempt commits, the duplicate finds the result; when it
//! dies (a crash drops the connection, the database rolls back), the duplicate runs instead.

#[cfg(feature = "postgres")]
mod control;
#[cfg(feature = "postgres")]
mod pg_lock;
mod records;

use async_trait::async_trait;

#[cfg(doc)]
use crate::migrations::AppMigrations;
use crate::migrations::tolerant;
use crate::{Dialect, EXPIRED_HANDLE_GRACE_MS, StoreOptions};
use serde_json::Value;
use sqlx::migrate::Migrator;
use sqlx::{Executor, Row};
use wharf::store::{
    Begin, Claim, Fence, HandleRecord, KeyLock, Millis, NewRecord, Record, SHARED_KEY_LEN,
    SharedKey, Store, StoreError, Transaction, TxMode, Write, check_key,
};

#[cfg(feature = "postgres")]
use sqlx::Postgres;
#[cfg(feature = "sqlite")]
use sqlx::Sqlite;

/// Runs `$body` with `$c` bound to the inner value of whichever variant `$e` (a [`SqlPool`] or
/// [`TypedTx`], by value or reference) holds: the body is compiled once per driver, so the
/// same query text binds and decodes with each database's own types.
macro_rules! on_driver {
    ($ty:ident, $e:expr, |$c:ident| $body:expr) => {
        match $e {
            #[cfg(feature = "sqlite")]
            $ty::Sqlite($c) => $body,
            #[cfg(feature = "postgres")]
            $ty::Postgres($c) => $body,
        }
    };
}

pub(crate) use on_driver;

/// Records a use of a handle, later than the last one recorded (SQLite).
#[cfg(feature = "sqlite")]
const TOUCH_SQL: &str =
    "UPDATE wharf_handles SET last_used_at = $2 WHERE id = $1 AND last_used_at < $2";
/// As SQLite's touch, except that a handle whose row another transaction holds (a call that
/// recorded its own use of it at its start, and commits at its end) is left as it is: that
/// use is about as recent, and waiting for the other call to end would hold this one (a read
/// that already has its answer, or a write under the same handle) for as long, and fail it
/// busy past the lock wait. So a handle may idle out early by as long as that call ran, one
/// touch interval more, or, should that call roll back, by the whole of it since the last
/// use recorded. A claim's `FOR KEY SHARE` does not conflict with this lock, so a use under
/// a running claim is recorded (PostgreSQL).
#[cfg(feature = "postgres")]
const PG_TOUCH_SQL: &str = "UPDATE wharf_handles SET last_used_at = $2 WHERE id = \
     (SELECT id FROM wharf_handles WHERE id = $1 AND last_used_at < $2 \
     FOR NO KEY UPDATE SKIP LOCKED)";

/// A connection pool of either database, for apps that read or write their own tables
/// outside a call (inside one, use the call's [`SqlTx`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum SqlPool {
    /// SQLite (feature `sqlite`).
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::SqlitePool),
    /// PostgreSQL (feature `postgres`).
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
}

/// The call's transaction as its database's typed sqlx transaction: statements run in it
/// commit with the call and its idempotency record, or not at all.
#[derive(Debug)]
#[non_exhaustive]
pub enum TypedTx {
    /// SQLite (feature `sqlite`).
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::Transaction<'static, Sqlite>),
    /// PostgreSQL (feature `postgres`).
    #[cfg(feature = "postgres")]
    Postgres(sqlx::Transaction<'static, Postgres>),
}

/// The columns the store reads, from either driver's rows.
trait Columns {
    fn text(&self, at: usize) -> Result<Option<String>, sqlx::Error>;
    fn int(&self, at: usize) -> Result<Option<i64>, sqlx::Error>;
}

macro_rules! columns {
    ($row:ty) => {
        impl Columns for $row {
            fn text(&self, at: usize) -> Result<Option<String>, sqlx::Error> {
                self.try_get(at)
            }
            fn int(&self, at: usize) -> Result<Option<i64>, sqlx::Error> {
                self.try_get(at)
            }
        }
    };
}
#[cfg(feature = "sqlite")]
columns!(sqlx::sqlite::SqliteRow);
#[cfg(feature = "postgres")]
columns!(sqlx::postgres::PgRow);

/// A column that may not be null.
fn required<T>(value: Option<T>, what: &str, at: usize) -> Result<T, StoreError> {
    value.ok_or_else(|| StoreError::Corrupt(format!("{what}: column {at} is null")))
}

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
#[cfg(feature = "postgres")]
const CLAIM_SQL: &str = "INSERT INTO wharf_idempotency \
     (scope, key, digest, state, result, created_at, updated_at, expires_at) \
     VALUES ($1, $2, $3, 'running', NULL, $4, $4, $5) \
     ON CONFLICT (scope, key) DO UPDATE SET \
     digest = excluded.digest, state = excluded.state, result = NULL, \
     created_at = excluded.created_at, updated_at = excluded.updated_at, \
     expires_at = excluded.expires_at \
     WHERE wharf_idempotency.expires_at <= $4";

/// [`CLAIM_SQL`] made only when `$7` owns handle `$6`, under the handle's lock taken shared
/// (see [`lock_handle`]) in the same statement, returning whether it was made, the handle,
/// and the record as the statement's snapshot saw it (a record committed while the claim
/// waited is not in that snapshot, and one past its retention does not count: [`settle`]
/// reads it again).
///
/// The lock is taken first (a one-time filter runs before the scan it guards). The snapshot
/// is older than the lock, so the handle's row is read `FOR KEY SHARE`: under READ
/// COMMITTED a locked row deleted since the snapshot is skipped, so a retirement that
/// committed while the lock waited leaves nothing to claim under. A handle replaced
/// (deleted and inserted again) in that time is skipped too, so a missing handle costs a
/// second statement ([`SqlStore::pg_claim_on_handle`] reads it again). A use recorded in that
/// time (`last_used_at`, which no lock orders) may not be seen: only a retirement that was
/// rolled back makes the lock wait, and then by at most the store's lock wait.
///
/// The row lock is written into the handle's tuple (a log record per claim; a MultiXact when
/// claims on one handle overlap), where the advisory lock lives in memory. It did not show:
/// the statement takes about 55 µs, as the claim and the lock's own statement took together
/// before (BENCHMARKS.md, 2026-12-05).
#[cfg(feature = "postgres")]
const PG_CLAIM_ON_HANDLE_SQL: &str = "WITH held AS MATERIALIZED ( \
     SELECT pg_advisory_xact_lock_shared(hashtextextended($6, 0))), \
     h AS ( \
     SELECT id, kind, owner, created_at, expires_at, idle_ms, last_used_at, data \
     FROM wharf_handles WHERE id = $6 AND EXISTS (SELECT 1 FROM held) FOR KEY SHARE), \
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
#[cfg(feature = "sqlite")]
const SQLITE_LOOKUP_SQL: &str = "SELECT \
     h.id, h.kind, h.owner, h.created_at, h.expires_at, h.idle_ms, h.last_used_at, h.data, \
     i.digest, i.state, i.result, i.expires_at \
     FROM (SELECT 1) AS one \
     LEFT JOIN wharf_handles h ON h.id = ?1 \
     LEFT JOIN wharf_idempotency i ON i.scope = ?2 AND i.key = ?3";

/// Binds `$1` to `$5` of [`CLAIM_SQL`] and [`PG_CLAIM_ON_HANDLE_SQL`]: the claim's scope,
/// key and digest, `now`, and the record's expiry.
#[cfg(feature = "postgres")]
fn bind_claim<'q>(
    query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    claim: &'q Claim,
    now: Millis,
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    query
        .bind(&claim.scope)
        .bind(&claim.key)
        .bind(claim.digest.as_str())
        .bind(now)
        .bind(claim.expires_at)
}

/// Runs [`PG_CLAIM_ON_HANDLE_SQL`] in `tx`: whether the claim was made, the handle, and the
/// record the statement saw.
#[cfg(feature = "postgres")]
async fn pg_claim_statement(
    tx: &mut sqlx::Transaction<'static, Postgres>,
    claim: &Claim,
    handle: &str,
    owner: &str,
    now: Millis,
) -> Result<(bool, Option<HandleRecord>, Option<Seen>), StoreError> {
    let row = bind_claim(sqlx::query(PG_CLAIM_ON_HANDLE_SQL), claim, now)
        .bind(handle)
        .bind(owner)
        .fetch_one(&mut **tx)
        .await
        .map_err(db_error)?;
    let get = |e: sqlx::Error| StoreError::Corrupt(format!("claim row: {e}"));
    let claimed = row.int(0).map_err(get)? == Some(1);
    let (record, seen) = handle_and_record(&row, 1, now)?;
    Ok((claimed, record, seen))
}

/// SQLite runs one writer at a time, and a write transaction takes the lock first
/// (`BEGIN IMMEDIATE`): no duplicate can run beside this one, so the claim needs no
/// `running` record. The record is looked up here and written, done, with the result
/// ([`SqlTx::complete_claim`]); a crash in between rolls back both.
#[cfg(feature = "sqlite")]
async fn sqlite_lookup(
    tx: &mut sqlx::Transaction<'static, Sqlite>,
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
    row: &impl Columns,
    at: usize,
    now: Millis,
) -> Result<(Option<HandleRecord>, Option<Seen>), StoreError> {
    let get = |e: sqlx::Error| StoreError::Corrupt(format!("lookup row: {e}"));
    let record = match row.text(at).map_err(get)? {
        Some(_) => Some(handle_from_row_at(row, at)?),
        None => None,
    };
    let expires_at = row.int(at + 11).map_err(get)?;
    let seen = match row.text(at + 8).map_err(get)? {
        Some(digest) if expires_at.is_some_and(|e| e > now) => Some(Seen {
            digest,
            state: required(row.text(at + 9).map_err(get)?, "lookup row", at + 9)?,
            result: row.text(at + 10).map_err(get)?,
        }),
        _ => None,
    };
    Ok((record, seen))
}

/// The outcome of a SQLite lookup: run (the claim is written with the result), or what
/// the record says.
#[cfg(feature = "sqlite")]
async fn settle_sqlite(
    tx: sqlx::Transaction<'static, Sqlite>,
    claim: &Claim,
    seen: Option<Seen>,
) -> Result<Begin, StoreError> {
    let tx = TypedTx::Sqlite(tx);
    match seen {
        None => Ok(Begin::Run(Box::new(SqlTx::new(tx, false)))),
        Some(seen) => settle(tx, claim, false, Some(seen)).await,
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
    mut tx: TypedTx,
    claim: &Claim,
    claimed: bool,
    seen: Option<Seen>,
) -> Result<Begin, StoreError> {
    if claimed {
        return Ok(Begin::Run(Box::new(SqlTx::new(tx, true))));
    }
    let seen = match seen {
        Some(s) if s.state == "done" => s,
        _ => {
            // A statement that waited for another attempt started before it committed; a new
            // statement sees the committed record.
            let sql =
                "SELECT digest, state, result FROM wharf_idempotency WHERE scope = $1 AND key = $2";
            let row = on_driver!(TypedTx, &mut tx, |tx| {
                let row = sqlx::query(sql)
                    .bind(&claim.scope)
                    .bind(&claim.key)
                    .fetch_optional(&mut **tx)
                    .await
                    .map_err(db_error)?;
                row.map(|row| -> Result<_, sqlx::Error> {
                    Ok((row.text(0)?, row.text(1)?, row.text(2)?))
                })
                .transpose()
                .map_err(db_error)?
            });
            let (digest, state, result) = row.ok_or_else(|| {
                StoreError::Busy("the idempotency record changed under this call".into())
            })?;
            Seen {
                digest: required(digest, "idempotency row", 0)?,
                state: required(state, "idempotency row", 1)?,
                result,
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

/// A store in SQLite or PostgreSQL.
pub struct SqlStore {
    pool: SqlPool,
    /// PostgreSQL's mutation locks; SQLite lives on one host, where the core's line is enough.
    #[cfg(feature = "postgres")]
    locks: Option<pg_lock::PgLocks>,
    /// PostgreSQL's LISTEN/NOTIFY bus; SQLite processes keep to their own.
    #[cfg(feature = "postgres")]
    bus: Option<std::sync::Arc<crate::bus::StoreBus>>,
    /// Where PostgreSQL's commits write what they announce.
    #[cfg(feature = "postgres")]
    outbox: Option<std::sync::Arc<crate::bus::PgOutbox>>,
    /// PostgreSQL's connection for the readiness ping and the bus's heartbeat.
    #[cfg(feature = "postgres")]
    control: Option<std::sync::Arc<control::ControlSession>>,
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
        if options.max_connections == 0 {
            // sqlx's pool panics on a capacity of 0.
            return Err(StoreError::Backend(
                "StoreOptions::max_connections must be at least 1".into(),
            ));
        }
        let app = match &options.app_migrations {
            Some(app) => app.for_dialect(dialect)?,
            None => None,
        };
        let pool = SqlPool::connect(url, dialect, options).await?;
        migrate(&own_migrations(dialect), &pool, options).await?;
        if let Some(app) = app {
            migrate(app, &pool, options).await?;
        }
        #[cfg(feature = "postgres")]
        let (bus, outbox, control) = match &pool {
            SqlPool::Postgres(pg) => {
                let control = std::sync::Arc::new(control::ControlSession::new(
                    (*pg.connect_options()).clone(),
                ));
                let bus = crate::bus::postgres(pg.clone(), heartbeat_on(&control));
                let outbox = crate::bus::PgOutbox::new(pg.clone(), std::sync::Arc::clone(&bus));
                (Some(bus), Some(std::sync::Arc::new(outbox)), Some(control))
            }
            #[cfg(feature = "sqlite")]
            SqlPool::Sqlite(_) => (None, None, None),
        };
        Ok(SqlStore {
            #[cfg(feature = "postgres")]
            locks: match dialect {
                Dialect::Postgres => Some(pg_lock::PgLocks::new(url, options.max_connections)?),
                Dialect::Sqlite => None,
            },
            #[cfg(feature = "postgres")]
            bus,
            #[cfg(feature = "postgres")]
            outbox,
            #[cfg(feature = "postgres")]
            control,
            pool,
        })
    }

    /// `tx` (this store's) set to write what its commit announces to the store's outbox
    /// (PostgreSQL with a bus; see [`crate::bus::PgOutbox`]).
    fn equipped(&self, tx: Box<dyn Transaction>) -> Box<dyn Transaction> {
        #[cfg(feature = "postgres")]
        let mut tx = tx;
        #[cfg(feature = "postgres")]
        if let Some(sql) = tx.backend_tx().downcast_mut::<SqlTx>() {
            sql.outbox.clone_from(&self.outbox);
        }
        tx
    }

    /// [`SqlStore::equipped`] for the transaction a claim began, if it runs.
    fn equip(&self, begin: Begin) -> Begin {
        match begin {
            Begin::Run(tx) => Begin::Run(self.equipped(tx)),
            settled => settled,
        }
    }

    /// PostgreSQL's claim on a handle: BEGIN, then the handle's shared lock, the handle, the
    /// claim (made only for the owner) and the record as the statement found it, in one
    /// statement ([`PG_CLAIM_ON_HANDLE_SQL`]).
    ///
    /// The statement runs in the open transaction, not in a `BEGIN` batch: a batch whose lock
    /// wait fails (lock timeout, deadlock) or is abandoned leaves the session in a failed or
    /// open transaction that sqlx does not know it began, and the pool would hand that
    /// session to the next call.
    #[cfg(feature = "postgres")]
    async fn pg_claim_on_handle(
        pool: &sqlx::PgPool,
        claim: &Claim,
        handle: &str,
        owner: &str,
        now: Millis,
    ) -> Result<(Option<HandleRecord>, Option<Begin>), StoreError> {
        let mut tx = pg_begin(pool).await?;
        let mut read = pg_claim_statement(&mut tx, claim, handle, owner, now).await?;
        if read.1.is_none() {
            // Gone, or replaced while the lock waited (the new row is not in the snapshot).
            // The lock is held now: a second statement's read is the last word.
            read = pg_claim_statement(&mut tx, claim, handle, owner, now).await?;
        }
        let (claimed, record, seen) = read;
        if record.as_ref().is_none_or(|r| r.owner != owner) {
            return Ok((record, None));
        }
        let begin = settle(TypedTx::Postgres(tx), claim, claimed, seen).await?;
        Ok((record, Some(begin)))
    }

    /// The connection pool, for apps that keep their own tables next to Wharf's.
    pub fn pool(&self) -> &SqlPool {
        &self.pool
    }

    /// The database it talks to.
    pub fn dialect(&self) -> Dialect {
        self.pool.dialect()
    }

    async fn begin_tx(&self, mode: TxMode) -> Result<TypedTx, StoreError> {
        match &self.pool {
            // Taking SQLite's write lock up front: a deferred transaction that read first
            // could fail half-way when it upgrades.
            #[cfg(feature = "sqlite")]
            SqlPool::Sqlite(pool) => match mode {
                TxMode::Write => sqlite_begin_write(pool).await,
                TxMode::Read => pool.begin().await.map_err(db_error),
            }
            .map(TypedTx::Sqlite),
            // PostgreSQL takes row locks as statements need them, whatever the mode.
            #[cfg(feature = "postgres")]
            SqlPool::Postgres(pool) => {
                let _ = mode;
                pg_begin(pool).await.map(TypedTx::Postgres)
            }
        }
    }
}

/// [`StoreOptions::lock_wait`] in milliseconds, as SQLite's `busy_timeout` and PostgreSQL's
/// `lock_timeout` take it: PostgreSQL reads 0 as "wait forever", and refuses more than an
/// int of milliseconds.
fn lock_wait_ms(options: &StoreOptions) -> u128 {
    options.lock_wait.as_millis().clamp(1, i32::MAX as u128)
}

/// The settings every PostgreSQL session of a store takes, in one round trip.
///
/// Every statement of the store is written for READ COMMITTED, PostgreSQL's default: a
/// row another transaction changed while a statement waited for it is read again, where a
/// stricter level (a role's or database's `default_transaction_isolation`) would fail the
/// statement instead. So each session sets it for itself.
///
/// And TCP keepalives on the server's side of the connection (30 s idle, then 3 probes 10 s
/// apart), so that a replica whose host vanished (a crash, a network cut: nothing closes
/// its connections) has its transactions and mutation locks ended in about a minute rather
/// than the two hours of the operating system's default, which would hold every call on
/// its keys. Unix-socket sessions ignore them.
#[cfg(feature = "postgres")]
pub(crate) async fn session_settings(conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    conn.execute(
        "SELECT set_config('default_transaction_isolation', 'read committed', false), \
                set_config('tcp_keepalives_idle', '30', false), \
                set_config('tcp_keepalives_interval', '10', false), \
                set_config('tcp_keepalives_count', '3', false)",
    )
    .await
    .map(drop)
}

/// The bus's heartbeat, published on `control` (see [`control`]).
#[cfg(feature = "postgres")]
fn heartbeat_on(control: &std::sync::Arc<control::ControlSession>) -> crate::bus::Publish {
    let control = std::sync::Arc::clone(control);
    Box::new(move |payload| {
        let control = std::sync::Arc::clone(&control);
        Box::pin(async move {
            let notify = || {
                sqlx::query("SELECT pg_notify($1, $2)")
                    .bind(crate::bus::CHANNEL)
                    .bind(payload.as_str())
            };
            control.execute(notify).await.map_err(|e| e.to_string())
        })
    })
}

/// A session of the calls' pool: [`session_settings`], and lock waits bounded by
/// `wait_ms` ([`StoreOptions::lock_wait`]).
#[cfg(feature = "postgres")]
async fn call_session(conn: &mut sqlx::PgConnection, wait_ms: u128) -> Result<(), sqlx::Error> {
    conn.execute(&*format!("SET lock_timeout = {wait_ms}"))
        .await?;
    session_settings(conn).await
}

impl SqlPool {
    /// Opens a pool with the settings every store connection needs.
    async fn connect(
        url: &str,
        dialect: Dialect,
        options: &StoreOptions,
    ) -> Result<Self, StoreError> {
        let wait_ms = lock_wait_ms(options);
        let opened = match dialect {
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => sqlx::pool::PoolOptions::<Sqlite>::new()
                .max_connections(options.max_connections)
                // A SQLite connection is a file handle in this process: pinging it before
                // each use (a round trip to its thread) cannot find anything wrong.
                .test_before_acquire(false)
                .after_connect(move |conn, _| {
                    Box::pin(async move {
                        // WAL lets readers run beside the one writer. FULL syncs the log at
                        // every commit: a write answered (and its idempotency record) survives
                        // the host losing power, where NORMAL could lose the last commits, so
                        // that a retry would make the write again and answer otherwise.
                        conn.execute("PRAGMA journal_mode = WAL").await?;
                        conn.execute("PRAGMA synchronous = FULL").await?;
                        conn.execute("PRAGMA foreign_keys = ON").await?;
                        conn.execute(&*format!("PRAGMA busy_timeout = {wait_ms}"))
                            .await?;
                        Ok(())
                    })
                })
                .connect(url)
                .await
                .map(SqlPool::Sqlite),
            #[cfg(feature = "postgres")]
            Dialect::Postgres => sqlx::pool::PoolOptions::<Postgres>::new()
                .max_connections(options.max_connections)
                .after_connect(move |conn, _| Box::pin(call_session(conn, wait_ms)))
                .connect(url)
                .await
                .map(SqlPool::Postgres),
            #[allow(unreachable_patterns)]
            _ => {
                return Err(StoreError::Backend(format!(
                    "this build has no {dialect:?} driver: enable wharf-store's feature for it"
                )));
            }
        };
        opened.map_err(|e| StoreError::Backend(format!("cannot open {}: {e}", redact(url))))
    }

    /// The database it talks to.
    pub fn dialect(&self) -> Dialect {
        match self {
            #[cfg(feature = "sqlite")]
            SqlPool::Sqlite(_) => Dialect::Sqlite,
            #[cfg(feature = "postgres")]
            SqlPool::Postgres(_) => Dialect::Postgres,
        }
    }
}

/// The advisory lock a store takes before it migrates a PostgreSQL database, its own (the
/// migrator's is taken under the lock wait its statements run with): "wharf_mg".
#[cfg(feature = "postgres")]
pub const PG_MIGRATIONS_LOCK: i64 = 0x7768_6172_665f_6d67;

/// Applies pending migrations. On PostgreSQL one replica migrates at a time, the others
/// waiting for it (see `migrate_postgres`); SQLite's migrator does not lock, so two
/// processes opening a new file at once both apply the first migration and the later one
/// fails on the other's tables. Each migration commits with its record, so reading the
/// applied ones again and going on is safe: a SQLite store retries, at most once per
/// migration.
async fn migrate(
    migrator: &Migrator,
    pool: &SqlPool,
    options: &StoreOptions,
) -> Result<(), StoreError> {
    // Read by PostgreSQL's migrations only.
    #[cfg(not(feature = "postgres"))]
    let _ = options;
    let mut retries = match pool.dialect() {
        Dialect::Sqlite => migrator.iter().count(),
        Dialect::Postgres => 0,
    };
    loop {
        let ran = match pool {
            #[cfg(feature = "sqlite")]
            SqlPool::Sqlite(pool) => migrator.run(pool).await,
            #[cfg(feature = "postgres")]
            SqlPool::Postgres(pool) => migrate_postgres(migrator, pool, options).await,
        };
        match ran {
            Ok(()) => return Ok(()),
            Err(e) if retries > 0 => {
                retries -= 1;
                tracing::debug!(error = %e, "a migration failed; reading the applied ones again");
            }
            Err(e) => return Err(StoreError::Backend(format!("migrations failed: {e}"))),
        }
    }
}

/// Runs `migrator` in a session of its own, once no other replica migrates: it waits for
/// [`PG_MIGRATIONS_LOCK`] up to ten minutes (a replica started beside one that migrates
/// would otherwise fail its start at the store's lock wait). The migrations' own
/// statements wait no longer than a call's (`lock_wait`): a table lock queued behind a
/// long call would hold every call's statements on that table behind it, so such a start
/// fails, to be retried, instead.
#[cfg(feature = "postgres")]
async fn migrate_postgres(
    migrator: &Migrator,
    pool: &sqlx::PgPool,
    options: &StoreOptions,
) -> Result<(), sqlx::migrate::MigrateError> {
    let wait_ms = lock_wait_ms(options);
    let statements_wait = format!("SET lock_timeout = {wait_ms}");
    let own = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        // Set up as the calls' sessions are: should the pool replace its connection between
        // the statements below, the new one waits as the migrations' statements must (the
        // migrator's own lock still keeps replicas from migrating at once).
        .after_connect(move |conn, _| Box::pin(call_session(conn, wait_ms)))
        .connect_with((*pool.connect_options()).clone())
        .await?;
    sqlx::query("SET lock_timeout = '10min'")
        .execute(&own)
        .await?;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(PG_MIGRATIONS_LOCK)
        .execute(&own)
        .await?;
    sqlx::query(&statements_wait).execute(&own).await?;
    let ran = migrator.run(&own).await;
    // The session ends, and the lock with it.
    own.close().await;
    ran
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

/// Maps a database error as the store does, for app code in the call's transaction: lock
/// waits that ran out, pools without a free connection and connections lost (the database
/// restarting or failing over) become [`StoreError::Busy`] (answered "retry": nothing in
/// the transaction committed), anything else [`StoreError::Backend`].
pub fn db_error(e: sqlx::Error) -> StoreError {
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
            // The database's own words name its tables and engine: they go to the log, and
            // the caller, who sees the message, is told only what to do.
            tracing::debug!(code = ?code, message = db.message(), "database busy");
            return StoreError::Busy(
                "another transaction held what this call needed for too long".into(),
            );
        }
    }
    if matches!(e, sqlx::Error::PoolTimedOut) {
        return StoreError::Busy("no database connection was free in time".into());
    }
    // The database restarting, failing over or cutting the connection: nothing written in
    // a transaction committed, so a retry is safe, as after a busy answer. A statement that
    // commits by itself is told apart by `write_error`.
    if connection_lost(&e) {
        tracing::warn!(error = %e, "the database connection was lost");
        return StoreError::Busy("the database cannot be reached right now".into());
    }
    StoreError::Backend(e.to_string())
}

/// Maps the error of a statement that commits (a `COMMIT`, or a write outside any
/// transaction): a connection lost may have taken the answer of a write that was applied,
/// so it is not called retryable ([`StoreError::Backend`]); anything else as [`db_error`].
pub(crate) fn write_error(e: sqlx::Error) -> StoreError {
    if connection_lost(&e) {
        return StoreError::Backend(format!(
            "the database's answer was lost ({e}); the write may have been applied"
        ));
    }
    db_error(e)
}

/// Whether `e` says the connection went away, or the server is going down or not yet up,
/// rather than that the statement failed.
fn connection_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) => true,
        // PostgreSQL: connection_exception (08xxx), admin_shutdown, crash_shutdown,
        // cannot_connect_now (57P01–57P03), too_many_connections. SQLite's codes are
        // numbers and never match.
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08") || matches!(&*code, "57P01" | "57P02" | "57P03" | "53300")
        }),
        _ => false,
    }
}

pub(crate) fn read_json(text: &str) -> Result<Value, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("stored JSON: {e}")))
}

/// A handle from the columns of [`LOAD_HANDLE_SQL`], starting at column `at`.
fn handle_from_row_at(row: &impl Columns, at: usize) -> Result<HandleRecord, StoreError> {
    let get = |e: sqlx::Error| StoreError::Corrupt(format!("handle row: {e}"));
    let text = |i: usize| required(row.text(at + i).map_err(get)?, "handle row", at + i);
    let int = |i: usize| required(row.int(at + i).map_err(get)?, "handle row", at + i);
    Ok(HandleRecord {
        id: text(0)?,
        kind: text(1)?,
        owner: text(2)?,
        created_at: int(3)?,
        expires_at: int(4)?,
        idle_ms: row.int(at + 5).map_err(get)?,
        last_used_at: int(6)?,
        data: row
            .text(at + 7)
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
        match self.dialect() {
            Dialect::Sqlite => "sqlite",
            Dialect::Postgres => "postgres",
        }
    }

    async fn ping(&self) -> Result<(), StoreError> {
        #[cfg(feature = "postgres")]
        if let Some(control) = &self.control {
            return control
                .execute(|| sqlx::query("SELECT 1"))
                .await
                .map_err(|e| match e {
                    control::ControlError::Db(e) => db_error(e),
                    timed_out => StoreError::Busy(timed_out.to_string()),
                });
        }
        on_driver!(SqlPool, &self.pool, |pool| sqlx::query("SELECT 1")
            .execute(pool)
            .await
            .map(drop)
            .map_err(db_error))
    }

    async fn load_handle(&self, id: &str) -> Result<Option<HandleRecord>, StoreError> {
        on_driver!(SqlPool, &self.pool, |pool| {
            let row = sqlx::query(LOAD_HANDLE_SQL)
                .bind(id)
                .fetch_optional(pool)
                .await
                .map_err(db_error)?;
            row.as_ref().map(|r| handle_from_row_at(r, 0)).transpose()
        })
    }

    async fn replay_of(&self, claim: &Claim, now: Millis) -> Result<Option<String>, StoreError> {
        let sql = "SELECT result FROM wharf_idempotency WHERE scope = $1 AND key = $2 \
             AND digest = $3 AND owner = $4 AND state = 'done' AND expires_at > $5";
        on_driver!(SqlPool, &self.pool, |pool| sqlx::query_scalar::<
            _,
            Option<String>,
        >(sql)
        .bind(&claim.scope)
        .bind(&claim.key)
        .bind(claim.digest.as_str())
        .bind(&claim.owner)
        .bind(now)
        .fetch_optional(pool)
        .await
        .map(Option::flatten)
        .map_err(db_error))
    }

    async fn touch_handle(&self, id: &str, now: Millis) -> Result<(), StoreError> {
        let sql = match &self.pool {
            #[cfg(feature = "sqlite")]
            SqlPool::Sqlite(_) => TOUCH_SQL,
            #[cfg(feature = "postgres")]
            SqlPool::Postgres(_) => PG_TOUCH_SQL,
        };
        on_driver!(SqlPool, &self.pool, |pool| sqlx::query(sql)
            .bind(id)
            .bind(now)
            .execute(pool)
            .await
            .map(drop)
            .map_err(db_error))
    }

    async fn begin(&self, mode: TxMode) -> Result<Box<dyn Transaction>, StoreError> {
        let tx = Box::new(SqlTx::new(self.begin_tx(mode).await?, false));
        Ok(self.equipped(tx))
    }

    async fn begin_idempotent(&self, claim: &Claim, now: Millis) -> Result<Begin, StoreError> {
        let begun = match self.begin_tx(TxMode::Write).await? {
            #[cfg(feature = "sqlite")]
            TypedTx::Sqlite(mut tx) => {
                let (_, seen) = sqlite_lookup(&mut tx, claim, None, now).await?;
                settle_sqlite(tx, claim, seen).await
            }
            #[cfg(feature = "postgres")]
            TypedTx::Postgres(mut tx) => {
                let claimed = bind_claim(sqlx::query(CLAIM_SQL), claim, now)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_error)?
                    .rows_affected()
                    == 1;
                settle(TypedTx::Postgres(tx), claim, claimed, None).await
            }
        };
        begun.map(|b| self.equip(b))
    }

    async fn claim_on_handle(
        &self,
        claim: &Claim,
        handle: &str,
        owner: &str,
        now: Millis,
    ) -> Result<(Option<HandleRecord>, Option<Begin>), StoreError> {
        match &self.pool {
            #[cfg(feature = "postgres")]
            SqlPool::Postgres(pool) => {
                let (record, begun) =
                    Self::pg_claim_on_handle(pool, claim, handle, owner, now).await?;
                Ok((record, begun.map(|b| self.equip(b))))
            }
            #[cfg(feature = "sqlite")]
            SqlPool::Sqlite(pool) => {
                let mut tx = sqlite_begin_write(pool).await?;
                let (record, seen) = sqlite_lookup(&mut tx, claim, Some(handle), now).await?;
                if record.as_ref().is_none_or(|r| r.owner != owner) {
                    return Ok((record, None));
                }
                Ok((record, Some(settle_sqlite(tx, claim, seen).await?)))
            }
        }
    }

    #[cfg(feature = "postgres")]
    fn bus(&self) -> Option<std::sync::Arc<dyn wharf::NotificationBus>> {
        self.bus
            .clone()
            .map(|b| b as std::sync::Arc<dyn wharf::NotificationBus>)
    }

    fn shares_locks(&self) -> bool {
        #[cfg(feature = "postgres")]
        return self.locks.is_some();
        #[cfg(not(feature = "postgres"))]
        false
    }

    fn lock_sessions(&self) -> Option<usize> {
        #[cfg(feature = "postgres")]
        return self.locks.as_ref().map(pg_lock::PgLocks::sessions);
        #[cfg(not(feature = "postgres"))]
        None
    }

    fn step_claims(&self) -> Option<usize> {
        match &self.pool {
            // One connection is left out for the short uses outside any call's transaction
            // (announcements, handle lookups, touches); of the rest, half may hold claims
            // and half stays for the steps (and every other call). The change bus listens
            // on a connection of its own, outside the pool.
            #[cfg(feature = "postgres")]
            SqlPool::Postgres(pool) => {
                let max = pool.options().get_max_connections();
                usize::try_from(max.saturating_sub(1) / 2).ok()
            }
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    async fn lock_key(&self, key: &str) -> Result<Option<Box<dyn KeyLock>>, StoreError> {
        #[cfg(feature = "postgres")]
        if let Some(locks) = &self.locks {
            return locks.lock(key).await.map(Some);
        }
        let _ = key;
        Ok(None)
    }

    async fn shared_keys(&self) -> Result<Vec<SharedKey>, StoreError> {
        let sql = "SELECT id, secret, active_from, expires_at FROM wharf_keys";
        let rows: Vec<(String, Vec<u8>, i64, i64)> =
            on_driver!(SqlPool, &self.pool, |pool| sqlx::query_as(sql)
                .fetch_all(pool)
                .await
                .map_err(db_error)?);
        rows.into_iter()
            .map(|(id, secret, active_from, expires_at)| {
                let secret: [u8; SHARED_KEY_LEN] = secret.try_into().map_err(|_| {
                    StoreError::Corrupt(format!("shared key {id}: not {SHARED_KEY_LEN} bytes"))
                })?;
                Ok(SharedKey {
                    id,
                    secret,
                    active_from,
                    expires_at,
                })
            })
            .collect()
    }

    async fn add_shared_key(&self, key: &SharedKey) -> Result<(), StoreError> {
        // The later of the two expiries, in either dialect (SQLite's two-argument MAX is
        // PostgreSQL's GREATEST).
        let sql = "INSERT INTO wharf_keys (id, secret, active_from, expires_at) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (id) DO UPDATE SET expires_at = \
             CASE WHEN excluded.expires_at > wharf_keys.expires_at \
             THEN excluded.expires_at ELSE wharf_keys.expires_at END";
        on_driver!(SqlPool, &self.pool, |pool| sqlx::query(sql)
            .bind(&key.id)
            .bind(key.secret.as_slice())
            .bind(key.active_from)
            .bind(key.expires_at)
            .execute(pool)
            .await
            .map(drop)
            .map_err(db_error))
    }

    async fn read_record(
        &self,
        namespace: &str,
        key: &str,
        now: Millis,
    ) -> Result<Option<Record>, StoreError> {
        check_key(namespace, key)?;
        records::read(&self.pool, namespace, key, now).await
    }

    async fn write_record(
        &self,
        record: &NewRecord<'_>,
        write: Write,
        now: Millis,
    ) -> Result<Option<u64>, StoreError> {
        record.check()?;
        records::write(&self.pool, record, write, now).await
    }

    async fn delete_record(
        &self,
        namespace: &str,
        key: &str,
        version: Option<u64>,
    ) -> Result<bool, StoreError> {
        check_key(namespace, key)?;
        records::delete(&self.pool, namespace, key, version).await
    }

    async fn records_of(
        &self,
        namespace: &str,
        owner: &str,
        now: Millis,
        limit: u32,
    ) -> Result<Vec<(String, Record)>, StoreError> {
        check_key(namespace, "")?;
        records::of_owner(&self.pool, namespace, owner, now, limit).await
    }

    async fn sweep(&self, now: Millis, batch: u32) -> Result<u64, StoreError> {
        let cutoff = now.saturating_sub(EXPIRED_HANDLE_GRACE_MS);
        let mut tx = SqlTx::new(self.begin_tx(TxMode::Write).await?, false);
        let ids: Vec<String> = on_driver!(TypedTx, &mut tx.tx, |t| sqlx::query_scalar(
            SWEEP_HANDLES_SQL
        )
        .bind(cutoff)
        .bind(i64::from(batch))
        .fetch_all(&mut **t)
        .await
        .map_err(db_error)?);
        let mut removed = 0;
        for id in &ids {
            tx.retire(id).await?;
            removed += 1;
        }
        // Past idempotency records, expired shared keys and records, a batch of each. The
        // outer test of `expires_at` is not redundant: under PostgreSQL's READ COMMITTED, a
        // row another transaction changed while this one waited for its lock is rechecked
        // against the outer WHERE alone, and a record re-claimed by then (a key reused past
        // its retention) has a new expiry and must stay.
        for past in [
            records::SWEEP,
            "DELETE FROM wharf_idempotency WHERE expires_at <= $1 AND (scope, key) IN \
             (SELECT scope, key FROM wharf_idempotency WHERE expires_at <= $1 LIMIT $2)",
            "DELETE FROM wharf_keys WHERE expires_at <= $1 AND id IN \
             (SELECT id FROM wharf_keys WHERE expires_at <= $1 LIMIT $2)",
        ] {
            removed += on_driver!(TypedTx, &mut tx.tx, |t| sqlx::query(past)
                .bind(now)
                .bind(i64::from(batch))
                .execute(&mut **t)
                .await
                .map_err(db_error)?
                .rows_affected());
        }
        // The fences of keys nobody locked for about a week (a lock moves `locked_at` on
        // hourly, see pg_lock.rs). A call that still held one would fail
        // its commit (as if its lock were lost) and be retried: safe, where a token seen
        // again would not be (tokens are random, so none ever is).
        #[cfg(feature = "postgres")]
        #[allow(irrefutable_let_patterns)]
        if let TypedTx::Postgres(t) = &mut tx.tx {
            // By the database's clock, which wrote `locked_at`.
            removed += sqlx::query(
                "WITH past AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint \
                 - $1 AS cutoff) \
                 DELETE FROM wharf_lock_fences WHERE locked_at <= (SELECT cutoff FROM past) \
                 AND lock IN (SELECT lock FROM wharf_lock_fences \
                 WHERE locked_at <= (SELECT cutoff FROM past) LIMIT $2)",
            )
            .bind(LOCK_FENCES_KEPT_MS)
            .bind(i64::from(batch))
            .execute(&mut **t)
            .await
            .map_err(db_error)?
            .rows_affected();
        }
        Box::new(tx).commit().await?;
        // (The only kind of pool in a build for SQLite alone.)
        #[cfg(feature = "sqlite")]
        #[allow(irrefutable_let_patterns)]
        if let SqlPool::Sqlite(pool) = &self.pool {
            checkpoint(pool).await;
        }
        Ok(removed)
    }
}

/// Empties SQLite's write-ahead log. Its automatic checkpoints are passive: under reads that
/// never pause they copy the log back into the database but can never start it over, and
/// the file grows without bound (2 GB in 30 minutes of bench/soak.sh's load, its index
/// mapped into the process besides). A `TRUNCATE` checkpoint waits (up to the busy timeout)
/// for the readers of the moment and empties the file; one that cannot is tried again at
/// the next sweep.
#[cfg(feature = "sqlite")]
async fn checkpoint(pool: &sqlx::SqlitePool) {
    match sqlx::query_as::<_, (i64, i64, i64)>("PRAGMA wal_checkpoint(TRUNCATE)")
        .fetch_one(pool)
        .await
    {
        Ok((0, _, _)) => {}
        Ok((_, frames, done)) => {
            tracing::debug!(
                frames,
                done,
                "WAL checkpoint not complete: readers kept it busy"
            );
        }
        Err(e) => tracing::debug!(error = %e, "WAL checkpoint failed"),
    }
}

/// How long the fence of a mutation key nobody locks is kept (PostgreSQL).
#[cfg(feature = "postgres")]
const LOCK_FENCES_KEPT_MS: Millis = 7 * 24 * 60 * 60 * 1000;

/// A transaction on a [`SqlStore`]: what [`Transaction::backend_tx`] of a SQL store gives,
/// for code that writes its own tables in the call's transaction ([`SqlTx::postgres`],
/// [`SqlTx::sqlite`], or [`SqlTx::sqlx`] for code that serves both).
///
/// ```no_run
/// # async fn write(tx: &mut dyn wharf::store::Transaction) -> Result<(), sqlx::Error> {
/// use wharf_store::SqlTx;
/// let pg = tx.backend_tx().downcast_mut::<SqlTx>().and_then(SqlTx::postgres);
/// if let Some(pg) = pg {
///     sqlx::query("INSERT INTO orders (item) VALUES ($1)")
///         .bind("anchor")
///         .execute(&mut **pg)
///         .await?;
/// }
/// # Ok(()) }
/// ```
pub struct SqlTx {
    tx: TypedTx,
    /// Whether the claim's record was written as `running` when it was claimed (PostgreSQL);
    /// on SQLite it is written only on completion.
    claim_written: bool,
    /// The mutation lock's fence the commit checks (PostgreSQL; SQLite's locks are the
    /// process's own).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fence: Option<Fence>,
    /// Whether the fence was checked already, with the claim's record (PostgreSQL): the row
    /// it locked stays locked to the commit, which need not check again.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fence_checked: bool,
    /// Whether a record a retry would find was written (a claim completed, a one-time step
    /// recorded): then a commit whose answer was lost may be retried.
    recorded: bool,
    /// Where the store's commits carry what they announce (PostgreSQL, when it has a bus).
    #[cfg(feature = "postgres")]
    outbox: Option<std::sync::Arc<crate::bus::PgOutbox>>,
    /// What this transaction's commit announces, as the channel carries it.
    #[cfg(feature = "postgres")]
    announced: Vec<String>,
}

/// Runs a transaction's begin on a task of its own, so that it completes even when the call
/// waiting for it is dropped (a client that goes away); completed there, a transaction nobody
/// takes is dropped, which rolls it back. Neither of sqlx 0.8's begins is cancel-safe:
/// - PostgreSQL's `BEGIN`, dropped while in flight, leaves the pooled session inside a
///   transaction nothing ends, and the pool hands that session on (transact-rs/sqlx#4393):
///   later statements run, and hold their locks, inside it, and a `pg_notify` waits for its
///   commit.
/// - SQLite's `begin_with` checks that its statement opened a transaction after the database
///   acknowledged it; dropped in between, the connection goes back to the pool inside
///   `BEGIN IMMEDIATE`, holding the database's write lock: every writer waits and fails busy,
///   and the next begin on it fails ("non-zero transaction depth"). The soak test
///   (bench/soak.sh) found this one; tests/cancelled_begins.rs cuts begins off at every point.
async fn begin_detached<DB: sqlx::Database>(
    begin: impl Future<Output = Result<sqlx::Transaction<'static, DB>, sqlx::Error>> + Send + 'static,
) -> Result<sqlx::Transaction<'static, DB>, StoreError> {
    tokio::spawn(begin)
        .await
        .map_err(|e| StoreError::Backend(format!("beginning a transaction failed: {e}")))?
        .map_err(db_error)
}

/// A PostgreSQL transaction, begun detached (see [`begin_detached`]).
#[cfg(feature = "postgres")]
async fn pg_begin(pool: &sqlx::PgPool) -> Result<sqlx::Transaction<'static, Postgres>, StoreError> {
    let pool = pool.clone();
    begin_detached(async move { pool.begin().await }).await
}

/// A SQLite write transaction (`BEGIN IMMEDIATE`, the write lock taken up front), begun
/// detached (see [`begin_detached`]).
#[cfg(feature = "sqlite")]
async fn sqlite_begin_write(
    pool: &sqlx::SqlitePool,
) -> Result<sqlx::Transaction<'static, Sqlite>, StoreError> {
    let pool = pool.clone();
    begin_detached(async move { pool.begin_with("BEGIN IMMEDIATE").await }).await
}

/// Takes the advisory lock that stands for handle `id` until the transaction ends: shared
/// for writing under it, exclusive for changing or retiring it.
#[cfg(feature = "postgres")]
async fn lock_handle(
    tx: &mut sqlx::Transaction<'static, Postgres>,
    id: &str,
    exclusive: bool,
) -> Result<(), StoreError> {
    let sql = if exclusive {
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))"
    } else {
        "SELECT pg_advisory_xact_lock_shared(hashtextextended($1, 0))"
    };
    sqlx::query(sql)
        .bind(id)
        .execute(&mut **tx)
        .await
        .map(drop)
        .map_err(db_error)
}

impl SqlTx {
    fn new(tx: TypedTx, claim_written: bool) -> Self {
        SqlTx {
            tx,
            claim_written,
            fence: None,
            fence_checked: false,
            recorded: false,
            #[cfg(feature = "postgres")]
            outbox: None,
            #[cfg(feature = "postgres")]
            announced: Vec::new(),
        }
    }

    /// The call's transaction, typed for its database.
    pub fn sqlx(&mut self) -> &mut TypedTx {
        &mut self.tx
    }

    /// The call's transaction if the store is PostgreSQL.
    #[cfg(feature = "postgres")]
    pub fn postgres(&mut self) -> Option<&mut sqlx::Transaction<'static, Postgres>> {
        match &mut self.tx {
            TypedTx::Postgres(tx) => Some(tx),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// The call's transaction if the store is SQLite.
    #[cfg(feature = "sqlite")]
    pub fn sqlite(&mut self) -> Option<&mut sqlx::Transaction<'static, Sqlite>> {
        match &mut self.tx {
            TypedTx::Sqlite(tx) => Some(tx),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// The database it talks to.
    pub fn dialect(&self) -> Dialect {
        match self.tx {
            #[cfg(feature = "sqlite")]
            TypedTx::Sqlite(_) => Dialect::Sqlite,
            #[cfg(feature = "postgres")]
            TypedTx::Postgres(_) => Dialect::Postgres,
        }
    }

    /// Runs one statement of the store's own, with text parameters, answering the rows it
    /// changed.
    /// Writes `claim`'s record, done with `result`, unless a live record holds its key
    /// (one past its retention is replaced); the rows written, 0 or 1.
    async fn insert_done(&mut self, claim: &Claim, result: &str) -> Result<u64, StoreError> {
        let now = wharf::store::now_millis();
        let sql = "INSERT INTO wharf_idempotency \
             (scope, key, digest, state, result, created_at, updated_at, expires_at, owner) \
             VALUES ($1, $2, $3, 'done', $4, $5, $5, $6, $7) \
             ON CONFLICT (scope, key) DO UPDATE SET \
             digest = excluded.digest, state = excluded.state, result = excluded.result, \
             created_at = excluded.created_at, updated_at = excluded.updated_at, \
             expires_at = excluded.expires_at, owner = excluded.owner \
             WHERE wharf_idempotency.expires_at <= $5";
        on_driver!(TypedTx, &mut self.tx, |tx| sqlx::query(sql)
            .bind(&claim.scope)
            .bind(&claim.key)
            .bind(claim.digest.as_str())
            .bind(result)
            .bind(now)
            .bind(claim.expires_at)
            .bind(&claim.owner)
            .execute(&mut **tx)
            .await
            .map(|done| done.rows_affected()))
        .map_err(db_error)
    }

    pub(crate) async fn run(&mut self, sql: &str, params: &[&str]) -> Result<u64, StoreError> {
        on_driver!(TypedTx, &mut self.tx, |tx| {
            let mut query = sqlx::query(sql);
            for p in params {
                query = query.bind(*p);
            }
            query
                .execute(&mut **tx)
                .await
                .map(|done| done.rows_affected())
                .map_err(db_error)
        })
    }

    async fn handle_exists(&mut self, id: &str) -> Result<bool, StoreError> {
        let sql = "SELECT 1 FROM wharf_handles WHERE id = $1";
        on_driver!(TypedTx, &mut self.tx, |tx| sqlx::query(sql)
            .bind(id)
            .fetch_optional(&mut **tx)
            .await
            .map(|row| row.is_some())
            .map_err(db_error))
    }

    async fn retire(&mut self, id: &str) -> Result<(), StoreError> {
        // Calls still writing under the handle finish first; later ones find it gone.
        #[cfg(feature = "postgres")]
        #[allow(irrefutable_let_patterns)]
        if let TypedTx::Postgres(tx) = &mut self.tx {
            lock_handle(tx, id, true).await?;
        }
        self.run("DELETE FROM wharf_handles WHERE id = $1", &[id])
            .await?;
        let (lo, hi) = owned_range(id);
        for table in [
            "DELETE FROM wharf_rows WHERE collection >= $1 AND collection < $2",
            "DELETE FROM wharf_docs WHERE collection >= $1 AND collection < $2",
            "DELETE FROM wharf_collections WHERE name >= $1 AND name < $2",
        ] {
            self.run(table, &[&lo, &hi]).await?;
        }
        Ok(())
    }
}

#[async_trait]
impl Transaction for SqlTx {
    async fn create_handle(&mut self, r: &HandleRecord) -> Result<(), StoreError> {
        let sql = "INSERT INTO wharf_handles \
             (id, kind, owner, created_at, expires_at, idle_ms, last_used_at, data) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";
        let data = r.data.as_ref().map(Value::to_string);
        on_driver!(TypedTx, &mut self.tx, |tx| sqlx::query(sql)
            .bind(&r.id)
            .bind(&r.kind)
            .bind(&r.owner)
            .bind(r.created_at)
            .bind(r.expires_at)
            .bind(r.idle_ms)
            .bind(r.last_used_at)
            .bind(&data)
            .execute(&mut **tx)
            .await
            .map(drop)
            .map_err(db_error))
    }

    async fn retire_handle(&mut self, id: &str) -> Result<(), StoreError> {
        self.retire(id).await
    }

    async fn live_handles(
        &mut self,
        owner: &str,
        kind: &str,
        now: Millis,
    ) -> Result<u64, StoreError> {
        // Alive as `HandleRecord::expired` judges it; the idle end is compared by
        // subtraction, which no stored lifetime can make overflow PostgreSQL's bigint.
        let sql = "SELECT COUNT(*) FROM wharf_handles \
             WHERE owner = $1 AND kind = $2 AND expires_at > $3 \
             AND (idle_ms IS NULL OR last_used_at > $3 - idle_ms)";
        let n: i64 = on_driver!(TypedTx, &mut self.tx, |tx| sqlx::query_scalar(sql)
            .bind(owner)
            .bind(kind)
            .bind(now)
            .fetch_one(&mut **tx)
            .await
            .map_err(db_error)?);
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn least_recently_used_handles(
        &mut self,
        owner: &str,
        kind: &str,
        now: Millis,
        n: u64,
    ) -> Result<Vec<String>, StoreError> {
        // The rows `live_handles` counts, through the same (owner, kind) index.
        let sql = "SELECT id FROM wharf_handles \
             WHERE owner = $1 AND kind = $2 AND expires_at > $3 \
             AND (idle_ms IS NULL OR last_used_at > $3 - idle_ms) \
             ORDER BY last_used_at, id LIMIT $4";
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        on_driver!(TypedTx, &mut self.tx, |tx| sqlx::query_scalar(sql)
            .bind(owner)
            .bind(kind)
            .bind(now)
            .bind(n)
            .fetch_all(&mut **tx)
            .await
            .map_err(db_error))
    }

    async fn hold_handle(
        &mut self,
        id: &str,
        touch_at: Option<Millis>,
    ) -> Result<bool, StoreError> {
        // PostgreSQL: a transaction-scoped advisory lock on the handle, shared by the calls
        // that write under it (held in memory: no row is written for it); only a retirement
        // takes it exclusively. Recording a use needs no more, and skips a row another
        // call's transaction holds (as `PG_TOUCH_SQL` says why): waiting for it would hold
        // this call until that one commits, and fail it busy past the lock wait; an
        // exclusive lock here would deadlock two calls that both hold the shared one from
        // their claims. The check runs after the lock is granted, in a statement of its
        // own, so it sees a retirement that committed while it waited. SQLite's write
        // transactions hold the whole database already.
        #[cfg(feature = "postgres")]
        #[allow(irrefutable_let_patterns)]
        if let TypedTx::Postgres(tx) = &mut self.tx {
            lock_handle(tx, id, false).await?;
        }
        let Some(now) = touch_at else {
            return self.handle_exists(id).await;
        };
        let sql = match &self.tx {
            #[cfg(feature = "sqlite")]
            TypedTx::Sqlite(_) => TOUCH_SQL,
            #[cfg(feature = "postgres")]
            TypedTx::Postgres(_) => PG_TOUCH_SQL,
        };
        let touched = on_driver!(TypedTx, &mut self.tx, |tx| sqlx::query(sql)
            .bind(id)
            .bind(now)
            .execute(&mut **tx)
            .await
            .map_err(db_error)?
            .rows_affected());
        Ok(touched > 0 || self.handle_exists(id).await?)
    }

    async fn check_handle(&mut self, id: &str) -> Result<bool, StoreError> {
        // No lock on PostgreSQL: a step's transaction may be open while the same call
        // retires the handle in its own (whose exclusive lock would then wait for the
        // step's shared one, and the step for the handler), or the other way round. SQLite's
        // write transactions hold the whole database already.
        self.handle_exists(id).await
    }

    async fn record_once(&mut self, claim: &Claim) -> Result<bool, StoreError> {
        let recorded = self.insert_done(claim, "used").await? == 1;
        self.recorded |= recorded;
        Ok(recorded)
    }

    async fn complete_claim(&mut self, claim: &Claim, result: &str) -> Result<(), StoreError> {
        // A fenced write on PostgreSQL checks its fence with the record, one round trip
        // instead of two.
        #[cfg(feature = "postgres")]
        #[allow(irrefutable_let_patterns)]
        if let (true, Some(fence), TypedTx::Postgres(tx)) =
            (self.claim_written, &self.fence, &mut self.tx)
        {
            pg_lock::complete_fenced(tx, claim, result, fence).await?;
            self.fence_checked = true;
            self.recorded = true;
            return Ok(());
        }
        let n = if self.claim_written {
            let sql = "UPDATE wharf_idempotency SET state = 'done', result = $3, updated_at = $4, \
                 owner = $5 WHERE scope = $1 AND key = $2 AND state = 'running'";
            on_driver!(TypedTx, &mut self.tx, |tx| sqlx::query(sql)
                .bind(&claim.scope)
                .bind(&claim.key)
                .bind(result)
                .bind(wharf::store::now_millis())
                .bind(&claim.owner)
                .execute(&mut **tx)
                .await
                .map(|done| done.rows_affected()))
            .map_err(db_error)?
        } else {
            self.insert_done(claim, result).await?
        };
        if n == 1 {
            self.recorded = true;
            Ok(())
        } else {
            Err(StoreError::ClaimLost)
        }
    }

    fn fence(&mut self, fence: &Fence) {
        self.fence = Some(fence.clone());
        self.fence_checked = false;
    }

    #[cfg(feature = "postgres")]
    fn announce_with_commit(&mut self, events: &[wharf::ChangeEvent]) -> bool {
        if self.outbox.is_none() || !matches!(self.tx, TypedTx::Postgres(_)) {
            return false;
        }
        self.announced
            .extend(crate::bus::PgOutbox::payloads(events));
        true
    }

    async fn commit(mut self: Box<Self>) -> Result<(), StoreError> {
        #[cfg(feature = "postgres")]
        if let (Some(fence), TypedTx::Postgres(tx), false) =
            (&self.fence, &mut self.tx, self.fence_checked)
        {
            pg_lock::check_fence(tx, fence).await?;
        }
        // What the commit announces goes in with its writes.
        #[cfg(feature = "postgres")]
        let announced = match (&mut self.tx, self.outbox.take()) {
            (TypedTx::Postgres(tx), Some(outbox)) if !self.announced.is_empty() => {
                let ids = crate::bus::PgOutbox::write(tx, &self.announced)
                    .await
                    .map_err(db_error)?;
                Some((outbox, ids))
            }
            _ => None,
        };
        let recorded = self.recorded;
        // With a record that a retry finds, a commit whose answer was lost may be retried
        // (the retry replays it if it was applied); without one, "retry" could apply it
        // twice.
        let committed =
            on_driver!(TypedTx, self.tx, |tx| tx.commit().await).map_err(match recorded {
                true => db_error,
                false => write_error,
            });
        #[cfg(feature = "postgres")]
        if let (Ok(()), Some((outbox, ids))) = (&committed, announced) {
            outbox.publish(ids);
        }
        committed
    }

    fn backend_tx(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

/// The handles due to be swept by `$1`, the longest due first: their lifetime ended, or
/// their idle time. Written as the expression `wharf_handles_sweep_at` indexes (migration
/// 0009), so only the handles due are read; ordered by it too, so that a generic plan
/// (PostgreSQL's, for a prepared statement, which cannot tell how many are due) still
/// reads the index rather than the table.
const SWEEP_HANDLES_SQL: &str = "SELECT id FROM wharf_handles WHERE \
     CASE WHEN idle_ms IS NULL OR idle_ms >= expires_at - last_used_at \
         THEN expires_at \
         ELSE last_used_at + idle_ms \
     END < $1 \
     ORDER BY CASE WHEN idle_ms IS NULL OR idle_ms >= expires_at - last_used_at \
         THEN expires_at \
         ELSE last_used_at + idle_ms \
     END \
     LIMIT $2";

#[cfg(test)]
mod tests {
    use super::*;

    /// The sweep reads handles through the index of migration 0009, on both databases: the
    /// planner must match its expression (PostgreSQL told not to scan the table, as it would
    /// for a table this small).
    #[tokio::test]
    async fn the_handle_sweep_reads_only_the_handles_due() {
        let dir = std::env::temp_dir().join(format!("wharf-sweep-plan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sqlite = format!("sqlite://{}/store.db?mode=rwc", dir.display());
        let options = StoreOptions::default();
        let store = SqlStore::connect(&sqlite, Dialect::Sqlite, &options)
            .await
            .unwrap();
        let SqlPool::Sqlite(pool) = &store.pool else {
            unreachable!("a SQLite store");
        };
        let plan: Vec<(i64, i64, i64, String)> =
            sqlx::query_as(&format!("EXPLAIN QUERY PLAN {SWEEP_HANDLES_SQL}"))
                .bind(0_i64)
                .bind(10_i64)
                .fetch_all(pool)
                .await
                .unwrap();
        let plan: Vec<&str> = plan.iter().map(|row| row.3.as_str()).collect();
        assert!(
            plan.iter()
                .any(|step| step.contains("USING INDEX wharf_handles_sweep_at")),
            "{plan:?}"
        );

        let url = std::env::var("WHARF_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        let store = SqlStore::connect(&url, Dialect::Postgres, &options)
            .await
            .expect("PostgreSQL at WHARF_TEST_POSTGRES_URL (scripts/services.sh starts it)");
        let SqlPool::Postgres(pool) = &store.pool else {
            unreachable!("a PostgreSQL store");
        };
        let mut conn = pool.acquire().await.unwrap();
        sqlx::query("SET enable_seqscan = off")
            .execute(&mut *conn)
            .await
            .unwrap();
        let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {SWEEP_HANDLES_SQL}"))
            .bind(0_i64)
            .bind(10_i64)
            .fetch_all(&mut *conn)
            .await
            .unwrap();
        // Put back for the next user of the pooled connection.
        sqlx::query("RESET enable_seqscan")
            .execute(&mut *conn)
            .await
            .unwrap();
        assert!(
            plan.iter()
                .any(|step| step.contains("wharf_handles_sweep_at")),
            "{plan:?}"
        );
    }

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
