//! Migrations of a store shared between replicas (PostgreSQL): a replica started while
//! another one migrates waits for it instead of failing at its store's lock wait (which is
//! seconds, for a quick "busy" answer); a migration's own statements wait no longer than
//! that, so a table lock queued behind a long call does not hold every call behind it. A
//! store of no connections is refused when opened (SQLite too).

mod support;

use std::time::Duration;

use sqlx::Connection as _;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use support::*;
use wharf_store::open;
use wharf_store::sql::PG_MIGRATIONS_LOCK;

/// The store's lock wait in these tests.
const LOCK_WAIT: Duration = Duration::from_millis(200);

/// A database of its own, migrated, for a test that holds locks every store open would
/// wait for; dropped at the next run should a test fail before it drops it.
struct Database {
    name: String,
    url: String,
    admin: PgConnection,
}

impl Database {
    async fn create() -> Self {
        let mut admin = PgConnection::connect(&pg_url()).await.unwrap();
        // Named after this process: those of earlier runs are stale, this run's are not.
        let prefix = format!("wharf_migrate_{}_", std::process::id());
        let stale: Vec<String> = sqlx::query_scalar(
            "SELECT datname FROM pg_database \
             WHERE datname LIKE 'wharf\\_migrate\\_%' AND NOT starts_with(datname, $1)",
        )
        .bind(&prefix)
        .fetch_all(&mut admin)
        .await
        .unwrap();
        for name in stale {
            sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)"))
                .execute(&mut admin)
                .await
                .unwrap();
        }
        let name = unique(&prefix).replace('-', "_");
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .unwrap();
        // The test URL with the database replaced, its parameters kept.
        let (base, query) = pg_url()
            .split_once('?')
            .map_or((pg_url(), String::new()), |(b, q)| {
                (b.to_owned(), format!("?{q}"))
            });
        let url = format!("{}/{name}{query}", base.rsplit_once('/').unwrap().0);
        drop(open(&url, &options(LOCK_WAIT)).await.expect("first open"));
        Database { name, url, admin }
    }

    async fn session(&self) -> PgConnection {
        let options: PgConnectOptions = self.url.parse().unwrap();
        PgConnection::connect_with(&options).await.unwrap()
    }

    async fn drop(mut self) {
        sqlx::query(&format!("DROP DATABASE {} WITH (FORCE)", self.name))
            .execute(&mut self.admin)
            .await
            .unwrap();
    }
}

async fn pid(conn: &mut PgConnection) -> i32 {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(conn)
        .await
        .unwrap()
}

/// A replica that starts while another migrates (holds the migrations' lock) for several of
/// its lock waits opens once the other is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_starting_beside_a_migration_waits_for_it() {
    let db = Database::create().await;
    let mut migrating = db.session().await;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(PG_MIGRATIONS_LOCK)
        .execute(&mut migrating)
        .await
        .unwrap();
    let holder = pid(&mut migrating).await;
    let observer = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&db.url)
        .await
        .unwrap();
    let short_wait = options(LOCK_WAIT);
    let (opened, ()) = tokio::join!(open(&db.url, &short_wait), async {
        until_pg_blocked_by(&observer, holder, "the new replica waits its turn").await;
        // Several of the store's lock waits: long enough for the wait to have given up,
        // had it been the store's.
        tokio::time::sleep(LOCK_WAIT * 5).await;
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(PG_MIGRATIONS_LOCK)
            .execute(&mut migrating)
            .await
            .unwrap();
    });
    opened.expect("opened once the other replica's migrations ended");
    drop((observer, migrating));
    db.drop().await;
}

/// A migration whose statements find a table locked (calls in flight on it) gives up at the
/// store's lock wait, rather than queue a lock that every call on the table waits behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_does_not_queue_behind_calls_for_longer_than_they_wait() {
    let db = Database::create().await;
    let mut calls = db.session().await;
    let mut tx = calls.begin().await.unwrap();
    sqlx::query("LOCK TABLE _sqlx_migrations IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .unwrap();
    let refused = open(&db.url, &options(LOCK_WAIT))
        .await
        .map(drop)
        .expect_err("the migrations' statements gave up while the table was locked");
    assert!(refused.to_string().contains("lock timeout"), "{refused}");
    tx.rollback().await.unwrap();
    drop(calls);
    db.drop().await;
}

#[tokio::test]
async fn a_store_of_no_connections_is_refused_by_name() {
    let mut none = options(LOCK_WAIT);
    none.max_connections = 0;
    // sqlx's pool would panic on a capacity of 0.
    for url in [sqlite_url("no-connections"), pg_url()] {
        let e = open(&url, &none).await.err().map(|e| e.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("max_connections must be at least 1")),
            "{url}: {e:?}"
        );
    }
}
