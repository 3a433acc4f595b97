//! One behaviour suite, run unchanged against every backend: SQLite (a file), PostgreSQL and
//! Redis (the real servers; `WHARF_TEST_POSTGRES_URL` and `WHARF_TEST_REDIS_URL` override
//! the local defaults). A backend that cannot be reached fails its tests: nothing is skipped.

#[macro_use]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};
use wharf_store::Documents;

use serde_json::{Value, json};
use support::{
    Monitor, claim, pg_backend_pid, pg_observer, postgres_with, redis_claim_key, redis_with, run,
    sqlite_url, sqlite_with, unique, until_pg_blocked_by,
};
use wharf::Principal;
use wharf::store::{
    Begin, Claim, HandleKind, HandleRecord, Millis, Store, StoreError, Transaction, TxMode,
    now_millis,
};

struct Thing;
impl HandleKind for Thing {
    const KIND: &'static str = "thing";
    const PREFIX: &'static str = "thg";
    const CREATED_BY: &'static str = "thing_new";
    const TTL: Duration = Duration::from_secs(3600);
    const IDLE_TTL: Option<Duration> = Some(Duration::from_secs(600));
}

const WAIT: Duration = Duration::from_secs(3);

async fn sqlite() -> Arc<dyn Store> {
    support::sqlite_with(&support::sqlite_url("behaviour"), WAIT).await
}

async fn postgres() -> Arc<dyn Store> {
    support::postgres_with(WAIT).await
}

async fn redis() -> Arc<dyn Store> {
    support::redis_with(WAIT).await
}

/// Shows, from the backend, that a duplicate waits for a first attempt still running.
enum Watch {
    /// A session blocked by the first attempt's session (on its uncommitted record).
    Postgres { pool: sqlx::PgPool, first: i32 },
    /// The duplicate's claim script runs a second time: it was told to wait, and asks again.
    Redis { monitor: Monitor, key: String },
    /// SQLite's wait happens inside the waiting connection's busy handler, which nothing
    /// outside it can see: the duplicate's wait is not observed there (the busy test below
    /// shows that it waits).
    Sqlite,
}

impl Watch {
    /// Starts watching; before the duplicate starts.
    async fn start(store: &Arc<dyn Store>, first: &mut Box<dyn Transaction>, c: &Claim) -> Self {
        match store.backend() {
            "postgres" => Watch::Postgres {
                first: pg_backend_pid(first).await,
                pool: pg_observer().await,
            },
            "redis" => Watch::Redis {
                monitor: Monitor::start().await,
                key: redis_claim_key(c),
            },
            _ => Watch::Sqlite,
        }
    }

    async fn until_the_duplicate_waits(&mut self) {
        let within = Duration::from_secs(10);
        match self {
            Watch::Postgres { pool, first } => {
                until_pg_blocked_by(pool, *first, "the duplicate waits for the first attempt").await
            }
            Watch::Redis { monitor, key } => monitor.scripts_on(key, 2, within).await,
            Watch::Sqlite => tokio::task::yield_now().await,
        }
    }
}

async fn handles_are_stored_with_their_owner_and_only_when_committed(store: Arc<dyn Store>) {
    let owner = Principal::new("user-42").unwrap();
    let mut kept = HandleRecord::mint::<Thing>(&owner, now_millis());
    kept.data = Some(json!({ "dataset": "d", "columns": [1, 2] }));
    let dropped = HandleRecord::mint::<Thing>(&owner, now_millis());
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    tx.create_handle(&kept).await.unwrap();
    tx.commit().await.unwrap();
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    tx.create_handle(&dropped).await.unwrap();
    drop(tx);
    assert_eq!(
        store.load_handle(&kept.id).await.unwrap(),
        Some(kept.clone())
    );
    assert_eq!(store.load_handle(&dropped.id).await.unwrap(), None);
    assert_eq!(store.load_handle("thg_nothing").await.unwrap(), None);

    store
        .touch_handle(&kept.id, kept.last_used_at + 5)
        .await
        .unwrap();
    let touched = store.load_handle(&kept.id).await.unwrap().unwrap();
    assert_eq!(touched.last_used_at, kept.last_used_at + 5);
}

/// A handle's last use only moves on: a use recorded late (a long call's, recorded when it
/// ends) after a later one was does not take it back, directly or with a commit, and so
/// does not bring the handle's idle expiry forward.
async fn a_handles_last_use_never_moves_back(store: Arc<dyn Store>) {
    let owner = Principal::new(unique("last-use")).unwrap();
    let handle = mint(&store, &owner).await;
    let at = |ms: i64| handle.last_used_at + ms;
    let last_use = async || {
        let stored = store.load_handle(&handle.id).await.unwrap().unwrap();
        stored.last_used_at
    };

    store.touch_handle(&handle.id, at(5_000)).await.unwrap();
    store.touch_handle(&handle.id, at(1_000)).await.unwrap();
    assert_eq!(last_use().await, at(5_000), "a direct use took it back");

    let mut tx = store.begin(TxMode::Write).await.unwrap();
    assert!(tx.hold_handle(&handle.id, Some(at(2_000))).await.unwrap());
    tx.commit().await.unwrap();
    assert_eq!(last_use().await, at(5_000), "a commit took it back");

    let mut tx = store.begin(TxMode::Write).await.unwrap();
    assert!(tx.hold_handle(&handle.id, Some(at(9_000))).await.unwrap());
    tx.commit().await.unwrap();
    assert_eq!(last_use().await, at(9_000), "a later use moves it on");
}

/// A kind that lives as long as it is used: a lifetime of `Duration::MAX`.
struct Lasting;
impl HandleKind for Lasting {
    const KIND: &'static str = "lasting";
    const PREFIX: &'static str = "lst";
    const CREATED_BY: &'static str = "lasting_new";
    const TTL: Duration = Duration::MAX;
    const IDLE_TTL: Option<Duration> = Some(Duration::MAX);
}

/// The longest lifetimes a kind may give are stored and read back exactly by every store
/// (Redis's scripts hold numbers as doubles).
async fn a_handle_that_never_expires_round_trips(store: Arc<dyn Store>) {
    let now = now_millis();
    let h = HandleRecord::mint::<Lasting>(&Principal::new("u").unwrap(), now);
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    tx.create_handle(&h).await.unwrap();
    tx.commit().await.unwrap();
    let loaded = store.load_handle(&h.id).await.unwrap().expect("stored");
    assert_eq!(loaded, h);
    assert_eq!(loaded.expired(now + 1_000_000_000), None);
    let mut tx = store.begin(TxMode::Read).await.unwrap();
    assert!(tx.live_handles("u", Lasting::KIND, now).await.unwrap() >= 1);
}

async fn retiring_a_handle_removes_the_data_filed_under_it(store: Arc<dyn Store>) {
    let h = HandleRecord::mint::<Thing>(&Principal::new("u").unwrap(), now_millis());
    let rows = format!("{}/rows", h.id);
    let other = unique("unrelated");
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    tx.create_handle(&h).await.unwrap();
    tx.append_rows(&rows, &[json!(1), json!(2)]).await.unwrap();
    tx.put_doc(&format!("{}/meta", h.id), "m", &json!({"a": 1}))
        .await
        .unwrap();
    tx.append_rows(&other, &[json!("keep")]).await.unwrap();
    tx.commit().await.unwrap();

    let mut tx = store.begin(TxMode::Write).await.unwrap();
    tx.retire_handle(&h.id).await.unwrap();
    tx.commit().await.unwrap();
    let mut tx = store.begin(TxMode::Read).await.unwrap();
    assert_eq!(store.load_handle(&h.id).await.unwrap(), None);
    assert_eq!(tx.count_rows(&rows).await.unwrap(), 0);
    assert_eq!(
        tx.get_doc(&format!("{}/meta", h.id), "m").await.unwrap(),
        None
    );
    assert_eq!(tx.count_rows(&other).await.unwrap(), 1);
}

