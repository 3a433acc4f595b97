//! Mutation locks on the stores shared between replicas (PostgreSQL and Redis), each test
//! with two store instances standing for two replicas. SQLite has none: it lives on one
//! host, where the core's in-process line is the lock (tested in the core).
//!
//! Who holds and who waits is read from the backend itself (Redis's line, PostgreSQL's
//! `pg_locks`), polled with a deadline; leases are a minute long unless a test is about
//! leases, so nothing passes because one ran out.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use wharf_store::Documents;

use ::redis::AsyncCommands;
use serde_json::json;
use support::*;
use wharf::store::{Begin, Fence, KeyLock, Store, StoreError, TxMode, now_millis};
use wharf_store::open;

/// A lease (Redis) far longer than any test here: none passes because a lease ran out.
const LONG: Duration = Duration::from_secs(60);
/// How long the tests wait for something the store is about to do.
const SOON: Duration = Duration::from_secs(10);

async fn postgres() -> Arc<dyn Store> {
    postgres_with(LONG).await
}

async fn redis() -> Arc<dyn Store> {
    redis_with(LONG).await
}

fn unique_key() -> String {
    unique("test")
}

async fn lock(store: &Arc<dyn Store>, key: &str) -> Box<dyn KeyLock> {
    store
        .lock_key(key)
        .await
        .expect("lock")
        .expect("a shared store has locks")
}

/// The line of one key as the backend itself reports it: Redis's sorted set of members
/// (the head holds the key), PostgreSQL's `pg_locks` rows (granted or waiting).
enum Line {
    Redis(::redis::aio::MultiplexedConnection, (String, String)),
    Postgres(sqlx::PgPool, String),
}

impl Line {
    async fn of(store: &Arc<dyn Store>, key: &str) -> Self {
        match store.backend() {
            "redis" => Line::Redis(raw_redis().await, redis_line_keys(key)),
            "postgres" => Line::Postgres(pg_observer().await, key.to_owned()),
            other => panic!("{other} has no shared lines"),
        }
    }

    /// The holder and the waiters.
    async fn members(&mut self) -> i64 {
        match self {
            Line::Redis(conn, (line, _)) => conn.zcard(&*line).await.expect("ZCARD"),
            Line::Postgres(pool, key) => sqlx::query_scalar(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
                 AND ((classid::bigint << 32) | objid::bigint) = hashtextextended($1, 1)",
            )
            .bind(&*key)
            .fetch_one(&*pool)
            .await
            .expect("pg_locks"),
        }
    }

    /// Waits until the line has `n` members.
    async fn until_members(&mut self, n: i64, what: &str) {
        wait_until(what, SOON, async || self.members().await == n).await;
    }

    /// Waits until the last to join the line is waiting in it. On Redis a member joins by
    /// one script and then polls its place: until its first poll renews its deadline, its
    /// process may not have its token yet. (A wait cancelled in that round trip leaves a
    /// place nobody can leave, which lapses with its deadline: another case, not tested
    /// here.) On PostgreSQL the session that waits is the member.
    async fn until_last_polls(&mut self) {
        let Line::Redis(conn, (line, alive)) = self else {
            return;
        };
        let last: Vec<u64> = conn.zrange(&*line, -1, -1).await.expect("ZRANGE");
        let last = *last.first().expect("a member");
        let joined: i64 = conn.hget(&*alive, last).await.expect("HGET");
        wait_until("the last member polls its place", SOON, async || {
            conn.hget::<_, _, i64>(&*alive, last).await.expect("HGET") != joined
        })
        .await;
    }
}

/// Counts the holders of a key at any moment, and the most there ever were.
#[derive(Default)]
struct Holders {
    now: AtomicUsize,
    most: AtomicUsize,
}

