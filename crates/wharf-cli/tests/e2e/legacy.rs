//! Clients of the initialization-based era (2025-11-25 and earlier) on the same endpoint as
//! stateless ones: sessions opened by `initialize`, kept in the store, served by any replica;
//! input requests as server requests on the call's stream; cancellation, subscriptions and
//! list changes across replicas. Every message the server sends them validates against the
//! 2025-11-25 schema.

use crate::common;

use std::time::Duration;

use common::import::*;
use common::peers::{PythonServer, venv_python};
use common::{ServerProcess, validate_legacy, validate_legacy_in};
use futures_util::{Stream, StreamExt};
use serde_json::{Value, json};
use wharf_client::{Client, Connection, HttpClient, LegacySession, Refuse, ToolCall};

const WAIT: Duration = Duration::from_secs(20);

fn start(store: &str, extra: &[&str]) -> ServerProcess {
    let mut args = replica_args(store);
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ServerProcess::start_on(common::free_port(), &args)
}

fn elicitation() -> Value {
    json!({ "elicitation": {} })
}

async fn open(client: &HttpClient) -> LegacySession {
    let session = LegacySession::initialize(client, "2025-11-25", elicitation())
        .await
        .expect("initialize");
    validate_legacy(
        "initialize",
        &json!({ "jsonrpc": "2.0", "id": 1, "result": session.initialized }),
    );
    session
}

/// A request of the session whose answer must be a result; returns it, every message
/// validated.
async fn ok(session: &LegacySession, method: &str, params: Value) -> Value {
    let reply = session.request(method, params).await.expect("request");
    assert_eq!(reply.status, 200, "{method}: {}", reply.body);
    for m in &reply.messages {
        validate_legacy(method, m);
    }
    reply
        .result()
        .unwrap_or_else(|| panic!("{method}: no result: {}", reply.body))
        .clone()
}

async fn tool(session: &LegacySession, name: &str, args: Value) -> Value {
    let result = ok(
        session,
        "tools/call",
        json!({ "name": name, "arguments": args }),
    )
    .await;
    assert_ne!(result["isError"], true, "{name}: {result}");
    result["structuredContent"].clone()
}

async fn next(stream: &mut (impl Stream<Item = Value> + Unpin), what: &str) -> Value {
    tokio::time::timeout(WAIT, stream.next())
        .await
        .unwrap_or_else(|_| panic!("no {what} within {WAIT:?}"))
        .unwrap_or_else(|| panic!("the stream ended before {what}"))
}

/// A committed dataset of `n` rows, loaded through the session.
async fn dataset(session: &LegacySession, n: i64) -> String {
    let name = unique("legacy");
    load(session, &name, n).await;
    name
}

/// Dataset `name` created with `n` rows, through the session.
async fn load(session: &LegacySession, name: &str, n: i64) {
    let begun = tool(
        session,
        "import_begin",
        json!({ "dataset": name, "columns": columns(), "idempotency_key": unique("begin") }),
    )
    .await;
    let import = begun["import"].as_str().unwrap().to_owned();
    let args = json!({ "import": import, "rows": rows(0, n), "idempotency_key": "k1" });
    tool(session, "import_append_rows", args).await;
    tool(
        session,
        "import_commit",
        json!({ "import": import, "idempotency_key": "commit" }),
    )
    .await;
}

