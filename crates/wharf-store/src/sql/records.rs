//! Records (see `wharf::store::Record`) in the `wharf_records` table: one row per namespace
//! and key; every conditional write is one statement, so the database's row lock decides
//! between two replicas writing at once.

use sqlx::Row;
use wharf::store::{Millis, NewRecord, Record, StoreError, Write, fresh_version};

use super::{SqlPool, db_error, on_driver, write_error};

/// What a record is read as.
const COLUMNS: &str = "value, version, owner, expires_at";

/// An insert that takes over an expired row. Parameters: namespace, key, value, owner,
/// expiry, new version, now.
const CREATE: &str = "INSERT INTO wharf_records (namespace, key, value, version, owner, expires_at) \
     VALUES ($1, $2, $3, $6, $4, $5) \
     ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, \
     version = excluded.version, owner = excluded.owner, expires_at = excluded.expires_at \
     WHERE wharf_records.expires_at IS NOT NULL AND wharf_records.expires_at <= $7 \
     RETURNING version";
/// An insert that takes over any row. Parameters: as [`CREATE`]'s, without now.
const UPSERT: &str = "INSERT INTO wharf_records (namespace, key, value, version, owner, expires_at) \
     VALUES ($1, $2, $3, $6, $4, $5) \
     ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, \
     version = excluded.version, owner = excluded.owner, expires_at = excluded.expires_at \
     RETURNING version";
/// A compare-and-swap on a live row. Parameters: as [`CREATE`]'s, then the expected version.
const REPLACE: &str = "UPDATE wharf_records SET value = $3, version = $6, owner = $4, \
     expires_at = $5 WHERE namespace = $1 AND key = $2 AND version = $8 \
     AND (expires_at IS NULL OR expires_at > $7) RETURNING version";

pub(super) async fn read(
    pool: &SqlPool,
    namespace: &str,
    key: &str,
    now: Millis,
) -> Result<Option<Record>, StoreError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM wharf_records WHERE namespace = $1 AND key = $2 \
         AND (expires_at IS NULL OR expires_at > $3)"
    );
    on_driver!(SqlPool, pool, |pool| {
        let row = sqlx::query(&sql)
            .bind(namespace)
            .bind(key)
            .bind(now)
            .fetch_optional(pool)
            .await
            .map_err(db_error)?;
        row.map(|row| {
            Ok(Record {
                value: row.try_get(0).map_err(db_error)?,
                version: version(row.try_get(1).map_err(db_error)?)?,
                owner: row.try_get(2).map_err(db_error)?,
                expires_at: row.try_get(3).map_err(db_error)?,
            })
        })
        .transpose()
    })
}

pub(super) async fn write(
    pool: &SqlPool,
    record: &NewRecord<'_>,
    write: Write,
    now: Millis,
) -> Result<Option<u64>, StoreError> {
    let sql = match write {
        Write::Create => CREATE,
        Write::Upsert => UPSERT,
        Write::Replace(_) => REPLACE,
    };
    let new_version = to_i64(fresh_version())?;
    let written: Option<i64> = on_driver!(SqlPool, pool, |pool| {
        let query = sqlx::query_scalar(sql)
            .bind(record.namespace)
            .bind(record.key)
            .bind(record.value)
            .bind(record.owner)
            .bind(record.expires_at)
            .bind(new_version);
        let query = match write {
            Write::Create => query.bind(now),
            Write::Upsert => query,
            Write::Replace(expected) => query.bind(now).bind(to_i64(expected)?),
        };
        query.fetch_optional(pool).await.map_err(write_error)?
    });
    written.map(version).transpose()
}

pub(super) async fn delete(
    pool: &SqlPool,
    namespace: &str,
    key: &str,
    expected: Option<u64>,
) -> Result<bool, StoreError> {
    let sql = match expected {
        None => "DELETE FROM wharf_records WHERE namespace = $1 AND key = $2",
        Some(_) => "DELETE FROM wharf_records WHERE namespace = $1 AND key = $2 AND version = $3",
    };
    let expected = expected.map(to_i64).transpose()?;
    let deleted = on_driver!(SqlPool, pool, |pool| {
        let mut query = sqlx::query(sql).bind(namespace).bind(key);
        if let Some(expected) = expected {
            query = query.bind(expected);
        }
        query
            .execute(pool)
            .await
            .map_err(write_error)?
            .rows_affected()
    });
    Ok(deleted > 0)
}

pub(super) async fn of_owner(
    pool: &SqlPool,
    namespace: &str,
    owner: &str,
    now: Millis,
    limit: u32,
) -> Result<Vec<(String, Record)>, StoreError> {
    let sql = format!(
        "SELECT key, {COLUMNS} FROM wharf_records WHERE namespace = $1 AND owner = $2 \
         AND (expires_at IS NULL OR expires_at > $3) ORDER BY key LIMIT $4"
    );
    on_driver!(SqlPool, pool, |pool| {
        let rows = sqlx::query(&sql)
            .bind(namespace)
            .bind(owner)
            .bind(now)
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await
            .map_err(db_error)?;
        rows.iter()
            .map(|row| {
                Ok((
                    row.try_get(0).map_err(db_error)?,
                    Record {
                        value: row.try_get(1).map_err(db_error)?,
                        version: version(row.try_get(2).map_err(db_error)?)?,
                        owner: row.try_get(3).map_err(db_error)?,
                        expires_at: row.try_get(4).map_err(db_error)?,
                    },
                ))
            })
            .collect()
    })
}

/// The sweep's statement for expired records, a batch at a time (the outer test of
/// `expires_at`: see the sweep in `sql.rs`).
pub(super) const SWEEP: &str = "DELETE FROM wharf_records \
     WHERE expires_at <= $1 AND (namespace, key) IN \
     (SELECT namespace, key FROM wharf_records WHERE expires_at <= $1 LIMIT $2)";

fn version(stored: i64) -> Result<u64, StoreError> {
    u64::try_from(stored).map_err(|_| StoreError::Corrupt(format!("record version {stored}")))
}

fn to_i64(version: u64) -> Result<i64, StoreError> {
    i64::try_from(version).map_err(|_| StoreError::Invalid(format!("record version {version}")))
}