impl Holders {
    fn enter(&self) {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(n, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Starts a waiter that records when it holds the key, then holds it until told to go.
fn waiter(
    store: &Arc<dyn Store>,
    key: &str,
    order: &Arc<std::sync::Mutex<Vec<usize>>>,
    holders: &Arc<Holders>,
    me: usize,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::oneshot::Sender<()>,
) {
    let (store, key, order, holders) = (
        Arc::clone(store),
        key.to_owned(),
        Arc::clone(order),
        Arc::clone(holders),
    );
    let (go, gone) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let held = lock(&store, &key).await;
        holders.enter();
        order.lock().unwrap().push(me);
        let _ = gone.await;
        holders.leave();
        held.release().await;
    });
    (task, go)
}

async fn one_holder_at_a_time_in_arrival_order_across_replicas(
    a: Arc<dyn Store>,
    b: Arc<dyn Store>,
) {
    let key = unique_key();
    let mut line = Line::of(&a, &key).await;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let holders = Arc::new(Holders::default());
    let first = lock(&a, &key).await;
    holders.enter();
    let mut waiters = Vec::new();
    for (i, store) in [&b, &a, &b].into_iter().enumerate() {
        waiters.push(waiter(store, &key, &order, &holders, i));
        // The next one arrives only once the store has this one in line.
        line.until_members(i as i64 + 2, "the waiter is in line")
            .await;
    }
    assert!(
        order.lock().unwrap().is_empty(),
        "nobody holds the key beside the first"
    );
    // Another key is free meanwhile.
    let other = tokio::time::timeout(SOON, lock(&b, &unique_key()))
        .await
        .expect("other keys are not held up");
    other.release().await;
    holders.leave();
    first.release().await;
    for (i, (task, go)) in waiters.into_iter().enumerate() {
        wait_until("the next waiter holds the key", SOON, async || {
            order.lock().unwrap().len() > i
        })
        .await;
        assert_eq!(
            *order.lock().unwrap(),
            (0..=i).collect::<Vec<_>>(),
            "waiter {i} holds the key, in turn"
        );
        go.send(()).unwrap();
        task.await.unwrap();
    }
    assert_eq!(
        holders.most.load(Ordering::SeqCst),
        1,
        "never two holders at once"
    );
    line.until_members(0, "the line is empty").await;
}

/// A waiter whose call is cancelled leaves the line at once, while the key is still held:
/// the holder's lease is a minute long and heads the line, so nothing but the waiter's own
/// leaving (Redis) or its closed session (PostgreSQL) can take its place out.
async fn a_cancelled_waiter_leaves_the_line_and_never_holds_the_key(
    a: Arc<dyn Store>,
    b: Arc<dyn Store>,
) {
    let key = unique_key();
    let mut line = Line::of(&a, &key).await;
    let first = lock(&a, &key).await;
    let cancelled = {
        let (b, key) = (Arc::clone(&b), key.clone());
        tokio::spawn(async move {
            let _lock = lock(&b, &key).await;
            std::future::pending::<()>().await;
        })
    };
    line.until_members(2, "the waiter is in line").await;
    line.until_last_polls().await;
    cancelled.abort();
    assert!(cancelled.await.unwrap_err().is_cancelled());
    line.until_members(
        1,
        "the cancelled waiter left the line while the key was held",
    )
    .await;
    first.release().await;
    let next = tokio::time::timeout(SOON, lock(&a, &key))
        .await
        .expect("the key goes past the cancelled waiter");
    next.release().await;
}

/// A holder dropped without `release` (its call's future was dropped) gives the key up at
/// once, not when its minute-long lease runs out.
async fn a_holder_dropped_without_release_frees_the_key(a: Arc<dyn Store>, b: Arc<dyn Store>) {
    let key = unique_key();
    let mut line = Line::of(&a, &key).await;
    let first = lock(&a, &key).await;
    line.until_members(1, "the holder is in line").await;
    drop(first);
    line.until_members(0, "the dropped holder left the line")
        .await;
    let next = tokio::time::timeout(SOON, lock(&b, &key))
        .await
        .expect("a dropped holder lets go");
    next.release().await;
}

macro_rules! shared_backends {
    ($($test:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(super::postgres().await, super::postgres().await).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(super::redis().await, super::redis().await).await;
                }
            )*
        }
    };
}

