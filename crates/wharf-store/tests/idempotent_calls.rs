//! Idempotent tool calls through the core, on every store: a tool without a handle keeps its
//! records per (principal, tool, key); a failed or cancelled call rolls back and records
//! nothing, so its retry runs; a call whose client leaves once the handler returned is still
//! committed, with its record, so the retry replays it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use wharf_store::Documents;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use wharf::protocol::Implementation;
use wharf::store::HandleRecord;
use wharf::store::{Store, TxMode};
use wharf::testing::Harness;
use wharf::{Context, Handle, HandleKind, HandlerError, Principal, Server, Structured, tool};

mod support;

use support::unique;

#[derive(Deserialize, schemars::JsonSchema)]
struct Append {
    /// Where the row goes (unique per test: the stores are shared).
    log: String,
    n: i64,
}

struct Thing;

impl HandleKind for Thing {
    const KIND: &'static str = "thing";
    const PREFIX: &'static str = "thg";
    const CREATED_BY: &'static str = "a test";
    const TTL: Duration = Duration::from_secs(3600);
    const IDLE_TTL: Option<Duration> = Some(Duration::from_secs(600));
}

/// A write in steps that ends by retiring the handle it was given.
#[derive(Deserialize, schemars::JsonSchema)]
struct Close {
    thing: Handle<Thing>,
    log: String,
}

#[derive(Serialize, schemars::JsonSchema)]
struct Appended {
    appended: i64,
}

/// What the handlers of one server do besides writing, set by the test.
#[derive(Default)]
struct Script {
    /// Block after writing, until cancelled.
    hang: AtomicBool,
    /// Told when the handler has written (and, unless hanging, is about to return).
    written: tokio::sync::Mutex<Option<tokio::sync::mpsc::UnboundedSender<()>>>,
    /// A write in steps waits for `release` after its first step.
    hold: AtomicBool,
    release: tokio::sync::Notify,
}

async fn append(
    cx: Context,
    args: Append,
    script: Arc<Script>,
) -> Result<Structured<Appended>, HandlerError> {
    cx.tx()
        .await?
        .append_rows(&args.log, &[json!(args.n)])
        .await
        .map_err(|e| HandlerError::internal(e.to_string()))?;
    if let Some(tx) = script.written.lock().await.as_ref() {
        let _ = tx.send(());
    }
    if script.hang.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
    Ok(Structured(Appended { appended: args.n }))
}

/// A write in steps: two rows, each committed on its own, then the result.
async fn append_in_steps(
    cx: Context,
    args: Append,
    script: Arc<Script>,
) -> Result<Structured<Appended>, HandlerError> {
    for step in 0..2 {
        let mut tx = cx.transaction(TxMode::Write).await?;
        tx.append_rows(&args.log, &[json!(args.n * 10 + step)])
            .await
            .map_err(|e| HandlerError::internal(e.to_string()))?;
        tx.commit().await?;
        if step == 0 {
            if let Some(tx) = script.written.lock().await.as_ref() {
                let _ = tx.send(());
            }
            if script.hold.load(Ordering::SeqCst) {
                script.release.notified().await;
            }
        }
    }
    Ok(Structured(Appended { appended: 2 }))
}

fn server(store: Arc<dyn Store>, script: &Arc<Script>) -> Server {
    let script_in_steps = Arc::clone(script);
    let mut builder =
        Server::builder(Implementation::new("t", "1"))
            .store(store)
            .tool(tool("append_in_steps").idempotent_in_steps().handler(
                move |cx, args: Append| append_in_steps(cx, args, Arc::clone(&script_in_steps)),
            ));
    for name in ["append", "append_too"] {
        let script = Arc::clone(script);
        builder = builder.tool(
            tool(name)
                .idempotent()
                .handler(move |cx, args: Append| append(cx, args, Arc::clone(&script))),
        );
    }
    builder = builder.tool(tool("close_in_steps").idempotent_in_steps().handler(
        |cx: Context, args: Close| async move {
            let mut tx = cx.transaction(TxMode::Write).await?;
            tx.append_rows(&args.log, &[json!(1)])
                .await
                .map_err(|e| HandlerError::internal(e.to_string()))?;
            tx.commit().await?;
            cx.retire_handle(&args.thing).await?;
            Ok::<_, HandlerError>(Structured(Appended { appended: 1 }))
        },
    ));
    let closing = Arc::clone(script);
    builder = builder.tool(tool("close_then_wait").idempotent_in_steps().handler(
        move |cx: Context, args: Close| {
            let script = Arc::clone(&closing);
            async move {
                // In a step of its own, committed before the call ends.
                let mut tx = cx.transaction(TxMode::Write).await?;
                tx.retire_handle(args.thing.id()).await?;
                tx.commit().await?;
                if let Some(tx) = script.written.lock().await.as_ref() {
                    let _ = tx.send(());
                }
                if script.hold.load(Ordering::SeqCst) {
                    script.release.notified().await;
                }
                Ok::<_, HandlerError>(Structured(Appended { appended: 0 }))
            }
        },
    ));
    let script = Arc::clone(script);
    builder = builder.tool(
        tool("append_locked")
            .idempotent()
            .mutates("log")
            .handler(move |cx, args: Append| append(cx, args, Arc::clone(&script))),
    );
    builder.build().unwrap()
}

/// Calls in-process as `who`, through parse and admission as a transport does.
fn as_user(server: &Server, who: &str) -> Harness {
    Harness::new(server.clone()).principal(Principal::new(who).unwrap())
}

fn call(name: &str, args: Value) -> Value {
    json!({ "name": name, "arguments": args })
}

/// The call's result.
async fn run(server: &Server, who: &str, name: &str, args: Value) -> Value {
    as_user(server, who)
        .call("tools/call", call(name, args))
        .await
        .unwrap()
}

fn replayed(result: &Value) -> bool {
    result["_meta"]["dev.wharf/idempotentReplay"] == true
}

async fn rows(store: &Arc<dyn Store>, log: &str) -> u64 {
    let mut tx = store.begin(TxMode::Read).await.unwrap();
    tx.count_rows(log).await.unwrap()
}

