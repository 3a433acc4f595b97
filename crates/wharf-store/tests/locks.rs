//! Mutation locks on the stores shared between replicas (PostgreSQL and Redis), each test
//! with two store instances standing for two replicas. SQLite has none: it lives on one
//! host, where the core's in-process line is the lock (tested in the core).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;
use wharf::state::{KeyLock, Store, StoreError, TxMode};
use wharf_store::{StoreOptions, open};

fn options() -> StoreOptions {
    StoreOptions {
        max_connections: 8,
        lock_wait: Duration::from_secs(2),
    }
}

async fn postgres() -> Arc<dyn Store> {
    let url = std::env::var("WHARF_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    open(&url, &options())
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {url} is required for these tests: {e}"))
}

fn redis_url() -> String {
    std::env::var("WHARF_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
}

async fn redis() -> Arc<dyn Store> {
    let url = redis_url();
    open(&url, &options())
        .await
        .unwrap_or_else(|e| panic!("Redis at {url} is required for these tests: {e}"))
}

fn unique_key() -> String {
    use std::hash::{BuildHasher, RandomState};
    format!(
        "test:{:016x}",
        RandomState::new().hash_one(std::time::Instant::now())
    )
}

async fn lock(store: &Arc<dyn Store>, key: &str) -> Box<dyn KeyLock> {
    store
        .lock_key(key)
        .await
        .expect("lock")
        .expect("a shared store has locks")
}

/// Starts a waiter that records when it holds the key, then holds it until told to go.
fn waiter(
    store: &Arc<dyn Store>,
    key: &str,
    order: &Arc<std::sync::Mutex<Vec<usize>>>,
    me: usize,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::oneshot::Sender<()>,
) {
    let (store, key, order) = (Arc::clone(store), key.to_owned(), Arc::clone(order));
    let (go, gone) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let held = lock(&store, &key).await;
        order.lock().unwrap().push(me);
        let _ = gone.await;
        held.release().await;
    });
    (task, go)
}

async fn settle() {
    tokio::time::sleep(Duration::from_millis(150)).await;
}

async fn one_holder_at_a_time_in_arrival_order_across_replicas(
    a: Arc<dyn Store>,
    b: Arc<dyn Store>,
) {
    let key = unique_key();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let first = lock(&a, &key).await;
    let mut waiters = Vec::new();
    for (i, store) in [&b, &a, &b].into_iter().enumerate() {
        waiters.push(waiter(store, &key, &order, i));
        settle().await;
    }
    assert!(
        order.lock().unwrap().is_empty(),
        "nobody holds the key beside the first"
    );
    // Another key is free meanwhile.
    let other = tokio::time::timeout(Duration::from_secs(2), lock(&b, &unique_key()))
        .await
        .expect("other keys are not held up");
    other.release().await;
    first.release().await;
    for (i, (task, go)) in waiters.into_iter().enumerate() {
        settle().await;
        assert_eq!(
            *order.lock().unwrap(),
            (0..=i).collect::<Vec<_>>(),
            "waiter {i} holds the key, alone and in turn"
        );
        go.send(()).unwrap();
        task.await.unwrap();
    }
}

async fn a_cancelled_waiter_never_holds_the_key(a: Arc<dyn Store>, b: Arc<dyn Store>) {
    let key = unique_key();
    let first = lock(&a, &key).await;
    let held = Arc::new(AtomicUsize::new(0));
    let cancelled = {
        let (b, key, held) = (Arc::clone(&b), key.clone(), Arc::clone(&held));
        tokio::spawn(async move {
            let _lock = lock(&b, &key).await;
            held.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<()>().await;
        })
    };
    settle().await;
    cancelled.abort();
    assert!(cancelled.await.unwrap_err().is_cancelled());
    settle().await;
    first.release().await;
    // Had the cancelled waiter taken the key, this would wait for ever.
    let next = tokio::time::timeout(Duration::from_secs(3), lock(&a, &key))
        .await
        .expect("the key goes past the cancelled waiter");
    assert_eq!(held.load(Ordering::SeqCst), 0);
    next.release().await;
}

async fn a_holder_dropped_without_release_frees_the_key(a: Arc<dyn Store>, b: Arc<dyn Store>) {
    let key = unique_key();
    let first = lock(&a, &key).await;
    drop(first);
    let next = tokio::time::timeout(Duration::from_secs(3), lock(&b, &key))
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
    a_cancelled_waiter_never_holds_the_key,
    a_holder_dropped_without_release_frees_the_key,
);

#[tokio::test]
async fn sqlite_relies_on_the_in_process_line() {
    let dir = std::env::temp_dir().join(format!("wharf-locks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = open(&format!("sqlite://{}/s.db", dir.display()), &options())
        .await
        .unwrap();
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
    let client = ::redis::Client::open(redis_url()).unwrap();
    let mut raw = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = ::redis::cmd("HSET")
        .arg(format!("wharf:m:{key}:alive"))
        .arg(fence.token)
        .arg(0)
        .query_async(&mut raw)
        .await
        .unwrap();
    let next = tokio::time::timeout(Duration::from_secs(3), lock(&b, &key))
        .await
        .expect("the next waiter takes over a lapsed lease");
    assert!(next.fence().unwrap().token > fence.token, "tokens increase");

    let doc = unique_key();
    let mut late = a.begin(TxMode::Write).await.unwrap();
    late.fence(&fence);
    late.put_doc("fenced", &doc, &json!(1)).await.unwrap();
    assert!(matches!(late.commit().await, Err(StoreError::LeaseLost)));
    let mut read = b.begin(TxMode::Read).await.unwrap();
    assert_eq!(
        read.get_doc("fenced", &doc).await.unwrap(),
        None,
        "nothing applied"
    );

    // The live holder's writes go through.
    let mut live = b.begin(TxMode::Write).await.unwrap();
    live.fence(&next.fence().unwrap());
    live.put_doc("fenced", &doc, &json!(2)).await.unwrap();
    live.commit().await.unwrap();
    next.release().await;
    stalled.release().await;
}

/// PostgreSQL: an abandoned wait leaves PostgreSQL's lock queue while the key is still held
/// (its session is closed and the backend notices), instead of lingering until its turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_abandoned_wait_leaves_the_queue_at_once() {
    let (a, b) = (postgres().await, postgres().await);
    let key = unique_key();
    let holder = lock(&a, &key).await;
    let waiter = {
        let (b, key) = (Arc::clone(&b), key.clone());
        tokio::spawn(async move {
            let _lock = lock(&b, &key).await;
        })
    };
    let url = std::env::var("WHARF_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&url).await.unwrap();
    let waiting = || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
             AND ((classid::bigint << 32) | objid::bigint) = hashtextextended($1, 1)",
        )
        .bind(&key)
        .fetch_one(&pool)
        .await
        .unwrap();
        n
    };
    let mut n = 0;
    for _ in 0..40 {
        n = waiting().await;
        if n == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(n, 1, "the waiter queues in PostgreSQL");
    waiter.abort();
    let _ = waiter.await;
    for _ in 0..80 {
        n = waiting().await;
        if n == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        n, 0,
        "the abandoned wait left the queue while the key was held"
    );
    holder.release().await;
}