/// Tells every replica on the store that the tool list changed, as a replica announcing it
/// would (the bus's own encoding: `t` on channel `wharf_changes`).
async fn announce_tools_changed(store: &str) {
    if store.starts_with("postgres") {
        let pool = sqlx::PgPool::connect(store).await.unwrap();
        sqlx::query("SELECT pg_notify('wharf_changes', 't')")
            .execute(&pool)
            .await
            .unwrap();
    } else {
        let client = redis::Client::open(store).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let _: i64 = redis::cmd("PUBLISH")
            .arg("wharf_changes")
            .arg("t")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}

/// Two replicas, each message of one session sent to whichever the test picks: the
/// session, its subscriptions, an answer to a server request, a cancellation and a list
/// change all reach the replica that needs them.
async fn a_legacy_session_spans_replicas(store: &str) {
    let a = start(store, &[]);
    let b = start(store, &[]);
    let on_a = open(&a.client().with_bearer(TOKEN_42)).await;
    let on_b = on_a.through(&b.client().with_bearer(TOKEN_42));

    // The session opened on A is served by B, and its stream opens there.
    let tools = ok(&on_b, "tools/list", json!({})).await;
    assert!(
        tools["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "import_commit")
    );
    let (status, events) = on_b.listen().await.unwrap();
    assert_eq!(status, 200);
    let mut events = Box::pin(events);

    // Subscribed through A; a commit through A reaches the stream on B.
    let name = dataset(&on_a, 450).await;
    let uri = format!("dataset://{name}");
    ok(&on_a, "resources/subscribe", json!({ "uri": uri })).await;
    let import = tool(
        &on_b,
        "import_begin",
        json!({ "dataset": name, "idempotency_key": unique("b2") }),
    )
    .await["import"]
        .as_str()
        .unwrap()
        .to_owned();
    let args = json!({ "import": import, "rows": rows(0, 2), "idempotency_key": "k2" });
    tool(&on_b, "import_append_rows", args).await;

    // The commit replaces rows: A asks the user on the call's stream; the answer goes to B.
    let commit = on_a.message(
        "tools/call",
        json!({ "name": "import_commit", "arguments": { "import": import, "mode": "replace", "idempotency_key": "commit" } }),
    );
    let mut call = Box::pin(on_a.stream(&commit).await.unwrap());
    let ask = next(&mut call, "the confirmation request").await;
    validate_legacy("tools/call", &ask);
    assert_eq!(ask["method"], "elicitation/create", "{ask}");
    let message = ask["params"]["message"].as_str().unwrap();
    assert!(
        message.contains("450 rows") && message.contains("2 rows"),
        "{message}"
    );
    let answer = json!({ "action": "accept", "content": { "replace": true } });
    assert_eq!(on_b.respond(&ask["id"], answer).await.unwrap(), 202);
    let done = next(&mut call, "the commit's result").await;
    validate_legacy("tools/call", &done);
    assert_eq!(done["id"], commit["id"]);
    assert_eq!(
        done["result"]["structuredContent"]["totalRows"], 2,
        "{done}"
    );
    assert!(
        call.next().await.is_none(),
        "the call's stream ends with its result"
    );
    let updated = next(&mut events, "the dataset's update").await;
    validate_legacy("", &updated);
    assert_eq!(updated["method"], "notifications/resources/updated");
    assert_eq!(updated["params"]["uri"], uri);

    // A list change announced anywhere reaches the session's stream.
    announce_tools_changed(store).await;
    let changed = next(&mut events, "tools/list_changed").await;
    validate_legacy("", &changed);
    assert_eq!(changed["method"], "notifications/tools/list_changed");

    // A cancellation naming an id too long for one message of the bus (the client picks
    // ids) still travels as one small message: were it announced as a gap instead, every
    // stream on every replica would end, this session's too (its later updates below).
    let long_id = "x".repeat(100_000);
    let cancel = json!({ "requestId": long_id });
    assert_eq!(
        on_b.notify("notifications/cancelled", cancel)
            .await
            .unwrap(),
        202
    );

    // A report runs on A; its cancellation, POSTed to B, stops it there.
    let big = dataset(&on_a, 1000).await;
    let report = on_a.message(
        "tools/call",
        json!({
            "name": "report_generate",
            "arguments": { "dataset": big, "chunk_rows": 100, "pause_ms": 300, "idempotency_key": unique("report") },
            "_meta": { "progressToken": "r1" },
        }),
    );
    let mut running = Box::pin(on_a.stream(&report).await.unwrap());
    let progress = next(&mut running, "the report's progress").await;
    validate_legacy("tools/call", &progress);
    assert_eq!(progress["params"]["progressToken"], "r1");
    let cancel = json!({ "requestId": report["id"], "reason": "the user changed their mind" });
    assert_eq!(
        on_b.notify("notifications/cancelled", cancel)
            .await
            .unwrap(),
        202
    );
    let rest: Vec<Value> = tokio::time::timeout(WAIT, running.collect())
        .await
        .expect("the cancelled call's stream ends");
    assert!(
        rest.iter()
            .all(|m| m.get("result").is_none() && m.get("error").is_none()),
        "a cancelled call sends no response: {rest:?}"
    );
    // The run's cleanup marks it cancelled once its last progress commit has landed.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let status = tool(&on_b, "report_status", json!({ "dataset": big })).await;
        if status["state"] == "cancelled" {
            break;
        }
        assert_eq!(status["state"], "running", "{status}");
        assert!(
            std::time::Instant::now() < deadline,
            "never marked cancelled: {status}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Two subscriptions made at once, on both replicas, both stay: each change is made to
    // the session as stored, not to a copy.
    let (x, y) = (unique("legacy_x"), unique("legacy_y"));
    let (sub_x, sub_y) = tokio::join!(
        ok(
            &on_a,
            "resources/subscribe",
            json!({ "uri": format!("dataset://{x}") })
        ),
        ok(
            &on_b,
            "resources/subscribe",
            json!({ "uri": format!("dataset://{y}") })
        ),
    );
    assert_eq!((sub_x, sub_y), (json!({}), json!({})));
    load(&on_a, &x, 1).await;
    load(&on_b, &y, 1).await;
    let mut heard = Vec::new();
    while heard.len() < 2 {
        let n = next(&mut events, "the updates of both datasets").await;
        if n["method"] == "notifications/resources/updated" {
            heard.push(n["params"]["uri"].as_str().unwrap().to_owned());
        }
    }
    heard.sort();
    assert_eq!(heard, [format!("dataset://{x}"), format!("dataset://{y}")]);

    // Unsubscribed through B: the next commit is not heard.
    ok(&on_b, "resources/unsubscribe", json!({ "uri": uri })).await;

    // Ended through B: the stream ends, and A answers 404 from then on.
    assert_eq!(on_b.delete().await.unwrap(), 200);
    let rest: Vec<Value> = tokio::time::timeout(WAIT, events.collect())
        .await
        .expect("the session's stream ends with the session");
    assert!(
        rest.iter()
            .all(|m| m["method"] != "notifications/resources/updated"),
        "{rest:?}"
    );
    // A heard of the end on the bus (a replica's copy of a session lives two seconds at
    // most should the announcement be missed): it answers 404 within that.
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        let gone = on_a.request("ping", json!({})).await.unwrap();
        if gone.status == 404 {
            break;
        }
        assert_eq!(gone.status, 200, "{}", gone.body);
        assert!(
            std::time::Instant::now() < deadline,
            "A still serves the ended session"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn postgres_a_legacy_session_spans_replicas() {
    a_legacy_session_spans_replicas(&pg_url()).await;
}

#[tokio::test]
async fn redis_a_legacy_session_spans_replicas() {
    a_legacy_session_spans_replicas(&redis_url()).await;
}

/// The lifecycle rules of 2025-11-25 on one replica (SQLite): version negotiation, the
/// session's owner, its end, the header that must match it, and the methods each era has.
#[tokio::test]
async fn sessions_follow_the_lifecycle_and_belong_to_their_principal() {
    let server = start(&sqlite_url("legacy-lifecycle"), &[]);
    let client = server.client().with_bearer(TOKEN_42);

    for (asked, settled) in [
        ("2025-06-18", "2025-06-18"),
        ("2025-03-26", "2025-03-26"),
        ("2024-11-05", "2025-11-25"),
        ("2026-07-28", "2025-11-25"),
    ] {
        let s = LegacySession::initialize(&client, asked, json!({}))
            .await
            .unwrap();
        assert_eq!(s.version(), settled, "asked {asked}");
    }
    let session = open(&client).await;
    assert!(
        session
            .id()
            .unwrap()
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b))
    );
    assert_eq!(ok(&session, "ping", json!({})).await, json!({}));

    // Another principal holding the id is refused as if it did not exist.
    let stolen = session.through(&server.client().with_bearer(TOKEN_7));
    let reply = stolen.request("tools/list", json!({})).await.unwrap();
    assert_eq!(reply.status, 404, "{}", reply.body);

    // The version header, when sent, must be the session's.
    let body = session.message("ping", json!({}));
    let mut headers = client.headers_for("ping", &json!({}));
    headers.insert("mcp-session-id", session.id().unwrap().parse().unwrap());
    headers.insert("mcp-protocol-version", "2025-06-18".parse().unwrap());
    let reply = client
        .send_raw(body.to_string().into_bytes(), headers)
        .await
        .unwrap();
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert!(
        reply.body.contains("is not the session's version"),
        "{}",
        reply.body
    );
    // A mirrored header that is sent must match the body, for the methods a session
    // answers at once too.
    let ping = session.message("ping", json!({}));
    let mut headers = client.headers_for("tools/list", &json!({}));
    headers.insert("mcp-session-id", session.id().unwrap().parse().unwrap());
    headers.insert("mcp-protocol-version", session.version().parse().unwrap());
    let reply = client
        .send_raw(ping.to_string().into_bytes(), headers)
        .await
        .unwrap();
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert_eq!(reply.error_code(), Some(-32020), "{}", reply.body);
    // A version after the legacy ones that this server does not know is refused as that,
    // with the versions it supports, whatever session id comes with it.
    let later = "2027-01-01";
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": later,
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    let discover = json!({ "jsonrpc": "2.0", "id": 9, "method": "server/discover", "params": { "_meta": meta } });
    let mut headers = client.headers_for("server/discover", &discover["params"]);
    headers.insert("mcp-session-id", session.id().unwrap().parse().unwrap());
    headers.insert("mcp-protocol-version", later.parse().unwrap());
    let reply = client
        .send_raw(discover.to_string().into_bytes(), headers)
        .await
        .unwrap();
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert_eq!(reply.error_code(), Some(-32022), "{}", reply.body);

    // The methods of 2026-07-28 alone do not exist in a session, nor does a second
    // initialize.
    for method in ["server/discover", "subscriptions/listen"] {
        let reply = session.request(method, json!({})).await.unwrap();
        validate_legacy(method, reply.response().unwrap());
        assert_eq!(reply.error_code(), Some(-32601), "{method}: {}", reply.body);
    }
    let again = session
        .request(
            "initialize",
            json!({ "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": { "name": "c", "version": "1" } }),
        )
        .await
        .unwrap();
    assert_eq!(again.error_code(), Some(-32600), "{}", again.body);

    // Stateless requests on the same endpoint are untouched, and an `initialize` that
    // carries their `_meta` is one of theirs: the method does not exist there.
    let discover = client.request("server/discover", json!({})).await.unwrap();
    assert_eq!(discover.status, 200, "{}", discover.body);
    let modern = client.request("initialize", json!({})).await.unwrap();
    assert_eq!(
        (modern.status, modern.error_code()),
        (404, Some(-32601)),
        "{}",
        modern.body
    );

    // A made-up session, an ended one, and an initialize without its version.
    let mut headers = client.headers_for("ping", &json!({}));
    headers.insert(
        "mcp-session-id",
        "mcs_00000000000000000000000000000000".parse().unwrap(),
    );
    let made_up = client
        .send_raw(body.to_string().into_bytes(), headers)
        .await
        .unwrap();
    assert_eq!(made_up.status, 404, "{}", made_up.body);
    let ended = LegacySession::initialize(&client, "2025-11-25", json!({}))
        .await
        .unwrap();
    assert_eq!(ended.delete().await.unwrap(), 200);
    assert_eq!(ended.delete().await.unwrap(), 404);
    assert_eq!(ended.request("ping", json!({})).await.unwrap().status, 404);
    let bad = client
        .send_raw(
            json!({ "jsonrpc": "2.0", "id": 5, "method": "initialize", "params": { "capabilities": {} } })
                .to_string()
                .into_bytes(),
            client.headers_for("initialize", &json!({})),
        )
        .await
        .unwrap();
    assert_eq!(bad.error_code(), Some(-32602), "{}", bad.body);
    assert!(bad.body.contains("protocolVersion"), "{}", bad.body);
    // A mirrored header, which this era does not require, must match when it is sent.
    let call = session.message(
        "tools/call",
        json!({ "name": "import_status", "arguments": { "import": "imp_x" } }),
    );
    let mut headers = client.headers_for("tools/call", &json!({ "name": "dataset_query" }));
    headers.insert("mcp-session-id", session.id().unwrap().parse().unwrap());
    headers.remove("mcp-protocol-version");
    let mismatch = client
        .send_raw(call.to_string().into_bytes(), headers)
        .await
        .unwrap();
    assert_eq!(
        (mismatch.status, mismatch.error_code()),
        (400, Some(-32020)),
        "{}",
        mismatch.body
    );
    assert!(mismatch.body.contains("Mcp-Name"), "{}", mismatch.body);

    // An answer to a request the server never sent is refused, and kept nowhere.
    let status = session.respond(&json!("made-up"), json!({})).await.unwrap();
    assert_eq!(status, 400);
    // None of this touched the session.
    assert_eq!(ok(&session, "ping", json!({})).await, json!({}));
}

/// Without a store (one process keeps the sessions), the session's stream still hears
/// list changes, and its end.
#[tokio::test]
async fn sessions_kept_in_the_process_hear_changes_and_their_end() {
    let server = ServerProcess::start_exact(&["--profile", "conformance", "--anonymous"]);
    let session = open(&server.client()).await;
    let (status, events) = session.listen().await.unwrap();
    assert_eq!(status, 200);
    let mut events = Box::pin(events);
    ok(
        &session,
        "resources/subscribe",
        json!({ "uri": "test://watched-resource" }),
    )
    .await;
    ok(
        &session,
        "tools/call",
        json!({ "name": "test_trigger_tool_change", "arguments": {} }),
    )
    .await;
    let changed = next(&mut events, "tools/list_changed").await;
    validate_legacy("", &changed);
    assert_eq!(changed["method"], "notifications/tools/list_changed");
    assert_eq!(session.delete().await.unwrap(), 200);
    let rest: Vec<Value> = tokio::time::timeout(WAIT, events.collect())
        .await
        .expect("the session's stream ends with the session");
    assert!(rest.is_empty(), "{rest:?}");
}

/// A resource that does not exist is answered with 2025-11-25's `-32002` in a session (what
/// its clients look for), whether the core or the app's handler found it missing, and with
/// 2026-07-28's `-32602` without a session; `data.uri` names it either way.
#[tokio::test]
async fn an_unknown_resource_is_answered_in_each_eras_code() {
    let not_found = async |session: &LegacySession, method: &str, uri: &str| {
        let reply = session
            .request(method, json!({ "uri": uri }))
            .await
            .expect("request");
        assert_eq!(reply.status, 200, "{method}: {}", reply.body);
        for m in &reply.messages {
            validate_legacy(method, m);
        }
        assert_eq!(reply.error_code(), Some(-32002), "{method}: {}", reply.body);
        assert_eq!(reply.error().unwrap()["data"]["uri"], uri, "{}", reply.body);
    };
    // Found missing by the core: no resource or template matches.
    let server = ServerProcess::start_exact(&["--profile", "conformance", "--anonymous"]);
    let client = server.client();
    let session = open(&client).await;
    not_found(&session, "resources/read", "test://nothing-here").await;
    not_found(&session, "resources/subscribe", "test://nothing-here").await;
    let modern = client
        .request("resources/read", json!({ "uri": "test://nothing-here" }))
        .await
        .unwrap();
    assert_eq!(modern.error_code(), Some(-32602), "{}", modern.body);
    assert_eq!(
        modern.error().unwrap()["data"]["uri"],
        "test://nothing-here"
    );
    // Found missing by the app: `dataset://{name}` matches, but there is no such dataset.
    let server = start(&sqlite_url("legacy-not-found"), &[]);
    let session = open(&server.client().with_bearer(TOKEN_42)).await;
    not_found(&session, "resources/read", "dataset://no-such-dataset").await;
}

/// A session has one stream at a time: a newer GET ends the older one, so that no message
/// goes out on both (2025-11-25 transports: a message is sent on one stream only).
#[tokio::test]
async fn a_newer_stream_of_a_session_ends_the_older_one() {
    let server = ServerProcess::start_exact(&["--profile", "conformance", "--anonymous"]);
    let session = open(&server.client()).await;
    let (status, older) = session.listen().await.unwrap();
    assert_eq!(status, 200);
    let mut older = Box::pin(older);
    // A stream announces itself as it opens, before its response head is sent: by the time
    // the 200 above arrived, the older stream's announcement was on the bus.
    let (status, newer) = session.listen().await.unwrap();
    assert_eq!(status, 200);
    let mut newer = Box::pin(newer);
    let rest: Vec<Value> = tokio::time::timeout(WAIT, older.by_ref().collect())
        .await
        .expect("the older stream ends once the newer one opened");
    assert!(rest.is_empty(), "{rest:?}");
    ok(
        &session,
        "tools/call",
        json!({ "name": "test_trigger_tool_change", "arguments": {} }),
    )
    .await;
    let changed = next(&mut newer, "tools/list_changed on the newer stream").await;
    assert_eq!(changed["method"], "notifications/tools/list_changed");
}

/// A session's stream ends when the server starts draining, as listen streams do, rather
/// than at the end of the grace or holding the drain until its deadline: a proxy's next
/// request on its connection is answered while the server still serves. A stream opened
/// during the drain ends at shutdown.
#[tokio::test]
async fn a_sessions_stream_ends_when_the_drain_begins() {
    let mut server = ServerProcess::start_exact(&[
        "--profile",
        "conformance",
        "--anonymous",
        "--drain-grace-secs",
        "60",
        "--drain-secs",
        "120",
    ]);
    let session = open(&server.client()).await;
    let (status, events) = session.listen().await.unwrap();
    assert_eq!(status, 200);
    server.terminate();
    // WAIT is far below the grace (60 s) and the drain's deadline (120 s).
    let rest: Vec<Value> = tokio::time::timeout(WAIT, Box::pin(events).collect())
        .await
        .expect("the session's stream ends when the drain begins");
    assert!(rest.is_empty(), "{rest:?}");
    let (status, events) = session.listen().await.unwrap();
    assert_eq!(status, 200);
    // A second signal skips the rest of the grace: the shutdown ends the newer stream.
    server.terminate();
    let rest: Vec<Value> = tokio::time::timeout(WAIT, Box::pin(events).collect())
        .await
        .expect("the session's stream ends at shutdown");
    assert!(rest.is_empty(), "{rest:?}");
    assert!(server.wait_exit(Duration::from_secs(15)).success());
}

/// A session's log level applies to every later call; its messages travel on the call's
/// stream, in the 2025-11-25 shapes.
#[tokio::test]
async fn set_level_streams_log_messages_of_later_calls() {
    let server = ServerProcess::start_exact(&["--profile", "conformance", "--anonymous"]);
    let session = open(&server.client()).await;
    let quiet = session
        .request(
            "tools/call",
            json!({ "name": "test_tool_with_logging", "arguments": {} }),
        )
        .await
        .unwrap();
    assert_eq!(quiet.notifications().count(), 0, "{}", quiet.body);
    assert_eq!(
        ok(&session, "logging/setLevel", json!({ "level": "info" })).await,
        json!({})
    );
    let loud = session
        .request(
            "tools/call",
            json!({ "name": "test_tool_with_logging", "arguments": {} }),
        )
        .await
        .unwrap();
    assert!(loud.is_sse(), "{}", loud.body);
    for m in &loud.messages {
        validate_legacy("tools/call", m);
    }
    let logs: Vec<&Value> = loud.notifications().collect();
    assert_eq!(logs.len(), 3, "{}", loud.body);
    assert!(logs.iter().all(|m| m["method"] == "notifications/message"));
}

/// A server started modern-only refuses `initialize`, naming the versions it speaks.
#[tokio::test]
async fn a_modern_only_server_names_its_versions_to_initialize() {
    let server = ServerProcess::start_exact(&["--profile", "demo", "--anonymous", "--modern-only"]);
    let err = LegacySession::initialize(&server.client(), "2025-11-25", json!({}))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("-32022") && text.contains("2026-07-28"),
        "{text}"
    );
}

/// A call that needs what the client did not declare is refused with what it lacks; one
/// whose question goes unanswered ends with a timeout, not a hang.
#[tokio::test]
async fn input_requests_need_the_capability_and_an_answer_in_time() {
    let server = ServerProcess::start_exact(&[
        "--profile",
        "conformance",
        "--anonymous",
        "--input-timeout-secs",
        "1",
    ]);
    let client = server.client();
    let bare = LegacySession::initialize(&client, "2025-11-25", json!({}))
        .await
        .unwrap();
    let args = json!({ "name": "test_elicitation", "arguments": { "message": "Who?" } });
    let refused = bare.request("tools/call", args.clone()).await.unwrap();
    validate_legacy("tools/call", refused.response().unwrap());
    assert_eq!(refused.error_code(), Some(-32021), "{}", refused.body);
    assert!(refused.body.contains("elicitation"), "{}", refused.body);

    let session = open(&client).await;
    let call = session.message("tools/call", args);
    let mut stream = Box::pin(session.stream(&call).await.unwrap());
    let ask = next(&mut stream, "the question").await;
    assert_eq!(ask["method"], "elicitation/create");
    // The question is withdrawn first, so that the client stops asking its user.
    let withdrawn = next(&mut stream, "the question withdrawn").await;
    validate_legacy("notifications/cancelled", &withdrawn);
    assert_eq!(withdrawn["params"]["requestId"], ask["id"], "{withdrawn}");
    let timed_out = next(&mut stream, "the timeout").await;
    validate_legacy("tools/call", &timed_out);
    assert_eq!(timed_out["id"], call["id"]);
    let message = timed_out["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("did not answer") && message.contains("1 s"),
        "{message}"
    );
    // A late answer changes nothing, and the session goes on.
    let late =
        json!({ "action": "accept", "content": { "username": "u", "email": "u@example.com" } });
    assert_eq!(session.respond(&ask["id"], late).await.unwrap(), 202);
    assert_eq!(ok(&session, "ping", json!({})).await, json!({}));
}

/// A client that refuses a tool's input request with a JSON-RPC error (its user declined)
/// ends the call with a tool error that says so, which the model reads, as when a tool's own
/// request fails; not with a protocol error blaming the client's call.
#[tokio::test]
async fn an_input_request_refused_with_an_error_ends_the_call_with_a_tool_error() {
    let server = ServerProcess::start_exact(&["--profile", "conformance", "--anonymous"]);
    let session = open(&server.client()).await;
    let args = json!({ "name": "test_elicitation", "arguments": { "message": "Who?" } });
    let call = session.message("tools/call", args);
    let mut stream = Box::pin(session.stream(&call).await.unwrap());
    let ask = next(&mut stream, "the question").await;
    assert_eq!(ask["method"], "elicitation/create");
    let status = session
        .respond_error(&ask["id"], -1, "User rejected the request")
        .await
        .unwrap();
    assert_eq!(status, 202);
    let ended = next(&mut stream, "the call's result").await;
    validate_legacy("tools/call", &ended);
    assert_eq!(ended["id"], call["id"], "{ended}");
    assert_eq!(ended["result"]["isError"], true, "{ended}");
    let text = ended["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("User rejected the request"), "{text}");
}

/// A dual-era client's fallback (2026-07-28 basic/versioning): a legacy-only server, the
/// Python SDK's last 1.x FastMCP, answers the modern probe with a 400 of its own and gets
/// `initialize`; Wharf, dual-era or modern-only, keeps the client modern.
#[tokio::test]
async fn a_dual_era_client_falls_back_only_for_a_legacy_server() {
    let server = PythonServer::start(&venv_python("pyvenv-legacy"), "legacy_server.py");
    let client = HttpClient::new(server.url.clone());
    let Connection::Legacy(session) = client.connect(json!({})).await.unwrap() else {
        panic!("a legacy-only server was taken for a modern one");
    };
    let echoed = session
        .request(
            "tools/call",
            json!({ "name": "echo", "arguments": { "text": "hi" } }),
        )
        .await
        .unwrap();
    assert_eq!(
        echoed.result().unwrap()["content"][0]["text"],
        "hi",
        "{}",
        echoed.body
    );

    for extra in [&[][..], &["--modern-only"][..]] {
        let mut args = vec!["--profile", "demo", "--anonymous"];
        args.extend_from_slice(extra);
        let wharf = ServerProcess::start_exact(&args);
        assert!(
            matches!(
                wharf.client().connect(json!({})).await.unwrap(),
                Connection::Modern(_)
            ),
            "Wharf {extra:?} was taken for a legacy server"
        );
    }
}

/// A server that no longer knows the client's session (it ended, expired, or the server
/// restarted) answers 404, and the client starts a new session and sends the request again
/// (2025-11-25 transports, session management: it MUST). Against the Python SDK's last 1.x
/// and against Wharf. (The request failed.)
#[tokio::test]
async fn a_client_whose_session_is_gone_starts_a_new_one() {
    let python = PythonServer::start(&venv_python("pyvenv-legacy"), "legacy_server.py");
    let wharf = ServerProcess::start_exact(&["--profile", "demo", "--anonymous"]);
    for url in [python.url.clone(), wharf.url()] {
        let http = HttpClient::new(url.clone());
        let session = LegacySession::initialize(&http, "2025-11-25", json!({}))
            .await
            .unwrap();
        let client = Client::over(Connection::Legacy(session.clone()));
        let first = session.id().expect("a session id");
        let ended = session.delete().await.unwrap();
        assert!(
            (200..300).contains(&ended),
            "{url}: DELETE answered {ended}"
        );

        let tools = client.list_tools().await.unwrap();
        assert!(
            tools.iter().any(|t| t["name"] == "echo"),
            "{url}: {tools:?}"
        );
        let renewed = session.id().expect("a session id");
        assert_ne!(renewed, first, "{url}: the session was not renewed");
        // Ended again, the call is sent again in yet another session, once.
        assert!((200..300).contains(&session.delete().await.unwrap()));
        let call = ToolCall::new("echo", json!({ "text": "again" }));
        let result = client
            .call_tool(&call, &mut Refuse, &mut |_| {})
            .await
            .unwrap();
        assert_eq!(result["content"][0]["text"], "again", "{url}");
        assert_ne!(session.id().unwrap(), renewed, "{url}");
    }
}

/// A stored session this build cannot read (another version wrote it) is answered as ended,
/// 404, so its client opens another, rather than 503 "retry" until it expires. Before that,
/// a malformed cancellation is ignored.
#[tokio::test]
async fn a_session_stored_unreadable_is_answered_as_ended() {
    let store = sqlite_url(&unique("legacy-unreadable"));
    let server = start(&store, &[]);
    let session = open(&server.client().with_bearer(TOKEN_42)).await;
    let id = session.id().expect("a session id");
    // A malformed cancellation is ignored (2025-11-25: it SHOULD be), not refused.
    let ignored = session
        .notify(
            "notifications/cancelled",
            json!({ "reason": "names no request" }),
        )
        .await
        .unwrap();
    assert_eq!(ignored, 202);
    let pool = sqlx::SqlitePool::connect(&format!("{store}?mode=rw"))
        .await
        .unwrap();
    let changed = sqlx::query("UPDATE wharf_handles SET data = '{\"version\":3}' WHERE id = ?")
        .bind(&id)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(changed.rows_affected(), 1);
    // A change of the session reads it from the store even while this replica's copy is
    // fresh: the session ended (404, as every request of an ended session), not "busy,
    // retry".
    let subscribe = session
        .request(
            "resources/subscribe",
            json!({ "uri": "dataset://anything" }),
        )
        .await
        .unwrap();
    assert_eq!(subscribe.status, 404, "{}", subscribe.body);
    assert!(
        subscribe.body.contains("unknown or has ended"),
        "{}",
        subscribe.body
    );
    // The change dropped the replica's copy: every request now reads the record, and ends.
    let reply = session.request("tools/list", json!({})).await.unwrap();
    assert_eq!(reply.status, 404, "{}", reply.body);
}

/// A legacy client that goes away does not cancel its call (2025-11-25: only
/// `notifications/cancelled` does): a plain JSON call keeps running to its end.
#[tokio::test]
async fn a_dropped_connection_does_not_cancel_a_legacy_call() {
    let server = ServerProcess::start_exact(&["--profile", "demo", "--anonymous"]);
    let session = open(&server.client()).await;
    let stats = async || {
        let s = tool(&session, "demo_stats", json!({})).await;
        (
            s["slowCountsStarted"].as_u64().unwrap(),
            s["slowCountsCancelled"].as_u64().unwrap(),
        )
    };
    let count = json!({ "name": "slow_count", "arguments": { "steps": 3, "interval_ms": 150 } });
    let gone = tokio::time::timeout(
        Duration::from_millis(100),
        session.request("tools/call", count),
    )
    .await;
    assert!(gone.is_err(), "the client went away before the answer");
    let deadline = std::time::Instant::now() + WAIT;
    while stats().await.0 == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the count never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The count takes 450 ms; a cancelled one would have said so at once.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        stats().await,
        (1, 0),
        "the call was cancelled by the dropped connection"
    );
}

/// Ending a session (DELETE) stops its calls still waiting for an answer: nobody is left to
/// give one, and each would otherwise hold its slot and its stream until its input timeout
/// (ten minutes by default).
#[tokio::test]
async fn ending_a_session_stops_the_calls_waiting_for_its_answers() {
    let server = ServerProcess::start_exact(&["--profile", "conformance", "--anonymous"]);
    let session = open(&server.client()).await;
    let call = session.message(
        "tools/call",
        json!({ "name": "test_elicitation", "arguments": { "message": "Who?" } }),
    );
    let mut stream = Box::pin(session.stream(&call).await.unwrap());
    let ask = next(&mut stream, "the question").await;
    assert_eq!(ask["method"], "elicitation/create");
    assert_eq!(session.delete().await.unwrap(), 200);
    let rest = tokio::time::timeout(WAIT, stream.collect::<Vec<_>>())
        .await
        .expect("the call's stream ends with its session");
    for m in &rest {
        validate_legacy("tools/call", m);
        assert!(m.get("result").is_none(), "the call went on: {m}");
    }
}

/// Over HTTP too, the id of a running call is refused to another request of its session
/// until the call ends or is cancelled: a cancellation names one call.
#[tokio::test]
async fn a_running_calls_id_is_refused_to_another_request_of_its_session() {
    let server = ServerProcess::start_exact(&["--profile", "demo", "--anonymous"]);
    let session = open(&server.client()).await;
    let slow = session.message(
        "tools/call",
        json!({ "name": "slow_count", "arguments": { "steps": 1000, "interval_ms": 100 },
            "_meta": { "progressToken": 1 } }),
    );
    // Its first progress says it runs.
    let mut running = Box::pin(session.stream(&slow).await.unwrap());
    let progress = next(&mut running, "progress").await;
    assert_eq!(progress["method"], "notifications/progress", "{progress}");
    let mut other = session.message(
        "tools/call",
        json!({ "name": "echo", "arguments": { "text": "x" } }),
    );
    other["id"] = slow["id"].clone();
    let refused = session.post(&other).await.unwrap();
    validate_legacy("tools/call", refused.response().unwrap());
    assert_eq!(refused.error_code(), Some(-32600), "{}", refused.body);
    assert!(refused.body.contains("already in use"), "{}", refused.body);
    // So is a request the server answers at once (it would answer the slow call's id
    // twice).
    let mut ping = session.message("ping", json!({}));
    ping["id"] = slow["id"].clone();
    let refused = session.post(&ping).await.unwrap();
    validate_legacy("ping", refused.response().unwrap());
    assert_eq!(refused.error_code(), Some(-32600), "{}", refused.body);
    assert!(refused.body.contains("already in use"), "{}", refused.body);

    session
        .notify(
            "notifications/cancelled",
            json!({ "requestId": slow["id"] }),
        )
        .await
        .unwrap();
    let rest = tokio::time::timeout(WAIT, running.collect::<Vec<_>>())
        .await
        .expect("the cancelled call's stream ends");
    assert!(
        rest.iter().all(|m| m.get("result").is_none()),
        "the cancelled call answered: {rest:?}"
    );
    let echoed = session.post(&other).await.unwrap();
    assert_eq!(
        echoed.result().unwrap()["content"][0]["text"],
        "x",
        "{}",
        echoed.body
    );
}

/// A session's own stream (GET) holds a slot under the listen caps, as a
/// `subscriptions/listen` stream does: a principal cannot open streams without end by
/// opening sessions.
#[tokio::test]
async fn session_streams_count_under_the_listen_caps() {
    let server = ServerProcess::start_exact(&[
        "--profile",
        "demo",
        "--api-key",
        &format!("user-42={TOKEN_42}"),
        "--max-listen-per-principal",
        "1",
    ]);
    let client = server.client().with_bearer(TOKEN_42);
    let (first, second) = (open(&client).await, open(&client).await);
    let (status, _open) = first.listen().await.unwrap();
    assert_eq!(status, 200);
    let (status, _) = second.listen().await.unwrap();
    assert_eq!(status, 503, "a second stream past the cap of one");
}

/// An answer is taken only for a request the server sent that session: a made-up id, a
/// real one whose tag was changed, or a real one posted to another session is refused (400,
/// naming it) before anything is filed (an answer to a made-up id would have waited in the
/// store until it expired, for anonymous clients without any bound). The real answer to the
/// real request is taken, and the call goes on with it.
#[tokio::test]
async fn only_answers_to_requests_the_server_sent_are_taken() {
    let store = sqlite_url("legacy-answers");
    let server =
        ServerProcess::start_exact(&["--profile", "conformance", "--store", &store, "--anonymous"]);
    let client = server.client();
    let (session, other) = (open(&client).await, open(&client).await);
    let args = json!({ "name": "test_elicitation", "arguments": { "message": "Who?" } });
    let call = session.message("tools/call", args);
    let mut stream = Box::pin(session.stream(&call).await.unwrap());
    let ask = next(&mut stream, "the question").await;
    assert_eq!(ask["method"], "elicitation/create", "{ask}");
    let id = ask["id"].as_str().unwrap();
    let (base, _) = id.split_once('.').expect("a tagged id");
    let (signed, mac) = id.rsplit_once('.').unwrap();
    let flipped = if mac.starts_with('A') { "B" } else { "A" };
    let changed = format!("{signed}.{flipped}{}", &mac[1..]);
    let answer =
        json!({ "action": "accept", "content": { "username": "u", "email": "u@example.com" } });
    for (what, id, on) in [
        ("a made-up id", json!("wharf-00000000000000ff-0"), &session),
        ("a changed tag", json!(changed), &session),
        ("the id without its tag", json!(base), &session),
        ("another session's request", json!(id), &other),
        ("a number", json!(7), &session),
    ] {
        let message = json!({ "jsonrpc": "2.0", "id": id, "result": answer });
        let refused = on.post(&message).await.unwrap();
        assert_eq!(refused.status, 400, "{what}: {}", refused.body);
        assert!(
            refused
                .body
                .contains("is not the id of a request this server sent"),
            "{what}: {}",
            refused.body
        );
    }
    assert_eq!(session.respond(&ask["id"], answer).await.unwrap(), 202);
    let done = next(&mut stream, "the call's result").await;
    validate_legacy("tools/call", &done);
    assert_eq!(done["id"], call["id"]);
    assert!(done.get("result").is_some(), "{done}");
}

/// Opens a session, and returns once the clock has moved past the millisecond its first
/// use was stamped in: sessions used within one millisecond tie, and ties are broken by
/// their random ids, so the next one opened is then the later.
async fn open_in_order(client: &HttpClient) -> LegacySession {
    let session = open(client).await;
    let stamped = std::time::SystemTime::now();
    while stamped.elapsed().unwrap_or_default() < Duration::from_millis(1) {
        tokio::task::yield_now().await;
    }
    session
}

/// One principal cannot take every session a deployment keeps, nor lock itself out with
/// sessions its clients abandoned: past its cap (here 3) a new `initialize` ends its least
/// recently used session, whose stream ends and whose requests get 404 (its client opens
/// another), and leaves its other sessions and other principals' alone. Anonymous callers,
/// who share one principal, are answered busy past theirs instead.
async fn live_sessions_are_bounded_per_principal(store: Option<&str>) {
    // Principals of this test alone: the shared stores hold other tests' sessions too.
    let (mine_key, theirs_key) = (unique("key-mine"), unique("key-theirs"));
    let keys = [
        format!("{}={mine_key}", unique("capped")),
        format!("{}={theirs_key}", unique("other")),
    ];
    let mut args = vec!["--profile", "demo", "--max-sessions-per-principal", "3"];
    args.extend(keys.iter().flat_map(|k| ["--api-key", k.as_str()]));
    args.extend(store.iter().flat_map(|s| ["--store", s]));
    let server = ServerProcess::start_exact(&args);
    let client = server.client().with_bearer(&mine_key);
    let theirs = open(&server.client().with_bearer(&theirs_key)).await;
    let mut mine = Vec::new();
    for _ in 0..3 {
        mine.push(open_in_order(&client).await);
    }
    let (status, stream) = mine[0].listen().await.unwrap();
    assert_eq!(status, 200);
    let newest = open_in_order(&client).await;
    // (What the stream carried before it ended is other tests' news on the shared bus.)
    tokio::time::timeout(WAIT, Box::pin(stream).collect::<Vec<Value>>())
        .await
        .expect("the ended session's stream ends");
    let reply = mine[0].request("ping", json!({})).await.unwrap();
    assert_eq!(reply.status, 404, "the least recently used: {}", reply.body);
    for (n, session) in mine[1..].iter().chain([&newest, &theirs]).enumerate() {
        let reply = session.request("ping", json!({})).await.unwrap();
        assert_eq!(reply.status, 200, "session {n}: {}", reply.body);
    }
    // An ended session is not counted: the next one ends the oldest still open.
    assert_eq!(mine[1].delete().await.unwrap(), 200);
    open_in_order(&client).await;
    let reply = mine[2].request("ping", json!({})).await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.body);
    open_in_order(&client).await;
    let reply = mine[2].request("ping", json!({})).await.unwrap();
    assert_eq!(
        reply.status, 404,
        "now the least recently used: {}",
        reply.body
    );
}

#[tokio::test]
async fn sqlite_live_sessions_are_bounded_per_principal() {
    live_sessions_are_bounded_per_principal(Some(&sqlite_url("legacy-sessions-cap"))).await;
}

#[tokio::test]
async fn postgres_live_sessions_are_bounded_per_principal() {
    live_sessions_are_bounded_per_principal(Some(&pg_url())).await;
}

#[tokio::test]
async fn redis_live_sessions_are_bounded_per_principal() {
    live_sessions_are_bounded_per_principal(Some(&redis_url())).await;
}

#[tokio::test]
async fn live_sessions_kept_in_the_process_are_bounded_per_principal() {
    live_sessions_are_bounded_per_principal(None).await;
}

/// Anonymous callers share one principal: past their cap (here 2) `initialize` is answered
/// busy (503) until one of their sessions ends, rather than ending a stranger's session.
#[tokio::test]
async fn anonymous_sessions_are_bounded_together() {
    let store = sqlite_url("legacy-anonymous-cap");
    let server = ServerProcess::start_exact(&[
        "--profile",
        "demo",
        "--store",
        &store,
        "--anonymous",
        "--max-anonymous-sessions",
        "2",
    ]);
    let client = server.client();
    let first = open(&client).await;
    let second = open(&client).await;
    let refused = LegacySession::initialize(&client, "2025-11-25", json!({}))
        .await
        .expect_err("a third anonymous session");
    let said = refused.to_string();
    assert!(
        said.contains("2 sessions are open for anonymous callers"),
        "{said}"
    );
    let reply = first.request("ping", json!({})).await.unwrap();
    assert_eq!(reply.status, 200, "left alone: {}", reply.body);
    assert_eq!(second.delete().await.unwrap(), 200);
    open(&client).await;
}

/// A 2025-03-26 session may send JSON-RPC batches (that revision's transport has servers
/// take them; 2025-06-18 removed them): each message is taken as if it came alone and the
/// answers stream back, the calls' progress among them, every message valid in that
/// revision. A batch of notifications gets 202; a batch with a message that cannot be read,
/// or with a notification or answer the server does not take, is refused whole; a later
/// revision's session is refused any batch.
#[tokio::test]
async fn a_2025_03_26_session_sends_batches() {
    let server = ServerProcess::start_exact(&["--profile", "demo", "--anonymous"]);
    let client = server.client();
    let session = LegacySession::initialize(&client, "2025-03-26", json!({}))
        .await
        .unwrap();
    assert_eq!(session.version(), "2025-03-26");
    let request = |id: i64, method: &str, params: Value| json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
    let call = |name: &str, arguments: Value| json!({ "name": name, "arguments": arguments });
    let methods = [
        (1, "ping"),
        (2, "tools/call"),
        (3, "tools/call"),
        (4, "tools/call"),
        (5, "tools/list"),
        (6, "initialize"),
    ];
    let batch = json!([
        { "jsonrpc": "2.0", "method": "notifications/initialized" },
        request(1, "ping", json!({})),
        request(2, "tools/call", call("echo", json!({ "text": "one" }))),
        request(3, "tools/call", call("add", json!({ "a": 1, "b": 2 }))),
        request(4, "tools/call", json!({ "name": "slow_count",
            "arguments": { "steps": 2, "interval_ms": 1 }, "_meta": { "progressToken": "p" } })),
        request(5, "tools/list", json!({})),
        request(6, "initialize", json!({ "protocolVersion": "2025-03-26",
            "capabilities": {}, "clientInfo": { "name": "t", "version": "1" } })),
    ]);
    let reply = session.post(&batch).await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(reply.is_sse(), "{}", reply.body);
    let mut answered: Vec<(i64, Value)> = Vec::new();
    let mut progress = 0;
    for m in &reply.messages {
        match m["id"].as_i64() {
            Some(id) => {
                let method = methods.iter().find(|(n, _)| *n == id).unwrap().1;
                validate_legacy_in("2025-03-26", method, m);
                answered.push((id, m.clone()));
            }
            None => {
                assert_eq!(m["method"], "notifications/progress", "{m}");
                validate_legacy_in("2025-03-26", "tools/call", m);
                progress += 1;
            }
        }
    }
    answered.sort_by_key(|(id, _)| *id);
    let ids: Vec<i64> = answered.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, [1, 2, 3, 4, 5, 6], "one answer each: {}", reply.body);
    assert_eq!(answered[1].1["result"]["content"][0]["text"], "one");
    assert_eq!(answered[2].1["result"]["structuredContent"]["sum"], 3);
    assert!(answered[4].1["result"]["tools"].as_array().unwrap().len() > 2);
    assert_eq!(answered[5].1["error"]["code"], -32600);
    assert!(progress >= 1, "{}", reply.body);

    // Only notifications: accepted, nothing to answer.
    let only = json!([{ "jsonrpc": "2.0", "method": "notifications/initialized" }]);
    assert_eq!(session.post(&only).await.unwrap().status, 202);
    // A message that cannot be read: refused whole, naming which one.
    let unreadable = json!([
        request(7, "tools/call", call("echo", json!({ "text": "never" }))),
        { "jsonrpc": "1.0", "id": 8, "method": "ping" },
    ]);
    let reply = session.post(&unreadable).await.unwrap();
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert_eq!(reply.error_code(), Some(-32600), "{}", reply.body);
    assert!(
        reply.body.contains("message 2 of the batch"),
        "{}",
        reply.body
    );
    // An answer the server does not take (it never asked under that id), beside a request:
    // refused as it would be alone, and the request does not run, so the client can send
    // the batch again (the answer used to be dropped, and the request answered).
    let answer_refused = json!([
        { "jsonrpc": "2.0", "id": "not-asked", "result": {} },
        request(12, "tools/call", call("echo", json!({ "text": "not run" }))),
    ]);
    let reply = session.post(&answer_refused).await.unwrap();
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert_eq!(reply.error_code(), Some(-32600), "{}", reply.body);
    assert!(
        reply
            .body
            .contains("not the id of a request this server sent"),
        "{}",
        reply.body
    );
    assert!(!reply.body.contains("not run"), "{}", reply.body);
    let reply = session.post(&json!([])).await.unwrap();
    assert_eq!(
        (reply.status, reply.error_code()),
        (400, Some(-32600)),
        "{}",
        reply.body
    );
    // Too long, or sent with a header that mirrors one message: refused whole.
    let long: Vec<Value> = (0..65)
        .map(|n| request(100 + n, "ping", json!({})))
        .collect();
    let reply = session.post(&json!(long)).await.unwrap();
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert!(reply.body.contains("at most 64"), "{}", reply.body);
    let mut headers = client.headers_for("ping", &json!({}));
    headers.insert("mcp-session-id", session.id().unwrap().parse().unwrap());
    headers.insert("mcp-protocol-version", "2025-03-26".parse().unwrap());
    let pings = json!([
        request(10, "ping", json!({})),
        request(11, "tools/list", json!({}))
    ]);
    let reply = client
        .send_raw(pings.to_string().into_bytes(), headers)
        .await
        .unwrap();
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert!(reply.body.contains("Mcp-Method"), "{}", reply.body);
    // 2025-06-18 has no batches.
    let later = LegacySession::initialize(&client, "2025-06-18", json!({}))
        .await
        .unwrap();
    let reply = later
        .post(&json!([request(9, "ping", json!({}))]))
        .await
        .unwrap();
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert!(reply.body.contains("batches"), "{}", reply.body);
}