async fn records_are_kept_per_principal_tool_and_key(store: Arc<dyn Store>) {
    let script = Arc::new(Script::default());
    let s = server(Arc::clone(&store), &script);
    let (log, key) = (unique("log"), unique("key"));
    let args = |n: i64| json!({ "log": log, "n": n, "idempotency_key": key });

    let first = run(&s, "alice", "append", args(1)).await;
    assert_eq!(first["structuredContent"]["appended"], 1, "{first}");
    assert!(!replayed(&first));
    let again = run(&s, "alice", "append", args(1)).await;
    assert!(replayed(&again), "{again}");
    assert_eq!(again["structuredContent"], first["structuredContent"]);
    assert_eq!(rows(&store, &log).await, 1, "the replay wrote nothing");

    // Another principal with the same key, and the same principal with another tool, are
    // other writes: they run.
    let bob = run(&s, "bob", "append", args(1)).await;
    assert!(!replayed(&bob), "{bob}");
    let other_tool = run(&s, "alice", "append_too", args(1)).await;
    assert!(!replayed(&other_tool), "{other_tool}");
    assert_eq!(rows(&store, &log).await, 3);

    // The same key with other arguments is refused, and changes nothing.
    let changed = run(&s, "alice", "append", args(2)).await;
    assert_eq!(changed["isError"], true, "{changed}");
    assert!(
        changed["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("other arguments"),
        "{changed}"
    );
    assert_eq!(rows(&store, &log).await, 3);
}

async fn a_cancelled_write_rolls_back_and_its_retry_runs(store: Arc<dyn Store>) {
    let script = Arc::new(Script::default());
    let s = server(Arc::clone(&store), &script);
    let (log, key) = (unique("log"), unique("key"));
    let args = json!({ "log": log, "n": 7, "idempotency_key": key });
    let (tx, mut written) = tokio::sync::mpsc::unbounded_channel();
    *script.written.lock().await = Some(tx);

    script.hang.store(true, Ordering::SeqCst);
    let alice = as_user(&s, "alice");
    let mut stalled = Box::pin(alice.call("tools/call", call("append", args.clone())));
    tokio::select! {
        _ = &mut stalled => panic!("a hanging call answered"),
        _ = written.recv() => {}
    }
    // The client leaves while the handler waits, its row written but not committed.
    drop(stalled);
    assert_eq!(rows(&store, &log).await, 0, "rolled back");

    script.hang.store(false, Ordering::SeqCst);
    let retry = run(&s, "alice", "append", args).await;
    assert!(
        !replayed(&retry),
        "nothing was recorded: the retry runs: {retry}"
    );
    assert_eq!(retry["structuredContent"]["appended"], 7);
    assert_eq!(rows(&store, &log).await, 1);
}

async fn a_call_whose_client_leaves_after_the_handler_returned_is_committed(store: Arc<dyn Store>) {
    let script = Arc::new(Script::default());
    let s = server(Arc::clone(&store), &script);
    let log = unique("log");
    let (tx, mut written) = tokio::sync::mpsc::unbounded_channel();
    *script.written.lock().await = Some(tx);
    // The handler returns in the same poll that tells the test it wrote; the test then
    // leaves while the core commits. Should the whole call finish within that one poll,
    // the window was missed: try again with another key.
    let mut left = 0;
    for _ in 0..20 {
        let key = unique("key");
        let args = json!({ "log": log, "n": 1, "idempotency_key": key });
        let before = rows(&store, &log).await;
        {
            let alice = as_user(&s, "alice");
            let call = alice.call("tools/call", call("append", args.clone()));
            tokio::pin!(call);
            tokio::select! {
                biased;
                _ = &mut call => continue,
                _ = written.recv() => {}
            }
        }
        left += 1;
        // The commit goes on without the client: the row and the record land.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while rows(&store, &log).await == before {
            assert!(std::time::Instant::now() < deadline, "never committed");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let retry = run(&s, "alice", "append", args).await;
        assert!(
            replayed(&retry),
            "the retry finds the first result: {retry}"
        );
        assert_eq!(rows(&store, &log).await, before + 1, "written once");
    }
    assert!(left > 0, "the client never left between return and commit");
}

/// A write in steps runs once per key: a duplicate sent while it runs waits, then replays;
/// other arguments under the key are refused; another principal's key is theirs. An attempt
/// cut short before its result was recorded runs again, its first step included.
async fn writes_in_steps_run_once_per_key(store: Arc<dyn Store>) {
    let script = Arc::new(Script::default());
    let s = server(Arc::clone(&store), &script);
    let (log, key) = (unique("log"), unique("key"));
    let args = |n: i64, key: &str| json!({ "log": log, "n": n, "idempotency_key": key });
    let (tx, mut written) = tokio::sync::mpsc::unbounded_channel();
    *script.written.lock().await = Some(tx);

    script.hold.store(true, Ordering::SeqCst);
    let first = tokio::spawn(run_owned(s.clone(), "alice", args(1, &key)));
    written.recv().await.unwrap();
    let duplicate = tokio::spawn(run_owned(s.clone(), "alice", args(1, &key)));
    // The duplicate runs up to its wait in the key's line (no I/O on the way there) before
    // the first is let go.
    for _ in 0..32 {
        tokio::task::yield_now().await;
    }
    script.hold.store(false, Ordering::SeqCst);
    script.release.notify_one();
    let (first, duplicate) = (first.await.unwrap(), duplicate.await.unwrap());
    assert!(!replayed(&first), "{first}");
    assert!(replayed(&duplicate), "{duplicate}");
    assert_eq!(duplicate["structuredContent"], first["structuredContent"]);
    assert_eq!(rows(&store, &log).await, 2, "both steps, once");

    let again = run(&s, "alice", "append_in_steps", args(1, &key)).await;
    assert!(replayed(&again), "{again}");
    let changed = run(&s, "alice", "append_in_steps", args(2, &key)).await;
    assert_eq!(changed["isError"], true, "{changed}");
    assert_eq!(rows(&store, &log).await, 2, "neither wrote");
    let bob = run(&s, "bob", "append_in_steps", args(1, &key)).await;
    assert!(!replayed(&bob), "{bob}");
    assert_eq!(rows(&store, &log).await, 4);

    // Cut short after its first step: nothing recorded, so the retry runs both steps.
    while written.try_recv().is_ok() {} // bob's step
    let cut = unique("key");
    script.hold.store(true, Ordering::SeqCst);
    let alice = as_user(&s, "alice");
    let mut stalled = Box::pin(alice.call("tools/call", call("append_in_steps", args(3, &cut))));
    tokio::select! {
        _ = &mut stalled => panic!("a held call answered"),
        _ = written.recv() => {}
    }
    drop(stalled);
    script.hold.store(false, Ordering::SeqCst);
    let retry = run(&s, "alice", "append_in_steps", args(3, &cut)).await;
    assert!(!replayed(&retry), "{retry}");
    assert_eq!(
        rows(&store, &log).await,
        7,
        "the cut attempt's first step stays"
    );
    let replay = run(&s, "alice", "append_in_steps", args(3, &cut)).await;
    assert!(replayed(&replay), "{replay}");
    assert_eq!(rows(&store, &log).await, 7);
}

/// Records kept (as good as) forever: a retention of `Duration::MAX` is capped at what every
/// store holds exactly, and the retry replays.
async fn records_kept_forever_still_replay(store: Arc<dyn Store>) {
    let mut config = wharf::ServerConfig::default();
    config.idempotency_retention = Duration::MAX;
    let script = Arc::new(Script::default());
    let mut builder = Server::builder(Implementation::new("t", "1"))
        .store(Arc::clone(&store))
        .config(config);
    let for_tool = Arc::clone(&script);
    builder = builder.tool(
        tool("append")
            .idempotent()
            .handler(move |cx, args: Append| append(cx, args, Arc::clone(&for_tool))),
    );
    let s = builder.build().unwrap();
    let (log, key) = (unique("log"), unique("key"));
    let args = json!({ "log": log, "n": 1, "idempotency_key": key });
    let first = run(&s, "alice", "append", args.clone()).await;
    assert_eq!(first["structuredContent"]["appended"], 1, "{first}");
    let again = run(&s, "alice", "append", args).await;
    assert!(replayed(&again), "{again}");
    assert_eq!(rows(&store, &log).await, 1);
}

/// Writes in steps that hold their claims while they commit steps of their own: more of them
/// at once than the store has connections all complete (on PostgreSQL each held claim keeps a
/// connection, which the steps of every write in steps also need).
async fn more_writes_in_steps_than_connections_all_complete(store: Arc<dyn Store>) {
    let script = Arc::new(Script::default());
    let s = server(Arc::clone(&store), &script);
    let log = unique("log");
    let calls = (0..8).map(|n| {
        let args = json!({ "log": log, "n": n, "idempotency_key": unique("key") });
        tokio::spawn(run_owned(s.clone(), "alice", args))
    });
    for call in futures_util::future::join_all(calls).await {
        let result = call.unwrap();
        assert_eq!(result["structuredContent"]["appended"], 2, "{result}");
    }
    assert_eq!(rows(&store, &log).await, 16, "every step of every write");
}

async fn run_owned(server: Server, who: &'static str, args: Value) -> Value {
    run(&server, who, "append_in_steps", args).await
}

const WAIT: Duration = Duration::from_secs(3);

async fn sqlite() -> Arc<dyn Store> {
    support::sqlite_with(&support::sqlite_url("idempotent-calls"), WAIT).await
}

async fn postgres() -> Arc<dyn Store> {
    support::postgres_with(WAIT).await
}

async fn redis() -> Arc<dyn Store> {
    support::redis_with(WAIT).await
}

/// A key or a locked name with a control character in it is refused with a tool execution
/// error naming the argument, alike on every backend (PostgreSQL's text cannot hold a NUL),
/// and writes nothing.
async fn control_characters_are_refused_alike(store: Arc<dyn Store>) {
    let script = Arc::new(Script::default());
    let server = server(Arc::clone(&store), &script);
    let log = unique("ctl");
    for (tool, args, names) in [
        (
            "append",
            json!({ "log": log, "n": 1, "idempotency_key": "k\u{0}x" }),
            "idempotency_key",
        ),
        (
            "append",
            json!({ "log": log, "n": 1, "idempotency_key": "k\u{1b}[2J" }),
            "idempotency_key",
        ),
        (
            "append_locked",
            json!({ "log": format!("{log}\u{0}"), "n": 1, "idempotency_key": unique("k") }),
            "log",
        ),
    ] {
        let refused = as_user(&server, "alice")
            .call("tools/call", call(tool, args))
            .await
            .unwrap();
        assert_eq!(refused["isError"], true, "{refused}");
        let text = refused["content"][0]["text"].as_str().unwrap();
        assert!(text.contains(names), "{text}");
    }
    assert_eq!(rows(&store, &log).await, 0);
    let done = run(
        &server,
        "alice",
        "append_locked",
        json!({ "log": log, "n": 2, "idempotency_key": unique("k") }),
    )
    .await;
    assert_eq!(done["structuredContent"]["appended"], 2, "{done}");
}

/// A handle argument no server could have minted (longer than any store keeps in a key) is
/// refused as unknown on every backend, and no write is looked up under it: PostgreSQL
/// answered the look-up -32603 with its index's row-size error.
async fn a_string_no_handle_could_be_is_refused_alike(store: Arc<dyn Store>) {
    let script = Arc::new(Script::default());
    let server = server(Arc::clone(&store), &script);
    let (who, _) = a_thing(&store).await;
    let log = unique("never");
    // Letters that do not repeat, or PostgreSQL compresses the key under its limit.
    let mut seed = 0x2545_f491_u32;
    let thing: String = (0..4_000)
        .map(|_| {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            char::from(b'a' + u8::try_from(seed >> 27).unwrap() % 26)
        })
        .collect();
    let args = json!({ "thing": thing, "log": log, "idempotency_key": unique("k") });
    let refused = as_user(&server, &who)
        .call("tools/call", call("close_in_steps", args))
        .await
        .unwrap();
    assert_eq!(refused["isError"], true, "{refused}");
    let text = refused["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("unknown"), "{text}");
    assert_eq!(rows(&store, &log).await, 0);
}

/// A new principal, and a thing it holds.
async fn a_thing(store: &Arc<dyn Store>) -> (String, HandleRecord) {
    let who = unique("closer");
    let thing = HandleRecord::mint::<Thing>(
        &Principal::new(who.clone()).unwrap(),
        wharf::store::now_millis(),
    );
    let mut tx = store.begin(TxMode::Write).await.unwrap();
    tx.create_handle(&thing).await.unwrap();
    tx.commit().await.unwrap();
    (who, thing)
}

/// A write in steps may retire the handle its key is scoped by, in its last step: it
/// commits once, and its retry replays the result though the handle is gone.
async fn a_write_in_steps_retires_its_handle_once(store: Arc<dyn Store>) {
    let script = Arc::new(Script::default());
    let server = server(Arc::clone(&store), &script);
    let (who, thing) = a_thing(&store).await;
    let log = unique("closed");
    let args = json!({ "thing": thing.id, "log": log, "idempotency_key": unique("k") });
    let first = run(&server, &who, "close_in_steps", args.clone()).await;
    assert_eq!(first["structuredContent"]["appended"], 1, "{first}");
    assert!(!replayed(&first));
    assert_eq!(store.load_handle(&thing.id).await.unwrap(), None, "retired");
    let again = run(&server, &who, "close_in_steps", args).await;
    assert!(replayed(&again), "{again}");
    assert_eq!(rows(&store, &log).await, 1, "one step, once");
}

/// A retry sent while the first attempt of a write in steps still runs, after a step of it
/// retired the handle the key is scoped by, waits for that attempt and replays its result:
/// it is not told the handle is gone (a model told so would start the whole write again),
/// on another replica too (a second server on the same store, where the store shares
/// locks: with one writer, the store serves one process).
async fn a_retry_of_a_write_that_retired_its_handle_waits_and_replays(store: Arc<dyn Store>) {
    let script = Arc::new(Script::default());
    let first_server = server(Arc::clone(&store), &script);
    let other_server = match store.shares_locks() {
        true => server(Arc::clone(&store), &script),
        false => first_server.clone(),
    };
    let (who, thing) = a_thing(&store).await;
    let args =
        json!({ "thing": thing.id, "log": unique("closed"), "idempotency_key": unique("k") });
    let (tx, mut written) = tokio::sync::mpsc::unbounded_channel();
    *script.written.lock().await = Some(tx);
    script.hold.store(true, Ordering::SeqCst);
    let first = {
        let (server, who, args) = (first_server.clone(), who.clone(), args.clone());
        tokio::spawn(async move { run(&server, &who, "close_then_wait", args).await })
    };
    tokio::time::timeout(WAIT, written.recv())
        .await
        .expect("the first attempt retired its handle")
        .unwrap();
    assert_eq!(store.load_handle(&thing.id).await.unwrap(), None, "retired");
    let mut retry = {
        let (server, who, args) = (other_server, who.clone(), args.clone());
        tokio::spawn(async move { run(&server, &who, "close_then_wait", args).await })
    };
    let early = tokio::time::timeout(Duration::from_millis(300), &mut retry).await;
    assert!(
        early.is_err(),
        "the retry was answered while the first attempt ran: {early:?}"
    );
    script.hold.store(false, Ordering::SeqCst);
    script.release.notify_one();
    let first = first.await.unwrap();
    assert!(!replayed(&first), "{first}");
    let retry = retry.await.unwrap();
    assert!(replayed(&retry), "{retry}");
    assert_eq!(retry["structuredContent"], first["structuredContent"]);
}

/// A call waiting for the claim of another attempt of the same write waits no longer than
/// its own limit: it is refused as timed out, without running, rather than held for the
/// store's whole lock wait and then told the store is busy. The attempt holding the claim
/// runs on another replica, whose limit for the tool is longer (a deploy under way).
async fn a_wait_for_a_claim_ends_at_the_calls_limit(store: Arc<dyn Store>) {
    let script = Arc::new(Script::default());
    let long = server(Arc::clone(&store), &script);
    let quick = Arc::clone(&script);
    let short = Server::builder(Implementation::new("t", "1"))
        .store(Arc::clone(&store))
        .tool(
            tool("append")
                .idempotent()
                .timeout(WAIT / 10)
                .handler(move |cx, args: Append| append(cx, args, Arc::clone(&quick))),
        )
        .build()
        .unwrap();
    let (log, key) = (unique("log"), unique("key"));
    let args = json!({ "log": log, "n": 1, "idempotency_key": key });
    let (tx, mut written) = tokio::sync::mpsc::unbounded_channel();
    *script.written.lock().await = Some(tx);
    script.hang.store(true, Ordering::SeqCst);
    let alice = as_user(&long, "alice");
    let mut first = Box::pin(alice.call("tools/call", call("append", args.clone())));
    tokio::select! {
        _ = &mut first => panic!("a hanging call answered"),
        _ = written.recv() => {}
    }
    let again = as_user(&short, "alice");
    let second = tokio::select! {
        _ = &mut first => panic!("a hanging call answered"),
        second = again.call("tools/call", call("append", args)) => second,
    };
    let refused = second.expect_err("the second attempt ran beside the first");
    assert_eq!(
        refused.error().kind,
        wharf::ErrorKind::TimedOut,
        "{refused:?}"
    );
    assert!(
        refused.error().message.contains("did not run"),
        "{refused:?}"
    );
    // Nothing is left behind that would hold the retry: once the first attempt is gone, it
    // runs.
    drop(first);
    assert_eq!(rows(&store, &log).await, 0);
    script.hang.store(false, Ordering::SeqCst);
    let retry = run(
        &long,
        "alice",
        "append",
        json!({ "log": log, "n": 1, "idempotency_key": key }),
    )
    .await;
    assert!(!replayed(&retry), "{retry}");
    assert_eq!(rows(&store, &log).await, 1);
}

/// Calls `tool` with `arguments` as a client that takes forms, and returns the params of the
/// retry that confirms what it asked (`confirm`'s `delete`).
async fn confirming_retry(caller: &Harness, tool: &str, arguments: Value) -> Value {
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": { "elicitation": { "form": {} } },
    });
    let mut call = json!({ "name": tool, "arguments": arguments, "_meta": meta });
    let asked = caller.call("tools/call", call.clone()).await.unwrap();
    assert!(asked["requestState"].is_string(), "{asked}");
    call["requestState"] = asked["requestState"].clone();
    call["inputResponses"] =
        json!({ "confirm": { "action": "accept", "content": { "delete": true } } });
    call
}

