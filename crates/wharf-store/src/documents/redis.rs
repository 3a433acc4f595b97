//! [`Documents`] on Redis: a collection's documents in one hash, its rows in one list, both
//! written through the transaction's buffer; reads see this transaction's own writes.

use async_trait::async_trait;
use redis::AsyncCommands;
use serde_json::{Value, json};
use wharf::store::StoreError;

use super::Documents;
use crate::redis::{RedisTx, backend};

fn doc_key(collection: &str) -> String {
    format!("wharf:d:{collection}")
}

/// A collection's list. Records' keys are `wharf:r:` and a length (`wharf:r:5:oauth:…`), so
/// a collection whose name starts that way (digits and a colon) keeps its list apart, under
/// `wharf:rc:`, where nothing else is kept; any other name keeps `wharf:r:` and so its rows.
fn rows_key(collection: &str) -> String {
    let digits = collection.bytes().take_while(u8::is_ascii_digit).count();
    if digits > 0 && collection.as_bytes().get(digits) == Some(&b':') {
        format!("wharf:rc:{collection}")
    } else {
        format!("wharf:r:{collection}")
    }
}

/// How many rows a collection had before its list was last emptied (cleared, or moved
/// away): its first row's number, so that numbers go on rising as they do in SQL. Like
/// SQL's row of the collection, it stays once made: a collection named after a handle
/// files it under the handle (retired with it); any other keeps it, a few bytes, for as
/// long as its name may be used again.
fn base_key(collection: &str) -> String {
    format!("wharf:rb:{collection}")
}

/// Up to ARGV[2] rows of list KEYS[1] numbered from ARGV[1] on, given the base KEYS[2]:
/// the first one's number, and the rows. One script, so the base and the list are read
/// together.
const SCAN_LUA: &str = r#"
local base = tonumber(redis.call('GET', KEYS[2]) or '0')
local from = math.max(tonumber(ARGV[1]) - base, 0)
return {base + from, redis.call('LRANGE', KEYS[1], from, from + tonumber(ARGV[2]) - 1)}
"#;

static SCAN: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(SCAN_LUA));

/// The handle a collection is filed under, if its name says so (`HANDLE/…`). Any other
/// name with a `/` (a principal's id, a URL) is filed under nothing: a set kept for a
/// handle that will never be retired would never be cleaned.
fn owner_of(collection: &str) -> Option<&str> {
    collection
        .split_once('/')
        .map(|(h, _)| h)
        .filter(|h| wharf::store::is_handle_id(h))
}

impl RedisTx {
    fn file_under_owner(&mut self, key: &str, collection: &str) {
        if let Some(owner) = owner_of(collection) {
            self.file_under_handle(owner, key);
        }
    }

    async fn stored_len(&mut self, collection: &str) -> Result<i64, StoreError> {
        let n: i64 = self
            .conn
            .llen(rows_key(collection))
            .await
            .map_err(backend)?;
        Ok(n)
    }
}

#[async_trait]
impl Documents for RedisTx {
    async fn get_doc(&mut self, collection: &str, key: &str) -> Result<Option<Value>, StoreError> {
        if let Some(pending) = self.docs.get(&(collection.to_owned(), key.to_owned())) {
            return Ok(pending.clone());
        }
        let text: Option<String> = self
            .conn
            .hget(doc_key(collection), key)
            .await
            .map_err(backend)?;
        text.map(|t| {
            serde_json::from_str(&t).map_err(|e| StoreError::Corrupt(format!("stored JSON: {e}")))
        })
        .transpose()
    }

    async fn put_doc(
        &mut self,
        collection: &str,
        key: &str,
        doc: &Value,
    ) -> Result<(), StoreError> {
        let k = doc_key(collection);
        self.ops.push(json!(["hset", k, key, doc.to_string()]));
        self.file_under_owner(&k, collection);
        self.docs
            .insert((collection.to_owned(), key.to_owned()), Some(doc.clone()));
        Ok(())
    }

    async fn insert_doc(
        &mut self,
        collection: &str,
        key: &str,
        doc: &Value,
    ) -> Result<Option<Value>, StoreError> {
        let slot = (collection.to_owned(), key.to_owned());
        // Deleted earlier in this transaction: its delete runs first at commit, so the
        // document is written whatever is there now.
        let deleted_here = matches!(self.docs.get(&slot), Some(None));
        if let Some(there) = self.get_doc(collection, key).await? {
            return Ok(Some(there));
        }
        // Otherwise written only if still absent at commit; a different one written
        // meanwhile makes the whole commit fail (`StoreError::Conflict`).
        let k = doc_key(collection);
        let op = if deleted_here { "hset" } else { "hsetnx" };
        self.ops.push(json!([op, k, key, doc.to_string()]));
        self.file_under_owner(&k, collection);
        self.docs.insert(slot, Some(doc.clone()));
        Ok(None)
    }

