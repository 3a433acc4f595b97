//! A tool's own execution limits, in-process: `tool(..).max_concurrency(n)` runs at most `n`
//! calls at once and queues the rest in the server's queue (refusing beyond it; a cap of 0,
//! or of more than a cap can count, fails the build, as the server's caps do), and
//! `tool(..).timeout(limit)` stops a call past its limit, dropping the handler's future.
//! Time is paused: tokio advances it only when every task waits, so nothing here depends on
//! how fast the machine is.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::Semaphore;
use wharf::protocol::Implementation;
use wharf::testing::Harness;
use wharf::{Context, ErrorKind, NoArgs, Principal, RpcError, Server, ServerConfig, tool};

/// Calls tool `name` the way a transport does: admitted (a slot first), then run.
async fn run(server: &Server, name: &str) -> Result<String, RpcError> {
    run_with(server, name, json!({})).await
}

async fn run_with(server: &Server, name: &str, arguments: Value) -> Result<String, RpcError> {
    Harness::new(server.clone())
        .call(
            "tools/call",
            json!({ "name": name, "arguments": arguments }),
        )
        .await
        .map(|result| result.to_string())
        .map_err(|e| e.error().clone())
}

/// Lets every task that can run, run (a bounded number of turns, so a test never hangs).
async fn settle() {
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
}

/// Waits until `counter` reaches `n`, letting the other tasks run.
async fn until(counter: &AtomicUsize, n: usize) {
    while counter.load(Ordering::SeqCst) < n {
        tokio::task::yield_now().await;
    }
}

