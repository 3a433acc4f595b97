//! A write transaction whose call is cancelled while it begins (the client went away) must
//! leave nothing behind: on SQLite, a connection returned to the pool still inside
//! `BEGIN IMMEDIATE` would hold the database's write lock, and every later writer would wait
//! and fail busy (found by bench/soak.sh); on PostgreSQL, a session left inside a transaction
//! would run everyone's later statements in it. Begins are cut off at many different points;
//! afterwards, writes on every connection of the pool go through at once.

mod support;

use std::future::Future as _;
use std::time::Duration;

use std::sync::Arc;

use support::{postgres_with, sqlite_url, sqlite_with};
use wharf::store::{Store, TxMode};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_begin_cut_off_midway_leaves_no_transaction_open() {
    // Begins cut off may still be finishing on their tasks when the checks start: a lock
    // wait long enough for them (a leaked transaction holds the lock for ever, so it is still
    // caught).
    let store = sqlite_with(&sqlite_url("cancelled-begins"), Duration::from_secs(10)).await;
    begins_cut_off_leave_nothing_open(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_begin_cut_off_midway_leaves_no_transaction_open() {
    begins_cut_off_leave_nothing_open(postgres_with(Duration::from_secs(10)).await).await;
}

async fn begins_cut_off_leave_nothing_open(store: Arc<dyn Store>) {
    for i in 0..2000u32 {
        // Polled a few times, each time after letting the database's thread run, then
        // dropped: the cut lands before, inside and after the database's answer.
        let mut begin = std::pin::pin!(store.begin(TxMode::Write));
        for _ in 0..i % 12 {
            let polled =
                std::future::poll_fn(|cx| std::task::Poll::Ready(begin.as_mut().poll(cx))).await;
            if polled.is_ready() {
                break;
            }
            std::thread::yield_now();
            tokio::task::yield_now().await;
        }
    }
    // More writes than the pool has connections, one after the other: each finds the write
    // lock free (a leaked transaction would make one wait out `lock_wait` and fail busy, or
    // fail to begin on its connection).
    for n in 0..32 {
        let tx = store.begin(TxMode::Write).await;
        let tx = tx.unwrap_or_else(|e| panic!("write {n} could not begin: {e}"));
        tx.commit()
            .await
            .unwrap_or_else(|e| panic!("write {n} could not commit: {e}"));
    }
}