    async fn delete_doc(&mut self, collection: &str, key: &str) -> Result<bool, StoreError> {
        let existed = self.get_doc(collection, key).await?.is_some();
        self.ops.push(json!(["hdel", doc_key(collection), key]));
        self.docs
            .insert((collection.to_owned(), key.to_owned()), None);
        Ok(existed)
    }

    async fn append_rows(&mut self, collection: &str, rows: &[Value]) -> Result<u64, StoreError> {
        if !rows.is_empty() {
            let k = rows_key(collection);
            let mut op = vec![json!("rpush"), json!(k)];
            op.extend(rows.iter().map(|r| Value::String(r.to_string())));
            self.ops.push(Value::Array(op));
            self.file_under_owner(&k, collection);
            *self.appended.entry(collection.to_owned()).or_default() +=
                i64::try_from(rows.len()).unwrap_or(i64::MAX);
        }
        self.count_rows(collection).await
    }

    async fn count_rows(&mut self, collection: &str) -> Result<u64, StoreError> {
        let pending = self.appended.get(collection).copied().unwrap_or(0);
        let n = self.stored_len(collection).await? + pending;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn scan_rows(
        &mut self,
        collection: &str,
        after: Option<i64>,
        limit: u32,
    ) -> Result<Vec<(i64, Value)>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // The script's numbers are Lua's doubles, exact below 2^53: far past any row.
        let from = after.map_or(0, |a| a.saturating_add(1)).clamp(0, 1 << 52);
        let (first, items): (i64, Vec<String>) = SCAN
            .key(rows_key(collection))
            .key(base_key(collection))
            .arg(from)
            .arg(limit)
            .invoke_async(&mut self.conn)
            .await
            .map_err(backend)?;
        items
            .iter()
            .zip(first..)
            .map(|(t, seq)| {
                serde_json::from_str(t)
                    .map(|v| (seq, v))
                    .map_err(|e| StoreError::Corrupt(format!("stored JSON: {e}")))
            })
            .collect()
    }

    async fn move_rows(&mut self, from: &str, to: &str) -> Result<u64, StoreError> {
        super::distinct(from, to)?;
        let n = self.count_rows(from).await?;
        let to_key = rows_key(to);
        let from_base = base_key(from);
        self.ops
            .push(json!(["move", rows_key(from), to_key, from_base]));
        self.file_under_owner(&to_key, to);
        self.file_under_owner(&from_base, from);
        let moved = i64::try_from(n).unwrap_or(i64::MAX);
        *self.appended.entry(to.to_owned()).or_default() += moved;
        *self.appended.entry(from.to_owned()).or_default() -= moved;
        Ok(n)
    }

    async fn clear_rows(&mut self, collection: &str) -> Result<u64, StoreError> {
        let n = self.count_rows(collection).await?;
        let base = base_key(collection);
        self.ops.push(json!(["del", rows_key(collection), base]));
        self.file_under_owner(&base, collection);
        *self.appended.entry(collection.to_owned()).or_default() -=
            i64::try_from(n).unwrap_or(i64::MAX);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_collections_named_after_a_handle_are_filed_under_it() {
        let handle = "imp_0123456789abcdef0123456789abcdef";
        assert_eq!(super::owner_of(&format!("{handle}/rows")), Some(handle));
        for unowned in [
            "https://issuer.example.com/alice/datasets",
            "oauth:https://as.example.com/sub/reports",
            "imp_nothex/rows",
            "plain",
        ] {
            assert_eq!(super::owner_of(unowned), None, "{unowned}");
        }
    }

    #[test]
    fn no_collection_is_keyed_as_a_record_or_as_another_collection() {
        use super::rows_key;
        let record = crate::redis::records::record_key("oauth", "x");
        assert_eq!(rows_key("5:oauth:x"), "wharf:rc:5:oauth:x");
        assert_ne!(rows_key("5:oauth:x"), record);
        // No other name reaches `wharf:rc:`.
        assert_eq!(rows_key("c:5:oauth:x"), "wharf:r:c:5:oauth:x");
        // Names that never looked like a record keep their keys (and their rows).
        for kept in [
            "imp_0123456789abcdef0123456789abcdef/rows",
            "3d/rows",
            "12",
            ":5",
            "~a",
        ] {
            assert_eq!(rows_key(kept), format!("wharf:r:{kept}"));
        }
    }
}