/// A handler that counts its start in `started`, then waits for a permit of `gate`.
fn gated(
    started: &Arc<AtomicUsize>,
    gate: &Arc<Semaphore>,
) -> impl Fn(Context, NoArgs) -> std::pin::Pin<Box<dyn Future<Output = &'static str> + Send>>
+ Send
+ Sync
+ 'static {
    let (started, gate) = (Arc::clone(started), Arc::clone(gate));
    move |_cx, _| {
        let (started, gate) = (Arc::clone(&started), Arc::clone(&gate));
        Box::pin(async move {
            started.fetch_add(1, Ordering::SeqCst);
            gate.acquire().await.unwrap().forget();
            "done"
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_tool_runs_at_most_its_concurrency_and_queues_the_rest() {
    let started = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Semaphore::new(0));
    let handler = gated(&started, &gate);
    let server = Arc::new(
        Server::builder(Implementation::new("t", "1"))
            .tool(tool("narrow").max_concurrency(1).handler(handler))
            .tool(tool("other").handler(|_cx: Context, _: NoArgs| async { "other" }))
            .config({
                let mut config = ServerConfig::default();
                config.limits.max_in_flight = None;
                config.limits.max_queue = 1;
                config.limits.per_principal = None;
                config
            })
            .build()
            .unwrap(),
    );
    let spawn = |_id: i64| {
        let server = Arc::clone(&server);
        tokio::spawn(async move { run(&server, "narrow").await })
    };
    let first = spawn(1);
    until(&started, 1).await;
    let second = spawn(2);
    // On this single-threaded runtime, one yield lets the second call run until it waits in
    // the queue; with the queue's one place taken, a third is refused at once.
    tokio::task::yield_now().await;
    let third = run(&server, "narrow").await.unwrap_err();
    assert_eq!(third.kind, ErrorKind::RetryLater);
    assert!(third.message.contains("queue is full"), "{}", third.message);
    assert!(third.message.contains("retry"), "{}", third.message);
    assert_eq!(started.load(Ordering::SeqCst), 1, "one call at a time");
    // Other tools are not held up by this tool's cap.
    assert!(run(&server, "other").await.unwrap().contains("\"other\""));

    gate.add_permits(1);
    assert!(first.await.unwrap().unwrap().contains("\"done\""));
    until(&started, 2).await;
    gate.add_permits(1);
    assert!(second.await.unwrap().unwrap().contains("\"done\""));
    assert_eq!(started.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn by_default_a_call_beyond_a_tools_cap_is_refused_at_once() {
    let started = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Semaphore::new(0));
    let server = Arc::new(
        Server::builder(Implementation::new("t", "1"))
            .tool(
                tool("narrow")
                    .max_concurrency(1)
                    .handler(gated(&started, &gate)),
            )
            .build()
            .unwrap(),
    );
    let first = {
        let server = Arc::clone(&server);
        tokio::spawn(async move { run(&server, "narrow").await })
    };
    until(&started, 1).await;
    // The server's queue holds nothing by default: no waiting.
    let second = run(&server, "narrow").await.unwrap_err();
    assert_eq!(second.kind, ErrorKind::RetryLater, "{}", second.message);
    gate.add_permits(1);
    assert!(first.await.unwrap().unwrap().contains("\"done\""));
}

#[test]
fn a_cap_of_zero_or_beyond_counting_fails_the_build() {
    let build = |cap: usize, config: ServerConfig| {
        Server::builder(Implementation::new("t", "1"))
            .tool(
                tool("t")
                    .max_concurrency(cap)
                    .handler(|_cx: Context, _: NoArgs| async { "x" }),
            )
            .config(config)
            .build()
    };
    let huge = usize::MAX;
    for cap in [0, huge] {
        let e = build(cap, ServerConfig::default()).err().unwrap();
        assert!(
            e.to_string().starts_with(&format!(
                "tool \"t\": max_concurrency is {cap}: a cap must be from 1 to "
            )),
            "{e}"
        );
    }
    type Set = fn(&mut ServerConfig, usize);
    let caps: [(&str, Set); 5] = [
        ("limits.max_in_flight", |c, n| {
            c.limits.max_in_flight = Some(n)
        }),
        ("limits.per_principal", |c, n| {
            c.limits.per_principal = Some(n)
        }),
        ("limits.max_listen_streams", |c, n| {
            c.limits.max_listen_streams = Some(n)
        }),
        ("limits.listen_per_principal", |c, n| {
            c.limits.listen_per_principal = Some(n)
        }),
        ("max_store_locks_per_principal", |c, n| {
            c.max_store_locks_per_principal = n
        }),
    ];
    for (what, set) in caps {
        for value in [0, huge] {
            let mut config = ServerConfig::default();
            set(&mut config, value);
            // Refused at build, where a semaphore of that size would have panicked or
            // never let anything run.
            let e = build(1, config).err().unwrap();
            assert!(
                e.to_string().starts_with(&format!("{what} is {value}: ")),
                "{e}"
            );
        }
        let mut config = ServerConfig::default();
        set(&mut config, 1);
        build(1, config).unwrap();
    }
}

/// Set when dropped: the handler's future was dropped, not left running.
struct Dropped(Arc<AtomicUsize>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn a_tool_past_its_timeout_is_stopped_and_its_future_dropped() {
    let dropped = Arc::new(AtomicUsize::new(0));
    let handler = {
        let dropped = Arc::clone(&dropped);
        move |_cx: Context, _: NoArgs| {
            let guard = Dropped(Arc::clone(&dropped));
            async move {
                let _guard = guard;
                tokio::time::sleep(Duration::from_secs(3600)).await;
                "finished"
            }
        }
    };
    let server = Server::builder(Implementation::new("t", "1"))
        .tool(
            tool("bounded")
                .timeout(Duration::from_secs(2))
                .handler(handler),
        )
        .build()
        .unwrap();
    let began = tokio::time::Instant::now();
    let e = run(&server, "bounded").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::TimedOut);
    assert!(e.message.contains("2 s"), "{}", e.message);
    // Paused time moves only as far as the next timer: the tool's limit, not the server's.
    assert_eq!(began.elapsed(), Duration::from_secs(2));
    assert_eq!(dropped.load(Ordering::SeqCst), 1, "the handler was dropped");
}

/// How long a handler sleeps.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Sleep {
    secs: u64,
}

/// A call stopped at its deadline runs what its handler registered with `on_cancel`, as a
/// cancelled call does; a call that returns in time runs none of it.
#[tokio::test(start_paused = true)]
async fn a_tool_past_its_timeout_runs_its_cancel_cleanups() {
    let cleaned = Arc::new(AtomicUsize::new(0));
    let handler = {
        let cleaned = Arc::clone(&cleaned);
        move |cx: Context, args: Sleep| {
            let cleaned = Arc::clone(&cleaned);
            async move {
                cx.on_cancel(async move {
                    cleaned.fetch_add(1, Ordering::SeqCst);
                });
                tokio::time::sleep(Duration::from_secs(args.secs)).await;
                "finished"
            }
        }
    };
    let server = Server::builder(Implementation::new("t", "1"))
        .tool(
            tool("bounded")
                .timeout(Duration::from_secs(2))
                .handler(handler),
        )
        .build()
        .unwrap();
    let e = run_with(&server, "bounded", json!({ "secs": 3600 }))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::TimedOut);
    // The cleanups run on a task of their own: a few turns of the scheduler let it run.
    settle().await;
    assert_eq!(cleaned.load(Ordering::SeqCst), 1, "the cleanup ran");
    let done = run_with(&server, "bounded", json!({ "secs": 1 })).await;
    assert!(done.unwrap().contains("finished"));
    settle().await;
    assert_eq!(
        cleaned.load(Ordering::SeqCst),
        1,
        "none for the call that returned"
    );
}

#[tokio::test(start_paused = true)]
async fn a_tool_timeout_never_extends_the_servers_limit() {
    let server = Server::builder(Implementation::new("t", "1"))
        .tool(tool("long").timeout(Duration::from_secs(600)).handler(
            |_cx: Context, _: NoArgs| async {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                "finished"
            },
        ))
        .config({
            let mut config = ServerConfig::default();
            config.max_call_duration = Duration::from_secs(5);
            config
        })
        .build()
        .unwrap();
    let began = tokio::time::Instant::now();
    let e = run(&server, "long").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::TimedOut);
    assert_eq!(began.elapsed(), Duration::from_secs(5));
}