shared_backends!(
    one_holder_at_a_time_in_arrival_order_across_replicas,
    a_cancelled_waiter_leaves_the_line_and_never_holds_the_key,
    a_holder_dropped_without_release_frees_the_key,
);

#[tokio::test]
async fn sqlite_relies_on_the_in_process_line() {
    let store = open(&sqlite_url("locks"), &options(LONG)).await.unwrap();
    assert!(store.lock_key("k").await.unwrap().is_none());
}

/// A holder that stalls past its lease loses the key, and its writes are refused at commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_refuses_the_writes_of_a_holder_whose_lease_ran_out() {
    let (a, b) = (redis().await, redis().await);
    let key = unique_key();
    let stalled = lock(&a, &key).await;
    let fence = stalled.fence().expect("Redis locks are fenced");
    // The stall, as the rest of the deployment sees it: the holder's deadline passes.
    let mut raw = raw_redis().await;
    let _: () = ::redis::cmd("HSET")
        .arg(redis_line_keys(&key).1)
        .arg(fence.token)
        .arg(0)
        .query_async(&mut raw)
        .await
        .unwrap();
    another_takes_over((&a, stalled), &b, &key, Duration::from_secs(3)).await;
}

/// A line that lapsed while its holder was cut off from Redis (its keys expire once idle)
/// hands the next holder a token of its own, never the stalled holder's: the stalled
/// holder's writes are refused when it comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_never_hands_a_token_out_twice_after_a_line_lapses() {
    let (a, b) = (redis().await, redis().await);
    let key = unique_key();
    let stalled = lock(&a, &key).await;
    let fence = stalled.fence().expect("Redis locks are fenced");
    // The lapse: every key of the line expires (`:next` is where an earlier release kept
    // its per-line counter).
    let (line, alive) = redis_line_keys(&key);
    let mut raw = raw_redis().await;
    let _: () = ::redis::cmd("DEL")
        .arg(&line)
        .arg(&alive)
        .arg(format!("wharf:m:{key}:next"))
        .query_async(&mut raw)
        .await
        .unwrap();
    let next = tokio::time::timeout(Duration::from_secs(3), lock(&b, &key))
        .await
        .expect("the key is free once its line lapsed");
    only_the_live_holder_commits((&a, &fence), (&b, &next.fence().unwrap())).await;
    next.release().await;
    stalled.release().await;
}