async fn documents_round_trip_and_roll_back(store: Arc<dyn Store>) {
    let c = unique("docs");
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    tx.put_doc(&c, "a", &json!({"n": 1})).await.unwrap();
    assert_eq!(tx.get_doc(&c, "a").await.unwrap(), Some(json!({"n": 1})));
    tx.commit().await.unwrap();

    let mut tx = store.begin(TxMode::Write).await.unwrap();
    tx.put_doc(&c, "a", &json!({"n": 2})).await.unwrap();
    assert!(tx.delete_doc(&c, "missing").await.is_ok());
    drop(tx);
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    assert_eq!(tx.get_doc(&c, "a").await.unwrap(), Some(json!({"n": 1})));
    assert!(tx.delete_doc(&c, "a").await.unwrap());
    tx.commit().await.unwrap();
    let mut tx = store.begin(TxMode::Read).await.unwrap();
    assert_eq!(tx.get_doc(&c, "a").await.unwrap(), None);
    drop(tx);

    // A document deleted and inserted again in one transaction is replaced (on Redis the
    // insert's check at commit saw the old one, and the commit failed as a conflict).
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    tx.put_doc(&c, "b", &json!({"n": 1})).await.unwrap();
    tx.commit().await.unwrap();
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    assert!(tx.delete_doc(&c, "b").await.unwrap());
    assert_eq!(
        tx.insert_doc(&c, "b", &json!({"n": 2})).await.unwrap(),
        None
    );
    tx.commit().await.unwrap();
    let mut tx = store.begin(TxMode::Read).await.unwrap();
    assert_eq!(tx.get_doc(&c, "b").await.unwrap(), Some(json!({"n": 2})));
}

