//! Handles are checked wherever a tool's arguments carry them: in arrays and nested structs
//! too, not only as top-level properties; and a handler can retire only a handle the core
//! checked for its call; what a handler writes commits only under the holds of its handles.
//! In-process, on SQLite and (where a test says so) PostgreSQL.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use wharf::protocol::Implementation;
use wharf::testing::Harness;
use wharf::{Context, Handle, HandleKind, HandlerError, Principal, Server, tool};

mod support;

struct Thing;

impl HandleKind for Thing {
    const KIND: &'static str = "thing";
    const PREFIX: &'static str = "thg";
    const CREATED_BY: &'static str = "make";
    const TTL: Duration = Duration::from_secs(3600);
}

/// A kind of handle no tool here takes.
struct Other;

impl HandleKind for Other {
    const KIND: &'static str = "other";
    const PREFIX: &'static str = "oth";
    const CREATED_BY: &'static str = "nothing";
    const TTL: Duration = Duration::from_secs(3600);
}

#[derive(Deserialize, schemars::JsonSchema)]
struct Many {
    things: Vec<Handle<Thing>>,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct Inner {
    thing: Handle<Thing>,
}

#[derive(Deserialize, schemars::JsonSchema)]
struct Outer {
    inner: Inner,
}

/// A field renamed with its old name kept as an alias: schemars leaves the alias out of the
/// schema, so a handle sent under it lies where no marker is.
#[derive(Deserialize, schemars::JsonSchema)]
struct Renamed {
    #[serde(alias = "old_thing")]
    thing: Option<Handle<Thing>>,
}

/// `keep`'s arguments: a thing, and the id of another one (a plain string).
#[derive(Deserialize, schemars::JsonSchema)]
struct Keep {
    thing: Handle<Thing>,
    other: Option<String>,
}

/// What `keep` seals into its round's state.
#[derive(serde::Serialize, Deserialize)]
struct Kept {
    thing: Handle<Thing>,
}

/// What `pick` asks for: a thing, typed as a handle.
#[derive(Deserialize)]
struct Picked {
    other: Handle<Thing>,
}

/// Merges its sources into `into`, retiring them: what a retry must replay.
#[derive(Deserialize, schemars::JsonSchema)]
struct Merge {
    into: Handle<Thing>,
    sources: Vec<Handle<Thing>>,
}

/// `make`: mints a thing handle, its id the result.
fn make() -> wharf::ToolDef {
    tool("make").handler(|cx: Context, _: wharf::NoArgs| async move {
        let handle = cx.mint_handle::<Thing>().await?;
        Ok::<_, HandlerError>(handle.id().to_owned())
    })
}

async fn server() -> Server {
    let store =
        support::sqlite_with(&support::sqlite_url("handle-args"), Duration::from_secs(5)).await;
    Server::builder(Implementation::new("t", "1"))
        .store(store)
        .tool(make())
        .tool(
            tool("count").handler(|_cx: Context, args: Many| async move {
                format!("{} things", args.things.len())
            }),
        )
        .tool(
            tool("nested").handler(|cx: Context, args: Outer| async move {
                // The core checked it: its record is there, as a thing only.
                let checked = cx.handle_record(&args.inner.thing).is_some();
                let as_other = Handle::<Other>::new(args.inner.thing.id());
                let other = cx.handle_record(&as_other).is_some();
                format!("checked: {checked}, as another kind: {other}")
            }),
        )
        .tool(
            tool("renamed").handler(|cx: Context, args: Renamed| async move {
                match &args.thing {
                    Some(thing) => format!("checked: {}", cx.handle_record(thing).is_some()),
                    None => "none".to_owned(),
                }
            }),
        )
        .tool(
            tool("merge")
                .idempotent()
                .handler(|cx: Context, args: Merge| async move {
                    for source in &args.sources {
                        cx.retire_handle(source).await?;
                    }
                    Ok::<_, HandlerError>(format!(
                        "merged {} into {}",
                        args.sources.len(),
                        args.into.id()
                    ))
                }),
        )
        .tool(
            // Asks for another thing, and says whether the answer read as one.
            tool("pick").handler(|cx: Context, args: Inner| async move {
                let form = wharf::FormSchema::new().string("other", "Another thing", true);
                match cx.elicited::<Picked>("pick", &form) {
                    Some(wharf::Elicited::Accepted(picked)) => Ok(format!(
                        "picked {}",
                        if picked.other == args.thing {
                            "the same"
                        } else {
                            "another"
                        }
                    )),
                    Some(_) => Ok("declined".to_owned()),
                    None => Err(HandlerError::execution("no thing read from the answer")),
                }
            }),
        )
        .tool(
            // Keeps a thing in its state (the argument, or the one `other` names) and asks to
            // go on; then says what the state read as.
            tool("keep").handler(|cx: Context, args: Keep| async move {
                if cx.round() == 0 {
                    let kept = match args.other {
                        Some(other) => Kept {
                            thing: Handle::new(other),
                        },
                        None => Kept { thing: args.thing },
                    };
                    let form = wharf::FormSchema::new().boolean("go", "Go on?", true);
                    return Err(cx.ask().elicit("go", "Go on?", form).state(&kept).into());
                }
                Ok::<_, HandlerError>(match cx.round_state::<Kept>() {
                    Some(kept) if kept.thing == args.thing => "kept the argument".to_owned(),
                    Some(_) => "kept another".to_owned(),
                    None => "no state".to_owned(),
                })
            }),
        )
        .tool(
            tool("retire_unchecked").raw_handler(
                serde_json::from_value(
                    json!({ "type": "object", "properties": { "id": { "type": "string" } } }),
                )
                .unwrap(),
                |cx: Context, args| async move {
                    let id = args.get("id").and_then(Value::as_str).unwrap_or_default();
                    cx.retire_handle(&Handle::<Thing>::new(id)).await?;
                    Ok::<_, HandlerError>("retired")
                },
            ),
        )
        .build()
        .unwrap()
}

/// The `_meta` of a client that answers forms (without it, a call's answers are not read).
fn answering_forms() -> Value {
    json!({ "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": { "elicitation": { "form": {} } } })
}

/// Two callers of one server.
async fn alice_and_bob() -> (Harness, Harness) {
    let s = server().await;
    let alice = Harness::new(s.clone()).principal(Principal::new("alice").unwrap());
    (
        alice,
        Harness::new(s).principal(Principal::new("bob").unwrap()),
    )
}

async fn call(h: &Harness, name: &str, arguments: Value) -> Value {
    h.call(
        "tools/call",
        json!({ "name": name, "arguments": arguments }),
    )
    .await
    .unwrap_or_else(|e| json!({ "rpcError": e.error().message }))
}

fn text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn handles_in_arrays_and_nested_structs_are_checked() {
    let (alice, bob) = alice_and_bob().await;
    let mine = text(&call(&alice, "make", json!({})).await).to_owned();
    let also_mine = text(&call(&alice, "make", json!({})).await).to_owned();
    let theirs = text(&call(&bob, "make", json!({})).await).to_owned();
    assert!(mine.starts_with("thg_"), "{mine}");

    let ok = call(&alice, "count", json!({ "things": [mine, also_mine] })).await;
    assert_eq!(text(&ok), "2 things", "{ok}");
    // One foreign handle in the array: the call does not run, and nothing says whose it is.
    let refused = call(&alice, "count", json!({ "things": [mine, theirs] })).await;
    assert_eq!(refused["isError"], true, "{refused}");
    assert!(
        text(&refused).contains("handle in \"things[]\" is unknown or has expired"),
        "{refused}"
    );
    let made_up = call(&alice, "count", json!({ "things": ["thg_x"] })).await;
    assert_eq!(text(&made_up), text(&refused));

    let ok = call(&alice, "nested", json!({ "inner": { "thing": mine } })).await;
    assert_eq!(text(&ok), "checked: true, as another kind: false", "{ok}");
    let refused = call(&alice, "nested", json!({ "inner": { "thing": theirs } })).await;
    assert!(
        text(&refused).contains("handle in \"inner.thing\" is unknown"),
        "{refused}"
    );
}

/// A handle under a name the input schema does not give (a serde alias) was never checked:
/// it does not reach the handler, whoever owns it.
#[tokio::test]
async fn a_handle_under_an_alias_the_schema_does_not_name_never_reaches_the_handler() {
    let (alice, bob) = alice_and_bob().await;
    let mine = text(&call(&alice, "make", json!({})).await).to_owned();
    let theirs = text(&call(&bob, "make", json!({})).await).to_owned();

    let ok = call(&alice, "renamed", json!({ "thing": mine })).await;
    assert_eq!(text(&ok), "checked: true", "{ok}");
    for id in [&theirs, &mine] {
        let refused = call(&alice, "renamed", json!({ "old_thing": id })).await;
        assert_eq!(refused["isError"], true, "{refused}");
        assert!(
            text(&refused).contains("a thing handle sits where the tool's input schema marks none"),
            "{refused}"
        );
        assert!(!text(&refused).contains(id.as_str()), "{refused}");
    }
    let none = call(&alice, "renamed", json!({})).await;
    assert_eq!(text(&none), "none", "{none}");
}

/// A handle the client writes into an answer to an input request was checked by nothing:
/// it reads only as one of the call's own handle arguments, never as another principal's
/// (nor as another of the caller's, which the core did not look at for this call).
#[tokio::test]
async fn a_handle_in_an_answer_reads_only_as_one_the_call_checked() {
    let (alice, bob) = alice_and_bob().await;
    let mine = text(&call(&alice, "make", json!({})).await).to_owned();
    let also_mine = text(&call(&alice, "make", json!({})).await).to_owned();
    let theirs = text(&call(&bob, "make", json!({})).await).to_owned();
    let pick = |other: &str| {
        alice.call(
            "tools/call",
            json!({ "name": "pick", "arguments": { "thing": mine },
                "inputResponses": { "pick": { "action": "accept", "content": { "other": other } } },
                "_meta": answering_forms() }),
        )
    };
    let same = pick(&mine).await.unwrap();
    assert_eq!(text(&same), "picked the same", "{same}");
    for other in [&theirs, &also_mine] {
        let refused = pick(other).await.unwrap();
        assert_eq!(refused["isError"], true, "{refused}");
        assert_eq!(text(&refused), "no thing read from the answer", "{refused}");
    }
}

/// A handle a round's state holds reads in the next round only as one of the call's checked
/// arguments: any other may have been retired or have expired since it was sealed.
#[tokio::test]
async fn a_handle_in_a_rounds_state_reads_only_as_one_the_call_checked() {
    let (alice, _) = alice_and_bob().await;
    let mine = text(&call(&alice, "make", json!({})).await).to_owned();
    let also_mine = text(&call(&alice, "make", json!({})).await).to_owned();
    for (other, read) in [(None, "kept the argument"), (Some(&also_mine), "no state")] {
        let mut params = json!({ "name": "keep", "arguments": { "thing": mine, "other": other },
            "_meta": answering_forms() });
        let asked = alice.call("tools/call", params.clone()).await.unwrap();
        assert!(asked["requestState"].is_string(), "{asked}");
        params["requestState"] = asked["requestState"].clone();
        params["inputResponses"] =
            json!({ "go": { "action": "accept", "content": { "go": true } } });
        let result = alice.call("tools/call", params).await.unwrap();
        assert_eq!(text(&result), read, "{result}");
    }
}

#[tokio::test]
async fn a_handler_cannot_retire_a_handle_the_core_did_not_check() {
    let (alice, bob) = alice_and_bob().await;
    let theirs = text(&call(&bob, "make", json!({})).await).to_owned();
    let refused = call(&alice, "retire_unchecked", json!({ "id": theirs })).await;
    assert_eq!(refused["rpcError"], "Internal error", "{refused}");
    // Bob's handle is alive: he can still use it.
    let ok = call(&bob, "count", json!({ "things": [theirs] })).await;
    assert_eq!(text(&ok), "1 things", "{ok}");
}

#[test]
fn a_handle_inside_a_recursive_type_fails_the_build() {
    #[derive(Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)] // only its schema matters
    struct Node {
        thing: Handle<Thing>,
        next: Option<Box<Node>>,
    }
    let refused = Server::builder(Implementation::new("t", "1"))
        .tool(tool("walk").handler(|_cx: Context, _: Node| async { "walked" }))
        .build()
        .err()
        .unwrap()
        .to_string();
    assert!(refused.contains("recursive type"), "{refused}");
}

/// A write that retired some of its handle arguments, retried with its key (its answer was
/// lost): the retry gets the first result, not a refusal of the handles it retired.
#[tokio::test]
async fn a_retry_replays_a_write_that_retired_its_handles() {
    let (alice, bob) = alice_and_bob().await;
    let into = text(&call(&alice, "make", json!({})).await).to_owned();
    let a = text(&call(&alice, "make", json!({})).await).to_owned();
    let b = text(&call(&alice, "make", json!({})).await).to_owned();
    let args = json!({ "into": into, "sources": [a, b], "idempotency_key": "m1" });
    let first = call(&alice, "merge", args.clone()).await;
    assert_eq!(text(&first), format!("merged 2 into {into}"), "{first}");

    let retry = call(&alice, "merge", args.clone()).await;
    assert_eq!(text(&retry), text(&first), "{retry}");
    assert_ne!(retry["isError"], true, "{retry}");
    // The sources are gone for anything but that replay: a new write is refused...
    let fresh = json!({ "into": into, "sources": [a], "idempotency_key": "m2" });
    let refused = call(&alice, "merge", fresh).await;
    assert!(
        text(&refused).contains("handle in \"sources[]\" is unknown"),
        "{refused}"
    );
    // ...and nobody else's call replays alice's write.
    let theirs = text(&call(&bob, "make", json!({})).await).to_owned();
    let args = json!({ "into": theirs, "sources": [a, b], "idempotency_key": "m1" });
    let refused = call(&bob, "merge", args).await;
    assert_eq!(refused["isError"], true, "{refused}");
}

/// A kind with a cap per owner, which minting counts.
struct Capped;

impl HandleKind for Capped {
    const KIND: &'static str = "capped";
    const PREFIX: &'static str = "cap";
    const CREATED_BY: &'static str = "open";
    const TTL: Duration = Duration::from_secs(3600);
    const MAX_PER_OWNER: Option<u64> = Some(2);
}

/// Minting a capped handle counts the caller's handles in the call's own transaction: on a
/// PostgreSQL pool of one connection, which an idempotent call holds for its claim, the
/// count needs no second one (it waited for the pool until it gave up), and the cap holds.
#[tokio::test]
async fn postgres_minting_a_capped_handle_needs_no_second_connection() {
    let mut one = support::options(Duration::from_secs(5));
    one.max_connections = 1;
    let store = wharf_store::open(&support::pg_url(), &one)
        .await
        .expect("PostgreSQL");
    let server = Server::builder(Implementation::new("t", "1"))
        .store(store)
        .tool(
            tool("open")
                .idempotent()
                .handler(|cx: Context, _: wharf::NoArgs| async move {
                    let handle = cx.mint_handle::<Capped>().await?;
                    Ok::<_, HandlerError>(handle.id().to_owned())
                }),
        )
        .build()
        .unwrap();
    let caller = Harness::new(server).principal(Principal::new(support::unique("capped")).unwrap());
    for n in 0..2 {
        let key = format!("k{n}");
        let opened = tokio::time::timeout(
            Duration::from_secs(10),
            call(&caller, "open", json!({ "idempotency_key": key })),
        )
        .await
        .expect("the mint waited for a second connection");
        assert!(text(&opened).starts_with("cap_"), "{opened}");
    }
    let third = call(&caller, "open", json!({ "idempotency_key": "k2" })).await;
    assert_eq!(third["isError"], true, "{third}");
    assert!(
        text(&third).contains("You hold 2 open capped handles"),
        "{third}"
    );
}

#[derive(Deserialize, schemars::JsonSchema)]
struct One {
    thing: Handle<Thing>,
}

/// When the handler is told to stop waiting for its transaction, and when it is to try again.
#[derive(Default)]
struct Cues {
    stop: tokio::sync::Notify,
    stopped: tokio::sync::Notify,
    go: tokio::sync::Notify,
}

/// A handler that stops waiting for its transaction while the store still waits to hold its
/// handle (a retirement holds it), then asks again: the second `cx.tx()` holds the handle
/// before it hands the transaction over, and finds it retired, so nothing the handler
/// writes commits. (The hold used to leave the call's list as soon as it was tried, so the
/// second `cx.tx()` handed the transaction over unheld, and the write committed under a
/// retired handle.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_hold_cut_short_is_taken_again_before_anything_is_written() {
    let store = support::postgres_with(Duration::from_secs(5)).await;
    let table = support::unique("held_writes").replace('-', "_");
    let observer = support::pg_observer().await;
    sqlx::query(&format!("CREATE TABLE {table} (thing TEXT NOT NULL)"))
        .execute(&observer)
        .await
        .unwrap();
    let cues = Arc::new(Cues::default());
    let handler_cues = Arc::clone(&cues);
    let insert = format!("INSERT INTO {table} (thing) VALUES ($1)");
    let server = Server::builder(Implementation::new("t", "1"))
        .store(Arc::clone(&store))
        .tool(make())
        .tool(tool("write").handler(move |cx: Context, args: One| {
            let cues = Arc::clone(&handler_cues);
            let insert = insert.clone();
            async move {
                tokio::select! {
                    _ = cx.tx() => panic!("the hold went through while the handle was locked"),
                    () = cues.stop.notified() => {}
                }
                cues.stopped.notify_one();
                cues.go.notified().await;
                let mut tx = cx.tx().await?;
                let sql = tx
                    .backend_tx()
                    .downcast_mut::<wharf_store::SqlTx>()
                    .and_then(wharf_store::SqlTx::postgres)
                    .expect("a PostgreSQL transaction");
                sqlx::query(&insert)
                    .bind(args.thing.id())
                    .execute(&mut **sql)
                    .await
                    .map_err(HandlerError::internal)?;
                Ok::<_, HandlerError>("written")
            }
        }))
        .build()
        .unwrap();
    let caller = Harness::new(server).principal(Principal::new(support::unique("holder")).unwrap());
    let id = text(&call(&caller, "make", json!({})).await).to_owned();
    assert!(id.starts_with("thg_"), "{id}");

