//! Redis's idempotency claims are leases, and its commits check at the last moment what the
//! SQL stores lock for the whole transaction. Two store instances stand for two replicas.

mod support;

use std::time::Duration;
use wharf_store::Documents;

use redis::AsyncCommands;
use serde_json::{Value, json};
use support::*;
use wharf::store::{Begin, StoreError, TxMode, now_millis};

/// When the stalled holder's late commit comes, relative to the taker's.
#[derive(Clone, Copy, PartialEq)]
enum Late {
    /// After the taker committed (the record is done).
    AfterTheTakerCommitted,
    /// While the taker still runs (the record is running, under the taker's token).
    WhileTheTakerRuns,
}

/// A holder whose lease is no longer renewed (its replica is gone, or cut off from Redis)
/// loses the claim once the lease runs out: another replica takes it over and commits; the
/// stalled holder's late commit is refused and applies nothing; a third attempt replays the
/// second one's result. Every write lands exactly once.
async fn a_stalled_claim_is_taken_over_and_its_late_commit_applies_nothing(late: Late) {
    // The claim's lease is the store's lock_wait.
    let lease = Duration::from_millis(500);
    let (a, b) = (redis_with(lease).await, redis_with(lease).await);
    let rows = unique("rows");
    let docs = unique("docs");
    let c = claim(&unique("h:takeover"), "k", json!({"n": 1}));

    let Begin::Run(mut stalled) = a.begin_idempotent(&c, now_millis()).await.unwrap() else {
        panic!("the first attempt must run")
    };
    stalled
        .backend_tx()
        .downcast_mut::<wharf_store::redis::RedisTx>()
        .expect("a Redis transaction")
        .stop_renewing();
    stalled
        .append_rows(&rows, &[json!("a1"), json!("a2")])
        .await
        .unwrap();
    stalled.put_doc(&docs, "by", &json!("a")).await.unwrap();

    // The stall: A does nothing more until its lease, as the record in Redis states it, is
    // over by the clock the claim script is given.
    let mut raw = raw_redis().await;
    let lease_until: i64 = raw
        .hget(redis_claim_key(&c), "lease_until")
        .await
        .expect("a running claim has a lease");
    wait_until(
        "the first attempt's lease is over",
        lease * 20,
        async || now_millis() > lease_until,
    )
    .await;

    // The taker keeps the record for its own retention, counted from its own start (the
    // first attempt's expiry would drop the taker's result early).
    let taken = wharf::store::Claim {
        expires_at: c.expires_at + 3_600_000,
        ..c.clone()
    };
    let Begin::Run(mut taker) = b.begin_idempotent(&taken, now_millis()).await.unwrap() else {
        panic!("a claim past its lease is taken over")
    };
    let expires: i64 = redis::cmd("PEXPIRETIME")
        .arg(redis_claim_key(&c))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(expires, taken.expires_at, "the taker's retention");
    taker.append_rows(&rows, &[json!("b1")]).await.unwrap();
    taker.put_doc(&docs, "by", &json!("b")).await.unwrap();
    taker.complete_claim(&c, "\"b\"").await.unwrap();
    let running = match late {
        Late::AfterTheTakerCommitted => {
            taker.commit().await.unwrap();
            None
        }
        Late::WhileTheTakerRuns => Some(taker),
    };

    // A wakes up and finishes as if nothing happened.
    stalled.complete_claim(&c, "\"a\"").await.unwrap();
    assert!(
        matches!(stalled.commit().await, Err(StoreError::ClaimLost)),
        "the late commit of a lost claim is refused"
    );
    if let Some(taker) = running {
        taker.commit().await.unwrap();
    }

    match a.begin_idempotent(&c, now_millis()).await.unwrap() {
        Begin::Replay(r) => assert_eq!(r, "\"b\"", "the duplicate gets the taker's result"),
        Begin::Run(_) => panic!("a third attempt ran the write again"),
        Begin::Mismatch => panic!("mismatch"),
    }
    assert_eq!(
        stored_rows(&b, &rows).await,
        vec![json!("b1")],
        "only the taker's rows, once"
    );
    let mut read = b.begin(TxMode::Read).await.unwrap();
    assert_eq!(read.get_doc(&docs, "by").await.unwrap(), Some(json!("b")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_commit_after_the_takers_commit_applies_nothing() {
    a_stalled_claim_is_taken_over_and_its_late_commit_applies_nothing(Late::AfterTheTakerCommitted)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_commit_while_the_taker_runs_applies_nothing() {
    a_stalled_claim_is_taken_over_and_its_late_commit_applies_nothing(Late::WhileTheTakerRuns)
        .await;
}

/// A call that runs three times its claim's lease keeps the claim (the lease is renewed
/// while it runs): a retry sent meanwhile waits instead of taking the write over, and gets
/// the first attempt's result once that commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_call_keeps_its_claim_and_a_retry_waits_then_replays() {
    let lease = Duration::from_millis(300);
    let (a, b) = (
        redis_with(lease).await,
        redis_with(Duration::from_secs(5)).await,
    );
    let rows = unique("rows");
    let c = claim(&unique("h:long"), "k", json!({"n": 1}));
    let Begin::Run(mut long) = a.begin_idempotent(&c, now_millis()).await.unwrap() else {
        panic!("the first attempt must run")
    };
    long.append_rows(&rows, &[json!("once")]).await.unwrap();
    // Three leases of running: without renewal the claim would be anyone's by now.
    tokio::time::sleep(lease * 3).await;
    let retry = tokio::spawn({
        let c = c.clone();
        async move { b.begin_idempotent(&c, now_millis()).await }
    });
    tokio::time::sleep(lease).await;
    assert!(!retry.is_finished(), "the retry waits for the running call");
    long.complete_claim(&c, "\"first\"").await.unwrap();
    long.commit().await.unwrap();
    match retry.await.unwrap().unwrap() {
        Begin::Replay(r) => assert_eq!(r, "\"first\""),
        Begin::Run(_) => panic!("the retry took the write over from a live call"),
        Begin::Mismatch => panic!("mismatch"),
    }
    assert_eq!(stored_rows(&a, &rows).await, vec![json!("once")]);
}

/// A call whose key is taken by an attempt still running, with other arguments, waits for
/// it as on the SQL stores: the attempt fails and leaves nothing, so the call runs; had it
/// completed, the call would be refused for its arguments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_call_under_a_running_key_waits_for_it_whatever_its_arguments() {
    let (a, b) = (
        redis_with(Duration::from_secs(5)).await,
        redis_with(Duration::from_secs(5)).await,
    );
    let scope = unique("h:other-args");
    let first = claim(&scope, "k", json!({"n": 1}));
    let other = claim(&scope, "k", json!({"n": 2}));
    let Begin::Run(running) = a.begin_idempotent(&first, now_millis()).await.unwrap() else {
        panic!("the first attempt must run")
    };
    // Told to wait, the call runs the claim script again: seen in Redis's own log.
    let mut monitor = Monitor::start().await;
    let waiting = tokio::spawn({
        let other = other.clone();
        async move { b.begin_idempotent(&other, now_millis()).await }
    });
    monitor
        .scripts_on(&redis_claim_key(&other), 2, Duration::from_secs(5))
        .await;
    assert!(!waiting.is_finished(), "it waits for the running attempt");
    // The first attempt fails: rolled back, it leaves no record.
    drop(running);
    match waiting.await.unwrap().unwrap() {
        Begin::Run(tx) => drop(tx),
        Begin::Replay(r) => panic!("replayed {r}"),
        Begin::Mismatch => panic!("refused for arguments no record holds"),
    }
}

/// The rows of collection `rows`, as committed.
async fn stored_rows(store: &std::sync::Arc<dyn wharf::store::Store>, rows: &str) -> Vec<Value> {
    let mut read = store.begin(TxMode::Read).await.unwrap();
    read.scan_rows(rows, None, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|(_, v)| v)
        .collect()
}

/// Two calls insert the same absent document; Redis finds out at commit: the later commit
/// is refused with `Conflict` and applies none of its writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_later_of_two_inserts_of_one_document_conflicts_and_applies_nothing() {
    let (a, b) = (
        redis_with(Duration::from_secs(3)).await,
        redis_with(Duration::from_secs(3)).await,
    );
    let docs = unique("docs");
    let rows = unique("rows");
    let mut first = a.begin(TxMode::Write).await.unwrap();
    let mut second = b.begin(TxMode::Write).await.unwrap();
    assert_eq!(
        first.insert_doc(&docs, "k", &json!("first")).await.unwrap(),
        None
    );
    assert_eq!(
        second
            .insert_doc(&docs, "k", &json!("second"))
            .await
            .unwrap(),
        None,
        "neither is committed yet: both see it absent"
    );
    second.append_rows(&rows, &[json!(1)]).await.unwrap();
    second.put_doc(&docs, "other", &json!(2)).await.unwrap();

    first.commit().await.unwrap();
    assert!(
        matches!(second.commit().await, Err(StoreError::Conflict)),
        "the later insert conflicts"
    );
    let mut read = a.begin(TxMode::Read).await.unwrap();
    assert_eq!(
        read.get_doc(&docs, "k").await.unwrap(),
        Some(json!("first"))
    );
    assert_eq!(
        read.get_doc(&docs, "other").await.unwrap(),
        None,
        "none of the conflicting transaction's writes applied"
    );
    assert_eq!(read.count_rows(&rows).await.unwrap(), 0);

    // Once committed, the document is seen and an insert returns it instead of conflicting.
    let mut late = b.begin(TxMode::Write).await.unwrap();
    assert_eq!(
        late.insert_doc(&docs, "k", &json!("late")).await.unwrap(),
        Some(json!("first"))
    );
    late.commit().await.unwrap();
}

/// The command buffer: an app's own commands land with the call's idempotency record, once;
/// a field the app expected unchanged that changed meanwhile makes the commit apply nothing.
#[tokio::test]
async fn queued_commands_land_with_the_claim_or_not_at_all() {
    use wharf_store::redis::RedisTx;
    let store = redis_with(Duration::from_secs(5)).await;
    let mut raw = raw_redis().await;
    let (list, hash) = (unique("app:list"), unique("app:hash"));
    let c = claim(&unique("h:buffer"), "k", json!({"n": 1}));
    let Begin::Run(mut tx) = store.begin_idempotent(&c, now_millis()).await.unwrap() else {
        panic!("the first attempt runs")
    };
    let app = tx.backend_tx().downcast_mut::<RedisTx>().unwrap();
    app.queue(["RPUSH", list.as_str(), "a", "b"]).unwrap();
    app.expect_field(&hash, "v", None);
    app.queue(["HSET", hash.as_str(), "v", "1"]).unwrap();
    let before: Vec<String> = raw.lrange(&list, 0, -1).await.unwrap();
    assert!(before.is_empty(), "nothing lands before the commit");
    tx.complete_claim(&c, "\"done\"").await.unwrap();
    tx.commit().await.unwrap();
    let after: Vec<String> = raw.lrange(&list, 0, -1).await.unwrap();
    assert_eq!(after, ["a", "b"]);
    // The retry replays; the commands do not run again.
    assert!(matches!(
        store.begin_idempotent(&c, now_millis()).await.unwrap(),
        Begin::Replay(r) if r == "\"done\""
    ));

    // Expected "1", but another writer made it "2": nothing of this commit lands.
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    let app = tx.backend_tx().downcast_mut::<RedisTx>().unwrap();
    app.expect_field(&hash, "v", Some("1"));
    app.queue(["RPUSH", list.as_str(), "c"]).unwrap();
    let () = raw.hset(&hash, "v", "2").await.unwrap();
    assert!(matches!(tx.commit().await, Err(StoreError::Conflict)));
    let after: Vec<String> = raw.lrange(&list, 0, -1).await.unwrap();
    assert_eq!(after, ["a", "b"]);

    // Commands a script cannot take are refused when queued.
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    let app = tx.backend_tx().downcast_mut::<RedisTx>().unwrap();
    assert!(app.queue(Vec::<String>::new()).is_err());
    let huge = std::iter::repeat_n("x".to_owned(), RedisTx::MAX_ARGS + 1);
    assert!(app.queue(huge).is_err());
}

/// Redis keeps what a script wrote before a command of it failed. A commit whose queued
/// command Redis refuses half-way (an `INCR` of a key that holds text) keeps the writes
/// before it, so its claim is recorded done with a failed result that says so: the retry
/// answers it, and nothing is applied a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_refused_half_way_is_recorded_and_not_applied_again() {
    let store = redis_with(Duration::from_secs(3)).await;
    let (list, text) = (unique("list"), unique("text"));
    let c = claim(&unique("h:partial"), "k", json!({"n": 1}));
    let attempt = async |store: &std::sync::Arc<dyn wharf::store::Store>| {
        let Begin::Run(mut tx) = store.begin_idempotent(&c, now_millis()).await.unwrap() else {
            return None;
        };
        let redis_tx = tx
            .backend_tx()
            .downcast_mut::<wharf_store::redis::RedisTx>()
            .expect("a Redis transaction");
        redis_tx.queue(["RPUSH", &list, "1"]).unwrap();
        redis_tx.queue(["SET", &text, "x"]).unwrap();
        redis_tx.queue(["INCR", &text]).unwrap();
        tx.complete_claim(&c, r#"{"resultType":"complete","content":[]}"#)
            .await
            .unwrap();
        Some(tx.commit().await)
    };

    let failed = attempt(&store).await.expect("the first attempt runs");
    let Err(StoreError::PartlyApplied(why)) = failed else {
        panic!("not refused half-way: {failed:?}");
    };
    assert!(
        why.contains("part-way") && why.contains("not an integer"),
        "{why}"
    );
    assert!(!why.contains("user_script"), "{why}");
    let mut raw = raw_redis().await;
    let pushed: i64 = raw.llen(&list).await.unwrap();
    assert_eq!(pushed, 1, "the write before the refused one is kept");

    // A retry, however late, answers the recorded failure and writes nothing.
    assert!(attempt(&store).await.is_none(), "the retry ran again");
    let Begin::Replay(stored) = store.begin_idempotent(&c, now_millis()).await.unwrap() else {
        panic!("the failure was not recorded");
    };
    // Found by its owner too, as a call that waited for its turn looks it up.
    assert_eq!(
        store.replay_of(&c, now_millis()).await.unwrap().as_deref(),
        Some(stored.as_str())
    );
    let stored: Value = serde_json::from_str(&stored).unwrap();
    assert_eq!(stored["isError"], true, "{stored}");
    assert_eq!(stored["content"][0]["text"], why.as_str(), "{stored}");
    let pushed: i64 = raw.llen(&list).await.unwrap();
    assert_eq!(pushed, 1, "applied twice");
}

/// A claim whose call was cancelled while Redis ran the claim script (the script ran, its
/// answer was never read) is given back, as a failed call's is: no retry waits out a lease
/// that nobody renews.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_abandoned_in_flight_is_given_back() {
    // A lease far longer than the test waits for anything.
    let store = redis_with(Duration::from_secs(60)).await;
    // The claim script is loaded, so the abandoned attempt's EVALSHA needs no second try.
    let warm = claim(&unique("h:warm"), "k", json!({}));
    drop(store.begin_idempotent(&warm, now_millis()).await.unwrap());
    let mut monitor = Monitor::start().await;

    // Polled once, which sends the script; dropped once Redis ran it, before its answer
    // was read. On a runtime with two threads the answer can come back within that one
    // poll (the connection's task, on the other thread, reads it first): the attempt then
    // simply ran, and the test tries again with another claim.
    let mut abandoned = None;
    for _ in 0..20 {
        use std::future::Future as _;
        let c = claim(&unique("h:abandoned"), "k", json!({"n": 1}));
        let key = redis_claim_key(&c);
        let sent_unread = {
            let mut attempt = std::pin::pin!(store.begin_idempotent(&c, now_millis()));
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            let pending = attempt.as_mut().poll(&mut cx).is_pending();
            if pending {
                monitor.scripts_on(&key, 1, Duration::from_secs(10)).await;
            }
            pending
        };
        if sent_unread {
            abandoned = Some((c, key));
            break;
        }
    }
    let (c, key) = abandoned.expect("every attempt was answered within its first poll");
    // The release.
    monitor.scripts_on(&key, 1, Duration::from_secs(10)).await;
    let Begin::Run(_retry) = store.begin_idempotent(&c, now_millis()).await.unwrap() else {
        panic!("the retry found the abandoned claim");
    };
}

