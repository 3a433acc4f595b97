//! Stores for Wharf: handles, idempotency records and app data.
//!
//! [`open`] picks a backend from a URL:
//! - `sqlite://PATH` — one file, created on first use, WAL mode (the default: `./wharf.db`);
//! - `postgres://…` — for several replicas;
//! - `redis://…` — for several replicas, see [`redis`] for what it guarantees;
//! - `memory://` — a throwaway SQLite file in the temporary directory, for tests.
//!
//! Migrations are embedded in the binary and applied when the store opens, the store's own
//! first and then the app's ([`AppMigrations`]). Each backend is a cargo feature (`sqlite`,
//! `postgres`, `redis`; all on by default): an app that uses one database compiles only its
//! driver.
//!
//! An app keeps its own data in the call's transaction, so it commits with the call's
//! idempotency record: on SQL stores in tables of its own through the database's typed sqlx
//! transaction (`SqlTx::postgres`, `SqlTx::sqlite`), on Redis in
//! keys of its own through [`redis::RedisTx`]'s command buffer. The optional `documents`
//! feature adds `Documents`, a ready-made model of keyed documents and ordered rows.

#[cfg(any(feature = "postgres", feature = "redis"))]
mod bus;
#[cfg(feature = "documents")]
mod documents;
#[cfg(feature = "sqlite")]
pub mod memory;
mod migrations;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub mod sql;
pub mod sweeper;

use std::sync::Arc;
use std::time::Duration;

use wharf::store::{Store, StoreError};

#[cfg(feature = "documents")]
pub use documents::Documents;
pub use migrations::AppMigrations;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use sql::{SqlPool, SqlStore, SqlTx, TypedTx};
pub use sweeper::spawn_sweeper;

/// How long after expiry a handle stays readable, so its owner is told it expired rather
/// than that it is unknown.
pub const EXPIRED_HANDLE_GRACE_MS: i64 = 3_600_000;

/// The store a server uses when told nothing.
pub const DEFAULT_URL: &str = "sqlite://./wharf.db";

/// Which SQL database a store talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Dialect {
    /// SQLite (feature `sqlite`).
    Sqlite,
    /// PostgreSQL (feature `postgres`).
    Postgres,
}

/// How a store is opened.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StoreOptions {
    /// Connections per process for calls (SQL backends; at least 1, or opening fails).
    /// PostgreSQL opens as many again for mutation locks (when a tool mutates), one for the
    /// change bus, one while migrating (closed before the store serves), and one (two while
    /// a ping and a heartbeat meet) for the readiness ping and the bus's heartbeat: up to
    /// `2 * max_connections + 3` per replica,
    /// to keep under the server's own `max_connections`.
    pub max_connections: u32,
    /// How long a write waits for a lock (a duplicate still running) before answering
    /// "busy, retry"; from a millisecond to about 24 days (an i32 of milliseconds), a
    /// longer one cut to that.
    pub lock_wait: Duration,
    /// The app's own schema, applied after the store's when a SQL store opens.
    pub app_migrations: Option<Arc<AppMigrations>>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            max_connections: 16,
            lock_wait: Duration::from_secs(10),
            app_migrations: None,
        }
    }
}