/// A call queued for a slot waits no longer than it may run: then it is refused busy (503
/// with Retry-After over HTTP) and never runs; the call holding the slot goes on.
#[tokio::test(start_paused = true)]
async fn a_call_queued_for_a_slot_waits_no_longer_than_its_limit() {
    let started = Arc::new(AtomicUsize::new(0));
    // The long call holds the one slot until the test lets it go.
    let gate = Arc::new(Semaphore::new(0));
    let long = {
        let (started, gate) = (Arc::clone(&started), Arc::clone(&gate));
        move |_cx: Context, _: NoArgs| {
            let (started, gate) = (Arc::clone(&started), Arc::clone(&gate));
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                gate.acquire().await.unwrap().forget();
                "finished"
            }
        }
    };
    let quick = {
        let started = Arc::clone(&started);
        move |_cx: Context, _: NoArgs| {
            started.fetch_add(1, Ordering::SeqCst);
            async { "finished" }
        }
    };
    let server = Arc::new(
        Server::builder(Implementation::new("t", "1"))
            .tool(tool("long").handler(long))
            .tool(tool("quick").timeout(Duration::from_secs(2)).handler(quick))
            .config({
                let mut config = ServerConfig::default();
                config.limits.max_in_flight = Some(1);
                config.limits.max_queue = 4;
                config
            })
            .build()
            .unwrap(),
    );
    let long = {
        let server = Arc::clone(&server);
        tokio::spawn(async move { run(&server, "long").await })
    };
    until(&started, 1).await;
    let began = tokio::time::Instant::now();
    // Paused time: the guard only turns a queue that never lets go into a failure.
    let e = tokio::time::timeout(Duration::from_secs(60), run(&server, "quick"))
        .await
        .expect("refused, not left in the queue")
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::RetryLater);
    assert!(e.message.contains("within 2 s"), "{}", e.message);
    assert_eq!(began.elapsed(), Duration::from_secs(2));
    assert_eq!(
        started.load(Ordering::SeqCst),
        1,
        "the queued call never ran"
    );
    gate.add_permits(1);
    assert!(long.await.unwrap().unwrap().contains("finished"));
    // With the slot free, the quick tool runs.
    assert!(run(&server, "quick").await.unwrap().contains("finished"));
}

/// Arguments of a mutating tool.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Key {
    key: String,
}

#[tokio::test(start_paused = true)]
async fn waiting_for_a_turn_counts_against_the_limit_and_the_call_never_runs() {
    let started = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Semaphore::new(0));
    let handler = {
        let (started, gate) = (Arc::clone(&started), Arc::clone(&gate));
        move |_cx: Context, args: Key| {
            let (started, gate) = (Arc::clone(&started), Arc::clone(&gate));
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                gate.acquire().await.unwrap().forget();
                args.key
            }
        }
    };
    let server = Arc::new(
        Server::builder(Implementation::new("t", "1"))
            .tool(
                tool("write")
                    .mutates("key")
                    .timeout(Duration::from_secs(2))
                    .handler(handler),
            )
            .build()
            .unwrap(),
    );
    let first = {
        let server = Arc::clone(&server);
        tokio::spawn(async move { run_with(&server, "write", json!({ "key": "k" })).await })
    };
    until(&started, 1).await;
    // The first holds the key past the second's limit: the second times out in line.
    let began = tokio::time::Instant::now();
    let e = run_with(&server, "write", json!({ "key": "k" }))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::TimedOut);
    assert!(e.message.contains("did not run"), "{}", e.message);
    assert_eq!(began.elapsed(), Duration::from_secs(2));
    assert_eq!(started.load(Ordering::SeqCst), 1, "the second never ran");
    // The first is cut off by its own limit in the same instant (it waited on the gate).
    let first = first.await.unwrap().unwrap_err();
    assert_eq!(first.kind, ErrorKind::TimedOut);
    assert!(first.message.contains("ran longer"), "{}", first.message);
    // The key is free again, and the next call on it runs.
    gate.add_permits(1);
    let next = run_with(&server, "write", json!({ "key": "k" })).await;
    assert!(next.is_ok(), "{next:?}");
    assert_eq!(started.load(Ordering::SeqCst), 2);
}