/// A lock wait longer than a deadline can hold (`--lock-wait-secs` at its largest) is cut to
/// what Redis and the clock hold: a claim is made, not a panic.
#[tokio::test]
async fn a_lock_wait_past_what_the_clock_holds_is_cut() {
    let store = redis_with(Duration::MAX).await;
    let c = claim(&unique("h:longwait"), "k", json!({"n": 1}));
    let Begin::Run(tx) = store.begin_idempotent(&c, now_millis()).await.unwrap() else {
        panic!("a first attempt runs")
    };
    drop(tx);
}

/// A Redis that stops answering without closing the connection (a failover that moved its
/// address, a partition) fails the store's commands within seconds, where each waited for
/// the kernel to give up on the connection (about a quarter of an hour), and every call of
/// the replica behind it.
#[tokio::test]
async fn a_redis_that_stops_answering_fails_commands_within_seconds() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    // A proxy in front of the test's Redis that, once `silent`, swallows what it reads in
    // either direction and keeps every connection open.
    let silent = Arc::new(AtomicBool::new(false));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = format!("redis://{}/", listener.local_addr().unwrap());
    let upstream = redis_url()
        .trim_start_matches("redis://")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    {
        let silent = Arc::clone(&silent);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = tokio::net::TcpStream::connect(&upstream).await.unwrap();
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                for (mut from, mut to) in [(client_read, server_write), (server_read, client_write)]
                {
                    let silent = Arc::clone(&silent);
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 16 * 1024];
                        while let Ok(n @ 1..) = from.read(&mut buf).await {
                            if !silent.load(Ordering::SeqCst) {
                                let _ = to.write_all(&buf[..n]).await;
                            }
                        }
                        // Held open: the peer hears no end.
                        std::future::pending::<()>().await;
                        drop(to);
                    });
                }
            }
        });
    }
    let store = wharf_store::open(&proxy, &options(Duration::from_secs(10)))
        .await
        .unwrap();
    store.ping().await.unwrap();
    silent.store(true, Ordering::SeqCst);
    // Bounded only so that a regression fails instead of hanging.
    let answered = tokio::time::timeout(Duration::from_secs(30), store.ping()).await;
    let refused = answered.expect("the command waited on a silent Redis");
    assert!(matches!(refused, Err(StoreError::Busy(_))), "{refused:?}");
}

