//! The import service's own data on every store it runs on: its tables (created by its
//! migrations when the store opens) on a SQLite file and on PostgreSQL, its keys on Redis.
//! Each test uses owners of its own, so runs against one database do not meet.

use std::sync::Arc;

use serde_json::{Map, Value, json};
use wharf::Principal;
use wharf::store::{HandleRecord, Store, StoreError, TxMode, now_millis};
use wharf_reference::data::{Commit, Data, Staged, migrations};
use wharf_reference::import::Import;
use wharf_store::{StoreOptions, open};

fn options() -> StoreOptions {
    let mut options = StoreOptions::default();
    options.max_connections = 4;
    options.app_migrations = Some(Arc::new(migrations()));
    options
}

fn sqlite_url(tag: &str) -> String {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("wharf-ref-data-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    format!("sqlite://{}/app.db", dir.display())
}

fn pg_url() -> String {
    std::env::var("WHARF_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

fn redis_url() -> String {
    std::env::var("WHARF_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
}

async fn store(url: &str) -> Arc<dyn Store> {
    open(url, &options())
        .await
        .unwrap_or_else(|e| panic!("the store at {url} is required for these tests: {e}"))
}

/// An owner no other run or test uses.
fn owner(tag: &str) -> Principal {
    Principal::new(format!("{tag}-{}-{}", std::process::id(), now_millis())).unwrap()
}

fn rows(from: u64, n: u64) -> Vec<Map<String, Value>> {
    (from..from + n)
        .map(|i| {
            let Value::Object(row) = json!({ "id": i, "name": format!("row {i}") }) else {
                unreachable!("rows are objects")
            };
            row
        })
        .collect()
}

/// The rows an append staged, which the tests expect to fit.
trait StagedCount {
    fn staged(self) -> u64;
}

impl StagedCount for Staged {
    fn staged(self) -> u64 {
        match self {
            Staged::Rows(n) => n,
            Staged::OverQuota { stored } => panic!("refused at {stored} bytes stored"),
        }
    }
}

/// What the tests count each row as, against its owner's stored bytes.
const ROW_BYTES: u64 = 10;

fn columns() -> Value {
    json!([{ "name": "id", "type": "integer", "nullable": false }])
}

/// Mints an import for `owner`, committed.
async fn import(store: &dyn Store, owner: &Principal) -> HandleRecord {
    let record = HandleRecord::mint::<Import>(owner, now_millis());
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    tx.create_handle(&record).await.unwrap();
    tx.commit().await.unwrap();
    record
}

/// Runs `f` on the app's data in a write transaction, then commits it.
async fn write<T>(
    store: &dyn Store,
    f: impl AsyncFnOnce(&mut Data<'_>) -> T,
) -> Result<T, StoreError> {
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    let out = f(&mut Data::of(tx.as_mut()).unwrap()).await;
    tx.commit().await.map(|()| out)
}

async fn read<T>(store: &dyn Store, f: impl AsyncFnOnce(&mut Data<'_>) -> T) -> T {
    let mut tx = store.begin(TxMode::Read).await.unwrap();
    f(&mut Data::of(tx.as_mut()).unwrap()).await
}

/// Stages `n` rows numbered from `from` in `import`, within any quota: how many it holds.
async fn stage(store: &dyn Store, import: &HandleRecord, from: u64, n: u64) -> u64 {
    write(store, async |d| {
        d.append_staged(import, &rows(from, n), ROW_BYTES * n, u64::MAX)
            .await
            .unwrap()
            .staged()
    })
    .await
    .unwrap()
}

/// Commits `import` into `owner`'s dataset `sales` with `columns`, after its rows or in
/// their place (`replace`).
async fn commit(
    store: &dyn Store,
    owner: &str,
    import: &HandleRecord,
    columns: &Value,
    replace: bool,
) -> Result<Commit, StoreError> {
    write(store, async |d| {
        let seen = d.dataset_to_change(owner, "sales").await.unwrap();
        d.commit_staged(owner, "sales", columns, &import.id, replace, seen.as_ref())
            .await
            .unwrap()
    })
    .await
}

async fn ids(store: &dyn Store, owner: &str, after: Option<i64>) -> Vec<(i64, u64)> {
    read(store, async |d| {
        d.scan(owner, "sales", after, 100).await.unwrap()
    })
    .await
    .into_iter()
    .map(|(seq, row)| (seq, row["id"].as_u64().unwrap()))
    .collect()
}

/// Stages rows over two calls, commits them, replaces them with another import's, reads
/// them in order from any point, and deletes the dataset.
async fn imports_commit_replace_scan_and_delete(store: Arc<dyn Store>) {
    let who = owner("commit");
    let owner = who.id();
    let first = import(&*store, &who).await;
    for (from, n) in [(0, 3), (3, 2)] {
        let staged = stage(&*store, &first, from, n).await;
        assert_eq!(staged, from + n);
    }
    // Staged rows are not the dataset's yet.
    assert!(ids(&*store, owner, None).await.is_empty());
    let committed = commit(&*store, owner, &first, &columns(), false)
        .await
        .unwrap();
    assert!(matches!(committed, Commit::Done { moved: 5, total: 5 }));
    let generation = async || {
        read(&*store, async |d| {
            d.dataset(owner, "sales").await.unwrap().unwrap().generation
        })
        .await
    };
    let made = generation().await;
    let all = ids(&*store, owner, None).await;
    assert_eq!(all, (0..5).map(|i| (i, i as u64)).collect::<Vec<_>>());
    assert_eq!(ids(&*store, owner, Some(2)).await, all[3..]);

    let second = import(&*store, &who).await;
    stage(&*store, &second, 100, 2).await;
    // Other columns are refused and change nothing.
    let refused = commit(&*store, owner, &second, &json!([]), true).await;
    assert!(matches!(refused, Ok(Commit::OtherColumns(c)) if c == columns()));
    let replaced = commit(&*store, owner, &second, &columns(), true)
        .await
        .unwrap();
    assert!(matches!(replaced, Commit::Done { moved: 2, total: 2 }));
    // Numbers go on from where the replaced rows ended: an old cursor never points into
    // the new rows.
    assert_eq!(ids(&*store, owner, None).await, vec![(5, 100), (6, 101)]);
    assert_eq!(ids(&*store, owner, Some(5)).await, vec![(6, 101)]);
    let staged = read(&*store, async |d| d.staged(&second.id).await.unwrap()).await;
    assert_eq!(staged, 0, "committed rows leave the import");
    assert_eq!(
        generation().await,
        made,
        "a replace keeps the dataset (and its cursors)"
    );

    let deleted = write(&*store, async |d| {
        let dataset = d.dataset(owner, "sales").await.unwrap().unwrap();
        assert_eq!(dataset.rows, 2);
        d.delete_dataset(owner, dataset, "sales").await.unwrap()
    })
    .await
    .unwrap();
    assert_eq!(deleted, 2);
    let gone = read(&*store, async |d| d.dataset(owner, "sales").await.unwrap()).await;
    assert!(gone.is_none());
    assert!(ids(&*store, owner, None).await.is_empty());

    // Made again under its name, its rows are numbered from the start: another making,
    // so that a cursor of the one deleted is refused rather than skipping rows.
    let third = import(&*store, &who).await;
    stage(&*store, &third, 200, 1).await;
    commit(&*store, owner, &third, &columns(), false)
        .await
        .unwrap();
    assert_eq!(ids(&*store, owner, None).await, vec![(0, 200)]);
    assert_ne!(generation().await, made);
}

/// An import's staged rows, and their count against the owner's stored bytes, go when its
/// handle is retired, by the store alone (SQL: a trigger on the handle's row; Redis: keys
/// filed under the handle).
async fn staged_rows_go_with_their_import(store: Arc<dyn Store>) {
    let who = owner("retire");
    let import = import(&*store, &who).await;
    stage(&*store, &import, 0, 4).await;
    // Retired as the sweeper retires an expired import: the service is not asked.
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    tx.retire_handle(&import.id).await.unwrap();
    tx.commit().await.unwrap();
    let left = read(&*store, async |d| d.staged(&import.id).await.unwrap()).await;
    assert_eq!(left, 0);
    let bytes = read(&*store, async |d| d.stored_bytes(who.id()).await.unwrap()).await;
    assert_eq!(bytes, 0, "their bytes go with them");
}

/// A report's cancellation mark holds for its own run only.
async fn a_cancellation_marks_its_own_run_only(store: Arc<dyn Store>) {
    let who = owner("report");
    let owner = who.id();
    let report = |run: u64| json!({ "dataset": "sales", "run": run, "state": "running" });
    write(&*store, async |d| {
        d.put_report(owner, "sales", 1, &report(1)).await.unwrap()
    })
    .await
    .unwrap();
    write(&*store, async |d| {
        d.mark_cancelled(owner, "sales", 1).await.unwrap()
    })
    .await
    .unwrap();
    let seen = read(&*store, async |d| d.report(owner, "sales").await.unwrap()).await;
    assert_eq!(seen, Some((report(1), true)));
    // Run 2 starts; run 1's late mark does not reach it.
    write(&*store, async |d| {
        d.put_report(owner, "sales", 2, &report(2)).await.unwrap()
    })
    .await
    .unwrap();
    write(&*store, async |d| {
        d.mark_cancelled(owner, "sales", 1).await.unwrap()
    })
    .await
    .unwrap();
    let seen = read(&*store, async |d| d.report(owner, "sales").await.unwrap()).await;
    assert_eq!(seen, Some((report(2), false)));
}

/// A deleted dataset's report goes with it, its last run's cancellation mark too: the
/// dataset made again under the name has no report, and its run 1 does not read as
/// cancelled.
async fn a_deleted_datasets_report_goes_with_it(store: Arc<dyn Store>) {
    let who = owner("report-delete");
    let owner = who.id();
    let report = |run: u64| json!({ "dataset": "sales", "run": run, "state": "running" });
    let first = import(&*store, &who).await;
    stage(&*store, &first, 0, 2).await;
    commit(&*store, owner, &first, &columns(), false)
        .await
        .unwrap();
    write(&*store, async |d| {
        d.put_report(owner, "sales", 1, &report(1)).await.unwrap();
        d.mark_cancelled(owner, "sales", 1).await.unwrap()
    })
    .await
    .unwrap();
    write(&*store, async |d| {
        let dataset = d.dataset(owner, "sales").await.unwrap().unwrap();
        d.delete_dataset(owner, dataset, "sales").await.unwrap()
    })
    .await
    .unwrap();
    let seen = read(&*store, async |d| d.report(owner, "sales").await.unwrap()).await;
    assert_eq!(seen, None);
    let again = import(&*store, &who).await;
    stage(&*store, &again, 0, 1).await;
    commit(&*store, owner, &again, &columns(), false)
        .await
        .unwrap();
    write(&*store, async |d| {
        d.put_report(owner, "sales", 1, &report(1)).await.unwrap()
    })
    .await
    .unwrap();
    let seen = read(&*store, async |d| d.report(owner, "sales").await.unwrap()).await;
    assert_eq!(seen, Some((report(1), false)));
}

/// What an owner stores follows its appends (staged), commits (moved, not doubled),
/// replaces (the replaced rows' bytes go), aborts and deletions; another owner's bytes are
/// apart.
async fn stored_bytes_follow_appends_commits_aborts_and_deletes(store: Arc<dyn Store>) {
    let who = owner("bytes");
    let owner = who.id();
    let stored = async || read(&*store, async |d| d.stored_bytes(owner).await.unwrap()).await;
    assert_eq!(stored().await, 0);
    let a = import(&*store, &who).await;
    stage(&*store, &a, 0, 3).await;
    stage(&*store, &a, 0, 2).await;
    assert_eq!(stored().await, 50, "staged rows count");
    // Past the limit: refused, and nothing written.
    let refused = write(&*store, async |d| {
        d.append_staged(&a, &rows(5, 1), ROW_BYTES, 55)
            .await
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(refused, Staged::OverQuota { stored: 50 });
    assert_eq!(stored().await, 50);
    let staged = read(&*store, async |d| d.staged(&a.id).await.unwrap()).await;
    assert_eq!(staged, 5, "nothing staged by the refused append");
    // Up to the limit exactly: fits.
    let fits = write(&*store, async |d| {
        d.append_staged(&a, &rows(5, 1), ROW_BYTES, 60)
            .await
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(fits, Staged::Rows(6));
    assert_eq!(stored().await, 60);
    let b = import(&*store, &who).await;
    stage(&*store, &b, 0, 1).await;
    assert_eq!(stored().await, 70);
    commit(&*store, owner, &a, &columns(), false).await.unwrap();
    assert_eq!(stored().await, 70, "committed rows move, not doubled");
    // A commit refused (other columns), even if its transaction commits, moves no bytes.
    let other = commit(&*store, owner, &b, &json!([]), true).await.unwrap();
    assert!(matches!(other, Commit::OtherColumns(_)));
    assert_eq!(stored().await, 70);
    commit(&*store, owner, &b, &columns(), true).await.unwrap();
    assert_eq!(stored().await, 10, "replaced rows no longer count");
    let c = import(&*store, &who).await;
    stage(&*store, &c, 0, 2).await;
    assert_eq!(stored().await, 30);
    write(&*store, async |d| {
        d.discard_staged(owner, &c.id).await.unwrap()
    })
    .await
    .unwrap();
    assert_eq!(stored().await, 10, "discarded rows no longer count");

    let them = self::owner("bytes-other");
    let theirs = import(&*store, &them).await;
    stage(&*store, &theirs, 0, 7).await;
    assert_eq!(stored().await, 10, "another owner's rows are theirs");

    write(&*store, async |d| {
        let dataset = d.dataset(owner, "sales").await.unwrap().unwrap();
        d.delete_dataset(owner, dataset, "sales").await.unwrap()
    })
    .await
    .unwrap();
    assert_eq!(
        stored().await,
        0,
        "a deleted dataset's rows no longer count"
    );
}

/// Every row of dataset `sales` of `owner`, read a page at a time: (number, id).
async fn every_row(store: &dyn Store, owner: &str) -> Vec<(i64, u64)> {
    let mut all: Vec<(i64, u64)> = Vec::new();
    loop {
        let after = all.last().map(|(seq, _)| *seq);
        let page = read(store, async |d| {
            d.scan(owner, "sales", after, 997).await.unwrap()
        })
        .await;
        if page.is_empty() {
            return all;
        }
        all.extend(
            page.into_iter()
                .map(|(seq, row)| (seq, row["id"].as_u64().unwrap())),
        );
    }
}

/// Imports of a few rows and of thousands, committed one after another into one dataset:
/// every row is there once, numbered in order, read a page at a time across them all. (On
/// Redis the smaller ones are copied onto the end of the segment before them.)
async fn small_and_large_imports_read_back_in_order(store: Arc<dyn Store>) {
    let who = owner("segments");
    let owner = who.id();
    let mut from = 0;
    for n in [1, 1, 3, 4090, 2, 5000, 1, 1] {
        let import = import(&*store, &who).await;
        stage(&*store, &import, from, n).await;
        let committed = commit(&*store, owner, &import, &columns(), false)
            .await
            .unwrap();
        from += n;
        assert!(matches!(committed, Commit::Done { moved, total } if moved == n && total == from));
    }
    let all = every_row(&*store, owner).await;
    assert_eq!(all.len() as u64, from);
    assert!(
        all.iter()
            .enumerate()
            .all(|(i, &(seq, id))| seq == i as i64 && id == i as u64),
        "rows out of order or numbered wrong"
    );
    // From inside each run of rows an import brought.
    for after in [0, 4, 4094, 4095, 4096, 9096, 9097] {
        let page = ids(&*store, owner, Some(after)).await;
        assert_eq!(
            page.first(),
            Some(&(after + 1, after as u64 + 1)),
            "after {after}"
        );
    }
    if store.backend() == "redis" {
        // The record a commit rewrites lists four segments, not one per import: the first
        // five rows share one with the 4,090 after them, and the last two theirs.
        let client = ::redis::Client::open(redis_url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let key = format!("ref:{}:{owner}:datasets", owner.len());
        let text: String = ::redis::cmd("HGET")
            .arg(&key)
            .arg("sales")
            .query_async(&mut conn)
            .await
            .unwrap();
        let stored: Value = serde_json::from_str(&text).unwrap();
        let lengths: Vec<u64> = stored["segments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s[2].as_u64().unwrap())
            .collect();
        assert_eq!(lengths, vec![4095, 2, 5000, 2]);
        // A row left on the last segment by a commit that failed half way is never read,
        // nor are rows copied after it: the next import gets a segment of its own.
        let last = stored["segments"][3][0].as_str().unwrap();
        let _: i64 = ::redis::cmd("RPUSH")
            .arg(last)
            .arg(r#"{"id":"left behind"}"#)
            .query_async(&mut conn)
            .await
            .unwrap();
        let import = import(&*store, &who).await;
        stage(&*store, &import, from, 1).await;
        commit(&*store, owner, &import, &columns(), false)
            .await
            .unwrap();
        let all = every_row(&*store, owner).await;
        assert_eq!(all.len() as u64, from + 1);
        assert!(
            all.iter()
                .enumerate()
                .all(|(i, &(seq, id))| seq == i as i64 && id == i as u64)
        );
    }
}

macro_rules! on_every_store {
    ($($test:ident),*) => {
        mod sqlite {
            $(#[tokio::test]
            async fn $test() {
                super::$test(super::store(&super::sqlite_url(stringify!($test))).await).await;
            })*
        }
        mod postgres {
            $(#[tokio::test]
            async fn $test() {
                super::$test(super::store(&super::pg_url()).await).await;
            })*
        }
        mod redis {
            $(#[tokio::test]
            async fn $test() {
                super::$test(super::store(&super::redis_url()).await).await;
            })*
        }
    };
}

on_every_store!(
    imports_commit_replace_scan_and_delete,
    staged_rows_go_with_their_import,
    stored_bytes_follow_appends_commits_aborts_and_deletes,
    a_cancellation_marks_its_own_run_only,
    a_deleted_datasets_report_goes_with_it,
    small_and_large_imports_read_back_in_order
);

/// Two calls commit imports into one new dataset at once: on SQL the second waits for the
/// first's lock and numbers its rows after them; on Redis it finds the dataset changed and
/// applies nothing (a retry then lands). Either way every row is there once, numbered once.
async fn concurrent_commits_to_one_dataset_number_rows_once(store: Arc<dyn Store>) {
    let who = owner("race");
    let owner = who.id().to_owned();
    let (a, b) = (import(&*store, &who).await, import(&*store, &who).await);
    for (i, imp) in [&a, &b].into_iter().enumerate() {
        stage(&*store, imp, i as u64 * 10, 3).await;
    }
    // Both read the dataset (absent) and queue or make their writes before either commits.
    let mut ta = store.begin(TxMode::Write).await.unwrap();
    Data::of(ta.as_mut())
        .unwrap()
        .commit_staged(&owner, "sales", &columns(), &a.id, false, None)
        .await
        .unwrap();
    let racer = {
        let (store, owner, b) = (Arc::clone(&store), owner.clone(), b.id.clone());
        tokio::spawn(async move {
            let mut tb = store.begin(TxMode::Write).await.unwrap();
            Data::of(tb.as_mut())
                .unwrap()
                .commit_staged(&owner, "sales", &columns(), &b, false, None)
                .await
                .unwrap();
            tb.commit().await
        })
    };
    if store.backend() == "redis" {
        // Let b read and commit first on Redis (its reads do not wait).
        let b_landed = racer.await.unwrap();
        assert!(b_landed.is_ok());
        assert!(matches!(ta.commit().await, Err(StoreError::Conflict)));
        commit(&*store, &owner, &a, &columns(), false)
            .await
            .unwrap();
    } else {
        ta.commit().await.unwrap();
        racer.await.unwrap().unwrap();
    }
    let mut seen = ids(&*store, &owner, None).await;
    let seqs: Vec<i64> = seen.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, (0..6).collect::<Vec<_>>());
    seen.sort_by_key(|(_, id)| *id);
    let got: Vec<u64> = seen.into_iter().map(|(_, id)| id).collect();
    assert_eq!(got, vec![0, 1, 2, 10, 11, 12]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_concurrent_commits_to_one_dataset_number_rows_once() {
    concurrent_commits_to_one_dataset_number_rows_once(store(&pg_url()).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_concurrent_commits_to_one_dataset_number_rows_once() {
    concurrent_commits_to_one_dataset_number_rows_once(store(&redis_url()).await).await;
}

/// A replacement decided on a dataset read as absent (nobody asked to confirm) writes
/// nothing when another import made the dataset before it commits: on PostgreSQL it says
/// so, on Redis its commit conflicts (and a retry reads the rows, and asks). The other
/// import's rows all stay. (On SQLite the first reader holds the one write lock.)
async fn a_replacement_never_lands_on_rows_it_did_not_see(store: Arc<dyn Store>) {
    let who = owner("replace-race");
    let owner = who.id().to_owned();
    let (a, b) = (import(&*store, &who).await, import(&*store, &who).await);
    stage(&*store, &a, 0, 3).await;
    stage(&*store, &b, 10, 5).await;
    let mut ta = store.begin(TxMode::Write).await.unwrap();
    let seen = Data::of(ta.as_mut())
        .unwrap()
        .dataset_to_change(&owner, "sales")
        .await
        .unwrap();
    assert!(seen.is_none());
    commit(&*store, &owner, &b, &columns(), false)
        .await
        .unwrap();
    let out = Data::of(ta.as_mut())
        .unwrap()
        .commit_staged(&owner, "sales", &columns(), &a.id, true, seen.as_ref())
        .await
        .unwrap();
    if store.backend() == "redis" {
        assert!(matches!(ta.commit().await, Err(StoreError::Conflict)));
    } else {
        assert!(matches!(out, Commit::Changed));
        drop(ta);
    }
    let ids: Vec<u64> = ids(&*store, &owner, None)
        .await
        .into_iter()
        .map(|(_, id)| id)
        .collect();
    assert_eq!(
        ids,
        vec![10, 11, 12, 13, 14],
        "the other import's rows stay"
    );
}

/// On Redis a scan's reads do not wait for a replacement, which unlinks the lists the
/// dataset's record named: a scan that read the record just before reads them short, and a
/// short page reads as the end of the data. Replaced over and over with as many rows, the
/// dataset reads whole every time, from one making or the other, or (a scan that lost to
/// replacements every time it started again) the scan is refused as busy, never short.
/// Once the replacements stop, it reads whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_scan_racing_replacements_reads_the_whole_dataset() {
    const ROWS: u64 = 20;
    let store = store(&redis_url()).await;
    let who = owner("scan-race");
    let owner = who.id().to_owned();
    let first = import(&*store, &who).await;
    stage(&*store, &first, 0, ROWS).await;
    commit(&*store, &owner, &first, &columns(), true)
        .await
        .unwrap();
    let replacing = {
        let (store, who, owner) = (Arc::clone(&store), who.clone(), owner.clone());
        tokio::spawn(async move {
            for round in 1..=150 {
                let next = import(&*store, &who).await;
                stage(&*store, &next, round * 100, ROWS).await;
                commit(&*store, &owner, &next, &columns(), true)
                    .await
                    .unwrap();
            }
        })
    };
    let mut scans = 0;
    let mut scanned = |rows: Vec<(i64, Value)>| {
        assert_eq!(rows.len() as u64, ROWS, "scan {scans} read a short page");
        let making = rows[0].1["id"].as_u64().unwrap() / 100;
        assert!(
            rows.iter()
                .all(|(_, r)| r["id"].as_u64().unwrap() / 100 == making),
            "one making's rows"
        );
        scans += 1;
    };
    while !replacing.is_finished() {
        match read(&*store, async |d| d.scan(&owner, "sales", None, 100).await).await {
            Ok(rows) => scanned(rows),
            Err(e) => {
                let busy = e.to_string();
                assert!(busy.contains("kept changing while it was read"), "{busy}");
            }
        }
    }
    replacing.await.unwrap();
    let settled = read(&*store, async |d| d.scan(&owner, "sales", None, 100).await).await;
    scanned(settled.expect("with the replacements done, the scan reads the dataset"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_replacement_never_lands_on_rows_it_did_not_see() {
    a_replacement_never_lands_on_rows_it_did_not_see(store(&pg_url()).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_replacement_never_lands_on_rows_it_did_not_see() {
    a_replacement_never_lands_on_rows_it_did_not_see(store(&redis_url()).await).await;
}

/// The service's migrations and the store's share one table of applied versions: a store
/// opened again, with or without the app's migrations, starts.
#[tokio::test]
async fn a_store_with_app_tables_opens_again_either_way() {
    let url = sqlite_url("reopen");
    drop(store(&url).await);
    drop(store(&url).await);
    let plain = open(&url, &StoreOptions::default()).await;
    assert!(plain.is_ok(), "{:?}", plain.err());
}