/// A confirmation (a request state redeemed once) answered by two retries at once unlocks
/// its effect once: the second is refused (-32602), and acts not at all. (That the
/// redemption is taken before the first commits is the store suite's
/// `a_one_time_record_is_taken_by_one_transaction`.)
async fn a_confirmation_answered_twice_at_once_acts_once(store: Arc<dyn Store>) {
    // `go` lets every held call go, a late one too (a second that wrongly acted).
    let (reached, go) = (
        Arc::new(tokio::sync::Notify::new()),
        tokio_util::sync::CancellationToken::new(),
    );
    let acted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let hold = Arc::new(AtomicBool::new(true));
    let (r, g, a, h) = (
        Arc::clone(&reached),
        go.clone(),
        Arc::clone(&acted),
        Arc::clone(&hold),
    );
    let server = Server::builder(Implementation::new("t", "1"))
        .store(store)
        .tool(tool("send").handler(move |cx: Context, _: wharf::NoArgs| {
            let (reached, go, acted, hold) =
                (Arc::clone(&r), g.clone(), Arc::clone(&a), Arc::clone(&h));
            async move {
                let form = wharf::FormSchema::new().boolean("delete", "Send it", true);
                match cx.elicited::<Confirmed>("confirm", &form) {
                    Some(wharf::Elicited::Accepted(Confirmed { delete: true })) => {
                        cx.redeem_once().await?;
                        // The effect outside the store.
                        acted.fetch_add(1, Ordering::SeqCst);
                        if hold.load(Ordering::SeqCst) {
                            reached.notify_one();
                            go.cancelled().await;
                        }
                        Ok("sent".to_owned())
                    }
                    Some(_) => Err(HandlerError::execution("not confirmed")),
                    None => Err(cx.ask().elicit("confirm", "Send?", form).into()),
                }
            }
        }))
        .build()
        .unwrap();
    let who = unique("sender");
    let alice = as_user(&server, &who);
    let answer = confirming_retry(&alice, "send", json!({})).await;
    let retry = || {
        let (alice, answer) = (alice.clone(), answer.clone());
        tokio::spawn(async move { alice.call("tools/call", answer).await })
    };
    let first = retry();
    tokio::time::timeout(WAIT, reached.notified())
        .await
        .expect("the first retry redeemed");
    let second = retry();
    go.cancel();
    let first = first.await.unwrap().unwrap();
    assert_eq!(first["content"][0]["text"], "sent", "{first}");
    let second = tokio::time::timeout(WAIT, second)
        .await
        .expect("the second retry ended")
        .unwrap();
    let refused = second.expect_err("the second retry acted too");
    assert_eq!(refused.error().code(), -32602, "{refused:?}");
    assert!(
        refused.error().message.contains("already used"),
        "{refused:?}"
    );
    assert_eq!(acted.load(Ordering::SeqCst), 1, "acted once");
}

