//! What the store tests share: the real servers, stores opened with a chosen `lock_wait`, and
//! ways to watch what a store's backend itself reports (a line's members in Redis, a blocked
//! session in PostgreSQL, the commands Redis runs), polled with a deadline, so that no test
//! is decided by how long it slept.
#![allow(dead_code)]

/// Runs each named test (an `async fn(Arc<dyn Store>)`) against `super::$backend()`.
#[allow(unused_macros)]
macro_rules! suite {
    ($backend:ident: $($test:ident),* $(,)?) => {
        mod $backend {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(super::$backend().await).await;
                }
            )*
        }
    };
}

/// Runs each named test against SQLite, PostgreSQL and Redis (the test file's `sqlite()`,
/// `postgres()` and `redis()`).
#[allow(unused_macros)]
macro_rules! all_backends {
    ($($test:ident),* $(,)?) => {
        suite!(sqlite: $($test),*);
        suite!(postgres: $($test),*);
        suite!(redis: $($test),*);
    };
}

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::TcpStream;
use wharf::store::{Claim, Store, Transaction};
use wharf_store::{StoreOptions, open};

pub(crate) fn pg_url() -> String {
    std::env::var("WHARF_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

pub(crate) fn redis_url() -> String {
    std::env::var("WHARF_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
}

pub(crate) fn options(lock_wait: Duration) -> StoreOptions {
    let mut options = StoreOptions::default();
    options.max_connections = 8;
    options.lock_wait = lock_wait;
    options
}

pub(crate) async fn postgres_with(lock_wait: Duration) -> Arc<dyn Store> {
    let url = pg_url();
    open(&url, &options(lock_wait))
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {url} is required for these tests: {e}"))
}

pub(crate) async fn redis_with(lock_wait: Duration) -> Arc<dyn Store> {
    let url = redis_url();
    open(&url, &options(lock_wait))
        .await
        .unwrap_or_else(|e| panic!("Redis at {url} is required for these tests: {e}"))
}

/// A SQLite file of its own (`tag` tells tests apart), for tests that hold its write lock.
pub(crate) fn sqlite_url(tag: &str) -> String {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("wharf-store-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    format!("sqlite://{}/store.db", dir.display())
}

pub(crate) async fn sqlite_with(url: &str, lock_wait: Duration) -> Arc<dyn Store> {
    open(url, &options(lock_wait)).await.expect("open SQLite")
}

/// A claim of key `key` in `scope` for a call of "tool" with `args`, kept a minute.
pub(crate) fn claim(scope: &str, key: &str, args: serde_json::Value) -> Claim {
    let serde_json::Value::Object(map) = args else {
        unreachable!("test args are objects")
    };
    Claim {
        scope: scope.to_owned(),
        key: key.to_owned(),
        digest: wharf::store::Digest::of("tool", &map),
        expires_at: wharf::store::now_millis() + 60_000,
        owner: "owner".to_owned(),
    }
}

pub(crate) fn unique(prefix: &str) -> String {
    use std::hash::{BuildHasher, RandomState};
    format!(
        "{prefix}-{:016x}",
        RandomState::new().hash_one(std::time::Instant::now())
    )
}

/// Polls `check` until it holds; fails the test after `within`.
pub(crate) async fn wait_until(what: &str, within: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    loop {
        if check().await {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A plain Redis connection, to read (or change) what the store keeps.
pub(crate) async fn raw_redis() -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis_url())
        .expect("Redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to Redis")
}

/// Redis's clock, in milliseconds (the clock leases are measured by).
pub(crate) async fn redis_now_ms(conn: &mut redis::aio::MultiplexedConnection) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    secs * 1000 + micros / 1000
}

/// Where the Redis store keeps an idempotency record (see `claim_key` in `redis.rs`).
pub(crate) fn redis_claim_key(claim: &Claim) -> String {
    format!(
        "wharf:i:{}:{}:{}",
        claim.scope.len(),
        claim.scope,
        claim.key
    )
}

/// The keys of a mutation line in Redis: the line (a sorted set of tokens, the head holds
/// the key) and the members' deadlines (see `line_keys` in `redis/lock.rs`).
pub(crate) fn redis_line_keys(key: &str) -> (String, String) {
    (
        format!("wharf:m:{key}:line"),
        format!("wharf:m:{key}:alive"),
    )
}

/// The commands Redis runs, as `MONITOR` streams them (one line each).
pub(crate) struct Monitor {
    lines: Lines<BufReader<TcpStream>>,
}

impl Monitor {
    pub(crate) async fn start() -> Self {
        let info = redis::Client::open(redis_url())
            .expect("Redis URL")
            .get_connection_info()
            .clone();
        let redis::ConnectionAddr::Tcp(host, port) = &info.addr else {
            panic!("the tests watch Redis over plain TCP");
        };
        let mut stream = TcpStream::connect((host.as_str(), *port))
            .await
            .expect("connect to Redis");
        let mut commands = Vec::new();
        if let Some(password) = &info.redis.password {
            let user = info
                .redis
                .username
                .clone()
                .unwrap_or_else(|| "default".into());
            commands.push(resp(&["AUTH", &user, password]));
        }
        commands.push(resp(&["MONITOR"]));
        let expected = commands.len();
        for c in commands {
            stream.write_all(&c).await.expect("send to Redis");
        }
        let mut lines = BufReader::new(stream).lines();
        for _ in 0..expected {
            let reply = lines.next_line().await.unwrap().unwrap_or_default();
            assert_eq!(reply, "+OK", "Redis refused MONITOR");
        }
        Monitor { lines }
    }

    /// Waits until `n` script calls (EVAL or EVALSHA) naming `key` have run since the
    /// monitor started.
    pub(crate) async fn scripts_on(&mut self, key: &str, n: usize, within: Duration) {
        let quoted = format!("\"{key}\"");
        let mut seen = 0;
        let deadline = tokio::time::Instant::now() + within;
        while seen < n {
            let line = tokio::time::timeout_at(deadline, self.lines.next_line())
                .await
                .unwrap_or_else(|_| {
                    panic!("Redis ran {seen} of {n} scripts on {key} in {within:?}")
                })
                .expect("read MONITOR")
                .expect("MONITOR ended");
            let script = line.contains("] \"EVALSHA\" ") || line.contains("] \"EVAL\" ");
            if script && line.contains(&quoted) {
                seen += 1;
            }
        }
    }
}

fn resp(parts: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", parts.len()).into_bytes();
    for p in parts {
        out.extend(format!("${}\r\n{p}\r\n", p.len()).into_bytes());
    }
    out
}

/// The PostgreSQL session behind a transaction of the SQL store.
pub(crate) async fn pg_backend_pid(tx: &mut Box<dyn Transaction>) -> i32 {
    let sql = tx
        .backend_tx()
        .downcast_mut::<wharf_store::SqlTx>()
        .and_then(wharf_store::SqlTx::postgres)
        .expect("a PostgreSQL store's transaction");
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut **sql)
        .await
        .expect("pg_backend_pid")
}

/// A pool to look at PostgreSQL's own views (`pg_locks`, `pg_stat_activity`).
pub(crate) async fn pg_observer() -> sqlx::PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&pg_url())
        .await
        .expect("connect to PostgreSQL")
}

/// Waits (10 s at most) until PostgreSQL reports a session blocked by session `pid`: `what`
/// names the wait when the test fails.
pub(crate) async fn until_pg_blocked_by(pool: &sqlx::PgPool, pid: i32, what: &str) {
    wait_until(what, Duration::from_secs(10), async || {
        let blocked: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
        )
        .bind(pid)
        .fetch_one(pool)
        .await
        .expect("pg_stat_activity");
        blocked >= 1
    })
    .await
}

/// Claims `c` for a first run; panics on a replay or a mismatch.
pub(crate) async fn run(store: &Arc<dyn Store>, c: &Claim) -> Box<dyn Transaction> {
    match store
        .begin_idempotent(c, wharf::store::now_millis())
        .await
        .expect("claim")
    {
        wharf::store::Begin::Run(tx) => tx,
        wharf::store::Begin::Replay(r) => panic!("expected a first run, got a replay of {r}"),
        wharf::store::Begin::Mismatch => panic!("expected a first run, got a mismatch"),
    }
}