/// Why a store URL could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// A URL of no known scheme, which it holds (not the URL: that may carry a password).
    #[error(
        "unsupported store URL scheme {0:?}: use sqlite://PATH, postgres://…, postgresql://…, redis://…, rediss://… or memory://"
    )]
    Scheme(String),
    /// A backend this build leaves out.
    #[error("this build has no {0} store: enable wharf-store's {0:?} feature")]
    NotBuilt(&'static str),
    /// The store refused to open (unreachable, migrations failed, …).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Opens the store at `url`, creating and migrating it as needed.
pub async fn open(url: &str, options: &StoreOptions) -> Result<Arc<dyn Store>, OpenError> {
    let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or_default();
    match scheme {
        #[cfg(feature = "sqlite")]
        "sqlite" => {
            let url = sqlite_url(url);
            let store = SqlStore::connect(&url, Dialect::Sqlite, options).await?;
            Ok(Arc::new(store))
        }
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => {
            let store = SqlStore::connect(url, Dialect::Postgres, options).await?;
            Ok(Arc::new(store))
        }
        #[cfg(feature = "redis")]
        "redis" | "rediss" => Ok(Arc::new(redis::RedisStore::connect(url, options).await?)),
        #[cfg(feature = "sqlite")]
        "memory" => Ok(Arc::new(memory::MemoryStore::open(options).await?)),
        #[cfg(not(feature = "sqlite"))]
        "sqlite" | "memory" => Err(OpenError::NotBuilt("sqlite")),
        #[cfg(not(feature = "postgres"))]
        "postgres" | "postgresql" => Err(OpenError::NotBuilt("postgres")),
        #[cfg(not(feature = "redis"))]
        "redis" | "rediss" => Err(OpenError::NotBuilt("redis")),
        _ => Err(OpenError::Scheme(scheme.to_owned())),
    }
}

/// The file a `sqlite:` store URL names, as the driver reads the URL (`sqlite:////abs`,
/// percent-escapes, a query); `None` for another store, a SQLite store in memory or
/// without a name, or one named by a SQLite `file:` URI.
#[cfg(feature = "sqlite")]
pub fn sqlite_file(url: &str) -> Option<std::path::PathBuf> {
    use std::str::FromStr as _;
    if !url.starts_with("sqlite:") {
        return None;
    }
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(&sqlite_url(url)).ok()?;
    let query = url.split_once('?').map(|(_, q)| q).unwrap_or_default();
    // sqlx keeps whether it is in memory to itself: `:memory:` becomes a private name of
    // its own, `mode=memory` keeps the path and opens none.
    let in_memory = query.split('&').any(|p| p == "mode=memory")
        || options
            .get_filename()
            .to_string_lossy()
            .starts_with("file:sqlx-in-memory-");
    // No name is a private temporary database; a `file:` URI name is read by SQLite itself,
    // not as a path, so it names no path here.
    let name = options.get_filename();
    let named = !name.as_os_str().is_empty() && !name.to_string_lossy().starts_with("file:");
    (!in_memory && named).then(|| name.to_owned())
}

/// SQLite URLs create their file unless told otherwise.
#[cfg(feature = "sqlite")]
fn sqlite_url(url: &str) -> String {
    if url.contains("mode=") {
        url.to_owned()
    } else if url.contains('?') {
        format!("{url}&mode=rwc")
    } else {
        format!("{url}?mode=rwc")
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;

    #[test]
    fn a_sqlite_urls_file_is_the_one_the_driver_opens() {
        let file = |url| sqlite_file(url).map(|p| p.display().to_string());
        for (url, path) in [
            ("sqlite://./w.db", "./w.db"),
            ("sqlite:w.db?mode=rwc", "w.db"),
            ("sqlite:///srv/w.db", "/srv/w.db"),
            ("sqlite:////srv/w.db", "//srv/w.db"),
            ("sqlite:///srv/my%20data/w.db", "/srv/my data/w.db"),
        ] {
            assert_eq!(file(url).as_deref(), Some(path), "{url}");
        }
        for none in [
            "sqlite::memory:",
            "sqlite://:memory:",
            "sqlite://w.db?mode=memory",
            "sqlite://",
            "sqlite:file:w.db",
            "postgres://db/w",
            "memory://",
        ] {
            assert_eq!(file(none), None, "{none}");
        }
    }

    #[test]
    fn sqlite_files_are_created_on_first_use() {
        assert_eq!(sqlite_url("sqlite://./w.db"), "sqlite://./w.db?mode=rwc");
        assert_eq!(
            sqlite_url("sqlite://w.db?x=1"),
            "sqlite://w.db?x=1&mode=rwc"
        );
        assert_eq!(sqlite_url("sqlite://w.db?mode=ro"), "sqlite://w.db?mode=ro");
    }

    /// Two replicas (or a replica and the `wharf` command) starting on one new SQLite file
    /// both apply its migrations: neither fails on the other's tables.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn replicas_opening_a_new_sqlite_file_at_once_all_start() {
        for round in 0..5 {
            let dir = std::env::temp_dir()
                .join(format!("wharf-first-open-{}-{round}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let url = format!("sqlite://{}/w.db", dir.display());
            let mut opens = tokio::task::JoinSet::new();
            for _ in 0..6 {
                let url = url.clone();
                opens.spawn(async move { open(&url, &StoreOptions::default()).await.map(drop) });
            }
            while let Some(opened) = opens.join_next().await {
                opened.unwrap().unwrap();
            }
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[tokio::test]
    async fn the_test_store_lives_in_a_temporary_file_removed_with_it() {
        let store = open("memory://", &StoreOptions::default()).await.unwrap();
        assert_eq!(store.backend(), "memory");
        store.ping().await.unwrap();
        let files = || {
            std::fs::read_dir(std::env::temp_dir())
                .unwrap()
                .filter_map(Result::ok)
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with(&format!("wharf-memory-{}-", std::process::id()))
                })
                .count()
        };
        assert!(files() > 0);
        drop(store);
        assert_eq!(files(), 0, "the file goes with the store");
    }

    #[tokio::test]
    async fn unknown_schemes_are_refused_by_name() {
        let err = open("postgress://app:s3cret@db/x", &StoreOptions::default())
            .await
            .err();
        assert!(matches!(&err, Some(OpenError::Scheme(s)) if s == "postgress"));
        // A typo in the scheme does not print the password the URL carries.
        let said = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            said.contains("\"postgress\"") && !said.contains("s3cret"),
            "{said}"
        );
    }
}