/// The writes of the holder that lost its key (`late`) are refused at commit and leave
/// nothing; the live holder's go through.
async fn only_the_live_holder_commits(
    (late_store, late_fence): (&Arc<dyn Store>, &Fence),
    (live_store, live_fence): (&Arc<dyn Store>, &Fence),
) {
    assert_ne!(
        live_fence.token, late_fence.token,
        "each holder has its own token"
    );
    let doc = unique_key();
    let mut late = late_store.begin(TxMode::Write).await.unwrap();
    late.fence(late_fence);
    late.put_doc("fenced", &doc, &json!(1)).await.unwrap();
    assert!(matches!(late.commit().await, Err(StoreError::LeaseLost)));
    let mut read = live_store.begin(TxMode::Read).await.unwrap();
    assert_eq!(
        read.get_doc("fenced", &doc).await.unwrap(),
        None,
        "nothing applied"
    );

    // A claimed write (an idempotent call) is refused too, whichever step finds the key lost
    // (PostgreSQL checks the fence in the statement that records the result), and leaves
    // nothing.
    let late_claim = claim("fenced", &unique_key(), json!({}));
    let mut late = run(late_store, &late_claim).await;
    late.fence(late_fence);
    late.put_doc("fenced", &doc, &json!(3)).await.unwrap();
    let refused = match late.complete_claim(&late_claim, "\"late\"").await {
        Ok(()) => late.commit().await,
        // Dropped, as the core drops a call's transaction that failed: rolled back.
        Err(e) => {
            drop(late);
            Err(e)
        }
    };
    assert!(matches!(refused, Err(StoreError::LeaseLost)), "{refused:?}");
    let mut read = live_store.begin(TxMode::Read).await.unwrap();
    assert_eq!(read.get_doc("fenced", &doc).await.unwrap(), None);

    let mut live = live_store.begin(TxMode::Write).await.unwrap();
    live.fence(live_fence);
    live.put_doc("fenced", &doc, &json!(2)).await.unwrap();
    live.commit().await.unwrap();
    let mut read = live_store.begin(TxMode::Read).await.unwrap();
    assert_eq!(read.get_doc("fenced", &doc).await.unwrap(), Some(json!(2)));

    // The live holder's claimed write commits, and its result is what a retry replays.
    let live_claim = claim("fenced", &unique_key(), json!({}));
    let mut live = run(live_store, &live_claim).await;
    live.fence(live_fence);
    live.put_doc("fenced", &doc, &json!(4)).await.unwrap();
    live.complete_claim(&live_claim, "\"live\"").await.unwrap();
    live.commit().await.unwrap();
    match live_store
        .begin_idempotent(&live_claim, now_millis())
        .await
        .unwrap()
    {
        Begin::Replay(result) => assert_eq!(result, "\"live\""),
        _ => panic!("the claimed write was not recorded"),
    }
    let mut read = live_store.begin(TxMode::Read).await.unwrap();
    assert_eq!(read.get_doc("fenced", &doc).await.unwrap(), Some(json!(4)));
}

/// A holder whose session ended while its call ran (a network cut, a restart, an
/// administrator's `pg_terminate_backend`) lost its advisory lock with it: once another
/// replica took the key, the first one's writes are refused at commit, and the new holder's
/// go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refuses_the_writes_of_a_holder_whose_session_ended() {
    let (a, b) = (postgres().await, postgres().await);
    let key = unique_key();
    let cut = lock(&a, &key).await;
    end_the_holders_session(&pg_observer().await, &key).await;
    another_takes_over((&a, cut), &b, &key, SOON).await;
}

/// A lock taken just before PostgreSQL crashed may not have reached its disk (lock sessions
/// commit without flushing the log): after the restart the key's fence holds the token from
/// before it, and the token sequence is back where it was. The holder whose lock the crash
/// took still runs on its replica; once another replica took the key, the first one's
/// writes are refused at commit all the same. With tokens from the sequence the new holder
/// was handed the lost token again, and both committed under the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refuses_the_writes_of_a_holder_whose_lock_a_crash_lost() {
    let (a, b) = (postgres().await, postgres().await);
    let key = unique_key();
    lock(&a, &key).await.release().await;
    let observer = pg_observer().await;
    let fence_row = "SELECT token FROM wharf_lock_fences WHERE lock = hashtextextended($1, 1)";
    let before: i64 = sqlx::query_scalar(fence_row)
        .bind(&key)
        .fetch_one(&observer)
        .await
        .expect("the key's fence");
    let cut = lock(&a, &key).await;
    let fence = cut.fence().expect("PostgreSQL locks are fenced");
    let lost = i64::try_from(fence.token).expect("a bigint token");
    // The crash: the holder's session ends, the fence row is back to the token before, and
    // the sequence hands out the lost token next.
    end_the_holders_session(&observer, &key).await;
    sqlx::query("UPDATE wharf_lock_fences SET token = $2 WHERE lock = hashtextextended($1, 1)")
        .bind(&key)
        .bind(before)
        .execute(&observer)
        .await
        .expect("the fence as the crash left it");
    sqlx::query("SELECT setval('wharf_lock_tokens', $1, false)")
        .bind(lost)
        .execute(&observer)
        .await
        .expect("the sequence as the crash left it");
    another_takes_over((&a, cut), &b, &key, SOON).await;
}