/// What a tool announces on commit reaches listeners whenever its writes may stand: a
/// write in steps that committed a step and then failed announces (the step stays), a
/// call whose one transaction rolled back does not.
async fn announcements_follow_what_was_written(store: Arc<dyn Store>) {
    let updated = |uri: &str| wharf::ChangeEvent::ResourceUpdated { uri: uri.into() };
    // A write in steps whose first step commits and announces `uri`, and whose second
    // ends the call with `error`.
    let step_then = |name: &str, uri: &'static str, error: fn() -> HandlerError| {
        tool(name)
            .idempotent_in_steps()
            .handler(move |cx: Context, args: Append| async move {
                let mut tx = cx.transaction(TxMode::Write).await?;
                tx.append_rows(&args.log, &[json!(args.n)])
                    .await
                    .map_err(|e| HandlerError::internal(e.to_string()))?;
                tx.commit().await?;
                cx.announce_on_commit(updated(uri)).await;
                Err::<Structured<Appended>, _>(error())
            })
    };
    let step_then_fail = step_then("step_then_fail", "notes://steps", || {
        HandlerError::execution("the second step failed")
    });
    // A protocol error ends the call before its settling.
    let step_then_refuse = step_then("step_then_refuse", "notes://steps-refused", || {
        HandlerError::Protocol(wharf::RpcError::invalid_params(
            "the second step needs what the client did not send",
        ))
    });
    let one_tx = |name: &str, uri: &'static str, fails: bool| {
        tool(name).handler(move |cx: Context, args: Append| async move {
            cx.tx()
                .await?
                .append_rows(&args.log, &[json!(args.n)])
                .await
                .map_err(|e| HandlerError::internal(e.to_string()))?;
            cx.announce_on_commit(updated(uri)).await;
            match fails {
                true => Err(HandlerError::execution("refused after writing")),
                false => Ok(Structured(Appended { appended: args.n })),
            }
        })
    };
    // This process's own bus: a shared one's first connection is a gap, which would have
    // the stream announce everything.
    let mut builder = Server::builder(Implementation::new("t", "1"))
        .store(Arc::clone(&store))
        .bus(Arc::new(wharf::InProcessBus::default()))
        .tool(step_then_fail)
        .tool(step_then_refuse)
        .tool(one_tx("rolled_back", "notes://rolled-back", true))
        .tool(one_tx("committed", "notes://committed", false));
    let uris = [
        "notes://steps",
        "notes://steps-refused",
        "notes://rolled-back",
        "notes://committed",
    ];
    for uri in uris {
        builder = builder.resource(wharf::resource(uri, "n").handler(|_cx, req| async move {
            Ok(vec![wharf::protocol::ResourceContents::text(
                req.uri,
                "text/plain",
                "x",
            )])
        }));
    }
    let server = builder.build().unwrap();
    let alice = as_user(&server, "alice");
    let subscriptions = json!({ "notifications": { "resourceSubscriptions": uris } });
    let mut heard = alice
        .open_stream(
            "subscriptions/listen",
            subscriptions,
            tokio_util::sync::CancellationToken::new(),
        )
        .await
        .unwrap();
    let ack = heard.recv().await.unwrap();
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    let log = unique("announced");
    let args = |n: i64| json!({ "log": log, "n": n, "idempotency_key": unique("k") });
    let rolled_back = run(&server, "alice", "rolled_back", args(1)).await;
    assert_eq!(rolled_back["isError"], true, "{rolled_back}");
    let steps = run(&server, "alice", "step_then_fail", args(2)).await;
    assert_eq!(steps["isError"], true, "{steps}");
    let refused = alice
        .call("tools/call", call("step_then_refuse", args(4)))
        .await
        .unwrap_err();
    assert_eq!(refused.error().code(), -32602, "{refused:?}");
    run(&server, "alice", "committed", args(3)).await;
    assert_eq!(
        rows(&store, &log).await,
        3,
        "the steps and the committed call"
    );
    for uri in [
        "notes://steps",
        "notes://steps-refused",
        "notes://committed",
    ] {
        let m = tokio::time::timeout(WAIT, heard.recv())
            .await
            .expect("announced in time")
            .unwrap();
        assert_eq!(m["params"]["uri"], uri, "{m}");
    }
}