/// A Redis server of this test's own, on a free port, killed when dropped.
struct OwnRedis {
    child: std::process::Child,
    url: String,
}

impl OwnRedis {
    async fn start() -> Self {
        // Below the range the kernel hands out for outgoing connections (32768 and up on
        // Linux): a reconnect attempt to a port in it, while the server is stopped, may be
        // given that very port as its own and hold it.
        let port = (20_000 + std::process::id() % 10_000..32_000)
            .map(|p| p as u16)
            .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
            .expect("a free port below 32000");
        let url = format!("redis://127.0.0.1:{port}/");
        let child = Self::spawn(&url).await;
        OwnRedis { child, url }
    }

    /// Starts a server at `url`'s port, answering once it says it accepts connections.
    async fn spawn(url: &str) -> std::process::Child {
        use std::io::BufRead as _;
        let port = url.rsplit(':').next().unwrap().trim_end_matches('/');
        let mut child = std::process::Command::new("redis-server")
            .args(["--port", port, "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("redis-server is required for this test (Debian: redis-server)");
        // Its log goes to stdout; the line comes once it listens (or the log ends with it).
        let log = std::io::BufReader::new(child.stdout.take().unwrap());
        let ready = log
            .lines()
            .map_while(Result::ok)
            .any(|line| line.contains("Ready to accept connections"));
        if !ready {
            let _ = child.kill();
            let _ = child.wait();
            panic!("redis-server at {url} did not come up");
        }
        child
    }

    async fn restart(&mut self) {
        self.child = Self::spawn(&self.url).await;
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Redis gone (restarting, failing over): what the store is asked answers "busy, retry"
/// (HTTP 503 with `Retry-After`), not an internal error, and a keyed call's claim alike;
/// and soon, not after the connection manager's reconnect loop (eight minutes with its
/// defaults). Once Redis is back, the store works again.
#[tokio::test]
async fn an_unreachable_redis_is_busy_not_an_internal_error() {
    let mut redis = OwnRedis::start().await;
    let store = wharf_store::open(&redis.url, &options(Duration::from_secs(1)))
        .await
        .unwrap();
    let handle = "hdl_00000000000000000000000000";
    store.load_handle(handle).await.unwrap();
    redis.stop();
    // A hang guard, generous: each answer comes within a few seconds.
    fn waited(what: &str) -> ! {
        panic!("{what} waited for the reconnect loop")
    }
    for _ in 0..3 {
        let read = tokio::time::timeout(Duration::from_secs(60), store.load_handle(handle))
            .await
            .unwrap_or_else(|_| waited("a read"));
        assert!(matches!(read, Err(StoreError::Busy(_))), "{read:?}");
    }
    let c = claim(&unique("p:gone"), "k", json!({"n": 1}));
    let claimed = store.begin_idempotent(&c, now_millis());
    let claimed = tokio::time::timeout(Duration::from_secs(60), claimed)
        .await
        .unwrap_or_else(|_| waited("a claim"));
    assert!(
        matches!(claimed, Err(StoreError::Busy(_))),
        "{:?}",
        claimed.err()
    );

    redis.restart().await;
    // Each command tries to connect again: the first one after the restart gets through.
    let answered = store.load_handle(handle).await;
    assert_eq!(answered.expect("Redis is back"), None);
}