async fn rows_append_scan_move_and_clear_in_order(store: Arc<dyn Store>) {
    let staging = unique("staging");
    let dataset = unique("dataset");
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    assert_eq!(tx.append_rows(&dataset, &[json!("d0")]).await.unwrap(), 1);
    let batch: Vec<Value> = (0..700).map(|i| json!({ "i": i })).collect();
    assert_eq!(tx.append_rows(&staging, &batch).await.unwrap(), 700);
    tx.commit().await.unwrap();

    let mut tx = store.begin(TxMode::Read).await.unwrap();
    let first = tx.scan_rows(&staging, None, 3).await.unwrap();
    assert_eq!(
        first.iter().map(|(_, v)| v.clone()).collect::<Vec<_>>(),
        vec![json!({"i": 0}), json!({"i": 1}), json!({"i": 2})]
    );
    let next = tx.scan_rows(&staging, Some(first[2].0), 2).await.unwrap();
    assert_eq!(next[0].1, json!({"i": 3}));
    drop(tx);

    let mut tx = store.begin(TxMode::Write).await.unwrap();
    assert_eq!(tx.move_rows(&staging, &dataset).await.unwrap(), 700);
    tx.commit().await.unwrap();
    let mut tx = store.begin(TxMode::Read).await.unwrap();
    assert_eq!(tx.count_rows(&staging).await.unwrap(), 0);
    assert_eq!(tx.count_rows(&dataset).await.unwrap(), 701);
    let all = tx.scan_rows(&dataset, None, 1000).await.unwrap();
    assert_eq!(all.len(), 701);
    assert_eq!(all[0].1, json!("d0"));
    assert_eq!(all[1].1, json!({"i": 0}));
    assert_eq!(all[700].1, json!({"i": 699}));
    assert!(
        all.windows(2).all(|w| w[0].0 < w[1].0),
        "sequence increases"
    );
    drop(tx);

    // Into a collection that holds nothing yet (on Redis a rename, not a copy).
    let fresh = unique("fresh");
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    assert_eq!(tx.move_rows(&dataset, &fresh).await.unwrap(), 701);
    tx.commit().await.unwrap();
    let mut tx = store.begin(TxMode::Read).await.unwrap();
    assert_eq!(tx.count_rows(&dataset).await.unwrap(), 0);
    let moved = tx.scan_rows(&fresh, None, 1000).await.unwrap();
    assert_eq!(moved.len(), 701);
    assert_eq!(moved[0].1, json!("d0"));
    assert_eq!(moved[700].1, json!({"i": 699}));
    drop(tx);

    let mut tx = store.begin(TxMode::Write).await.unwrap();
    let odd = unique("odd");
    let kinds = vec![
        json!(true),
        json!(false),
        json!(null),
        json!(-7),
        json!(2.5),
        // Numbers whose text a double printed to 15 digits would change.
        json!(0.1 + 0.2),
        json!(1.0 / 3.0),
        json!(1e300),
        json!(u64::MAX),
        json!(i64::MIN),
        json!("it's \"quoted\""),
        json!([1, {"a": null}]),
        json!({"nested": {"x": [true, 1e-7]}}),
    ];
    assert_eq!(
        tx.append_rows(&odd, &kinds).await.unwrap(),
        kinds.len() as u64
    );
    tx.commit().await.unwrap();
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    let back: Vec<Value> = tx
        .scan_rows(&odd, None, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(
        back, kinds,
        "every kind of JSON value comes back as it went in"
    );
    assert_eq!(tx.clear_rows(&fresh).await.unwrap(), 701);
    tx.commit().await.unwrap();
    let mut tx = store.begin(TxMode::Read).await.unwrap();
    assert_eq!(tx.count_rows(&fresh).await.unwrap(), 0);
}

async fn a_completed_write_replays_and_refuses_other_arguments(store: Arc<dyn Store>) {
    let scope = unique("h:scope");
    let rows = unique("rows");
    let first = claim(&scope, "k1", json!({"rows": [1, 2]}));
    let mut tx = run(&store, &first).await;
    tx.append_rows(&rows, &[json!(1), json!(2)]).await.unwrap();
    tx.complete_claim(&first, r#"{"appended":2}"#)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let again = claim(&scope, "k1", json!({"rows": [1, 2]}));
    match store.begin_idempotent(&again, now_millis()).await.unwrap() {
        Begin::Replay(r) => assert_eq!(r, r#"{"appended":2}"#),
        _ => panic!("expected a replay"),
    }
    let other = claim(&scope, "k1", json!({"rows": [3]}));
    assert!(matches!(
        store.begin_idempotent(&other, now_millis()).await.unwrap(),
        Begin::Mismatch
    ));
    // Another key in the same scope is another write.
    let fresh = claim(&scope, "k2", json!({"rows": [1, 2]}));
    drop(run(&store, &fresh).await);
    let mut tx = store.begin(TxMode::Read).await.unwrap();
    assert_eq!(tx.count_rows(&rows).await.unwrap(), 2);
}

async fn a_failed_write_leaves_no_record(store: Arc<dyn Store>) {
    let scope = unique("h:scope");
    let rows = unique("rows");
    let c = claim(&scope, "k", json!({}));
    let mut tx = run(&store, &c).await;
    tx.append_rows(&rows, &[json!(1)]).await.unwrap();
    drop(tx);
    // Redis gives the claim back from a task: allow it a moment.
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        match store.begin_idempotent(&c, now_millis()).await {
            Ok(Begin::Run(_)) => break,
            Err(StoreError::Busy(_)) | Ok(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => panic!("the failed write left a record behind: {:?}", other.is_ok()),
        }
    }
    let mut tx = store.begin(TxMode::Read).await.unwrap();
    assert_eq!(tx.count_rows(&rows).await.unwrap(), 0);
}

async fn a_duplicate_waits_for_the_first_and_replays(store: Arc<dyn Store>) {
    let scope = unique("h:scope");
    let rows = unique("rows");
    let c = claim(&scope, "k", json!({"n": 1}));
    let mut first = run(&store, &c).await;
    first.append_rows(&rows, &[json!("once")]).await.unwrap();
    let mut watch = Watch::start(&store, &mut first, &c).await;
    let dup = {
        let store = Arc::clone(&store);
        let c = c.clone();
        tokio::spawn(async move { store.begin_idempotent(&c, now_millis()).await })
    };
    // Once the duplicate is seen waiting, it can only end as a replay of the first result:
    // a duplicate that ran beside the first, or gave up at once, fails below.
    watch.until_the_duplicate_waits().await;
    assert!(
        !dup.is_finished(),
        "the duplicate must wait for the first attempt"
    );
    first.complete_claim(&c, "\"first\"").await.unwrap();
    first.commit().await.unwrap();
    match dup.await.unwrap().unwrap() {
        Begin::Replay(r) => assert_eq!(r, "\"first\""),
        Begin::Run(_) => panic!("the duplicate ran a second time"),
        Begin::Mismatch => panic!("mismatch"),
    }
    let mut tx = store.begin(TxMode::Read).await.unwrap();
    assert_eq!(tx.count_rows(&rows).await.unwrap(), 1);
}

async fn expired_records_count_as_absent(store: Arc<dyn Store>) {
    let scope = unique("h:scope");
    let mut c = claim(&scope, "k", json!({}));
    c.expires_at = now_millis() + 200;
    let mut tx = run(&store, &c).await;
    tx.complete_claim(&c, "1").await.unwrap();
    tx.commit().await.unwrap();
    // Once it has expired, the key is free again. Redis expires records on its own clock,
    // so the test waits for the expiry itself (a lower bound: no machine is too slow).
    let later = claim(&scope, "k", json!({"other": true}));
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(matches!(
        store.begin_idempotent(&later, now_millis()).await.unwrap(),
        Begin::Run(_)
    ));
}

async fn the_sweeper_removes_long_expired_handles_in_batches(store: Arc<dyn Store>) {
    const HOUR: i64 = 3_600_000;
    let owner = Principal::new("u").unwrap();
    let idle = i64::try_from(Thing::IDLE_TTL.unwrap().as_millis()).unwrap();
    let now = now_millis();
    // Handles whose idle lifetime ended `ago` milliseconds before now.
    let expired = |ago: i64| HandleRecord::mint::<Thing>(&owner, now - idle - ago);
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    let mut old = Vec::new();
    for _ in 0..5 {
        let h = expired(10 * HOUR);
        tx.create_handle(&h).await.unwrap();
        tx.append_rows(&format!("{}/rows", h.id), &[json!(1)])
            .await
            .unwrap();
        old.push(h);
    }
    // Expired, but within the hour of grace in which its owner is told why it is gone.
    let recent = expired(HOUR - 60_000);
    tx.create_handle(&recent).await.unwrap();
    let live = HandleRecord::mint::<Thing>(&owner, now);
    tx.create_handle(&live).await.unwrap();
    tx.commit().await.unwrap();
    // Other tests share the store: sweep until nothing is left, one small batch at a time;
    // no call removes more than its batch of handles, of idempotency records and of shared
    // keys.
    let mut calls = 0;
    loop {
        let n = store.sweep(now_millis(), 2).await.unwrap();
        assert!(
            n <= 6,
            "a sweep removed {n} records, beyond its batches of 2"
        );
        calls += 1;
        if n == 0 {
            break;
        }
        assert!(calls < 1_000_000, "the sweep never ends");
    }
    assert!(
        calls >= 3,
        "five handles in batches of two take three sweeps"
    );
    for h in &old {
        assert_eq!(store.load_handle(&h.id).await.unwrap(), None);
        let mut tx = store.begin(TxMode::Read).await.unwrap();
        assert_eq!(tx.count_rows(&format!("{}/rows", h.id)).await.unwrap(), 0);
    }
    let kept = store.load_handle(&recent.id).await.unwrap();
    assert!(
        kept.is_some_and(|h| h.expired(now_millis()).is_some()),
        "an hour of grace: kept, and known to have expired"
    );
    assert!(store.load_handle(&live.id).await.unwrap().is_some());
}

async fn claims_on_a_handle_are_for_its_owner_only(store: Arc<dyn Store>) {
    let owner = Principal::new("user-42").unwrap();
    let h = HandleRecord::mint::<Thing>(&owner, now_millis());
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    tx.create_handle(&h).await.unwrap();
    tx.commit().await.unwrap();
    let scope = format!("h:{}", h.id);
    let c = claim(&scope, "k", json!({"rows": [1]}));

    // Another principal: the handle comes back for the core to refuse, nothing is claimed.
    let (record, begun) = store
        .claim_on_handle(&c, &h.id, "user-7", now_millis())
        .await
        .unwrap();
    assert_eq!(record.as_ref().map(|r| r.owner.as_str()), Some("user-42"));
    assert!(begun.is_none());
    let (record, begun) = store
        .claim_on_handle(&c, "thg_unknown", "user-42", now_millis())
        .await
        .unwrap();
    assert!(record.is_none() && begun.is_none());

    // The owner claims; a duplicate arriving meanwhile waits, then replays.
    let (record, begun) = store
        .claim_on_handle(&c, &h.id, "user-42", now_millis())
        .await
        .unwrap();
    assert_eq!(record.unwrap().id, h.id);
    let Some(Begin::Run(mut first)) = begun else {
        panic!("the owner's first call must run")
    };
    let mut watch = Watch::start(&store, &mut first, &c).await;
    let dup = {
        let (store, c, id) = (Arc::clone(&store), c.clone(), h.id.clone());
        tokio::spawn(async move {
            store
                .claim_on_handle(&c, &id, "user-42", now_millis())
                .await
        })
    };
    watch.until_the_duplicate_waits().await;
    assert!(
        !dup.is_finished(),
        "the duplicate must wait for the first attempt"
    );
    first.complete_claim(&c, "\"once\"").await.unwrap();
    first.commit().await.unwrap();
    match dup.await.unwrap().unwrap() {
        (Some(_), Some(Begin::Replay(r))) => assert_eq!(r, "\"once\""),
        _ => panic!("the duplicate must replay the first result"),
    }
    let other = claim(&scope, "k", json!({"rows": [2]}));
    assert!(matches!(
        store
            .claim_on_handle(&other, &h.id, "user-42", now_millis())
            .await
            .unwrap(),
        (Some(_), Some(Begin::Mismatch))
    ));
}

async fn keys_and_results_are_stored_exactly_whatever_they_hold(store: Arc<dyn Store>) {
    let scope = unique("h:quotes");
    let key = "k'\"; DROP TABLE wharf_rows; --$w$ $$ \\ \u{1F600}";
    let result = r#"{"text":"it's $w0123456789abcdef$ $$ \\ '' \"q\" 😀"}"#;
    let c = claim(&scope, key, json!({"a": 1}));
    let mut tx = run(&store, &c).await;
    tx.complete_claim(&c, result).await.unwrap();
    tx.commit().await.unwrap();
    match store.begin_idempotent(&c, now_millis()).await.unwrap() {
        Begin::Replay(r) => assert_eq!(r, result),
        _ => panic!("expected the stored result"),
    }
}

async fn nothing_is_left_under_a_handle_retired_while_a_write_ran(store: Arc<dyn Store>) {
    let h = HandleRecord::mint::<Thing>(&Principal::new("u").unwrap(), now_millis());
    let rows = format!("{}/rows", h.id);
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    tx.create_handle(&h).await.unwrap();
    tx.commit().await.unwrap();

    // A write holds the handle and appends; meanwhile another call retires it.
    let mut writer = store.begin(TxMode::Write).await.unwrap();
    assert!(writer.hold_handle(&h.id, None).await.unwrap());
    writer
        .append_rows(&rows, &[json!(1), json!(2)])
        .await
        .unwrap();
    let retirer = {
        let (store, id) = (Arc::clone(&store), h.id.clone());
        tokio::spawn(async move {
            let mut tx = store.begin(TxMode::Write).await?;
            tx.retire_handle(&id).await?;
            tx.commit().await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    // SQL stores make the retirement wait for the write; Redis refuses the write at commit.
    match writer.commit().await {
        Ok(()) | Err(StoreError::HandleGone) => {}
        Err(e) => panic!("unexpected: {e}"),
    }
    retirer.await.unwrap().unwrap();
    assert_eq!(store.load_handle(&h.id).await.unwrap(), None);
    let mut tx = store.begin(TxMode::Read).await.unwrap();
    assert_eq!(
        tx.count_rows(&rows).await.unwrap(),
        0,
        "no rows outlive their handle"
    );
    drop(tx);
    // And a write that starts after the retirement cannot hold it.
    let mut late = store.begin(TxMode::Write).await.unwrap();
    assert!(!late.hold_handle(&h.id, None).await.unwrap());
}

/// A duplicate of a write still running waits at most its store's `lock_wait`, then is
/// told "busy" (the core answers 503 / -31000: retry); it never runs beside the first. The
/// retry, after the first committed, replays. `holder` keeps its claim far longer than
/// `dup` waits (on Redis a claim's lease is the lock_wait of the store that took it).
async fn a_duplicate_of_a_write_still_running_is_busy_after_its_wait(
    holder: Arc<dyn Store>,
    dup: Arc<dyn Store>,
    wait: Duration,
) {
    busy_after_its_wait(&holder, &dup, wait, 0).await;
    // A duplicate on a replica whose clock runs five minutes ahead (far past the claim's
    // lease) waits all the same: leases are not judged by the replicas' clocks.
    busy_after_its_wait(&holder, &dup, wait, 300_000).await;
}

async fn busy_after_its_wait(
    holder: &Arc<dyn Store>,
    dup: &Arc<dyn Store>,
    wait: Duration,
    ahead: i64,
) {
    let scope = unique("h:busy");
    let rows = unique("rows");
    let c = claim(&scope, "k", json!({"n": 1}));
    let mut first = run(holder, &c).await;
    first.append_rows(&rows, &[json!("once")]).await.unwrap();

    let started = Instant::now();
    match dup.begin_idempotent(&c, now_millis() + ahead).await {
        // The caller reads this; the database's own words (its engine, its tables) are
        // for the log.
        Err(StoreError::Busy(why)) => assert!(
            !why.contains("lock timeout") && !why.contains("database is locked"),
            "{why}"
        ),
        Ok(Begin::Run(_)) => panic!("the duplicate ran beside the first attempt"),
        Ok(Begin::Replay(r)) => panic!("a replay of {r} before the first committed"),
        Ok(Begin::Mismatch) => panic!("mismatch"),
        Err(e) => panic!("expected busy, got {e}"),
    }
    let waited = started.elapsed();
    assert!(
        waited >= wait,
        "the duplicate gave up after {waited:?}, before its wait of {wait:?}"
    );
    assert!(
        waited < wait + Duration::from_secs(10),
        "the duplicate's wait of {wait:?} lasted {waited:?}"
    );

    first.complete_claim(&c, "\"first\"").await.unwrap();
    first.commit().await.unwrap();
    match dup.begin_idempotent(&c, now_millis()).await.unwrap() {
        Begin::Replay(r) => assert_eq!(r, "\"first\""),
        _ => panic!("the retry must replay the first result"),
    }
    let mut tx = dup.begin(TxMode::Read).await.unwrap();
    assert_eq!(tx.count_rows(&rows).await.unwrap(), 1);
}

const SHORT_WAIT: Duration = Duration::from_millis(700);
const LONG_WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_duplicate_of_a_write_still_running_is_busy_after_its_wait() {
    // A file of its own: the first attempt holds its write lock for the whole wait.
    let url = sqlite_url("busy");
    let (holder, dup) = (
        sqlite_with(&url, LONG_WAIT).await,
        sqlite_with(&url, SHORT_WAIT).await,
    );
    a_duplicate_of_a_write_still_running_is_busy_after_its_wait(holder, dup, SHORT_WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_duplicate_of_a_write_still_running_is_busy_after_its_wait() {
    a_duplicate_of_a_write_still_running_is_busy_after_its_wait(
        postgres_with(LONG_WAIT).await,
        postgres_with(SHORT_WAIT).await,
        SHORT_WAIT,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_duplicate_of_a_write_still_running_is_busy_after_its_wait() {
    a_duplicate_of_a_write_still_running_is_busy_after_its_wait(
        redis_with(LONG_WAIT).await,
        redis_with(SHORT_WAIT).await,
        SHORT_WAIT,
    )
    .await;
}

struct Other;
impl HandleKind for Other {
    const KIND: &'static str = "other";
    const PREFIX: &'static str = "oth";
    const CREATED_BY: &'static str = "other_new";
    const TTL: Duration = Duration::from_secs(3600);
}

/// A principal's live handles of one kind are counted (what a kind's cap per owner reads):
/// not another owner's, not another kind's, not one retired, idle too long, past its
/// lifetime, or swept, and not one of a transaction rolled back.
async fn live_handles_count_one_owners_live_handles_of_one_kind(store: Arc<dyn Store>) {
    let owner = Principal::new(unique("owner/with:separators")).unwrap();
    let now = now_millis();
    let idle = i64::try_from(Thing::IDLE_TTL.unwrap().as_millis()).unwrap();
    let ttl = i64::try_from(Thing::TTL.as_millis()).unwrap();
    let live: Vec<HandleRecord> = (0..3)
        .map(|_| HandleRecord::mint::<Thing>(&owner, now))
        .collect();
    // Both past the sweeper's hour of grace, so a sweep at `now` removes them.
    const LONG_AGO: i64 = 10 * 3_600_000;
    let idle_out = HandleRecord::mint::<Thing>(&owner, now - idle - LONG_AGO);
    let mut lifetime_out = HandleRecord::mint::<Thing>(&owner, now - ttl - LONG_AGO);
    // Used a moment ago, so only its lifetime is over.
    lifetime_out.last_used_at = now - 1;
    let theirs = HandleRecord::mint::<Thing>(&Principal::new(unique("someone else")).unwrap(), now);
    let other_kind = HandleRecord::mint::<Other>(&owner, now);
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    for r in live
        .iter()
        .chain([&idle_out, &lifetime_out, &theirs, &other_kind])
    {
        tx.create_handle(r).await.unwrap();
    }
    tx.commit().await.unwrap();
    let count = async |kind: &str, at: Millis| {
        let mut tx = store.begin(TxMode::Read).await.unwrap();
        tx.live_handles(owner.id(), kind, at).await.unwrap()
    };
    assert_eq!(count(Thing::KIND, now).await, 3);
    assert_eq!(count(Other::KIND, now).await, 1);

    let mut tx = store.begin(TxMode::Write).await.unwrap();
    tx.create_handle(&HandleRecord::mint::<Thing>(&owner, now))
        .await
        .unwrap();
    drop(tx);
    assert_eq!(
        count(Thing::KIND, now).await,
        3,
        "a rolled-back handle is not counted"
    );

    let mut tx = store.begin(TxMode::Write).await.unwrap();
    tx.retire_handle(&live[0].id).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        count(Thing::KIND, now).await,
        2,
        "a retired handle is not counted"
    );
    assert_eq!(
        count(Thing::KIND, now + idle).await,
        0,
        "idle for its idle lifetime"
    );
    // Other tests share the store: sweep until both expired handles are gone.
    for gone in [&idle_out, &lifetime_out] {
        while store.load_handle(&gone.id).await.unwrap().is_some() {
            store.sweep(now_millis(), 100).await.unwrap();
        }
    }
    assert_eq!(
        count(Thing::KIND, now).await,
        2,
        "the count is still right once swept"
    );
}

/// The least recently used of a principal's live handles of one kind come first, the
/// earliest last use first (ties by id), as many as asked: not another owner's or kind's,
/// not one idle too long, past its lifetime or retired.
async fn least_recently_used_handles_are_one_owners_live_ones_oldest_first(store: Arc<dyn Store>) {
    let owner = Principal::new(unique("lru owner")).unwrap();
    let now = now_millis();
    let idle = i64::try_from(Thing::IDLE_TTL.unwrap().as_millis()).unwrap();
    let used_at = |ago: i64| {
        let mut r = HandleRecord::mint::<Thing>(&owner, now - 1000);
        r.last_used_at = now - ago;
        r
    };
    // Used 30, 10, 20 and (twice) 40 seconds ago: the order asked of them.
    let (a, b, c) = (used_at(30_000), used_at(10_000), used_at(20_000));
    let (mut d, mut e) = (used_at(40_000), used_at(40_000));
    if e.id < d.id {
        std::mem::swap(&mut d, &mut e);
    }
    let idle_out = used_at(idle + 1);
    let retired = used_at(50_000);
    let theirs =
        HandleRecord::mint::<Thing>(&Principal::new(unique("another")).unwrap(), now - 60_000);
    let other_kind = HandleRecord::mint::<Other>(&owner, now - 60_000);
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    for r in [
        &a,
        &b,
        &c,
        &d,
        &e,
        &idle_out,
        &retired,
        &theirs,
        &other_kind,
    ] {
        tx.create_handle(r).await.unwrap();
    }
    tx.commit().await.unwrap();
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    tx.retire_handle(&retired.id).await.unwrap();
    tx.commit().await.unwrap();

    let oldest = async |n: u64| {
        let mut tx = store.begin(TxMode::Write).await.unwrap();
        tx.least_recently_used_handles(owner.id(), Thing::KIND, now, n)
            .await
            .unwrap()
    };
    assert_eq!(oldest(2).await, vec![d.id.clone(), e.id.clone()]);
    assert_eq!(
        oldest(10).await,
        vec![
            d.id.clone(),
            e.id.clone(),
            a.id.clone(),
            c.id.clone(),
            b.id.clone()
        ],
        "every live one, oldest first"
    );
    assert!(oldest(0).await.is_empty());
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    let none = tx
        .least_recently_used_handles(owner.id(), Other::KIND, now + 2 * 3_600_000, 5)
        .await
        .unwrap();
    assert!(none.is_empty(), "past their lifetime: {none:?}");
}

/// A one-time record (a confirmation redeemed once) taken by one transaction is not taken
/// by another before the first ends: what it unlocks may be an effect outside the store.
/// The second is told it is used: at once where the record is reserved at once (Redis,
/// whose writes otherwise wait for the commit), or once the first committed, where the
/// store makes it wait (SQL).
async fn a_one_time_record_is_taken_by_one_transaction(store: Arc<dyn Store>) {
    let once = claim("mrtr", &unique("nonce"), json!({}));
    let mut first = store.begin(TxMode::Write).await.unwrap();
    assert!(first.record_once(&once).await.unwrap(), "free");
    let second = {
        let (store, once) = (Arc::clone(&store), once.clone());
        tokio::spawn(async move {
            let mut tx = store.begin(TxMode::Write).await?;
            tx.record_once(&once).await
        })
    };
    let taken = if store.backend() == "redis" {
        let taken = second.await.unwrap().unwrap();
        first.commit().await.unwrap();
        taken
    } else {
        first.commit().await.unwrap();
        second.await.unwrap().unwrap()
    };
    assert!(
        !taken,
        "a second transaction took the record the first held"
    );
}

/// Row numbers only ever rise in a collection: rows appended after a clear or a move are
/// numbered after the ones that went, so a reader paging by `after` neither skips nor
/// repeats. An `after` below the first row reads from the start.
async fn row_numbers_go_on_rising_after_a_clear_or_a_move(store: Arc<dyn Store>) {
    let (c, to) = (unique("numbered"), unique("numbered-to"));
    let scan = async |collection: &str, after: Option<i64>| {
        let mut tx = store.begin(TxMode::Read).await.unwrap();
        tx.scan_rows(collection, after, 10).await.unwrap()
    };
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    tx.append_rows(&c, &[json!("a"), json!("b"), json!("c")])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    assert_eq!(tx.clear_rows(&c).await.unwrap(), 3);
    tx.commit().await.unwrap();
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    assert_eq!(tx.append_rows(&c, &[json!("d")]).await.unwrap(), 1);
    tx.commit().await.unwrap();
    assert_eq!(scan(&c, Some(2)).await, vec![(3, json!("d"))]);
    assert_eq!(scan(&c, None).await, vec![(3, json!("d"))]);
    assert_eq!(scan(&c, Some(-5)).await, vec![(3, json!("d"))]);
    assert_eq!(scan(&c, Some(3)).await, vec![]);
    assert_eq!(scan(&c, Some(i64::MAX)).await, vec![]);

    let mut tx = store.begin(TxMode::Write).await.unwrap();
    assert_eq!(tx.move_rows(&c, &to).await.unwrap(), 1);
    tx.commit().await.unwrap();
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    tx.append_rows(&c, &[json!("e")]).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(scan(&c, None).await, vec![(4, json!("e"))]);
    assert_eq!(scan(&to, None).await, vec![(0, json!("d"))]);
}

all_backends!(
    handles_are_stored_with_their_owner_and_only_when_committed,
    a_handle_that_never_expires_round_trips,
    retiring_a_handle_removes_the_data_filed_under_it,
    documents_round_trip_and_roll_back,
    rows_append_scan_move_and_clear_in_order,
    row_numbers_go_on_rising_after_a_clear_or_a_move,
    a_completed_write_replays_and_refuses_other_arguments,
    a_failed_write_leaves_no_record,
    a_duplicate_waits_for_the_first_and_replays,
    expired_records_count_as_absent,
    the_sweeper_removes_long_expired_handles_in_batches,
    claims_on_a_handle_are_for_its_owner_only,
    keys_and_results_are_stored_exactly_whatever_they_hold,
    nothing_is_left_under_a_handle_retired_while_a_write_ran,
    live_handles_count_one_owners_live_handles_of_one_kind,
    least_recently_used_handles_are_one_owners_live_ones_oldest_first,
    a_one_time_record_is_taken_by_one_transaction,
    a_handles_last_use_never_moves_back,
    rows_cannot_move_onto_their_own_collection,
    a_collection_named_like_a_record_leaves_records_alone,
);

/// Two writes under one handle, each claimed (so each holds the handle's lock shared), both
/// hold it and record a use where none is in flight: neither waits for the other's claim,
/// and both commit. (An exclusive lock to record a use deadlocked them.)
#[tokio::test]
async fn postgres_two_claimed_writes_under_one_handle_both_hold_it() {
    let store = postgres().await;
    let owner = Principal::new(unique("touch")).unwrap();
    let handle = mint(&store, &owner).await;
    let scope = format!("h:{}", handle.id);
    let (c1, c2) = (
        claim(&scope, &unique("k"), json!({ "n": 1 })),
        claim(&scope, &unique("k"), json!({ "n": 2 })),
    );
    let begin = |c: Claim| {
        let (store, id, owner) = (Arc::clone(&store), handle.id.clone(), owner.clone());
        async move {
            match store
                .claim_on_handle(&c, &id, owner.id(), now_millis())
                .await
            {
                Ok((Some(_), Some(Begin::Run(tx)))) => (tx, c),
                other => panic!("the owner's claim runs: {:?}", other.err()),
            }
        }
    };
    let (mut first, c1) = begin(c1).await;
    let (mut second, c2) = begin(c2).await;
    let used = now_millis() + 1_000;
    assert!(first.hold_handle(&handle.id, Some(used)).await.unwrap());
    let later = tokio::spawn(async move {
        let held = second.hold_handle(&handle.id, Some(used + 1)).await?;
        second.complete_claim(&c2, "2").await?;
        second.commit().await.map(|()| held)
    });
    first.complete_claim(&c1, "1").await.unwrap();
    first.commit().await.unwrap();
    assert!(
        later.await.unwrap().unwrap(),
        "the second write holds the handle too"
    );
}

/// A claim on a handle holds it until the claim's transaction ends: a retirement waits for
/// the write, then removes what it wrote. Later claims queue behind the waiting retirement
/// (a stream of writes cannot starve it), then find the handle gone and claim nothing.
#[tokio::test]
async fn postgres_a_claim_on_a_handle_holds_it_and_a_retirement_waits_its_turn() {
    let store = postgres().await;
    let observer = pg_observer().await;
    let owner = Principal::new(unique("held")).unwrap();
    let handle = mint(&store, &owner).await;
    let scope = format!("h:{}", handle.id);
    let rows = format!("{}/rows", handle.id);
    let c = claim(&scope, &unique("k"), json!({ "n": 1 }));
    let Ok((Some(_), Some(Begin::Run(mut writer)))) = store
        .claim_on_handle(&c, &handle.id, owner.id(), now_millis())
        .await
    else {
        panic!("the owner's claim runs")
    };
    writer.append_rows(&rows, &[json!(1)]).await.unwrap();
    let writer_pid = pg_backend_pid(&mut writer).await;

    let mut retiring = store.begin(TxMode::Write).await.unwrap();
    let retiring_pid = pg_backend_pid(&mut retiring).await;
    let retirer = {
        let id = handle.id.clone();
        tokio::spawn(async move {
            retiring.retire_handle(&id).await?;
            retiring.commit().await
        })
    };
    until_pg_blocked_by(
        &observer,
        writer_pid,
        "the retirement waits for the claimed write",
    )
    .await;
    let late = claim_in_background(&store, &scope, &handle.id, &owner);
    until_pg_blocked_by(
        &observer,
        retiring_pid,
        "a later claim waits behind the retirement",
    )
    .await;

    writer.complete_claim(&c, "1").await.unwrap();
    writer.commit().await.unwrap();
    retirer.await.unwrap().unwrap();
    assert_eq!(
        late.await.unwrap().unwrap(),
        (false, false),
        "the handle is gone and nothing was claimed"
    );
    assert_eq!(store.load_handle(&handle.id).await.unwrap(), None);
    let mut tx = store.begin(TxMode::Read).await.unwrap();
    assert_eq!(tx.count_rows(&rows).await.unwrap(), 0, "no rows outlive it");
}

/// A claim that waited while its handle was replaced (deleted and inserted again in one
/// transaction, as a legacy session's change does) finds the new one and runs.
#[tokio::test]
async fn postgres_a_claim_finds_a_handle_replaced_while_it_waited() {
    let store = postgres().await;
    let observer = pg_observer().await;
    let owner = Principal::new(unique("replaced")).unwrap();
    let handle = mint(&store, &owner).await;
    let mut replacing = store.begin(TxMode::Write).await.unwrap();
    let replacing_pid = pg_backend_pid(&mut replacing).await;
    replacing.retire_handle(&handle.id).await.unwrap();
    replacing.create_handle(&handle).await.unwrap();
    let waiting = claim_in_background(&store, &format!("h:{}", handle.id), &handle.id, &owner);
    until_pg_blocked_by(
        &observer,
        replacing_pid,
        "the claim waits for the replacement",
    )
    .await;
    replacing.commit().await.unwrap();
    assert_eq!(
        waiting.await.unwrap().unwrap(),
        (true, true),
        "the claim finds the handle and runs"
    );
}

/// A committed handle of `owner`'s.
async fn mint(store: &Arc<dyn Store>, owner: &Principal) -> HandleRecord {
    let handle = HandleRecord::mint::<Thing>(owner, now_millis());
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    tx.create_handle(&handle).await.unwrap();
    tx.commit().await.unwrap();
    handle
}

/// A claim on `handle` in a task of its own, answering whether it found the handle and
/// whether it claimed (its transaction is rolled back then).
fn claim_in_background(
    store: &Arc<dyn Store>,
    scope: &str,
    handle: &str,
    owner: &Principal,
) -> tokio::task::JoinHandle<Result<(bool, bool), StoreError>> {
    let (store, c, id, owner) = (
        Arc::clone(store),
        claim(scope, &unique("k"), json!({ "n": 2 })),
        handle.to_owned(),
        owner.clone(),
    );
    tokio::spawn(async move {
        let (record, begun) = store
            .claim_on_handle(&c, &id, owner.id(), now_millis())
            .await?;
        Ok((record.is_some(), begun.is_some()))
    })
}

/// A claim whose wait for its handle's lock runs out is answered "busy", and the session it
/// waited on goes back to the pool clean: with one connection, the next claim runs.
#[tokio::test]
async fn postgres_a_claim_that_timed_out_on_its_handle_leaves_the_pool_usable() {
    let holder = postgres().await;
    let mut one = support::options(Duration::from_millis(200));
    one.max_connections = 1;
    let url = support::pg_url();
    let waiter = wharf_store::open(&url, &one).await.expect("PostgreSQL");
    let owner = Principal::new(unique("timeout")).unwrap();
    let handle = mint(&holder, &owner).await;

    // Held exclusively, as a retirement holds it (rolled back below).
    let mut busy = holder.begin(TxMode::Write).await.unwrap();
    busy.retire_handle(&handle.id).await.unwrap();
    let c = claim(&format!("h:{}", handle.id), "k1", json!({ "n": 1 }));
    let waited = waiter
        .claim_on_handle(&c, &handle.id, owner.id(), now_millis())
        .await;
    assert!(
        matches!(waited, Err(StoreError::Busy(_))),
        "{:?}",
        waited.err()
    );
    drop(busy);

    let (record, begun) = waiter
        .claim_on_handle(&c, &handle.id, owner.id(), now_millis())
        .await
        .expect("the pool's only session is usable again");
    assert!(record.is_some());
    let Some(Begin::Run(tx)) = begun else {
        panic!("the claim runs once the handle is free")
    };
    tx.commit().await.unwrap();
}

/// A transaction whose caller goes away while its `BEGIN` is in flight (a client that
/// disconnects) leaves no transaction open on the pooled session: with one connection, the
/// next transaction starts fresh, not inside a leftover one.
#[tokio::test]
async fn postgres_a_begin_dropped_in_flight_leaves_no_transaction_behind() {
    let mut one = support::options(WAIT);
    one.max_connections = 1;
    let store = wharf_store::open(&support::pg_url(), &one)
        .await
        .expect("PostgreSQL");
    for round in 0..10 {
        // Polled once (BEGIN sent), then dropped.
        let _ = tokio::time::timeout(Duration::ZERO, store.begin(TxMode::Write)).await;
        tokio::time::sleep(Duration::from_millis(60)).await;
        let mut tx = store.begin(TxMode::Write).await.unwrap();
        let sql = wharf_store::SqlTx::postgres(
            tx.backend_tx()
                .downcast_mut::<wharf_store::SqlTx>()
                .expect("a SQL transaction"),
        )
        .expect("PostgreSQL");
        // A transaction begun just now started less than 50 ms ago; a leftover one, before
        // the sleep.
        let stale: bool = sqlx::query_scalar(
            "SELECT xact_start < clock_timestamp() - interval '50 milliseconds' \
             FROM pg_stat_activity WHERE pid = pg_backend_pid()",
        )
        .fetch_one(&mut **sql)
        .await
        .unwrap();
        assert!(
            !stale,
            "round {round}: the session was still in an old transaction"
        );
    }
}

/// A sweep that found a record expired, and then waits for it while a retry of that key
/// re-claims it (a key reused past its retention), leaves the new record alone: deleting it
/// would let a third attempt apply the write again.
#[tokio::test]
async fn postgres_a_sweep_spares_a_record_reclaimed_while_it_waited() {
    let store = postgres().await;
    let scope = unique("h:scope");
    // A record whose retention is already over when it is written.
    let mut first = claim(&scope, "k", json!({}));
    first.expires_at = now_millis() - 1_000;
    let mut tx = run(&store, &first).await;
    tx.complete_claim(&first, "\"first\"").await.unwrap();
    tx.commit().await.unwrap();

    // The retry takes the expired record over, and holds its row until it commits.
    let retry = claim(&scope, "k", json!({}));
    let mut retrying = run(&store, &retry).await;
    let holder = pg_backend_pid(&mut retrying).await;
    let observer = pg_observer().await;
    let sweep = {
        let store = Arc::clone(&store);
        tokio::spawn(async move { store.sweep(now_millis(), 100).await })
    };
    until_pg_blocked_by(
        &observer,
        holder,
        "the sweep waits for the re-claimed record",
    )
    .await;
    retrying.complete_claim(&retry, "\"second\"").await.unwrap();
    retrying.commit().await.unwrap();
    sweep.await.unwrap().unwrap();

    let third = claim(&scope, "k", json!({}));
    match store.begin_idempotent(&third, now_millis()).await.unwrap() {
        Begin::Replay(r) => assert_eq!(r, "\"second\""),
        Begin::Run(_) => panic!("the sweep deleted the re-claimed record"),
        Begin::Mismatch => panic!("mismatch"),
    }
}

/// Ends the PostgreSQL session behind `tx`, as a restart or a failover would.
async fn cut_off(tx: &mut Box<dyn Transaction>) {
    let pid = pg_backend_pid(tx).await;
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&pg_observer().await)
        .await
        .expect("pg_terminate_backend");
    assert!(ended, "session {pid} was not there to end");
}

/// Each session of a PostgreSQL store reads committed whatever the database's default, and
/// has the server probe its connection: a replica whose host vanished has its transactions
/// and locks ended in about a minute, not the system's two hours.
#[tokio::test]
async fn postgres_sessions_read_committed_and_are_probed_for_a_vanished_peer() {
    let store = postgres().await;
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    let sql = tx
        .backend_tx()
        .downcast_mut::<wharf_store::SqlTx>()
        .and_then(wharf_store::SqlTx::postgres)
        .expect("a PostgreSQL store's transaction");
    let settings: (String, String, String, String) = sqlx::query_as(
        "SELECT current_setting('transaction_isolation'), current_setting('tcp_keepalives_idle'), \
                current_setting('tcp_keepalives_interval'), current_setting('tcp_keepalives_count')",
    )
    .fetch_one(&mut **sql)
    .await
    .unwrap();
    assert_eq!(
        settings,
        (
            "read committed".into(),
            "30".into(),
            "10".into(),
            "3".into()
        )
    );
}

/// A SQLite store's commits reach the disk before they are answered (the log is synced at
/// every commit): a write answered, with its idempotency record, survives the host losing
/// power, so a retry replays its result rather than making it again.
#[tokio::test]
async fn sqlite_commits_are_synced_before_they_are_answered() {
    let store = sqlite().await;
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    let sql = tx
        .backend_tx()
        .downcast_mut::<wharf_store::SqlTx>()
        .and_then(wharf_store::SqlTx::sqlite)
        .expect("a SQLite store's transaction");
    let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut **sql)
        .await
        .unwrap();
    let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&mut **sql)
        .await
        .unwrap();
    assert_eq!(
        (journal.as_str(), synchronous),
        ("wal", 2),
        "WAL, synchronous FULL"
    );
}

/// A connection PostgreSQL cut (a restart, a failover) makes a statement answer "busy,
/// retry" (it was a 500), and so does a keyed call's commit, whose retry finds its record if
/// the commit went through after all; an unkeyed commit whose answer was lost is not called
/// retryable, since it may have been applied.
#[tokio::test]
async fn postgres_a_lost_connection_is_busy_unless_a_retry_could_apply_twice() {
    let store = postgres().await;
    let mut reading = store.begin(TxMode::Write).await.unwrap();
    cut_off(&mut reading).await;
    match reading.hold_handle(&unique("thg"), None).await {
        Err(StoreError::Busy(why)) => assert!(why.contains("cannot be reached"), "{why}"),
        other => panic!("a statement on a cut connection: {other:?}"),
    }
    drop(reading);

    let keyed = claim(&unique("lost:scope"), "k", json!({}));
    let mut writing = run(&store, &keyed).await;
    writing.complete_claim(&keyed, "\"done\"").await.unwrap();
    cut_off(&mut writing).await;
    match writing.commit().await {
        Err(StoreError::Busy(_)) => {}
        other => panic!("a keyed commit on a cut connection: {other:?}"),
    }
    // What the retry finds: the commit did not go through, so the write runs again, once.
    match store.begin_idempotent(&keyed, now_millis()).await.unwrap() {
        Begin::Run(_) => {}
        Begin::Replay(r) => panic!("a commit on a cut connection applied: {r}"),
        Begin::Mismatch => panic!("mismatch"),
    }

    let mut unkeyed = store.begin(TxMode::Write).await.unwrap();
    unkeyed
        .create_handle(&HandleRecord::mint::<Thing>(
            &Principal::new("lost").unwrap(),
            now_millis(),
        ))
        .await
        .unwrap();
    cut_off(&mut unkeyed).await;
    match unkeyed.commit().await {
        Err(StoreError::Backend(why)) => assert!(why.contains("may have been applied"), "{why}"),
        other => panic!("an unkeyed commit on a cut connection: {other:?}"),
    }
    // The pool serves the next call on a live connection.
    store.ping().await.unwrap();
}

/// A collection's rows cannot move onto themselves (they would be copied, then deleted with
/// the source): refused, and nothing changes.
async fn rows_cannot_move_onto_their_own_collection(store: Arc<dyn Store>) {
    let c = unique("self-move");
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    tx.append_rows(&c, &[json!(1), json!(2)]).await.unwrap();
    tx.commit().await.unwrap();
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    let refused = tx.move_rows(&c, &c).await.unwrap_err();
    assert!(matches!(refused, StoreError::Invalid(_)), "{refused:?}");
    tx.commit().await.unwrap();
    let mut tx = store.begin(TxMode::Read).await.unwrap();
    assert_eq!(tx.count_rows(&c).await.unwrap(), 2);
    assert_eq!(tx.scan_rows(&c, None, 10).await.unwrap().len(), 2);
}

/// A collection may be named anything, even as a record's key is spelled on some backend
/// (`wharf:r:5:oauth:…` on Redis): its rows and clears touch no record, nor another
/// collection's.
async fn a_collection_named_like_a_record_leaves_records_alone(store: Arc<dyn Store>) {
    let ns = unique("oauth");
    let key = "client";
    let record = wharf::store::NewRecord {
        namespace: &ns,
        key,
        value: "kept",
        owner: None,
        expires_at: None,
    };
    let now = now_millis();
    store
        .write_record(&record, wharf::store::Write::Create, now)
        .await
        .unwrap()
        .expect("written");
    let named = format!("{}:{ns}:{key}", ns.len());
    let other = format!("c:{named}");
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    tx.append_rows(&named, &[json!(1), json!(2)]).await.unwrap();
    tx.append_rows(&other, &[json!("other")]).await.unwrap();
    tx.commit().await.unwrap();
    let read = store.read_record(&ns, key, now).await.unwrap();
    assert_eq!(read.map(|r| r.value).as_deref(), Some("kept"));

    let mut tx = store.begin(TxMode::Write).await.unwrap();
    assert_eq!(tx.count_rows(&other).await.unwrap(), 1);
    assert_eq!(tx.clear_rows(&named).await.unwrap(), 2);
    tx.commit().await.unwrap();
    let read = store.read_record(&ns, key, now).await.unwrap();
    assert_eq!(read.map(|r| r.value).as_deref(), Some("kept"));
    let mut tx = store.begin(TxMode::Read).await.unwrap();
    assert_eq!(tx.scan_rows(&other, None, 10).await.unwrap().len(), 1);
}

/// Clearing a collection while an append to it is in flight leaves it empty and its count
/// at zero: the clear waits for the append's counter, then deletes every row the count
/// said, the appended ones too (PostgreSQL, where the two can overlap).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_clear_beside_an_append_leaves_no_row_uncounted() {
    let store = postgres().await;
    let c = unique("clear-append");
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    tx.append_rows(&c, &[json!("first")]).await.unwrap();
    tx.commit().await.unwrap();
    let mut appending = store.begin(TxMode::Write).await.unwrap();
    appending.append_rows(&c, &[json!("a")]).await.unwrap();
    let pid = pg_backend_pid(&mut appending).await;
    let clearing = tokio::spawn({
        let (store, c) = (Arc::clone(&store), c.clone());
        async move {
            let mut tx = store.begin(TxMode::Write).await.unwrap();
            tx.clear_rows(&c).await.unwrap();
            tx.commit().await.unwrap();
        }
    });
    let observer = pg_observer().await;
    until_pg_blocked_by(&observer, pid, "the clear waits for the append").await;
    appending.commit().await.unwrap();
    clearing.await.unwrap();

    let mut tx = store.begin(TxMode::Read).await.unwrap();
    assert_eq!(tx.count_rows(&c).await.unwrap(), 0);
    assert_eq!(
        tx.scan_rows(&c, None, 10).await.unwrap(),
        Vec::<(i64, Value)>::new(),
        "rows outlived their count"
    );
}

/// Recording a use of a handle does not wait for a transaction that holds the handle's row
/// (a long write that recorded its own use at its start, and commits at its end): that use
/// is about as recent, and a read that has its answer should not wait out the write
/// (PostgreSQL; here the store's lock wait is a second, past which the touch would fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_use_is_recorded_without_waiting_for_a_write_in_flight() {
    let store = postgres_with(Duration::from_secs(1)).await;
    let owner = Principal::new(unique("touch-skip")).unwrap();
    let handle = mint(&store, &owner).await;
    let at = |ms: i64| handle.last_used_at + ms;

    let mut writing = store.begin(TxMode::Write).await.unwrap();
    assert!(
        writing
            .hold_handle(&handle.id, Some(at(1_000)))
            .await
            .unwrap()
    );
    store
        .touch_handle(&handle.id, at(2_000))
        .await
        .expect("the use waited for the write");
    writing.commit().await.unwrap();
    let stored = store.load_handle(&handle.id).await.unwrap().unwrap();
    assert_eq!(stored.last_used_at, at(1_000));

    // With nothing holding it, a later use is recorded.
    store.touch_handle(&handle.id, at(3_000)).await.unwrap();
    let stored = store.load_handle(&handle.id).await.unwrap().unwrap();
    assert_eq!(stored.last_used_at, at(3_000));

    // A running claim under the handle holds its row too, but only against its removal: a
    // use beside it is recorded, not skipped.
    let c = claim(&format!("h:{}", handle.id), &unique("k"), json!({ "n": 1 }));
    let (_, claimed) = store
        .claim_on_handle(&c, &handle.id, owner.id(), now_millis())
        .await
        .unwrap();
    let Some(Begin::Run(claimed)) = claimed else {
        panic!("the claim did not run");
    };
    store.touch_handle(&handle.id, at(4_000)).await.unwrap();
    let stored = store.load_handle(&handle.id).await.unwrap().unwrap();
    assert_eq!(
        stored.last_used_at,
        at(4_000),
        "a use under a claim was skipped"
    );
    drop(claimed);
}

/// Two writes under one handle, each recording a use at its start: the second does not wait
/// for the first's transaction, which holds the handle's row until it commits (it would
/// fail busy past the store's lock wait, here a second). PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_write_recording_a_use_does_not_wait_for_another_in_flight() {
    let store = postgres_with(Duration::from_secs(1)).await;
    let owner = Principal::new(unique("hold-skip")).unwrap();
    let handle = HandleRecord::mint::<Thing>(&owner, now_millis());
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    tx.create_handle(&handle).await.unwrap();
    tx.commit().await.unwrap();
    let at = |ms: i64| handle.last_used_at + ms;

    let mut first = store.begin(TxMode::Write).await.unwrap();
    assert!(
        first
            .hold_handle(&handle.id, Some(at(1_000)))
            .await
            .unwrap()
    );
    let mut second = store.begin(TxMode::Write).await.unwrap();
    let held = second.hold_handle(&handle.id, Some(at(2_000))).await;
    assert!(held.expect("the second write waited for the first"));
    second.commit().await.unwrap();
    first.commit().await.unwrap();
    let stored = store.load_handle(&handle.id).await.unwrap().unwrap();
    assert_eq!(stored.last_used_at, at(1_000));
}