/// On the store's own bus, a call's commit announces what the call announced once: the
/// commit carries it where the store can (Redis, PostgreSQL), and the replica does not
/// announce it again; elsewhere the replica announces it. Two calls, one after the other, are heard in
/// their order, each once.
async fn a_commit_is_announced_once_on_the_stores_own_bus(store: Arc<dyn Store>) {
    let announcing = tool("announcing").handler(|cx: Context, args: Append| async move {
        cx.tx()
            .await?
            .append_rows(&args.log, &[json!(args.n)])
            .await
            .map_err(|e| HandlerError::internal(e.to_string()))?;
        let uri = format!("notes://{}", args.log);
        cx.announce_on_commit(wharf::ChangeEvent::ResourceUpdated { uri })
            .await;
        Ok::<_, HandlerError>(Structured(Appended { appended: args.n }))
    });
    let server = Server::builder(Implementation::new("t", "1"))
        .store(Arc::clone(&store))
        .tool(announcing)
        .build()
        .unwrap();
    server.prepare(Duration::from_secs(10)).await.unwrap();
    // Other tests share the channel, and may cut its connections (a gap closes the
    // receiver): the two calls are made again until a run without a gap.
    for _ in 0..5 {
        let mut heard = server.bus().subscribe();
        let (first, second) = (unique("announced"), unique("announced"));
        for log in [&first, &second] {
            let args = json!({ "log": log, "n": 1 });
            let result = run(&server, "alice", "announcing", args).await;
            assert_ne!(result["isError"], true, "{result}");
        }
        let ours = [&first, &second].map(|log| wharf::ChangeEvent::ResourceUpdated {
            uri: format!("notes://{log}"),
        });
        let mut got = Vec::new();
        let gap = loop {
            match tokio::time::timeout(WAIT, heard.recv()).await {
                Ok(Ok(event)) if ours.contains(&event) => {
                    got.push(event.clone());
                    if event == ours[1] {
                        break false;
                    }
                }
                Ok(Ok(_)) => {}
                Ok(Err(_)) => break true,
                Err(_) => panic!("the second call was not announced in time; heard {got:?}"),
            }
        };
        if !gap {
            assert_eq!(got, ours, "each commit announced once, in order");
            return;
        }
    }
    panic!("every run met a gap in the bus");
}

