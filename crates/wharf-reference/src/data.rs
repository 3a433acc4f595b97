//! Where the import service and its reports keep their data: tables of their own on SQLite
//! and PostgreSQL (created by the migrations in `migrations/`, see [`migrations`]), keys of
//! their own on Redis. Every write goes into the call's transaction, so it commits with the
//! call's idempotency record, or not at all.
//!
//! On Redis (the owner's length goes first, so no owner can spell another's keys):
//! - `ref:<len>:<owner>:datasets`, a hash: dataset name → the dataset as JSON, which lists
//!   the dataset's segments;
//! - `ref:seg:<import>`: a segment, a list of committed rows: an import's staging list
//!   renamed, and the rows of smaller imports committed after it, copied onto its end;
//! - `ref:staged:<import>`: an open import's rows, and `ref:staged:<import>:bytes`, their
//!   size, both filed under the import's handle (retired with it: committed, aborted, or
//!   swept once expired);
//! - `ref:<len>:<owner>:bytes`: the bytes of rows the owner's datasets hold, and
//!   `ref:<len>:<owner>:imports`, a set of the owner's imports that staged rows (for the
//!   per-user cap on stored bytes);
//! - `ref:<len>:<owner>:reports`, a hash: dataset → its latest report, and
//!   `ref:<len>:<owner>:cancelled`, a set of `<run>:<dataset>` for runs cut short.
//!
//! Each change of a dataset on Redis expects the hash field it read to be unchanged at
//! commit, so two calls changing one dataset at once cannot both act on what they read.
//! Nothing a commit or a deletion does on Redis takes time in proportion to the rows: lists
//! are renamed, and copied only when small (a few thousand rows, a megabyte at most), and
//! dropped with `UNLINK` (freed in the background), so a tenant's million-row dataset never
//! blocks Redis for every replica.

use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sqlx::Row;
use wharf::HandlerError;
use wharf::store::{HandleRecord, StoreError, Transaction, now_millis};
use wharf_store::EXPIRED_HANDLE_GRACE_MS;
use wharf_store::redis::RedisTx;
use wharf_store::{AppMigrations, SqlTx, TypedTx};

/// The tables of the import service and its reports, for the store to create when it opens.
pub fn migrations() -> AppMigrations {
    AppMigrations::new()
        .sqlite(sqlx::migrate!("./migrations/sqlite"))
        .postgres(sqlx::migrate!("./migrations/postgres"))
}

/// A dataset as stored: its columns (JSON) and how many rows it holds.
pub struct Dataset {
    /// Its columns, as the import service defines them.
    pub columns: Value,
    /// How many rows it holds.
    pub rows: u64,
    /// Which making of the dataset this is: another after it was deleted and made again
    /// under its name (0 for datasets made before generations were kept).
    pub generation: i64,
    /// On Redis: the hash field as read, to expect unchanged when writing.
    redis: Option<(String, Stored)>,
}

/// A dataset on Redis.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Stored {
    columns: Value,
    rows: u64,
    next_seq: i64,
    segments: Vec<Segment>,
    /// Bytes of row JSON (datasets stored before the count was kept count 0).
    #[serde(default)]
    bytes: u64,
    /// See [`Dataset::generation`].
    #[serde(default)]
    generation: i64,
}

/// A committed import's rows on Redis: its list, the sequence number of its first row, and
/// how many rows it holds. Small imports committed one after another share one.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Segment(String, i64, u64);

/// Rows an import's commit copies onto the dataset's last segment rather than adding a
/// segment of its own, as long as the last one stays within this many. Each segment costs
/// about 60 bytes in the dataset's record, read and written whole at each commit: with one
/// segment per import, a dataset fed one row at a time made every commit slower than the
/// last. Bounded so, any two segments side by side hold more than this many rows together
/// (imports over [`SEGMENT_COPY_BYTES`] aside): a dataset of `r` rows has fewer than
/// `2r / SEGMENT_ROWS + 1` segments.
const SEGMENT_ROWS: u64 = 4096;

/// Row bytes a commit copies at most (the rest are renamed, as larger imports are): the
/// copy is read into the server and sent back with the commit.
const SEGMENT_COPY_BYTES: u64 = 1 << 20;

/// How appending rows to an import went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Staged {
    /// The rows are staged; the import holds this many now.
    Rows(u64),
    /// Nothing was written: the owner stores `stored` bytes already, and the rows would
    /// take it past the limit.
    OverQuota {
        /// Bytes of rows the owner stores, committed and staged.
        stored: u64,
    },
}

/// How committing an import's rows went.
pub enum Commit {
    /// The rows were moved; the dataset holds `total` rows now.
    Done {
        /// Rows moved from the import.
        moved: u64,
        /// Rows in the dataset now.
        total: u64,
    },
    /// The dataset exists with these other columns; nothing was written.
    OtherColumns(Value),
    /// A replacement found the dataset made by another commit since it was read (as
    /// absent): its rows were not the ones the caller decided on; nothing was written.
    Changed,
}

