//! Handles are checked wherever a tool's arguments carry them: in arrays and nested structs
//! too, not only as top-level properties; and a handler can retire only a handle the core
//! checked for its call. In-process on SQLite.

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

/// Merges its sources into `into`, retiring them: what a retry must replay.
#[derive(Deserialize, schemars::JsonSchema)]
struct Merge {
    into: Handle<Thing>,
    sources: Vec<Handle<Thing>>,
}

async fn server() -> Server {
    let store =
        support::sqlite_with(&support::sqlite_url("handle-args"), Duration::from_secs(5)).await;
    Server::builder(Implementation::new("t", "1"))
        .store(store)
        .tool(
            tool("make").handler(|cx: Context, _: wharf::NoArgs| async move {
                let handle = cx.mint_handle::<Thing>().await?;
                Ok::<_, HandlerError>(handle.id().to_owned())
            }),
        )
        .tool(
            tool("count").handler(|_cx: Context, args: Many| async move {
                format!("{} things", args.things.len())
            }),
        )
        .tool(
            tool("nested").handler(|cx: Context, args: Outer| async move {
                // The core checked it: its record is there.
                let checked = cx.handle_record(&args.inner.thing).is_some();
                format!("checked: {checked}")
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
    let s = server().await;
    let alice = Harness::new(s.clone()).principal(Principal::new("alice"));
    let bob = Harness::new(s).principal(Principal::new("bob"));
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
    assert_eq!(text(&ok), "checked: true", "{ok}");
    let refused = call(&alice, "nested", json!({ "inner": { "thing": theirs } })).await;
    assert!(
        text(&refused).contains("handle in \"inner.thing\" is unknown"),
        "{refused}"
    );
}

#[tokio::test]
async fn a_handler_cannot_retire_a_handle_the_core_did_not_check() {
    let s = server().await;
    let bob = Harness::new(s.clone()).principal(Principal::new("bob"));
    let alice = Harness::new(s).principal(Principal::new("alice"));
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
    let s = server().await;
    let alice = Harness::new(s.clone()).principal(Principal::new("alice"));
    let bob = Harness::new(s).principal(Principal::new("bob"));
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
    let caller = Harness::new(server).principal(Principal::new(support::unique("capped")));
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
