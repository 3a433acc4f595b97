//! A throwaway store for tests: SQLite in a fresh file under the temporary directory,
//! removed when the store is dropped. Never for production data.

use std::path::PathBuf;

use async_trait::async_trait;
use wharf::store::{
    Begin, Claim, HandleRecord, Millis, NewRecord, Record, SharedKey, Store, StoreError,
    Transaction, TxMode, Write,
};

use crate::Dialect;
use crate::StoreOptions;
use crate::sql::SqlStore;

/// A [`SqlStore`] on a temporary SQLite file.
pub struct MemoryStore {
    inner: SqlStore,
    path: PathBuf,
}

impl MemoryStore {
    /// Creates the store in a new temporary file.
    pub async fn open(options: &StoreOptions) -> Result<Self, StoreError> {
        let name = format!(
            "wharf-memory-{}-{:016x}.db",
            std::process::id(),
            rand_suffix()
        );
        let path = std::env::temp_dir().join(name);
        let url = format!("sqlite://{}?mode=rwc", path.display());
        let inner = SqlStore::connect(&url, Dialect::Sqlite, options).await?;
        Ok(MemoryStore { inner, path })
    }
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

impl Drop for MemoryStore {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = self.path.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
    }
}

#[async_trait]
impl Store for MemoryStore {
    fn backend(&self) -> &'static str {
        "memory"
    }
    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.ping().await
    }
    async fn load_handle(&self, id: &str) -> Result<Option<HandleRecord>, StoreError> {
        self.inner.load_handle(id).await
    }
    async fn replay_of(&self, claim: &Claim, now: Millis) -> Result<Option<String>, StoreError> {
        self.inner.replay_of(claim, now).await
    }
    async fn touch_handle(&self, id: &str, now: Millis) -> Result<(), StoreError> {
        self.inner.touch_handle(id, now).await
    }
    async fn begin(&self, mode: TxMode) -> Result<Box<dyn Transaction>, StoreError> {
        self.inner.begin(mode).await
    }
    async fn begin_idempotent(&self, claim: &Claim, now: Millis) -> Result<Begin, StoreError> {
        self.inner.begin_idempotent(claim, now).await
    }
    async fn shared_keys(&self) -> Result<Vec<SharedKey>, StoreError> {
        self.inner.shared_keys().await
    }
    async fn add_shared_key(&self, key: &SharedKey) -> Result<(), StoreError> {
        self.inner.add_shared_key(key).await
    }
    async fn read_record(
        &self,
        namespace: &str,
        key: &str,
        now: Millis,
    ) -> Result<Option<Record>, StoreError> {
        self.inner.read_record(namespace, key, now).await
    }
    async fn write_record(
        &self,
        record: &NewRecord<'_>,
        write: Write,
        now: Millis,
    ) -> Result<Option<u64>, StoreError> {
        self.inner.write_record(record, write, now).await
    }
    async fn delete_record(
        &self,
        namespace: &str,
        key: &str,
        version: Option<u64>,
    ) -> Result<bool, StoreError> {
        self.inner.delete_record(namespace, key, version).await
    }
    async fn records_of(
        &self,
        namespace: &str,
        owner: &str,
        now: Millis,
        limit: u32,
    ) -> Result<Vec<(String, Record)>, StoreError> {
        self.inner.records_of(namespace, owner, now, limit).await
    }
    async fn sweep(&self, now: Millis, batch: u32) -> Result<u64, StoreError> {
        self.inner.sweep(now, batch).await
    }
}
