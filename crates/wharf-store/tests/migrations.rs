//! Migrations of a store shared between replicas (PostgreSQL): a replica that starts while
//! another one migrates, or while calls hold a table a migration needs, waits for it instead
//! of failing at its store's lock wait (which is seconds, for a quick "busy" answer).

mod support;

use std::time::Duration;

use sqlx::Connection as _;
use support::*;
use wharf_store::open;

/// A store whose lock wait is short opens all the same while the migrations' table is
/// locked for several times that wait, once the lock is let go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_starting_beside_a_migration_waits_for_it() {
    // A database of its own: the lock below would hold every other test's store open.
    let name = unique("wharf_migrate").replace('-', "_");
    let mut admin = sqlx::PgConnection::connect(&pg_url()).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await
        .unwrap();
    let url = format!("{}/{name}", pg_url().rsplit_once('/').unwrap().0);
    let lock_wait = Duration::from_millis(200);
    drop(open(&url, &options(lock_wait)).await.expect("first open"));

    // Another replica's migration, as the table lock it takes.
    let mut migrating = sqlx::PgConnection::connect(&url).await.unwrap();
    let mut tx = migrating.begin().await.unwrap();
    sqlx::query("LOCK TABLE _sqlx_migrations IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let observer = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .unwrap();
    let short_wait = options(lock_wait);
    let (opened, ()) = tokio::join!(open(&url, &short_wait), async {
        until_pg_blocked_by(&observer, pid, "the new replica's migrations wait").await;
        // Several of the store's lock waits: long enough for the wait to have given up,
        // had it been the store's.
        tokio::time::sleep(lock_wait * 5).await;
        tx.commit().await.unwrap();
    });
    opened.expect("opened once the migration ended");

    drop((observer, migrating));
    sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)"))
        .execute(&mut admin)
        .await
        .unwrap();
}