/// The calls of one batch take their turns under the server's caps like any others: one
/// waiting for a slot waits for the call before it to end, never on a call that cannot start
/// until the whole batch was taken.
#[tokio::test]
async fn a_batchs_calls_take_their_turns() {
    let server = ServerProcess::start_exact(&[
        "--profile",
        "demo",
        "--anonymous",
        "--max-in-flight",
        "1",
        "--max-queue",
        "8",
    ]);
    let session = LegacySession::initialize(&server.client(), "2025-03-26", json!({}))
        .await
        .unwrap();
    let calls: Vec<Value> = (1..=3)
        .map(|n| {
            json!({ "jsonrpc": "2.0", "id": n, "method": "tools/call",
                "params": { "name": "echo", "arguments": { "text": format!("call {n}") } } })
        })
        .collect();
    let reply = tokio::time::timeout(WAIT, session.post(&json!(calls)))
        .await
        .expect("the batch was answered")
        .unwrap();
    assert_eq!(reply.status, 200, "{}", reply.body);
    let mut texts: Vec<String> = reply
        .messages
        .iter()
        .map(|m| {
            m["result"]["content"][0]["text"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    texts.sort();
    assert_eq!(texts, ["call 1", "call 2", "call 3"], "{}", reply.body);
}

/// A session of each 2025 revision reads every kind of answer in its own revision's schema:
/// lists, prompts (with arguments, with an embedded resource), resources (text, binary,
/// from a template), completions and tools of every content type, on the conformance
/// profile.
#[tokio::test]
async fn every_kind_of_answer_validates_in_each_revision() {
    let server = ServerProcess::start(&["--profile", "conformance"]);
    let client = server.client();
    let asks = [
        ("tools/list", json!({})),
        ("prompts/list", json!({})),
        ("resources/list", json!({})),
        ("resources/templates/list", json!({})),
        (
            "prompts/get",
            json!({ "name": "test_prompt_with_arguments",
                "arguments": { "arg1": "a", "arg2": "b" } }),
        ),
        (
            "prompts/get",
            json!({ "name": "test_prompt_with_embedded_resource",
                "arguments": { "resourceUri": "test://embedded" } }),
        ),
        ("resources/read", json!({ "uri": "test://static-text" })),
        ("resources/read", json!({ "uri": "test://static-binary" })),
        ("resources/read", json!({ "uri": "test://template/7/data" })),
        (
            "completion/complete",
            json!({ "ref": { "type": "ref/prompt", "name": "test_prompt_with_arguments" },
                "argument": { "name": "arg1", "value": "pa" } }),
        ),
        (
            "tools/call",
            json!({ "name": "test_image_content", "arguments": {} }),
        ),
        (
            "tools/call",
            json!({ "name": "test_audio_content", "arguments": {} }),
        ),
        (
            "tools/call",
            json!({ "name": "test_embedded_resource", "arguments": {} }),
        ),
        (
            "tools/call",
            json!({ "name": "test_multiple_content_types", "arguments": {} }),
        ),
        (
            "tools/call",
            json!({ "name": "test_error_handling", "arguments": {} }),
        ),
    ];
    for rev in ["2025-03-26", "2025-06-18", "2025-11-25"] {
        let session = LegacySession::initialize(&client, rev, json!({ "elicitation": {} }))
            .await
            .expect("initialize");
        validate_legacy_in(
            rev,
            "initialize",
            &json!({ "jsonrpc": "2.0", "id": 1, "result": session.initialized }),
        );
        for (method, params) in &asks {
            let reply = session.request(method, params.clone()).await.unwrap();
            assert_eq!(reply.status, 200, "{rev} {method}: {}", reply.body);
            assert!(reply.result().is_some(), "{rev} {method}: {}", reply.body);
            for m in &reply.messages {
                validate_legacy_in(rev, method, m);
            }
        }
        session.delete().await.unwrap();
    }
}