/// A write in steps that redeemed its confirmation and was cut short (its client left) is
/// the same write when retried with the same round (so the same key): the retry redeems it
/// again and finishes, rather than being refused as a second use. A retry after it was
/// made replays it.
async fn a_write_in_steps_cut_short_after_its_confirmation_goes_on(store: Arc<dyn Store>) {
    let script = Arc::new(Script::default());
    let in_handler = Arc::clone(&script);
    let server = Server::builder(Implementation::new("t", "1"))
        .store(Arc::clone(&store))
        .tool(tool("confirmed_steps").idempotent_in_steps().handler(
            move |cx: Context, args: Append| {
                let script = Arc::clone(&in_handler);
                async move {
                    let form = wharf::FormSchema::new().boolean("delete", "Go on", true);
                    match cx.elicited::<Confirmed>("confirm", &form) {
                        Some(wharf::Elicited::Accepted(Confirmed { delete: true })) => {}
                        Some(_) => return Err(HandlerError::execution("not confirmed")),
                        None => return Err(cx.ask().elicit("confirm", "Go on?", form).into()),
                    }
                    cx.redeem_once().await?;
                    if let Some(tx) = script.written.lock().await.as_ref() {
                        let _ = tx.send(());
                    }
                    if script.hold.load(Ordering::SeqCst) {
                        script.release.notified().await;
                    }
                    let mut tx = cx.transaction(TxMode::Write).await?;
                    tx.append_rows(&args.log, &[json!(args.n)])
                        .await
                        .map_err(|e| HandlerError::internal(e.to_string()))?;
                    tx.commit().await?;
                    Ok(Structured(Appended { appended: args.n }))
                }
            },
        ))
        .build()
        .unwrap();
    let alice = as_user(&server, "alice");
    let log = unique("confirmed-steps");
    let arguments = json!({ "log": log, "n": 5, "idempotency_key": unique("k") });
    let round = confirming_retry(&alice, "confirmed_steps", arguments).await;
    let (tx, mut written) = tokio::sync::mpsc::unbounded_channel();
    *script.written.lock().await = Some(tx);
    script.hold.store(true, Ordering::SeqCst);
    {
        let mut cut = Box::pin(alice.call("tools/call", round.clone()));
        tokio::select! {
            _ = &mut cut => panic!("a held call answered"),
            _ = written.recv() => {}
        }
    }
    script.hold.store(false, Ordering::SeqCst);
    let retried = alice.call("tools/call", round.clone()).await.unwrap();
    assert_eq!(retried["structuredContent"]["appended"], 5, "{retried}");
    assert!(!replayed(&retried), "{retried}");
    let again = alice.call("tools/call", round).await.unwrap();
    assert!(replayed(&again), "{again}");
    assert_eq!(rows(&store, &log).await, 1);
}