    // A retirement of the handle, begun and not yet committed: it holds the handle's lock.
    let mut retiring = store.begin(wharf::store::TxMode::Write).await.unwrap();
    retiring.retire_handle(&id).await.unwrap();
    let retiring_pid = support::pg_backend_pid(&mut retiring).await;

    let write = tokio::spawn({
        let id = id.clone();
        async move { call(&caller, "write", json!({ "thing": id })).await }
    });
    support::until_pg_blocked_by(&observer, retiring_pid, "the call's hold waits").await;
    cues.stop.notify_one();
    cues.stopped.notified().await;
    retiring.commit().await.unwrap();
    cues.go.notify_one();

    let result = write.await.unwrap();
    assert_eq!(result["isError"], true, "{result}");
    assert!(
        text(&result).contains("handle in \"thing\" is unknown or has expired"),
        "{result}"
    );
    let written: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(&observer)
        .await
        .unwrap();
    assert_eq!(written, 0, "a write committed under a retired handle");
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(&observer)
        .await
        .unwrap();
}

/// A write the handler makes in a transaction of its own (a step) holds the call's handles as
/// the call's transaction does: a handle another call retired since the core checked it
/// refuses the step, and nothing is written under it (its data would outlive it: no sweep
/// removes data of a handle already gone).
#[tokio::test]
async fn a_step_written_after_its_handle_was_retired_is_refused() {
    let store =
        support::sqlite_with(&support::sqlite_url("handle-steps"), Duration::from_secs(5)).await;
    let started = Arc::new(tokio::sync::Notify::new());
    let go = Arc::new(tokio::sync::Notify::new());
    let (handler_started, handler_go) = (Arc::clone(&started), Arc::clone(&go));
    let server = Server::builder(Implementation::new("t", "1"))
        .store(store)
        .tool(make())
        .tool(tool("finish").handler(|cx: Context, args: One| async move {
            cx.retire_handle(&args.thing).await?;
            Ok::<_, HandlerError>("finished")
        }))
        .tool(tool("step").handler(move |cx: Context, args: One| {
            let (started, go) = (Arc::clone(&handler_started), Arc::clone(&handler_go));
            async move {
                started.notify_one();
                go.notified().await;
                let mut tx = cx.transaction(wharf::store::TxMode::Write).await?;
                wharf_store::Documents::append_rows(
                    tx.as_mut(),
                    &args.thing.collection("rows"),
                    &[json!({ "n": 1 })],
                )
                .await?;
                tx.commit().await?;
                Ok::<_, HandlerError>("stepped")
            }
        }))
        .build()
        .unwrap();
    let alice = Harness::new(server).principal(Principal::new("alice").unwrap());
    let id = text(&call(&alice, "make", json!({})).await).to_owned();

    let step = tokio::spawn({
        let (alice, id) = (alice.clone(), id.clone());
        async move { call(&alice, "step", json!({ "thing": id })).await }
    });
    started.notified().await;
    let finished = call(&alice, "finish", json!({ "thing": id })).await;
    assert_eq!(text(&finished), "finished", "{finished}");
    go.notify_one();
    let stepped = step.await.unwrap();
    assert_eq!(stepped["isError"], true, "{stepped}");
    assert!(
        text(&stepped).contains("handle in \"thing\" is unknown or has expired"),
        "{stepped}"
    );
}

