//! App code in the call's transaction gets its database's own typed sqlx transaction, and
//! what it writes there commits with the call's idempotency record or not at all: a replay
//! of the key returns the first result and the app's row is there once; a call that fails
//! before committing leaves neither the row nor the record.

mod support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use support::{claim, postgres_with, sqlite_url, sqlite_with, unique};
use wharf::store::{Begin, Store};
use wharf_store::{SqlTx, TypedTx};

/// The app's table, created through the typed transaction of whichever database it is.
async fn create_table(store: &Arc<dyn Store>, table: &str) {
    let ddl = format!("CREATE TABLE IF NOT EXISTS {table} (k TEXT PRIMARY KEY, n BIGINT NOT NULL)");
    let mut tx = store.begin(wharf::store::TxMode::Write).await.unwrap();
    let sql = tx
        .backend_tx()
        .downcast_mut::<SqlTx>()
        .expect("a SQL store");
    match sql.sqlx() {
        TypedTx::Sqlite(tx) => sqlx::query(&ddl).execute(&mut **tx).await.map(drop),
        TypedTx::Postgres(tx) => sqlx::query(&ddl).execute(&mut **tx).await.map(drop),
        _ => unreachable!("both drivers are built for the tests"),
    }
    .unwrap();
    tx.commit().await.unwrap();
}

/// Inserts `(k, n)` into the app's table inside the call's transaction.
async fn insert(tx: &mut Box<dyn wharf::store::Transaction>, table: &str, k: &str, n: i64) {
    let sql = tx
        .backend_tx()
        .downcast_mut::<SqlTx>()
        .expect("a SQL store");
    let insert = format!("INSERT INTO {table} (k, n) VALUES ($1, $2)");
    match sql.sqlx() {
        TypedTx::Sqlite(tx) => sqlx::query(&insert)
            .bind(k)
            .bind(n)
            .execute(&mut **tx)
            .await
            .map(drop),
        TypedTx::Postgres(tx) => sqlx::query(&insert)
            .bind(k)
            .bind(n)
            .execute(&mut **tx)
            .await
            .map(drop),
        _ => unreachable!("both drivers are built for the tests"),
    }
    .unwrap();
}

/// How many rows of the app's table carry key `k`, read outside any call.
async fn rows(store: &Arc<dyn Store>, table: &str, k: &str) -> i64 {
    let mut tx = store.begin(wharf::store::TxMode::Read).await.unwrap();
    let sql = tx
        .backend_tx()
        .downcast_mut::<SqlTx>()
        .expect("a SQL store");
    let count = format!("SELECT count(*) FROM {table} WHERE k = $1");
    match sql.sqlx() {
        TypedTx::Sqlite(tx) => {
            sqlx::query_scalar(&count)
                .bind(k)
                .fetch_one(&mut **tx)
                .await
        }
        TypedTx::Postgres(tx) => {
            sqlx::query_scalar(&count)
                .bind(k)
                .fetch_one(&mut **tx)
                .await
        }
        _ => unreachable!("both drivers are built for the tests"),
    }
    .unwrap()
}

async fn writes_commit_with_the_claim(store: Arc<dyn Store>) {
    let table = "typed_tx_app";
    create_table(&store, table).await;
    let k = unique("typed");
    let c = claim(&format!("p:typed:{k}"), &k, json!({ "k": k }));

    // A first attempt writes its row, then fails before committing: nothing stays.
    let Begin::Run(mut tx) = store
        .begin_idempotent(&c, wharf::store::now_millis())
        .await
        .unwrap()
    else {
        panic!("a new key runs")
    };
    insert(&mut tx, table, &k, 1).await;
    drop(tx);
    assert_eq!(
        rows(&store, table, &k).await,
        0,
        "a rolled-back call wrote nothing"
    );

    // The retry runs (no record was left), writes, completes and commits.
    let Begin::Run(mut tx) = store
        .begin_idempotent(&c, wharf::store::now_millis())
        .await
        .unwrap()
    else {
        panic!("a key whose first attempt rolled back runs again")
    };
    insert(&mut tx, table, &k, 2).await;
    tx.complete_claim(&c, r#"{"n":2}"#).await.unwrap();
    tx.commit().await.unwrap();

    // A replay returns the first result and writes nothing more.
    match store
        .begin_idempotent(&c, wharf::store::now_millis())
        .await
        .unwrap()
    {
        Begin::Replay(result) => assert_eq!(result, r#"{"n":2}"#),
        _ => panic!("a completed key replays"),
    }
    assert_eq!(rows(&store, table, &k).await, 1, "the row is there once");
}

#[tokio::test]
async fn sqlite_app_writes_in_the_typed_transaction_commit_with_the_claim() {
    let store = sqlite_with(&sqlite_url("typed"), Duration::from_secs(5)).await;
    let mut tx = store.begin(wharf::store::TxMode::Read).await.unwrap();
    let sql = tx
        .backend_tx()
        .downcast_mut::<SqlTx>()
        .expect("a SQL store");
    assert!(sql.sqlite().is_some() && sql.postgres().is_none());
    drop(tx);
    writes_commit_with_the_claim(store).await;
}

#[tokio::test]
async fn postgres_app_writes_in_the_typed_transaction_commit_with_the_claim() {
    let store = postgres_with(Duration::from_secs(5)).await;
    let mut tx = store.begin(wharf::store::TxMode::Read).await.unwrap();
    let sql = tx
        .backend_tx()
        .downcast_mut::<SqlTx>()
        .expect("a SQL store");
    assert!(sql.postgres().is_some() && sql.sqlite().is_none());
    drop(tx);
    writes_commit_with_the_claim(store).await;
}
