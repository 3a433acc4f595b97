//! [`Documents`] on SQLite and PostgreSQL: documents in `wharf_docs`, rows in `wharf_rows`,
//! each collection's length and next sequence number in `wharf_collections`.

use async_trait::async_trait;
use serde_json::Value;
use wharf::store::StoreError;

use super::Documents;
use crate::sql::{SqlTx, TypedTx, db_error, on_driver, read_json};

/// Appends the rows of the JSON array `?3` to collection `?1` (`?2` of them), returning the
/// collection's length: three statements in one call (sqlx runs them in turn on SQLite's
/// connection thread). `json_each` gives objects and arrays as JSON text and scalars as SQL
/// values: strings are quoted back, and numbers are taken from the array as text (`->`),
/// since a REAL printed back keeps only 15 digits and an integer past i64 is a REAL.
#[cfg(feature = "sqlite")]
const SQLITE_APPEND_SQL: &str = "INSERT INTO wharf_collections (name, next_seq, len) \
     VALUES (?1, ?2, ?2) ON CONFLICT (name) DO UPDATE SET \
     next_seq = wharf_collections.next_seq + excluded.next_seq, \
     len = wharf_collections.len + excluded.len; \
     INSERT INTO wharf_rows (collection, seq, doc) \
     SELECT ?1, (SELECT next_seq FROM wharf_collections WHERE name = ?1) - ?2 + j.key, \
     CASE j.type WHEN 'object' THEN j.value WHEN 'array' THEN j.value \
     WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' WHEN 'null' THEN 'null' \
     WHEN 'text' THEN json_quote(j.value) ELSE ?3 -> j.fullkey END \
     FROM json_each(?3) AS j; \
     SELECT len FROM wharf_collections WHERE name = ?1";

/// The same on PostgreSQL, in one statement; `json` (not `jsonb`) keeps each row's text.
#[cfg(feature = "postgres")]
const PG_APPEND_SQL: &str = "WITH r AS (INSERT INTO wharf_collections (name, next_seq, len) \
     VALUES ($1, $2, $2) ON CONFLICT (name) DO UPDATE SET \
     next_seq = wharf_collections.next_seq + excluded.next_seq, \
     len = wharf_collections.len + excluded.len \
     RETURNING next_seq - $2 AS base, len), \
     ins AS (INSERT INTO wharf_rows (collection, seq, doc) \
     SELECT $1, r.base + j.ord - 1, j.value::text \
     FROM r, json_array_elements($3::json) WITH ORDINALITY AS j(value, ord)) \
     SELECT len FROM r";

impl SqlTx {
    /// Reserves `n` sequence numbers at the end of `collection`: the first one, and the
    /// collection's length with them.
    async fn reserve(&mut self, collection: &str, n: i64) -> Result<(i64, i64), StoreError> {
        let sql = "INSERT INTO wharf_collections (name, next_seq, len) VALUES ($1, $2, $2) \
             ON CONFLICT (name) DO UPDATE SET \
             next_seq = wharf_collections.next_seq + excluded.next_seq, \
             len = wharf_collections.len + excluded.len \
             RETURNING next_seq, len";
        let (next, len): (i64, i64) = on_driver!(TypedTx, self.sqlx(), |tx| sqlx::query_as(sql)
            .bind(collection)
            .bind(n)
            .fetch_one(&mut **tx)
            .await
            .map_err(db_error)?);
        Ok((next - n, len))
    }

    /// A text column of the first row a statement with text parameters returns.
    async fn text(&mut self, sql: &str, params: &[&str]) -> Result<Option<String>, StoreError> {
        on_driver!(TypedTx, self.sqlx(), |tx| {
            let mut query = sqlx::query_scalar(sql);
            for p in params {
                query = query.bind(*p);
            }
            query.fetch_optional(&mut **tx).await.map_err(db_error)
        })
    }

    /// An integer column of the first row a statement with text parameters returns.
    async fn int(&mut self, sql: &str, params: &[&str]) -> Result<Option<i64>, StoreError> {
        on_driver!(TypedTx, self.sqlx(), |tx| {
            let mut query = sqlx::query_scalar(sql);
            for p in params {
                query = query.bind(*p);
            }
            query.fetch_optional(&mut **tx).await.map_err(db_error)
        })
    }
}

#[async_trait]
impl Documents for SqlTx {
    async fn get_doc(&mut self, collection: &str, key: &str) -> Result<Option<Value>, StoreError> {
        let sql = "SELECT doc FROM wharf_docs WHERE collection = $1 AND key = $2";
        let text = self.text(sql, &[collection, key]).await?;
        text.as_deref().map(read_json).transpose()
    }

    async fn put_doc(
        &mut self,
        collection: &str,
        key: &str,
        doc: &Value,
    ) -> Result<(), StoreError> {
        let sql = "INSERT INTO wharf_docs (collection, key, doc) VALUES ($1, $2, $3) \
             ON CONFLICT (collection, key) DO UPDATE SET doc = excluded.doc";
        self.run(sql, &[collection, key, &doc.to_string()])
            .await
            .map(drop)
    }