/// A call's steps never wait on its own retirement of a handle: on PostgreSQL the
/// retirement keeps the handle's lock until the call's transaction commits, when the handler
/// returns, so a step that held the handle, opened before the retirement or after it, would
/// wait for its own call (or it for the step) until the lock wait gave up.
#[tokio::test]
async fn postgres_a_step_after_the_call_retired_its_handle_does_not_wait_for_it() {
    let store = support::postgres_with(Duration::from_secs(5)).await;
    let server = Server::builder(Implementation::new("t", "1"))
        .store(store)
        .tool(make())
        .tool(tool("close").handler(|cx: Context, args: One| async move {
            // A step opened before the retirement, and one after.
            let mut before = cx.transaction(wharf::store::TxMode::Write).await?;
            wharf_store::Documents::put_doc(
                before.as_mut(),
                "closings",
                &format!("{}-before", args.thing.id()),
                &json!({ "closing": true }),
            )
            .await?;
            cx.retire_handle(&args.thing).await?;
            before.commit().await?;
            let mut step = cx.transaction(wharf::store::TxMode::Write).await?;
            wharf_store::Documents::put_doc(
                step.as_mut(),
                "closings",
                args.thing.id(),
                &json!({ "closed": true }),
            )
            .await?;
            step.commit().await?;
            Ok::<_, HandlerError>("closed")
        }))
        .build()
        .unwrap();
    let caller = Harness::new(server).principal(Principal::new(support::unique("closer")).unwrap());
    let id = text(&call(&caller, "make", json!({})).await).to_owned();
    let closed = tokio::time::timeout(
        Duration::from_secs(20),
        call(&caller, "close", json!({ "thing": id })),
    )
    .await
    .expect("the step waited for its own call's retirement");
    assert_eq!(text(&closed), "closed", "{closed}");
    let again = call(&caller, "close", json!({ "thing": id })).await;
    assert!(text(&again).contains("unknown or has expired"), "{again}");
}
