//! SQLite's write-ahead log does not grow without bound: under reads that never pause, its
//! automatic (passive) checkpoints can never start the log over, so the sweep empties it.
//! (bench/soak.sh saw it reach 2 GB in 30 minutes before the sweep did this.)

mod support;

use std::time::Duration;

use support::{sqlite_url, sqlite_with};
use wharf::store::now_millis;

#[tokio::test]
async fn the_sweep_empties_a_write_ahead_log_readers_kept_growing() {
    let url = sqlite_url("wal");
    let store = sqlite_with(&url, Duration::from_secs(5)).await;
    let path = url.trim_start_matches("sqlite://").to_owned();
    let wal = format!("{path}-wal");
    let other = sqlx::SqlitePool::connect(&format!("{url}?mode=rw"))
        .await
        .unwrap();
    sqlx::query("CREATE TABLE IF NOT EXISTS filler (b BLOB)")
        .execute(&other)
        .await
        .unwrap();
    // A reader holding its snapshot while 8 MB are written.
    let mut reader = other.begin().await.unwrap();
    let _: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM filler")
        .fetch_one(&mut *reader)
        .await
        .unwrap();
    for _ in 0..128 {
        sqlx::query("INSERT INTO filler (b) VALUES (zeroblob(65536))")
            .execute(&other)
            .await
            .unwrap();
    }
    let grown = std::fs::metadata(&wal).unwrap().len();
    assert!(grown > 8_000_000, "the log holds the writes: {grown} bytes");
    reader.rollback().await.unwrap();
    store.sweep(now_millis(), 10).await.unwrap();
    assert_eq!(
        std::fs::metadata(&wal).unwrap().len(),
        0,
        "the log was emptied"
    );
}