    async fn insert_doc(
        &mut self,
        collection: &str,
        key: &str,
        doc: &Value,
    ) -> Result<Option<Value>, StoreError> {
        let sql = "INSERT INTO wharf_docs (collection, key, doc) VALUES ($1, $2, $3) \
             ON CONFLICT (collection, key) DO NOTHING";
        if self.run(sql, &[collection, key, &doc.to_string()]).await? == 1 {
            return Ok(None);
        }
        // A new statement sees what the concurrent writer committed.
        self.get_doc(collection, key).await
    }

    async fn delete_doc(&mut self, collection: &str, key: &str) -> Result<bool, StoreError> {
        let sql = "DELETE FROM wharf_docs WHERE collection = $1 AND key = $2";
        Ok(self.run(sql, &[collection, key]).await? > 0)
    }

    async fn append_rows(&mut self, collection: &str, rows: &[Value]) -> Result<u64, StoreError> {
        if rows.is_empty() {
            return self.count_rows(collection).await;
        }
        // The rows travel as one JSON array and the database splits them: one parameter and
        // one round trip however many rows there are, sequence numbers reserved on the way.
        let n = i64::try_from(rows.len()).unwrap_or(i64::MAX);
        let array = serde_json::to_string(rows)
            .map_err(|e| StoreError::Backend(format!("rows do not serialize: {e}")))?;
        // `fetch_all`: on SQLite the length comes from the last of the statements.
        let lens: Vec<i64> = match self.sqlx() {
            #[cfg(feature = "sqlite")]
            TypedTx::Sqlite(tx) => {
                sqlx::query_scalar(SQLITE_APPEND_SQL)
                    .bind(collection)
                    .bind(n)
                    .bind(array)
                    .fetch_all(&mut **tx)
                    .await
            }
            #[cfg(feature = "postgres")]
            TypedTx::Postgres(tx) => {
                sqlx::query_scalar(PG_APPEND_SQL)
                    .bind(collection)
                    .bind(n)
                    .bind(array)
                    .fetch_all(&mut **tx)
                    .await
            }
        }
        .map_err(db_error)?;
        let len = lens
            .last()
            .copied()
            .ok_or_else(|| StoreError::Backend("appending rows returned no length".into()))?;
        Ok(u64::try_from(len).unwrap_or(0))
    }

    async fn count_rows(&mut self, collection: &str) -> Result<u64, StoreError> {
        let sql = "SELECT len FROM wharf_collections WHERE name = $1";
        let len = self.int(sql, &[collection]).await?;
        Ok(len.and_then(|l| u64::try_from(l).ok()).unwrap_or(0))
    }

    async fn scan_rows(
        &mut self,
        collection: &str,
        after: Option<i64>,
        limit: u32,
    ) -> Result<Vec<(i64, Value)>, StoreError> {
        let sql = "SELECT seq, doc FROM wharf_rows WHERE collection = $1 AND seq > $2 \
             ORDER BY seq LIMIT $3";
        let rows: Vec<(i64, String)> = on_driver!(TypedTx, self.sqlx(), |tx| sqlx::query_as(sql)
            .bind(collection)
            .bind(after.unwrap_or(-1))
            .bind(i64::from(limit))
            .fetch_all(&mut **tx)
            .await
            .map_err(db_error)?);
        rows.into_iter()
            .map(|(seq, doc)| Ok((seq, read_json(&doc)?)))
            .collect()
    }

    async fn move_rows(&mut self, from: &str, to: &str) -> Result<u64, StoreError> {
        super::distinct(from, to)?;
        // Lock the source's counter first: appends to it wait until this transaction ends,
        // so the count and the rows moved are the same rows.
        let sql = "UPDATE wharf_collections SET len = len WHERE name = $1 RETURNING len";
        let n = self.int(sql, &[from]).await?.unwrap_or(0);
        if n == 0 {
            return Ok(0);
        }
        let (base, _) = self.reserve(to, n).await?;
        let sql = "INSERT INTO wharf_rows (collection, seq, doc) \
             SELECT $2, $3 + ROW_NUMBER() OVER (ORDER BY seq) - 1, doc \
             FROM wharf_rows WHERE collection = $1";
        let moved = on_driver!(TypedTx, self.sqlx(), |tx| sqlx::query(sql)
            .bind(from)
            .bind(to)
            .bind(base)
            .execute(&mut **tx)
            .await
            .map_err(db_error)?
            .rows_affected());
        if i64::try_from(moved).ok() != Some(n) {
            return Err(StoreError::Corrupt(format!(
                "collection {from:?} counts {n} rows but holds {moved}"
            )));
        }
        self.clear_rows(from).await
    }

    async fn clear_rows(&mut self, collection: &str) -> Result<u64, StoreError> {
        // The counter first, as an append takes it: an append waits until this transaction
        // ends, so the rows deleted are every row counted, and none lands between the two.
        self.run(
            "UPDATE wharf_collections SET len = 0 WHERE name = $1",
            &[collection],
        )
        .await?;
        self.run(
            "DELETE FROM wharf_rows WHERE collection = $1",
            &[collection],
        )
        .await
    }
}
