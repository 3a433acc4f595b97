//! Documents and ordered row collections (feature `documents`): a ready-made app data model,
//! kept in tables (SQL) or keys (Redis) of the store's and written in the call's transaction,
//! so it commits with the call's idempotency record. An app with a model of its own keeps it
//! in tables of its own through its database's typed transaction (`SqlTx::postgres`,
//! `SqlTx::sqlite`), or keys of its own through
//! [`RedisTx::queue`].
//!
//! Collections named `<handle>/…` belong to that handle: they go when it is retired.

use async_trait::async_trait;
use serde_json::Value;
use wharf::store::{StoreError, Transaction};

#[cfg(feature = "redis")]
use crate::redis::RedisTx;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::sql::SqlTx;

#[cfg(feature = "redis")]
mod redis;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql;

/// Documents by key and ordered rows, per collection.
#[async_trait]
pub trait Documents: Send {
    /// Reads a document.
    async fn get_doc(&mut self, collection: &str, key: &str) -> Result<Option<Value>, StoreError>;

    /// Writes a document, replacing any previous one.
    async fn put_doc(&mut self, collection: &str, key: &str, doc: &Value)
    -> Result<(), StoreError>;

    /// Writes a document unless one is there already; returns the one that was there (as
    /// committed by a concurrent call, if that is what won).
    async fn insert_doc(
        &mut self,
        collection: &str,
        key: &str,
        doc: &Value,
    ) -> Result<Option<Value>, StoreError>;

    /// Deletes a document; whether it existed.
    async fn delete_doc(&mut self, collection: &str, key: &str) -> Result<bool, StoreError>;

    /// Appends rows; the collection's length afterwards. On Redis that is the length as this
    /// transaction sees it: rows another call appends before this one commits are not in
    /// it (on SQL the collection's counter is locked until commit).
    async fn append_rows(&mut self, collection: &str, rows: &[Value]) -> Result<u64, StoreError>;

    /// The number of rows in a collection.
    async fn count_rows(&mut self, collection: &str) -> Result<u64, StoreError>;

    /// Up to `limit` rows with a sequence number above `after`, in order. A collection's
    /// numbers only ever rise: rows appended after a clear or a move come after the ones
    /// that went.
    async fn scan_rows(
        &mut self,
        collection: &str,
        after: Option<i64>,
        limit: u32,
    ) -> Result<Vec<(i64, Value)>, StoreError>;

    /// Moves every row of `from` to the end of `to`, in order; how many moved. Refused
    /// ([`StoreError::Invalid`]) when `from` is `to`.
    async fn move_rows(&mut self, from: &str, to: &str) -> Result<u64, StoreError>;

    /// Deletes every row of a collection; how many went.
    async fn clear_rows(&mut self, collection: &str) -> Result<u64, StoreError>;
}

/// Refuses a move of a collection onto itself: its rows would be copied, then deleted with
/// the source.
fn distinct(from: &str, to: &str) -> Result<(), StoreError> {
    if from == to {
        return Err(StoreError::Invalid(format!(
            "rows cannot move from collection {from:?} into itself"
        )));
    }
    Ok(())
}

/// The transaction of a store this crate does not know.
fn foreign() -> StoreError {
    StoreError::Backend("this store keeps no documents: it is not one of wharf-store's".into())
}

/// Finds the store's own transaction behind the core's.
fn documents<'a>(tx: &'a mut (dyn Transaction + '_)) -> Result<&'a mut dyn Documents, StoreError> {
    let any = tx.backend_tx();
    #[cfg(feature = "redis")]
    if any.is::<RedisTx>() {
        return any
            .downcast_mut::<RedisTx>()
            .map(|t| t as &mut dyn Documents)
            .ok_or_else(foreign);
    }
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    if any.is::<SqlTx>() {
        return any
            .downcast_mut::<SqlTx>()
            .map(|t| t as &mut dyn Documents)
            .ok_or_else(foreign);
    }
    Err(foreign())
}

/// Any transaction of a wharf-store store, as the core hands it out (`Context::tx`,
/// `Store::begin`).
#[async_trait]
impl<'t> Documents for dyn Transaction + 't {
    async fn get_doc(&mut self, collection: &str, key: &str) -> Result<Option<Value>, StoreError> {
        documents(self)?.get_doc(collection, key).await
    }

    async fn put_doc(
        &mut self,
        collection: &str,
        key: &str,
        doc: &Value,
    ) -> Result<(), StoreError> {
        documents(self)?.put_doc(collection, key, doc).await
    }

    async fn insert_doc(
        &mut self,
        collection: &str,
        key: &str,
        doc: &Value,
    ) -> Result<Option<Value>, StoreError> {
        documents(self)?.insert_doc(collection, key, doc).await
    }

    async fn delete_doc(&mut self, collection: &str, key: &str) -> Result<bool, StoreError> {
        documents(self)?.delete_doc(collection, key).await
    }

    async fn append_rows(&mut self, collection: &str, rows: &[Value]) -> Result<u64, StoreError> {
        documents(self)?.append_rows(collection, rows).await
    }

    async fn count_rows(&mut self, collection: &str) -> Result<u64, StoreError> {
        documents(self)?.count_rows(collection).await
    }

    async fn scan_rows(
        &mut self,
        collection: &str,
        after: Option<i64>,
        limit: u32,
    ) -> Result<Vec<(i64, Value)>, StoreError> {
        documents(self)?.scan_rows(collection, after, limit).await
    }

    async fn move_rows(&mut self, from: &str, to: &str) -> Result<u64, StoreError> {
        documents(self)?.move_rows(from, to).await
    }

    async fn clear_rows(&mut self, collection: &str) -> Result<u64, StoreError> {
        documents(self)?.clear_rows(collection).await
    }
}