/// `live` takes `key` (within `within`) from `late`'s holder, which lost it: only the live
/// holder's writes commit. Both let the key go after.
async fn another_takes_over(
    (late_store, late): (&Arc<dyn Store>, Box<dyn KeyLock>),
    live_store: &Arc<dyn Store>,
    key: &str,
    within: Duration,
) {
    let next = tokio::time::timeout(within, lock(live_store, key))
        .await
        .expect("the key is taken over once its holder lost it");
    let (late_fence, live_fence) = (late.fence().unwrap(), next.fence().unwrap());
    only_the_live_holder_commits((late_store, &late_fence), (live_store, &live_fence)).await;
    next.release().await;
    late.release().await;
}

/// Ends the session that holds `key`'s advisory lock, as a network cut or a restart would.
async fn end_the_holders_session(observer: &sqlx::PgPool, key: &str) {
    let ended: bool = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted \
         AND ((classid::bigint << 32) | objid::bigint) = hashtextextended($1, 1)",
    )
    .bind(key)
    .fetch_one(observer)
    .await
    .expect("the holder's session");
    assert!(ended, "the holder's session was ended");
}

/// The sweep forgets the fences of keys nobody locked for a week, and keeps the others.
#[tokio::test]
async fn postgres_sweeps_the_fences_of_keys_idle_for_a_week() {
    let store = postgres().await;
    let (idle, fresh) = (unique_key(), unique_key());
    for key in [&idle, &fresh] {
        lock(&store, key).await.release().await;
    }
    let observer = pg_observer().await;
    let fences = async |key: &str| -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM wharf_lock_fences WHERE lock = hashtextextended($1, 1)",
        )
        .bind(key)
        .fetch_one(&observer)
        .await
        .expect("wharf_lock_fences")
    };
    assert_eq!((fences(&idle).await, fences(&fresh).await), (1, 1));
    sqlx::query(
        "UPDATE wharf_lock_fences SET locked_at = locked_at - 8 * 86400000 \
         WHERE lock = hashtextextended($1, 1)",
    )
    .bind(&idle)
    .execute(&observer)
    .await
    .expect("backdate a fence");
    store
        .sweep(wharf::store::now_millis(), 10_000)
        .await
        .unwrap();
    assert_eq!(fences(&idle).await, 0, "idle for over a week");
    assert_eq!(fences(&fresh).await, 1, "locked just now");
}

/// Taking a key moves its fence's `locked_at` on once it is an hour old, not at every lock
/// (so the row is updated in place), and a key taken again after a week idle is not
/// forgotten by the sweep.
#[tokio::test]
async fn postgres_a_key_in_use_keeps_its_fence() {
    let store = postgres().await;
    let key = unique_key();
    lock(&store, &key).await.release().await;
    let observer = pg_observer().await;
    let backdate = async |by_ms: i64| -> i64 {
        sqlx::query_scalar(
            "UPDATE wharf_lock_fences SET locked_at = locked_at - $2 \
             WHERE lock = hashtextextended($1, 1) RETURNING locked_at",
        )
        .bind(&key)
        .bind(by_ms)
        .fetch_one(&observer)
        .await
        .expect("backdate the fence")
    };
    let locked_at = async || -> i64 {
        sqlx::query_scalar(
            "SELECT locked_at FROM wharf_lock_fences WHERE lock = hashtextextended($1, 1)",
        )
        .bind(&key)
        .fetch_one(&observer)
        .await
        .expect("the key's fence")
    };

    let recent = backdate(60_000).await;
    lock(&store, &key).await.release().await;
    assert_eq!(locked_at().await, recent, "a minute old: left as it was");

    let stale = backdate(8 * 86_400_000).await;
    let held = lock(&store, &key).await;
    assert!(
        locked_at().await > stale + 86_400_000,
        "a week old: moved on"
    );
    let moved = locked_at().await;
    store
        .sweep(wharf::store::now_millis(), 10_000)
        .await
        .unwrap();
    assert_eq!(locked_at().await, moved, "kept by the sweep");
    held.release().await;
}