/// Tool names never hold a `:`, which is what keeps the idempotency scope
/// `p:{principal}:{tool}` unambiguous without a length prefix: a principal id may contain
/// `:`, but the tool name after the last one cannot.
#[test]
fn a_tool_name_with_a_colon_is_refused_at_build() {
    for name in ["a:b", ":", "tool:"] {
        let built = Server::builder(Implementation::new("t", "1.0.0"))
            .tool(tool(name).handler(|_cx: Context, _: NoArgs| async { "x" }))
            .build();
        let error = built.err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(
            error,
            format!(
                "tool {name:?}: the name must be 1 to 128 characters of A-Z, a-z, 0-9, '_', '-' and '.'"
            )
        );
    }
}

/// A handle kind for the build checks below.
struct Doc;

impl wharf::HandleKind for Doc {
    const KIND: &'static str = "doc";
    const PREFIX: &'static str = "doc";
    const CREATED_BY: &'static str = "doc_open";
    const TTL: Duration = Duration::from_secs(60);
}

#[derive(serde::Deserialize, wharf::schemars::JsonSchema)]
struct ByName {
    #[allow(dead_code)]
    docs: std::collections::HashMap<String, wharf::Handle<Doc>>,
}

#[derive(serde::Deserialize, wharf::schemars::JsonSchema)]
struct Pair {
    #[allow(dead_code)]
    pair: (wharf::Handle<Doc>, u32),
}

/// Handles are checked for their owner and expiry wherever a call's arguments carry them:
/// a place the core cannot name on every call (a map's values, a tuple's items) is refused
/// when the server is built, not left unchecked.
#[test]
fn a_handle_the_core_could_not_check_is_refused_at_build() {
    let by_name = Server::builder(Implementation::new("t", "1.0.0"))
        .tool(tool("merge").handler(|_cx: Context, _: ByName| async { "x" }))
        .build();
    let error = by_name.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        error.contains("merge") && error.contains(r#"under "additionalProperties" at "docs""#),
        "{error}"
    );
    let pair = Server::builder(Implementation::new("t", "1.0.0"))
        .tool(tool("pair").handler(|_cx: Context, _: Pair| async { "x" }))
        .build();
    let error = pair.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        error.contains("pair") && error.contains(r#"at "pair""#),
        "{error}"
    );
}

/// The cap per principal holds for each principal someone authenticated, not for anonymous
/// requests: they all share one id, and it would cap the whole server.
#[tokio::test(start_paused = true)]
async fn the_cap_per_principal_leaves_anonymous_requests_to_the_others() {
    let started = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Semaphore::new(0));
    let handler = gated(&started, &gate);
    let server = Server::builder(Implementation::new("t", "1"))
        .tool(tool("wait").handler(handler))
        .config({
            let mut config = ServerConfig::default();
            config.limits.per_principal = Some(1);
            config
        })
        .build()
        .unwrap();
    let call = |principal: Principal| {
        let harness = Harness::new(server.clone()).principal(principal);
        tokio::spawn(async move {
            harness
                .call("tools/call", json!({ "name": "wait", "arguments": {} }))
                .await
                .map_err(|e| e.error().clone())
        })
    };
    let anonymous = [call(Principal::anonymous()), call(Principal::anonymous())];
    // A refusal would end a call at once: a few turns of the scheduler show both running.
    settle().await;
    assert_eq!(
        started.load(Ordering::SeqCst),
        2,
        "both anonymous calls run"
    );
    let alice = call(Principal::new("alice").unwrap());
    until(&started, 3).await;
    let refused = call(Principal::new("alice").unwrap())
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(refused.kind, ErrorKind::RetryLater);
    assert!(
        refused.message.contains("1 requests running"),
        "{}",
        refused.message
    );
    gate.add_permits(3);
    for call in anonymous.into_iter().chain([alice]) {
        call.await.unwrap().unwrap();
    }
}

/// An argument of any JSON value (`serde_json::Value`, which schemars describes as the
/// schema `true`) is listed as the empty object schema, which every revision reads (before
/// 2026-07-28 each property of an input schema must be an object), and still takes any
/// value.
#[tokio::test]
async fn an_argument_of_any_value_is_listed_as_an_object_schema() {
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct Anything {
        data: Value,
    }
    let server = Server::builder(Implementation::new("t", "1"))
        .tool(tool("keep").handler(|_cx: Context, a: Anything| async move { a.data.to_string() }))
        .build()
        .unwrap();
    let listed = Harness::new(server.clone())
        .call("tools/list", json!({}))
        .await
        .unwrap();
    let data = &listed["tools"][0]["inputSchema"]["properties"]["data"];
    assert_eq!(*data, json!({}), "{listed}");
    let kept = run_with(&server, "keep", json!({ "data": [1, "two"] }))
        .await
        .unwrap();
    assert!(kept.contains(r#"[1,\"two\"]"#), "{kept}");
}