macro_rules! all_backends {
    ($($test:ident),* $(,)?) => {
        mod sqlite { $( #[tokio::test] async fn $test() { super::$test(super::sqlite().await).await; } )* }
        mod postgres { $( #[tokio::test] async fn $test() { super::$test(super::postgres().await).await; } )* }
        mod redis { $( #[tokio::test] async fn $test() { super::$test(super::redis().await).await; } )* }
    };
}

all_backends!(
    records_are_kept_per_principal_tool_and_key,
    a_cancelled_write_rolls_back_and_its_retry_runs,
    a_call_whose_client_leaves_after_the_handler_returned_is_committed,
    writes_in_steps_run_once_per_key,
    records_kept_forever_still_replay,
    control_characters_are_refused_alike,
    a_write_in_steps_retires_its_handle_once,
    a_string_no_handle_could_be_is_refused_alike,
    a_retry_of_a_write_that_retired_its_handle_waits_and_replays,
    a_confirmation_answered_twice_at_once_acts_once,
    announcements_follow_what_was_written,
    a_commit_is_announced_once_on_the_stores_own_bus,
    a_write_in_steps_cut_short_after_its_confirmation_goes_on,
    a_wait_for_a_claim_ends_at_the_calls_limit,
);

/// On PostgreSQL, a write in steps whose mutation lock ended with its session mid-call (a
/// network cut, a database restart) commits no further step once another replica took the
/// key, and records nothing: its retry runs again instead of replaying a result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_in_steps_that_lost_its_lock_commits_no_further_step() {
    // The first replica's sessions are told apart by their application name.
    let name = unique("fenced");
    let base = support::pg_url();
    let separator = if base.contains('?') { '&' } else { '?' };
    let first_store =
        with_connections(&format!("{base}{separator}application_name={name}"), 8).await;
    let second_store = with_connections(&base, 8).await;
    let replica = |store: &Arc<dyn Store>, script: &Arc<Script>| {
        let script = Arc::clone(script);
        Server::builder(Implementation::new("t", "1"))
            .store(Arc::clone(store))
            .tool(
                tool("append_locked")
                    .idempotent_in_steps()
                    .mutates("log")
                    .handler(move |cx, args: Append| {
                        append_in_steps(cx, args, Arc::clone(&script))
                    }),
            )
            .build()
            .unwrap()
    };
    let (held, free) = (Arc::new(Script::default()), Arc::new(Script::default()));
    let (first, second) = (replica(&first_store, &held), replica(&second_store, &free));
    let log = unique("log");
    let args = |key: &str| {
        call(
            "append_locked",
            json!({ "log": log, "n": 1, "idempotency_key": key }),
        )
    };
    let key = unique("key");

    let (tx, mut written) = tokio::sync::mpsc::unbounded_channel();
    *held.written.lock().await = Some(tx);
    held.hold.store(true, Ordering::SeqCst);
    let cut = {
        let (first, args) = (first.clone(), args(&key));
        tokio::spawn(async move { as_user(&first, "alice").call("tools/call", args).await })
    };
    written.recv().await.unwrap(); // its first step is committed, and it holds the key
    let observer = support::pg_observer().await;
    let ended: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(a.pid) FROM pg_stat_activity a \
         JOIN pg_locks l ON l.pid = a.pid \
         WHERE a.application_name = $1 AND l.locktype = 'advisory' AND l.granted",
    )
    .bind(&name)
    .fetch_all(&observer)
    .await
    .unwrap();
    assert_eq!(ended, [true], "the one lock session of the first replica");

    // The other replica takes the key and writes meanwhile.
    let other = as_user(&second, "alice")
        .call("tools/call", args(&unique("key")))
        .await
        .unwrap();
    assert_eq!(other["structuredContent"]["appended"], 2, "{other}");

    held.hold.store(false, Ordering::SeqCst);
    held.release.notify_one();
    let refused = cut.await.unwrap().expect_err("its second step was refused");
    assert_eq!(
        refused.error().kind,
        wharf::ErrorKind::RetryLater,
        "{refused:?}"
    );
    assert_eq!(
        rows(&first_store, &log).await,
        3,
        "its first step and the other call's two"
    );
    let retry = as_user(&first, "alice")
        .call("tools/call", args(&key))
        .await
        .unwrap();
    assert!(!replayed(&retry), "nothing was recorded: {retry}");
    assert_eq!(rows(&first_store, &log).await, 5);
}

/// A store with `n` connections in its pool (PostgreSQL's, SQLite's).
async fn with_connections(url: &str, n: u32) -> Arc<dyn Store> {
    let mut options = support::options(WAIT);
    options.max_connections = n;
    wharf_store::open(url, &options)
        .await
        .expect("open the store")
}

/// Writes in steps on a pool of three connections, with the change bus listening (on
/// PostgreSQL its listener keeps one of them).
async fn more_writes_in_steps_than_connections_on(url: &str) {
    let store = with_connections(url, 3).await;
    if let Some(bus) = store.bus() {
        let _changes = bus.subscribe();
        support::wait_until("the bus listens", Duration::from_secs(10), async || {
            bus.is_connected()
        })
        .await;
    }
    more_writes_in_steps_than_connections_all_complete(store).await;
}

mod small_pool {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() {
        let url = super::support::sqlite_url("small-pool");
        super::more_writes_in_steps_than_connections_on(&url).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        super::more_writes_in_steps_than_connections_on(&super::support::pg_url()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis() {
        super::more_writes_in_steps_than_connections_on(&super::support::redis_url()).await;
    }
}

/// On Redis, whose scripts keep what they wrote before a command failed, a call whose
/// commit Redis refuses half-way answers the failure its key was recorded with, and its
/// retry answers the same without applying anything a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_commit_refused_half_way_answers_what_its_retries_will() {
    use ::redis::AsyncCommands as _;

    let store = redis().await;
    let server =
        Server::builder(Implementation::new("t", "1"))
            .store(Arc::clone(&store))
            .tool(tool("push_then_fail").idempotent().handler(
                |cx: Context, args: Append| async move {
                    let mut tx = cx.tx().await?;
                    let buffer = tx
                        .backend_tx()
                        .downcast_mut::<wharf_store::redis::RedisTx>()
                        .ok_or_else(|| HandlerError::internal("not a Redis transaction"))?;
                    let text = format!("{}:text", args.log);
                    for command in [
                        vec!["RPUSH", &args.log, "1"],
                        vec!["SET", &text, "x"],
                        // Refused: the key holds text.
                        vec!["INCR", &text],
                    ] {
                        buffer
                            .queue(command)
                            .map_err(|e| HandlerError::internal(e.to_string()))?;
                    }
                    Ok::<_, HandlerError>("pushed")
                },
            ))
            .build()
            .unwrap();
    let log = unique("log");
    let args = json!({ "log": log, "n": 1, "idempotency_key": unique("key") });

    let first = run(&server, "alice", "push_then_fail", args.clone()).await;
    assert_eq!(first["isError"], true, "{first}");
    let said = first["content"][0]["text"].as_str().unwrap_or_default();
    assert!(said.contains("part-way"), "{first}");
    let again = run(&server, "alice", "push_then_fail", args).await;
    assert!(replayed(&again), "{again}");
    assert_eq!(again["content"], first["content"]);
    assert_eq!(again["isError"], true);
    let mut raw = support::raw_redis().await;
    let pushed: i64 = raw.llen(&log).await.unwrap();
    assert_eq!(pushed, 1, "applied twice");
}

/// A server with a store whose idempotency records would not outlive its longest call is not
/// built: a retry could find the first attempt's claim expired while that attempt still ran.
/// Without a store nothing is recorded, and nothing is checked.
#[tokio::test]
async fn idempotency_records_must_outlive_the_longest_call() {
    let store = sqlite().await;
    let build = |retention: u64, store: Option<Arc<dyn Store>>| {
        let mut config = wharf::ServerConfig::default();
        config.max_call_duration = Duration::from_secs(3600);
        config.idempotency_retention = Duration::from_secs(retention);
        let builder = Server::builder(Implementation::new("t", "1")).config(config);
        match store {
            Some(store) => builder.store(store),
            None => builder,
        }
        .build()
    };
    let refused = build(3600, Some(Arc::clone(&store)))
        .expect_err("built")
        .to_string();
    assert!(
        refused.contains("idempotency_retention") && refused.contains("max_call_duration"),
        "{refused}"
    );
    assert!(build(3601, Some(store)).is_ok());
    assert!(build(3600, None).is_ok());
}

/// What the confirmation's form asks.
#[derive(Deserialize)]
struct Confirmed {
    delete: bool,
}

/// A confirmation (a request state redeemed once) answered by a retry that got through
/// while the state was alive but redeems it after it expired: refused. (The record of a
/// redemption was kept a minute past the state's expiry, so two retries that got through
/// in time, the second redeeming later than that, both redeemed it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmation_redeemed_after_its_state_expired_is_refused() {
    let store = support::sqlite_with(
        &support::sqlite_url("confirm-expired"),
        Duration::from_secs(5),
    )
    .await;
    let (reached, go) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let mut config = wharf::ServerConfig::default();
    config.request_state.max_age = Duration::from_secs(2);
    let (handler_reached, handler_go) = (Arc::clone(&reached), Arc::clone(&go));
    let server = Server::builder(Implementation::new("t", "1"))
        .config(config)
        .store(store)
        .tool(
            tool("delete").handler(move |cx: Context, _: wharf::NoArgs| {
                let (reached, go) = (Arc::clone(&handler_reached), Arc::clone(&handler_go));
                async move {
                    let form = wharf::FormSchema::new().boolean("delete", "Delete it", true);
                    match cx.elicited::<Confirmed>("confirm", &form) {
                        Some(wharf::Elicited::Accepted(Confirmed { delete: true })) => {
                            reached.notify_one();
                            go.notified().await;
                            cx.redeem_once().await?;
                            Ok("deleted".to_owned())
                        }
                        Some(_) => Err(HandlerError::execution("not confirmed")),
                        None => Err(cx.ask().elicit("confirm", "Delete?", form).into()),
                    }
                }
            }),
        )
        .build()
        .unwrap();
    let alice = as_user(&server, "alice");
    let answer = confirming_retry(&alice, "delete", json!({})).await;
    // The state lives two seconds from when it was sealed, at the latest now.
    let expired_by = wharf::store::now_millis() + 2_000;
    let retry = tokio::spawn(async move { alice.call("tools/call", answer).await });
    // The retry got through with the state alive; it redeems once the state has expired.
    reached.notified().await;
    while wharf::store::now_millis() <= expired_by {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    go.notify_one();
    let refused = retry.await.unwrap().unwrap_err();
    assert_eq!(refused.error().code(), -32602, "{refused:?}");
    assert!(
        refused.error().message.contains("expired before this step"),
        "{refused:?}"
    );
}

/// A server on `store` whose tool `delete` appends to its log once the user confirmed.
fn confirming_delete(store: &Arc<dyn Store>, config: wharf::ServerConfig) -> Server {
    Server::builder(Implementation::new("t", "1"))
        .config(config)
        .store(Arc::clone(store))
        .tool(
            tool("delete")
                .idempotent()
                .handler(|cx: Context, args: Append| async move {
                    let form = wharf::FormSchema::new().boolean("delete", "Delete it", true);
                    match cx.elicited::<Confirmed>("confirm", &form) {
                        Some(wharf::Elicited::Accepted(Confirmed { delete: true })) => {
                            cx.tx()
                                .await?
                                .append_rows(&args.log, &[json!(args.n)])
                                .await
                                .map_err(|e| HandlerError::internal(e.to_string()))?;
                            Ok(Structured(Appended { appended: args.n }))
                        }
                        Some(_) => Err(HandlerError::execution("not confirmed")),
                        None => Err(cx.ask().elicit("confirm", "Delete?", form).into()),
                    }
                }),
        )
        .build()
        .unwrap()
}

/// A confirmed write whose answer was lost, retried once the round's state has expired (the
/// user took their time; the client resends the same round): the retry gets the write's
/// first result, not an error about the state, which would have the client report a write
/// that was made as failed. A round never completed is still refused as expired.
#[tokio::test]
async fn a_confirmed_write_retried_after_its_state_expired_replays() {
    let store = support::sqlite_with(
        &support::sqlite_url("confirm-replay"),
        Duration::from_secs(5),
    )
    .await;
    let mut config = wharf::ServerConfig::default();
    // Long enough for the two rounds below on a slow machine.
    config.request_state.max_age = Duration::from_secs(3);
    let server = confirming_delete(&store, config);
    let alice = as_user(&server, "alice");
    let log = unique("confirmed");
    let arguments = |key: &str| json!({ "log": log, "n": 1, "idempotency_key": key });
    let (done, left) = (unique("k"), unique("k"));
    let first = confirming_retry(&alice, "delete", arguments(&done)).await;
    let made = alice.call("tools/call", first.clone()).await.unwrap();
    assert_eq!(made["structuredContent"]["appended"], 1, "{made}");
    let never = confirming_retry(&alice, "delete", arguments(&left)).await;
    // Both states were sealed before this.
    let expired_by = wharf::store::now_millis() + 3_000;
    while wharf::store::now_millis() <= expired_by {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let again = alice.call("tools/call", first).await.unwrap();
    assert!(replayed(&again), "{again}");
    assert_eq!(again["structuredContent"], made["structuredContent"]);
    assert_eq!(rows(&store, &log).await, 1, "written once");
    let refused = alice.call("tools/call", never).await.unwrap_err();
    assert_eq!(refused.error().code(), -32602, "{refused:?}");
    assert!(refused.error().message.contains("expired"), "{refused:?}");
    assert_eq!(rows(&store, &log).await, 1);
}

/// A confirmed write whose answer was lost, retried with a state this server can no longer
/// open (its key retired since; keys rotate, and a state sealed just before a rotation
/// outlives its key by as little as the keys' overlap; here the state is altered, which
/// reads the same): the retry gets the write's first result, as a retry without any state
/// would. A state nothing opens confirms nothing: a write never made is still refused.
#[tokio::test]
async fn a_confirmed_write_retried_with_a_state_no_longer_opened_replays() {
    let store = support::sqlite_with(
        &support::sqlite_url("confirm-unopened"),
        Duration::from_secs(5),
    )
    .await;
    let server = confirming_delete(&store, wharf::ServerConfig::default());
    let alice = as_user(&server, "alice");
    let log = unique("confirmed");
    let arguments = |key: &str| json!({ "log": log, "n": 1, "idempotency_key": key });
    let unopened = |mut call: Value| {
        let state = call["requestState"].as_str().unwrap();
        call["requestState"] = format!("{state}x").into();
        call
    };
    let first = confirming_retry(&alice, "delete", arguments(&unique("k"))).await;
    let made = alice.call("tools/call", first.clone()).await.unwrap();
    assert_eq!(made["structuredContent"]["appended"], 1, "{made}");
    let again = alice.call("tools/call", unopened(first)).await.unwrap();
    assert!(replayed(&again), "{again}");
    assert_eq!(again["structuredContent"], made["structuredContent"]);
    let never = confirming_retry(&alice, "delete", arguments(&unique("k"))).await;
    let refused = alice.call("tools/call", unopened(never)).await.unwrap_err();
    assert_eq!(refused.error().code(), -32602, "{refused:?}");
    assert_eq!(rows(&store, &log).await, 1, "written once");
}