/// A holder keeps its key for as long as it holds it, far past one lease: its lease is
/// renewed every third of it, so another replica's waiter never takes the key over, and the
/// holder's fenced commit still goes through after four lease lengths.
///
/// Margins: a renewal may come up to two thirds of a lease (600 ms here) late before the
/// lease runs out, which is far more than a loaded runner delays a timer or a round trip to
/// a local Redis. The time that passes is read from Redis's clock, which leases are measured
/// by; nothing is decided by how long the test slept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_renews_the_lease_of_a_holder_that_keeps_its_key() {
    const LEASE: Duration = Duration::from_millis(900);
    let lease_ms = LEASE.as_millis() as i64;
    let (a, b) = (redis_with(LEASE).await, redis_with(LEASE).await);
    let key = unique_key();
    let (line, alive) = redis_line_keys(&key);
    let mut raw = raw_redis().await;

    let held = lock(&a, &key).await;
    let fence = held.fence().expect("Redis locks are fenced");
    let first_deadline: i64 = raw.hget(&alive, fence.token).await.unwrap();
    let contender = {
        let (b, key) = (Arc::clone(&b), key.clone());
        tokio::spawn(async move { lock(&b, &key).await })
    };
    wait_until("the other replica waits in line", SOON, async || {
        raw.zcard::<_, i64>(&line).await.unwrap() == 2
    })
    .await;

    // Four lease lengths after the key was taken: the first lease ran out three lease
    // lengths ago, unless it was renewed.
    let until = first_deadline + 3 * lease_ms;
    wait_until("four lease lengths have passed", 10 * SOON, async || {
        redis_now_ms(&mut raw).await > until
    })
    .await;
    assert!(
        !contender.is_finished(),
        "another replica took the key from its live holder"
    );
    let head: Vec<u64> = raw.zrange(&line, 0, 0).await.unwrap();
    assert_eq!(head, vec![fence.token], "the holder still heads the line");
    let deadline: i64 = raw.hget(&alive, fence.token).await.unwrap();
    assert!(deadline > until, "the holder's lease was renewed");

    let doc = unique_key();
    let mut tx = a.begin(TxMode::Write).await.unwrap();
    tx.fence(&fence);
    tx.put_doc("fenced", &doc, &json!("kept")).await.unwrap();
    tx.commit()
        .await
        .expect("the holder's fenced commit goes through after four lease lengths");
    let mut read = b.begin(TxMode::Read).await.unwrap();
    assert_eq!(
        read.get_doc("fenced", &doc).await.unwrap(),
        Some(json!("kept"))
    );

    held.release().await;
    let next = tokio::time::timeout(SOON, contender)
        .await
        .expect("the waiter holds the key once it is released")
        .unwrap();
    assert!(next.fence().unwrap().token > fence.token, "tokens increase");
    next.release().await;
}

/// A runtime that shuts down while its tasks hold or wait for Redis keys (a server that
/// stops) drops those tasks; their places in line are left to lapse, and nothing else
/// happens: in particular no drop tries, over and over, to spawn its leaving on a runtime
/// that no longer runs anything.
#[test]
fn a_runtime_shut_down_with_keys_held_and_awaited_exits_cleanly() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let key = unique_key();
    runtime.block_on(async {
        let (a, b) = (redis().await, redis().await);
        let mut line = Line::of(&a, &key).await;
        let held = lock(&a, &key).await;
        tokio::spawn(async move {
            let _held = held;
            std::future::pending::<()>().await;
        });
        let waiting = Arc::clone(&b);
        let key = key.clone();
        tokio::spawn(async move {
            let _lock = lock(&waiting, &key).await;
        });
        line.until_members(2, "the waiter is in line").await;
    });
    drop(runtime);
}