/// The app's data, in the transaction of whichever store the server runs on.
pub enum Data<'t> {
    /// SQLite or PostgreSQL: the driver's own typed transaction.
    Sql(&'t mut TypedTx),
    /// Redis.
    Redis(&'t mut RedisTx),
}

/// How many rows an import has staged: numbered from 0 without gaps, the last number tells
/// the count, from the primary key alone.
const STAGED_SQL: &str = "SELECT COALESCE(MAX(seq) + 1, 0) FROM ref_staged_rows WHERE import = $1";

/// Runs `$body` with `$c` bound to the typed transaction of a SQL store, once per database:
/// where both take the same SQL, each driver binds and decodes it with its own types.
macro_rules! on_sql {
    ($tx:expr, |$c:ident| $body:expr) => {
        match $tx {
            TypedTx::Sqlite($c) => $body,
            TypedTx::Postgres($c) => $body,
            _ => Err(HandlerError::internal(
                "the import service has no SQL for this database",
            )),
        }
    };
}

fn backend(e: impl std::fmt::Display) -> HandlerError {
    HandlerError::from(StoreError::Backend(e.to_string()))
}

/// How many times a Redis scan starts again when the dataset changed under it.
const SCAN_TRIES: usize = 3;

/// Reads up to `limit` rows after `after` from a Redis dataset's `segments` (as its record
/// lists them); `None` when a list held fewer rows than the record says: it changed since.
async fn scan_segments(
    tx: &mut RedisTx,
    segments: &[Segment],
    after: Option<i64>,
    limit: u32,
) -> Result<Option<Vec<(i64, Value)>>, HandlerError> {
    let mut out = Vec::new();
    let mut next = after.map_or(0, |a| a.saturating_add(1));
    for Segment(key, first, len) in segments {
        let first = *first;
        let end = first.saturating_add(i64::try_from(*len).unwrap_or(i64::MAX));
        let wanted = i64::from(limit) - out.len() as i64;
        if wanted <= 0 {
            break;
        }
        if end <= next {
            continue;
        }
        let from = (next - first).max(0);
        // Within what the record says the list holds: a list may hold more (rows copied
        // onto it since this record was read), numbered after it.
        let to = (from + wanted).min(end - first) - 1;
        let items: Vec<String> = tx
            .reader()
            .lrange(
                key,
                isize::try_from(from).unwrap_or(isize::MAX),
                isize::try_from(to).unwrap_or(isize::MAX),
            )
            .await
            .map_err(backend)?;
        if items.len() as i64 != to - from + 1 {
            return Ok(None);
        }
        for (item, seq) in items.iter().zip(first + from..) {
            out.push((seq, json_text(item)?));
            next = seq + 1;
        }
    }
    Ok(Some(out))
}

/// As the store maps its own errors: a lock wait that ran out (a commit holding the dataset
/// row, say) is "busy, retry".
fn sql(e: sqlx::Error) -> HandlerError {
    HandlerError::from(wharf_store::sql::db_error(e))
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> HandlerError {
    HandlerError::from(StoreError::Corrupt(format!("{what}: {e}")))
}

fn json_text(text: &str) -> Result<Value, HandlerError> {
    serde_json::from_str(text).map_err(|e| corrupt("stored JSON", e))
}

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// The count `query` answers for its one parameter, on a SQL store.
async fn sql_count(tx: &mut TypedTx, query: &str, param: &str) -> Result<u64, HandlerError> {
    on_sql!(tx, |c| {
        let n: i64 = sqlx::query_scalar(query)
            .bind(param)
            .fetch_one(&mut **c)
            .await
            .map_err(sql)?;
        Ok(count(n))
    })
}

fn owner_key(owner: &str, what: &str) -> String {
    format!("ref:{}:{owner}:{what}", owner.len())
}

fn staged_key(import: &str) -> String {
    format!("ref:staged:{import}")
}

/// Forgets an import's staged bytes, returning them (SQL).
const TAKE_STAGED_BYTES_SQL: &str =
    "DELETE FROM ref_staged_bytes WHERE import = $1 RETURNING bytes";

fn staged_bytes_key(import: &str) -> String {
    format!("ref:staged:{import}:bytes")
}

/// Forgets an import's staged bytes (committed or dropped), returning them (Redis).
async fn take_staging(tx: &mut RedisTx, owner: &str, import: &str) -> Result<u64, HandlerError> {
    let key = staged_bytes_key(import);
    let had: Option<i64> = tx.reader().get(&key).await.map_err(backend)?;
    tx.queue(["UNLINK".to_owned(), key])?;
    tx.queue([
        "SREM".to_owned(),
        owner_key(owner, "imports"),
        import.to_owned(),
    ])?;
    Ok(count(had.unwrap_or(0)))
}

/// Queues the copy of `import`'s `staged` rows onto the end of list `segment`, and the
/// removal of its staging list.
async fn append_rows(
    tx: &mut RedisTx,
    import: &str,
    segment: &str,
    staged: u64,
) -> Result<(), HandlerError> {
    let key = staged_key(import);
    let rows: Vec<String> = tx.reader().lrange(&key, 0, -1).await.map_err(backend)?;
    if rows.len() as u64 != staged {
        // Appends to one import take turns with its commit: another count means the list
        // changed under this call, and its rows would be numbered wrong. Nothing is written;
        // the call is answered "busy, retry".
        tracing::warn!(
            import,
            staged,
            read = rows.len(),
            "staged rows changed during a commit"
        );
        return Err(StoreError::Conflict.into());
    }
    for chunk in rows.chunks(RedisTx::MAX_ARGS - 2) {
        let mut command = vec!["RPUSH".to_owned(), segment.to_owned()];
        command.extend(chunk.iter().cloned());
        tx.queue(command)?;
    }
    tx.queue(["UNLINK".to_owned(), key])?;
    Ok(())
}

impl<'t> Data<'t> {
    /// The app's view of a transaction of one of wharf-store's stores.
    pub fn of(tx: &'t mut (dyn Transaction + '_)) -> Result<Self, HandlerError> {
        let any = tx.backend_tx();
        let unknown = || HandlerError::internal("the import service runs on wharf-store's stores");
        if any.is::<RedisTx>() {
            return any
                .downcast_mut::<RedisTx>()
                .map(Data::Redis)
                .ok_or_else(unknown);
        }
        any.downcast_mut::<SqlTx>()
            .map(|sql| Data::Sql(sql.sqlx()))
            .ok_or_else(unknown)
    }

    /// How many datasets `owner` holds.
    pub async fn dataset_count(&mut self, owner: &str) -> Result<u64, HandlerError> {
        match self {
            Data::Sql(tx) => {
                sql_count(
                    tx,
                    "SELECT COUNT(*) FROM ref_datasets WHERE owner = $1",
                    owner,
                )
                .await
            }
            Data::Redis(tx) => {
                let n: u64 = tx
                    .reader()
                    .hlen(owner_key(owner, "datasets"))
                    .await
                    .map_err(backend)?;
                Ok(n)
            }
        }
    }

    /// A dataset of `owner`'s, if it exists.
    pub async fn dataset(
        &mut self,
        owner: &str,
        name: &str,
    ) -> Result<Option<Dataset>, HandlerError> {
        self.read_dataset(owner, name, false).await
    }

    /// As [`Data::dataset`], for a write that depends on what it reads (a delete or a
    /// replacement the user confirmed for this many rows): on PostgreSQL the row stays
    /// locked to the commit, so a commit into the dataset under way is waited for and seen,
    /// and none gets in before this write lands. (SQLite's one writer holds it already;
    /// Redis checks the stored text at commit.)
    pub async fn dataset_to_change(
        &mut self,
        owner: &str,
        name: &str,
    ) -> Result<Option<Dataset>, HandlerError> {
        self.read_dataset(owner, name, true).await
    }

    async fn read_dataset(
        &mut self,
        owner: &str,
        name: &str,
        lock: bool,
    ) -> Result<Option<Dataset>, HandlerError> {
        match self {
            Data::Sql(tx) => {
                let read = match (&**tx, lock) {
                    (TypedTx::Postgres(_), true) => {
                        "SELECT columns, row_count, generation FROM ref_datasets \
                         WHERE owner = $1 AND name = $2 FOR UPDATE"
                    }
                    _ => {
                        "SELECT columns, row_count, generation FROM ref_datasets \
                         WHERE owner = $1 AND name = $2"
                    }
                };
                on_sql!(&mut **tx, |c| {
                    let row = sqlx::query(read)
                        .bind(owner)
                        .bind(name)
                        .fetch_optional(&mut **c)
                        .await
                        .map_err(sql)?;
                    row.map(|row| {
                        let columns: String = row.try_get(0).map_err(sql)?;
                        Ok(Dataset {
                            columns: json_text(&columns)?,
                            rows: count(row.try_get(1).map_err(sql)?),
                            generation: row.try_get(2).map_err(sql)?,
                            redis: None,
                        })
                    })
                    .transpose()
                })
            }
            Data::Redis(tx) => {
                let text: Option<String> = tx
                    .reader()
                    .hget(owner_key(owner, "datasets"), name)
                    .await
                    .map_err(backend)?;
                text.map(|text| {
                    let stored: Stored =
                        serde_json::from_str(&text).map_err(|e| corrupt("stored dataset", e))?;
                    Ok(Dataset {
                        columns: stored.columns.clone(),
                        rows: stored.rows,
                        generation: stored.generation,
                        redis: Some((text, stored)),
                    })
                })
                .transpose()
            }
        }
    }

    /// How many bytes of rows `owner` stores: in datasets, and staged by imports (until an
    /// import's handle is retired: committed, aborted, or swept once expired, which takes
    /// its rows along on every store).
    pub async fn stored_bytes(&mut self, owner: &str) -> Result<u64, HandlerError> {
        match self {
            Data::Sql(tx) => {
                let query = "SELECT CAST(\
                     COALESCE((SELECT SUM(bytes) FROM ref_datasets WHERE owner = $1), 0) \
                     + COALESCE((SELECT SUM(bytes) FROM ref_staged_bytes WHERE owner = $1), 0) \
                     AS BIGINT)";
                sql_count(tx, query, owner).await
            }
            Data::Redis(tx) => {
                let committed: Option<i64> = tx
                    .reader()
                    .get(owner_key(owner, "bytes"))
                    .await
                    .map_err(backend)?;
                let staging_key = owner_key(owner, "imports");
                let imports: Vec<String> =
                    tx.reader().smembers(&staging_key).await.map_err(backend)?;
                let mut total = count(committed.unwrap_or(0));
                if imports.is_empty() {
                    return Ok(total);
                }
                let keys: Vec<String> = imports.iter().map(|i| staged_bytes_key(i)).collect();
                let sizes: Vec<Option<i64>> = redis::cmd("MGET")
                    .arg(&keys)
                    .query_async(tx.reader())
                    .await
                    .map_err(backend)?;
                for (import, size) in imports.into_iter().zip(sizes) {
                    match size {
                        Some(bytes) => total = total.saturating_add(count(bytes)),
                        // Retired with its import (or expired): forget it with this call's
                        // writes.
                        None => tx.queue(["SREM".to_owned(), staging_key.clone(), import])?,
                    }
                }
                Ok(total)
            }
        }
    }

    /// How many rows an import has staged.
    pub async fn staged(&mut self, import: &str) -> Result<u64, HandlerError> {
        match self {
            Data::Sql(tx) => sql_count(tx, STAGED_SQL, import).await,
            Data::Redis(tx) => {
                let n: i64 = tx
                    .reader()
                    .llen(staged_key(import))
                    .await
                    .map_err(backend)?;
                Ok(count(n))
            }
        }
    }

    /// Stages rows (objects) for an import (its handle's record) that add `bytes` to what its
    /// owner stores, unless the owner would then store more than `max_bytes`: then nothing is
    /// written. Appends to one import are serialized by its mutation lock; appends to two
    /// imports of one owner at once may both fit, off by at most the calls in flight.
    pub async fn append_staged(
        &mut self,
        import: &HandleRecord,
        rows: &[Map<String, Value>],
        bytes: u64,
        max_bytes: u64,
    ) -> Result<Staged, HandlerError> {
        let (owner, created_at, expires_at) =
            (import.owner.as_str(), import.created_at, import.expires_at);
        let import = import.id.as_str();
        if rows.is_empty() {
            return Ok(Staged::Rows(self.staged(import).await?));
        }
        let n = rows.len() as u64;
        let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        if let Data::Sql(TypedTx::Postgres(tx)) = self {
            let array = serde_json::to_string(rows).map_err(HandlerError::internal)?;
            // One statement, one round trip: what the owner stores, and if the rows fit,
            // the rows numbered on from the import's last one and their bytes counted.
            // PostgreSQL's `json_array_elements` keeps each row's text as sent.
            let row = sqlx::query(
                "WITH used AS (SELECT \
                 COALESCE((SELECT SUM(bytes) FROM ref_datasets WHERE owner = $4), 0) \
                 + COALESCE((SELECT SUM(bytes) FROM ref_staged_bytes WHERE owner = $4), 0) AS n), \
                 fits AS (SELECT 1 FROM used WHERE n + $5 <= $6), \
                 base AS (SELECT COALESCE(MAX(seq) + 1, 0) AS b \
                 FROM ref_staged_rows WHERE import = $1), \
                 ins AS (INSERT INTO ref_staged_rows (import, seq, doc) \
                 SELECT $1, base.b + j.ord - 1, j.value::text FROM fits, base, \
                 json_array_elements($2::json) WITH ORDINALITY AS j(value, ord)), \
                 counted AS (INSERT INTO ref_staged_bytes (import, owner, bytes) \
                 SELECT $1, $4, $5 FROM fits ON CONFLICT (import) \
                 DO UPDATE SET bytes = ref_staged_bytes.bytes + excluded.bytes) \
                 SELECT base.b + $3, used.n::BIGINT, EXISTS (SELECT 1 FROM fits) FROM base, used",
            )
            .bind(import)
            .bind(array)
            .bind(int(n))
            .bind(owner)
            .bind(int(bytes))
            .bind(int(max_bytes))
            .fetch_one(&mut **tx)
            .await
            .map_err(sql)?;
            let staged: i64 = row.try_get(0).map_err(sql)?;
            let stored: i64 = row.try_get(1).map_err(sql)?;
            let fits: bool = row.try_get(2).map_err(sql)?;
            return Ok(if fits {
                Staged::Rows(count(staged))
            } else {
                Staged::OverQuota {
                    stored: count(stored),
                }
            });
        }
        if let Data::Sql(TypedTx::Sqlite(tx)) = self {
            // Two statements (one writer at a time on SQLite, so what they read holds until
            // the rows go in): the import's bytes counted first, returning where its rows go
            // on and what the owner stores with them; then the rows, if they fit.
            let row = sqlx::query(
                "INSERT INTO ref_staged_bytes (import, owner, bytes) VALUES ($1, $2, $3) \
                 ON CONFLICT (import) DO UPDATE SET bytes = ref_staged_bytes.bytes + excluded.bytes \
                 RETURNING (SELECT COALESCE(MAX(seq) + 1, 0) FROM ref_staged_rows WHERE import = $1), \
                 bytes + COALESCE((SELECT SUM(d.bytes) FROM ref_datasets AS d WHERE d.owner = $2), 0) \
                 + COALESCE((SELECT SUM(s.bytes) FROM ref_staged_bytes AS s \
                 WHERE s.owner = $2 AND s.import <> $1), 0)",
            )
            .bind(import)
            .bind(owner)
            .bind(int(bytes))
            .fetch_one(&mut **tx)
            .await
            .map_err(sql)?;
            let before: i64 = row.try_get(0).map_err(sql)?;
            let with_rows = count(row.try_get(1).map_err(sql)?);
            if with_rows > max_bytes {
                // Counted too soon: taken back (the row too, if this made it), so nothing
                // is written.
                sqlx::query("UPDATE ref_staged_bytes SET bytes = bytes - $1 WHERE import = $2")
                    .bind(int(bytes))
                    .bind(import)
                    .execute(&mut **tx)
                    .await
                    .map_err(sql)?;
                sqlx::query("DELETE FROM ref_staged_bytes WHERE import = $1 AND bytes = 0")
                    .bind(import)
                    .execute(&mut **tx)
                    .await
                    .map_err(sql)?;
                let stored = with_rows.saturating_sub(bytes);
                return Ok(Staged::OverQuota { stored });
            }
            let array = serde_json::to_string(rows).map_err(HandlerError::internal)?;
            sqlx::query(
                "INSERT INTO ref_staged_rows (import, seq, doc) \
                 SELECT $1, $2 + j.key, j.value FROM json_each($3) AS j",
            )
            .bind(import)
            .bind(before)
            .bind(array)
            .execute(&mut **tx)
            .await
            .map_err(sql)?;
            return Ok(Staged::Rows(count(before) + n));
        }
        let stored = self.stored_bytes(owner).await?;
        if stored.saturating_add(bytes) > max_bytes {
            return Ok(Staged::OverQuota { stored });
        }
        match self {
            Data::Sql(_) => Err(HandlerError::internal(
                "the import service has no SQL for this database",
            )),
            Data::Redis(tx) => {
                let key = staged_key(import);
                let before: i64 = tx.reader().llen(&key).await.map_err(backend)?;
                let mut push = vec!["RPUSH".to_owned(), key.clone()];
                for row in rows {
                    push.push(serde_json::to_string(row).map_err(HandlerError::internal)?);
                }
                tx.queue(push)?;
                let size = staged_bytes_key(import);
                tx.queue(["INCRBY".to_owned(), size.clone(), bytes.to_string()])?;
                // They go when the import's handle is retired (as SQL's trigger drops its
                // rows), and expire with its lifetime at the latest (plus the grace during
                // which it is still reported as expired).
                let until = expires_at.saturating_add(EXPIRED_HANDLE_GRACE_MS);
                for key in [key, size] {
                    tx.file_under_handle(import, &key);
                    tx.queue(["PEXPIREAT".to_owned(), key, until.to_string()])?;
                }
                let staging = owner_key(owner, "imports");
                tx.queue(["SADD".to_owned(), staging.clone(), import.to_owned()])?;
                // No import alive now outlives an import begun now: the set is kept while
                // any might (each append pushes this on).
                let lifetime = expires_at.saturating_sub(created_at);
                let keep = now_millis()
                    .saturating_add(lifetime)
                    .saturating_add(EXPIRED_HANDLE_GRACE_MS);
                tx.queue(["PEXPIREAT".to_owned(), staging, keep.to_string()])?;
                Ok(Staged::Rows(count(before) + n))
            }
        }
    }

    /// Drops `owner`'s import's staged rows; how many there were.
    pub async fn discard_staged(&mut self, owner: &str, import: &str) -> Result<u64, HandlerError> {
        let staged = self.staged(import).await?;
        self.take_staged_bytes(owner, import).await?;
        match self {
            Data::Sql(tx) => on_sql!(&mut **tx, |c| {
                sqlx::query("DELETE FROM ref_staged_rows WHERE import = $1")
                    .bind(import)
                    .execute(&mut **c)
                    .await
                    .map_err(sql)?;
                Ok(())
            })?,
            Data::Redis(tx) => tx.queue(["UNLINK".to_owned(), staged_key(import)])?,
        }
        Ok(staged)
    }

    /// Forgets the bytes `owner`'s import staged (they are dropped); how many.
    async fn take_staged_bytes(&mut self, owner: &str, import: &str) -> Result<u64, HandlerError> {
        match self {
            Data::Sql(tx) => on_sql!(&mut **tx, |c| {
                let bytes: Option<i64> = sqlx::query_scalar(TAKE_STAGED_BYTES_SQL)
                    .bind(import)
                    .fetch_optional(&mut **c)
                    .await
                    .map_err(sql)?;
                Ok(bytes.map_or(0, count))
            }),
            Data::Redis(tx) => take_staging(tx, owner, import).await,
        }
    }

    /// Moves an import's staged rows to the end of dataset `name` (created with `columns`
    /// if it does not exist), or in place of its rows with `replace`. `seen` is the dataset
    /// as [`dataset_to_change`](Self::dataset_to_change) read it in this transaction: what
    /// the caller decided on (a replacement confirmed, say) is what gets changed, or nothing.
    pub async fn commit_staged(
        &mut self,
        owner: &str,
        name: &str,
        columns: &Value,
        import: &str,
        replace: bool,
        seen: Option<&Dataset>,
    ) -> Result<Commit, HandlerError> {
        let staged = self.staged(import).await?;
        let n = i64::try_from(staged).unwrap_or(i64::MAX);
        match self {
            Data::Sql(tx) => {
                let read = match &**tx {
                    TypedTx::Postgres(_) => {
                        "SELECT columns FROM ref_datasets WHERE owner = $1 AND name = $2 FOR UPDATE"
                    }
                    _ => "SELECT columns FROM ref_datasets WHERE owner = $1 AND name = $2",
                };
                on_sql!(&mut **tx, |c| {
                    let columns_text = columns.to_string();
                    let made = sqlx::query(
                        "INSERT INTO ref_datasets (owner, name, columns, generation) \
                         VALUES ($1, $2, $3, $4) ON CONFLICT (owner, name) DO NOTHING",
                    )
                    .bind(owner)
                    .bind(name)
                    .bind(&columns_text)
                    .bind(rand::random::<i64>())
                    .execute(&mut **c)
                    .await
                    .map_err(sql)?
                    .rows_affected()
                        == 1;
                    // Read absent, there now: another commit made it in between (on
                    // PostgreSQL; a dataset read present stays locked since). Its rows are
                    // not for a replacement nobody was asked about.
                    if replace && seen.is_none() && !made {
                        return Ok(Commit::Changed);
                    }
                    // The dataset's row is locked first (PostgreSQL; SQLite has one writer):
                    // concurrent commits to one dataset number their rows in turn, and nothing
                    // is written when the columns differ.
                    let have: String = sqlx::query_scalar(read)
                        .bind(owner)
                        .bind(name)
                        .fetch_one(&mut **c)
                        .await
                        .map_err(sql)?;
                    let have = json_text(&have)?;
                    if have != *columns {
                        return Ok(Commit::OtherColumns(have));
                    }
                    // The staged rows' bytes go to the dataset.
                    let b: Option<i64> = sqlx::query_scalar(TAKE_STAGED_BYTES_SQL)
                        .bind(import)
                        .fetch_optional(&mut **c)
                        .await
                        .map_err(sql)?;
                    let b = b.unwrap_or(0);
                    let update = if replace {
                        "UPDATE ref_datasets SET row_count = $3, next_seq = next_seq + $3, bytes = $4 \
                     WHERE owner = $1 AND name = $2 RETURNING next_seq - $3, row_count"
                    } else {
                        "UPDATE ref_datasets SET row_count = row_count + $3, next_seq = next_seq + $3, \
                     bytes = bytes + $4 WHERE owner = $1 AND name = $2 RETURNING next_seq - $3, row_count"
                    };
                    let row = sqlx::query(update)
                        .bind(owner)
                        .bind(name)
                        .bind(n)
                        .bind(b)
                        .fetch_one(&mut **c)
                        .await
                        .map_err(sql)?;
                    let first: i64 = row.try_get(0).map_err(sql)?;
                    let total: i64 = row.try_get(1).map_err(sql)?;
                    if replace {
                        sqlx::query(
                            "DELETE FROM ref_dataset_rows WHERE owner = $1 AND dataset = $2",
                        )
                        .bind(owner)
                        .bind(name)
                        .execute(&mut **c)
                        .await
                        .map_err(sql)?;
                    }
                    sqlx::query(
                        "INSERT INTO ref_dataset_rows (owner, dataset, seq, doc) \
                     SELECT $1, $2, $3 + seq, doc FROM ref_staged_rows WHERE import = $4",
                    )
                    .bind(owner)
                    .bind(name)
                    .bind(first)
                    .bind(import)
                    .execute(&mut **c)
                    .await
                    .map_err(sql)?;
                    sqlx::query("DELETE FROM ref_staged_rows WHERE import = $1")
                        .bind(import)
                        .execute(&mut **c)
                        .await
                        .map_err(sql)?;
                    Ok(Commit::Done {
                        moved: staged,
                        total: count(total),
                    })
                })
            }
            Data::Redis(tx) => {
                let datasets = owner_key(owner, "datasets");
                // The dataset as read before, expected unchanged when the commit applies:
                // a concurrent commit makes this call retry rather than act on rows the
                // caller never saw.
                let (text, stored) = match seen.and_then(|d| d.redis.as_ref()) {
                    Some((text, stored)) => (Some(text.as_str()), Some(stored.clone())),
                    None => (None, None),
                };
                let mut stored = match stored {
                    Some(stored) => stored,
                    None => Stored {
                        columns: columns.clone(),
                        rows: 0,
                        next_seq: 0,
                        segments: Vec::new(),
                        bytes: 0,
                        generation: rand::random(),
                    },
                };
                if stored.columns != *columns {
                    return Ok(Commit::OtherColumns(stored.columns));
                }
                tx.expect_field(&datasets, name, text);
                let bytes = take_staging(tx, owner, import).await?;
                let mut grown = i64::try_from(bytes).unwrap_or(i64::MAX);
                if replace {
                    for Segment(key, ..) in stored.segments.drain(..) {
                        tx.queue(["UNLINK".to_owned(), key])?;
                    }
                    stored.rows = 0;
                    grown = grown.saturating_sub(i64::try_from(stored.bytes).unwrap_or(i64::MAX));
                    stored.bytes = 0;
                }
                stored.bytes = stored.bytes.saturating_add(bytes);
                tx.queue([
                    "INCRBY".to_owned(),
                    owner_key(owner, "bytes"),
                    grown.to_string(),
                ])?;
                if staged > 0 {
                    // A few rows after a few rows are copied onto the end of the last
                    // segment (its rows are numbered up to `next_seq`), so a dataset fed by
                    // many small imports keeps few segments, and the list of them each
                    // commit rewrites stays short.
                    let onto = match stored.segments.last() {
                        Some(Segment(last, _, len))
                            if *len + staged <= SEGMENT_ROWS && bytes <= SEGMENT_COPY_BYTES =>
                        {
                            // Only onto a list that holds what the record says (a commit that
                            // failed half way may have left more): else the copied rows would
                            // be numbered wrong.
                            let held: u64 = tx.reader().llen(last).await.map_err(backend)?;
                            (held == *len).then(|| last.clone())
                        }
                        _ => None,
                    };
                    if let Some(last) = onto {
                        append_rows(tx, import, &last, staged).await?;
                        if let Some(Segment(_, _, len)) = stored.segments.last_mut() {
                            *len += staged;
                        }
                    } else {
                        // Renamed, not copied: committing is as cheap for a million rows as
                        // for one. The staging list expired with the handle; the segment
                        // lasts.
                        let segment = format!("ref:seg:{import}");
                        tx.queue(["RENAME".to_owned(), staged_key(import), segment.clone()])?;
                        tx.queue(["PERSIST".to_owned(), segment.clone()])?;
                        stored
                            .segments
                            .push(Segment(segment, stored.next_seq, staged));
                    }
                    stored.next_seq += n;
                    stored.rows += staged;
                }
                let json = serde_json::to_string(&stored).map_err(HandlerError::internal)?;
                tx.queue(["HSET".to_owned(), datasets, name.to_owned(), json])?;
                Ok(Commit::Done {
                    moved: staged,
                    total: stored.rows,
                })
            }
        }
    }

    /// Deletes a dataset and its rows; how many rows went.
    pub async fn delete_dataset(
        &mut self,
        owner: &str,
        dataset: Dataset,
        name: &str,
    ) -> Result<u64, HandlerError> {
        match self {
            Data::Sql(tx) => on_sql!(&mut **tx, |c| {
                // Its rows go with it (ON DELETE CASCADE); its report too: a dataset made
                // again under the name has none yet, and numbers its runs from 1.
                let row: Option<i64> = sqlx::query_scalar(
                    "DELETE FROM ref_datasets WHERE owner = $1 AND name = $2 RETURNING row_count",
                )
                .bind(owner)
                .bind(name)
                .fetch_optional(&mut **c)
                .await
                .map_err(sql)?;
                sqlx::query("DELETE FROM ref_reports WHERE owner = $1 AND dataset = $2")
                    .bind(owner)
                    .bind(name)
                    .execute(&mut **c)
                    .await
                    .map_err(sql)?;
                Ok(row.map_or(0, count))
            }),
            Data::Redis(tx) => {
                let Some((text, stored)) = dataset.redis else {
                    return Err(HandlerError::internal(
                        "a Redis dataset read without its text",
                    ));
                };
                let datasets = owner_key(owner, "datasets");
                tx.expect_field(&datasets, name, Some(&text));
                tx.queue(["HDEL".to_owned(), datasets, name.to_owned()])?;
                tx.queue([
                    "DECRBY".to_owned(),
                    owner_key(owner, "bytes"),
                    stored.bytes.to_string(),
                ])?;
                for Segment(key, ..) in stored.segments {
                    tx.queue(["UNLINK".to_owned(), key])?;
                }
                // Its report too, and the mark of its last run if that was cut short (only
                // the last run's can be left: each run clears the one before): a dataset
                // made again under the name numbers its runs from 1, and run 1 must not
                // read as cancelled.
                let reports = owner_key(owner, "reports");
                let report: Option<String> =
                    tx.reader().hget(&reports, name).await.map_err(backend)?;
                // Unchanged when the deletion applies: a run that wrote since makes it retry.
                tx.expect_field(&reports, name, report.as_deref());
                let run = report
                    .and_then(|text| serde_json::from_str::<Value>(&text).ok())
                    .and_then(|doc| doc["run"].as_u64());
                tx.queue(["HDEL".to_owned(), reports, name.to_owned()])?;
                if let Some(run) = run {
                    tx.queue([
                        "SREM".to_owned(),
                        owner_key(owner, "cancelled"),
                        format!("{run}:{name}"),
                    ])?;
                }
                Ok(stored.rows)
            }
        }
    }

    /// Up to `limit` rows of a dataset numbered above `after`, in order.
    pub async fn scan(
        &mut self,
        owner: &str,
        name: &str,
        after: Option<i64>,
        limit: u32,
    ) -> Result<Vec<(i64, Value)>, HandlerError> {
        match self {
            Data::Sql(tx) => on_sql!(&mut **tx, |c| {
                let rows = sqlx::query(
                    "SELECT seq, doc FROM ref_dataset_rows \
                     WHERE owner = $1 AND dataset = $2 AND seq > $3 ORDER BY seq LIMIT $4",
                )
                .bind(owner)
                .bind(name)
                .bind(after.unwrap_or(-1))
                .bind(i64::from(limit))
                .fetch_all(&mut **c)
                .await
                .map_err(sql)?;
                rows.iter()
                    .map(|row| {
                        let doc: String = row.try_get(1).map_err(sql)?;
                        Ok((row.try_get(0).map_err(sql)?, json_text(&doc)?))
                    })
                    .collect()
            }),
            Data::Redis(_) => {
                // Redis reads do not wait for writers: a replacement or a deletion committed
                // between reading the record and reading its lists unlinks lists the record
                // names, which then read short. A short page would read as the end of the
                // data, so the scan starts again from the record as it is now.
                for _ in 0..SCAN_TRIES {
                    let Some(Dataset {
                        redis: Some((_, stored)),
                        ..
                    }) = self.dataset(owner, name).await?
                    else {
                        return Ok(Vec::new());
                    };
                    let Data::Redis(tx) = self else {
                        return Ok(Vec::new());
                    };
                    if let Some(rows) = scan_segments(tx, &stored.segments, after, limit).await? {
                        return Ok(rows);
                    }
                }
                Err(HandlerError::from(StoreError::Busy(format!(
                    "dataset {name:?} kept changing while it was read"
                ))))
            }
        }
    }

    /// A dataset's latest report, and whether its run was cut short.
    pub async fn report(
        &mut self,
        owner: &str,
        dataset: &str,
    ) -> Result<Option<(Value, bool)>, HandlerError> {
        match self {
            Data::Sql(tx) => on_sql!(&mut **tx, |c| {
                let row = sqlx::query(
                    "SELECT doc, cancelled FROM ref_reports WHERE owner = $1 AND dataset = $2",
                )
                .bind(owner)
                .bind(dataset)
                .fetch_optional(&mut **c)
                .await
                .map_err(sql)?;
                row.map(|row| {
                    let doc: String = row.try_get(0).map_err(sql)?;
                    let cancelled: i64 = row.try_get(1).map_err(sql)?;
                    Ok((json_text(&doc)?, cancelled != 0))
                })
                .transpose()
            }),
            Data::Redis(tx) => {
                let text: Option<String> = tx
                    .reader()
                    .hget(owner_key(owner, "reports"), dataset)
                    .await
                    .map_err(backend)?;
                let Some(text) = text else {
                    return Ok(None);
                };
                let doc = json_text(&text)?;
                let run = doc.get("run").and_then(Value::as_u64).unwrap_or(0);
                let cancelled: bool = tx
                    .reader()
                    .sismember(owner_key(owner, "cancelled"), format!("{run}:{dataset}"))
                    .await
                    .map_err(backend)?;
                Ok(Some((doc, cancelled)))
            }
        }
    }

    /// Records run `run`'s report of a dataset; a new run starts not cancelled.
    pub async fn put_report(
        &mut self,
        owner: &str,
        dataset: &str,
        run: u64,
        doc: &Value,
    ) -> Result<(), HandlerError> {
        match self {
            Data::Sql(tx) => on_sql!(&mut **tx, |c| {
                sqlx::query(
                    "INSERT INTO ref_reports (owner, dataset, run, doc, cancelled) \
                     VALUES ($1, $2, $3, $4, 0) ON CONFLICT (owner, dataset) DO UPDATE SET \
                     cancelled = CASE WHEN ref_reports.run = excluded.run \
                     THEN ref_reports.cancelled ELSE 0 END, \
                     run = excluded.run, doc = excluded.doc",
                )
                .bind(owner)
                .bind(dataset)
                .bind(i64::try_from(run).unwrap_or(i64::MAX))
                .bind(doc.to_string())
                .execute(&mut **c)
                .await
                .map_err(sql)?;
                Ok(())
            })?,
            Data::Redis(tx) => {
                let reports = owner_key(owner, "reports");
                tx.queue([
                    "HSET".to_owned(),
                    reports,
                    dataset.to_owned(),
                    doc.to_string(),
                ])?;
                // The marks of the run before and of this run's number (left by a run of a
                // dataset deleted since, under the same name) do not reach this run.
                let cancelled = owner_key(owner, "cancelled");
                let mut stale = vec!["SREM".to_owned(), cancelled, format!("{run}:{dataset}")];
                if let Some(previous) = run.checked_sub(1) {
                    stale.push(format!("{previous}:{dataset}"));
                }
                tx.queue(stale)?;
            }
        }
        Ok(())
    }

    /// Marks run `run` of a dataset's report cut short; a later run is left alone.
    pub async fn mark_cancelled(
        &mut self,
        owner: &str,
        dataset: &str,
        run: u64,
    ) -> Result<(), HandlerError> {
        match self {
            Data::Sql(tx) => on_sql!(&mut **tx, |c| {
                sqlx::query(
                    "UPDATE ref_reports SET cancelled = 1 \
                     WHERE owner = $1 AND dataset = $2 AND run = $3",
                )
                .bind(owner)
                .bind(dataset)
                .bind(i64::try_from(run).unwrap_or(i64::MAX))
                .execute(&mut **c)
                .await
                .map_err(sql)?;
                Ok(())
            })?,
            Data::Redis(tx) => {
                let cancelled = owner_key(owner, "cancelled");
                tx.queue(["SADD".to_owned(), cancelled, format!("{run}:{dataset}")])?;
            }
        }
        Ok(())
    }
}
