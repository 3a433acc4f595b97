//! `wharf serve --stdio`: newline-delimited JSON-RPC, concurrent requests, cancellation.

use crate::common;

use std::time::Duration;

use common::validate_message;
use serde_json::{Value, json};
use wharf_client::StdioClient;

/// `wharf serve --stdio --profile PROFILE` with `extra` options.
fn spawn(profile: &str, extra: &[&str]) -> StdioClient {
    let mut args = vec!["serve", "--stdio", "--profile", profile];
    args.extend_from_slice(extra);
    StdioClient::spawn(env!("CARGO_BIN_EXE_wharf"), &args).unwrap()
}

async fn recv(c: &mut StdioClient) -> Value {
    tokio::time::timeout(Duration::from_secs(10), c.recv())
        .await
        .expect("in time")
        .expect("read")
        .expect("a message")
}

/// Opens a legacy session: `initialize` at `version` with `capabilities`, its answer
/// (returned), then `notifications/initialized`.
async fn initialize_legacy(c: &mut StdioClient, version: &str, capabilities: Value) -> Value {
    let init = json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": version,
        "capabilities": capabilities,
        "clientInfo": { "name": "legacy-test", "version": "1" },
    }});
    c.send(&init).await.unwrap();
    let m = recv(c).await;
    assert_eq!(m["id"], 0, "{m}");
    c.send(&json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }))
        .await
        .unwrap();
    m
}

/// Closes stdin and asserts that the server sends nothing more while it drains (up to a
/// minute), then exits 0.
async fn end_input_expecting_silence(mut c: StdioClient, why: &str) {
    c.close_stdin();
    if let Some(m) = tokio::time::timeout(Duration::from_secs(60), c.recv())
        .await
        .unwrap()
        .unwrap()
    {
        panic!("{why}: {m}");
    }
    assert!(c.wait().await.unwrap().success());
}

#[tokio::test]
async fn serves_concurrently_cancels_and_exits_on_eof() {
    let mut c = spawn("demo", &["--drain-secs", "60"]);
    c.request(json!(1), "server/discover", json!({}))
        .await
        .unwrap();
    let m = recv(&mut c).await;
    validate_message("server/discover", &m);
    assert_eq!(m["id"], 1);

    // A slow call with progress (a hundred seconds unless cancelled), then a fast one: the
    // fast answer overtakes the slow one.
    c.request(json!("slow"), "tools/call", json!({ "name": "slow_count", "arguments": { "steps": 1000, "interval_ms": 100 }, "_meta": { "progressToken": 9 } })).await.unwrap();
    c.request(
        json!("fast"),
        "tools/call",
        json!({ "name": "echo", "arguments": { "text": "quick" } }),
    )
    .await
    .unwrap();
    let mut seen_fast = false;
    let mut progress = 0;
    while !seen_fast || progress < 1 {
        let m = recv(&mut c).await;
        validate_message("tools/call", &m);
        if m["id"] == "fast" {
            assert_eq!(m["result"]["content"][0]["text"], "quick");
            seen_fast = true;
        } else if m["method"] == "notifications/progress" {
            assert_eq!(m["params"]["progressToken"], 9);
            progress += 1;
        } else {
            panic!("unexpected {m}");
        }
    }
    // Cancel the slow one: nothing more is sent for it.
    c.send(&json!({ "jsonrpc": "2.0", "method": "notifications/cancelled", "params": { "requestId": "slow" } })).await.unwrap();
    c.request(
        json!(2),
        "tools/call",
        json!({ "name": "echo", "arguments": { "text": "after" } }),
    )
    .await
    .unwrap();
    loop {
        let m = recv(&mut c).await;
        if m["id"] == 2 {
            break;
        }
        // A progress notification already in the pipe may still arrive; a response must not.
        assert_eq!(
            m["method"], "notifications/progress",
            "nothing but in-flight progress for a cancelled request: {m}"
        );
    }
    // Bad input gets a precise error; the server carries on.
    c.send(&json!({ "jsonrpc": "2.0", "id": 3, "method": "nope/nope", "params": {} }))
        .await
        .unwrap();
    let m = recv(&mut c).await;
    assert_eq!(m["error"]["code"], -32601);
    // End of input: nothing is running any more, so nothing more is sent (had the
    // cancellation not stopped the slow call, its progress would go on through the drain),
    // and the server exits 0.
    end_input_expecting_silence(c, "nothing is sent once every request ended").await;
}

/// Lines that are not requests get the precise error a JSON-RPC peer expects, and the
/// server goes on serving the requests that follow.
#[tokio::test]
async fn bad_lines_get_precise_errors_and_the_server_carries_on() {
    // The HTTP body's limits hold for a line.
    let mut c = spawn(
        "demo",
        &["--max-body-bytes", "65536", "--max-json-depth", "16"],
    );
    let deep = format!("{}{}", "[".repeat(20), "]".repeat(20));
    let meta = json!({ "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {} });
    let cases: Vec<(String, i64, Value, &str)> = vec![
        ("{not json".into(), -32700, Value::Null, "Parse error"),
        (
            json!({ "jsonrpc": "1.0", "id": 3, "method": "tools/list", "params": { "_meta": meta } })
                .to_string(),
            -32600,
            json!(3),
            "jsonrpc",
        ),
        (
            json!({ "jsonrpc": "2.0", "id": "u", "method": "no/such", "params": { "_meta": meta } })
                .to_string(),
            -32601,
            json!("u"),
            "no/such",
        ),
        (
            json!({ "jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": { "_meta": meta, "arguments": { "text": "x" } } })
                .to_string(),
            -32602,
            json!(4),
            "name",
        ),
        (
            format!("\"{}\"", "x".repeat(65536)),
            -32600,
            Value::Null,
            "longer than 65536 bytes",
        ),
        (
            format!(
                r#"{{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{{"_meta":{meta},"name":"echo","arguments":{{"text":{deep}}}}}}}"#
            ),
            -32600,
            json!(6),
            "deeper than 16",
        ),
    ];
    let mut cases: Vec<(Vec<u8>, i64, Value, &str)> = cases
        .into_iter()
        .map(|(line, code, id, says)| (line.into_bytes(), code, id, says))
        .collect();
    cases.push((
        b"{\"jsonrpc\":\"2.0\",\xff}".to_vec(),
        -32700,
        Value::Null,
        "UTF-8",
    ));
    for (line, code, id, says) in cases {
        c.send_line(&line).await.unwrap();
        let m = recv(&mut c).await;
        validate_message("tools/call", &m);
        assert_eq!(m["error"]["code"], code, "{m}");
        assert_eq!(m["id"], id, "{m}");
        let message = m["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message:?} should name {says:?}");
    }
    // Arguments the tool's schema refuses: a result the model reads and can correct.
    c.request(
        json!(5),
        "tools/call",
        json!({ "name": "echo", "arguments": { "text": 7 } }),
    )
    .await
    .unwrap();
    let m = recv(&mut c).await;
    validate_message("tools/call", &m);
    assert_eq!(m["result"]["isError"], true, "{m}");
    let text = m["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("text"), "{text:?} should name the argument");
    // A response is never answered, not even the client's error with a null id.
    let theirs = json!({ "jsonrpc": "2.0", "id": null,
        "error": { "code": -32700, "message": "Parse error" } });
    c.send(&theirs).await.unwrap();
    c.request(
        json!("after"),
        "tools/call",
        json!({ "name": "echo", "arguments": { "text": "still here" } }),
    )
    .await
    .unwrap();
    let m = recv(&mut c).await;
    assert_eq!(m["id"], "after");
    assert_eq!(m["result"]["content"][0]["text"], "still here");
    c.close_stdin();
    assert!(c.wait().await.unwrap().success());
}

/// A client that opens with `initialize` gets a legacy session for the process: the
/// handler's input request goes out on stdout as a server request, the answer comes back on
/// stdin, and the call finishes; progress and log messages use the 2025 shapes.
#[tokio::test]
async fn a_legacy_client_initializes_and_answers_an_elicitation() {
    use common::validate_legacy_in;
    // Every message is checked against the session's own revision.
    let validate_legacy = |method: &str, m: &Value| validate_legacy_in("2025-06-18", method, m);
    let mut c = spawn("conformance", &[]);
    let m = initialize_legacy(&mut c, "2025-06-18", json!({ "elicitation": {} })).await;
    validate_legacy("initialize", &m);
    assert_eq!(m["result"]["protocolVersion"], "2025-06-18");

    let call = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "test_elicitation", "arguments": { "message": "Who are you?" } } });
    c.send(&call).await.unwrap();
    let ask = recv(&mut c).await;
    validate_legacy("tools/call", &ask);
    assert_eq!(ask["method"], "elicitation/create", "{ask}");
    assert_eq!(ask["params"]["message"], "Who are you?");
    let answer =
        json!({ "action": "accept", "content": { "username": "ann", "email": "ann@example.com" } });
    c.send(&json!({ "jsonrpc": "2.0", "id": ask["id"], "result": answer }))
        .await
        .unwrap();
    let done = recv(&mut c).await;
    validate_legacy("tools/call", &done);
    assert_eq!(done["id"], 1);
    let text = done["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("ann@example.com"), "{text}");

    // The session's log level holds for the calls after it.
    let level = json!({ "jsonrpc": "2.0", "id": 2, "method": "logging/setLevel", "params": { "level": "info" } });
    c.send(&level).await.unwrap();
    let m = recv(&mut c).await;
    assert_eq!(m, json!({ "jsonrpc": "2.0", "id": 2, "result": {} }));
    let logged = json!({ "jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "test_tool_with_logging", "arguments": {} } });
    c.send(&logged).await.unwrap();
    let mut logs = 0;
    loop {
        let m = recv(&mut c).await;
        validate_legacy("tools/call", &m);
        if m["id"] == 3 {
            break;
        }
        assert_eq!(m["method"], "notifications/message", "{m}");
        logs += 1;
    }
    assert_eq!(logs, 3);

    // A form of titled and multiple choices (SEP-1330, 2025-11-25): a 2025-06-18 client
    // cannot show the multiple ones, so the call fails naming one, and asks nothing.
    let choices = json!({ "jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {
        "name": "test_elicitation_sep1330_enums", "arguments": {} } });
    c.send(&choices).await.unwrap();
    let m = recv(&mut c).await;
    validate_legacy("tools/call", &m);
    assert_eq!(m["id"], 4, "{m}");
    assert_eq!(m["error"]["code"], -32603, "{m}");
    let message = m["error"]["message"].as_str().unwrap();
    assert!(message.contains("as a multiple choice"), "{message}");

    // A line that does not parse has no id to answer with, and this revision's errors need
    // one: nothing is sent for it (the ping's answer is the next message).
    c.send_line("{\n".to_owned()).await.unwrap();
    c.request(json!(5), "ping", json!({})).await.unwrap();
    let m = recv(&mut c).await;
    validate_legacy("ping", &m);
    assert_eq!(m["id"], 5, "{m}");
    c.close_stdin();
    assert!(c.wait().await.unwrap().success());
}

/// A legacy session's call cancelled in the same write that sent it stops, though the
/// session had not seen it yet, and nothing is sent for it: not its result, not an error.
#[tokio::test]
async fn a_legacy_call_cancelled_as_it_is_sent_stops_and_sends_nothing() {
    let mut c = spawn("demo", &["--workers", "1", "--drain-secs", "60"]);
    initialize_legacy(&mut c, "2025-11-25", json!({})).await;
    let call = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "slow_count", "arguments": { "steps": 30, "interval_ms": 100 } } });
    let cancel = json!({ "jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": { "requestId": 1 } });
    c.send_line(format!("{call}\n{cancel}")).await.unwrap();
    c.request(json!(2), "ping", json!({})).await.unwrap();
    let m = recv(&mut c).await;
    assert_eq!(
        m["id"], 2,
        "nothing for the cancelled call before this: {m}"
    );
    // End of input: the server drains what still runs (up to a minute) and exits; had the
    // call gone on, its result would come out now.
    end_input_expecting_silence(c, "nothing is sent for a cancelled call").await;
}

/// In a legacy session, the id of a running call is refused to any other request, those
/// the session answers at once included (a `ping`, a subscription): the client would get two
/// responses with one id, and the subscription would be made anyway.
#[tokio::test]
async fn a_legacy_sessions_running_id_is_refused_to_every_other_request() {
    let mut c = spawn("demo", &["--drain-secs", "60"]);
    initialize_legacy(&mut c, "2025-11-25", json!({})).await;
    c.request(
        json!(7),
        "tools/call",
        json!({ "name": "slow_count", "arguments": { "steps": 1000, "interval_ms": 100 } }),
    )
    .await
    .unwrap();
    for method in ["ping", "tools/call"] {
        let params = if method == "ping" {
            json!({})
        } else {
            json!({ "name": "echo", "arguments": { "text": "x" } })
        };
        c.request(json!(7), method, params).await.unwrap();
        let m = recv(&mut c).await;
        assert_eq!(m["id"], 7, "{m}");
        assert_eq!(m["error"]["code"], -32600, "{method}: {m}");
        assert!(
            m["error"]["message"]
                .as_str()
                .unwrap()
                .contains("already in use"),
            "{m}"
        );
    }
    // Once cancelled, its id is free again.
    c.send(&json!({ "jsonrpc": "2.0", "method": "notifications/cancelled", "params": { "requestId": 7 } }))
        .await
        .unwrap();
    c.request(json!(7), "ping", json!({})).await.unwrap();
    let m = recv(&mut c).await;
    assert_eq!(
        (m["id"].clone(), m["result"].clone()),
        (json!(7), json!({})),
        "{m}"
    );
    end_input_expecting_silence(c, "nothing is sent for the cancelled call").await;
}

/// A legacy call cancelled while it waits for the client's answer to its elicitation tells
/// the client that elicitation is cancelled too, so that it stops asking its user.
#[tokio::test]
async fn a_cancelled_call_withdraws_the_input_it_asked_for() {
    let mut c = spawn("conformance", &[]);
    initialize_legacy(&mut c, "2025-11-25", json!({ "elicitation": {} })).await;
    let call = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "test_elicitation", "arguments": { "message": "Who are you?" } } });
    c.send(&call).await.unwrap();
    let ask = recv(&mut c).await;
    assert_eq!(ask["method"], "elicitation/create", "{ask}");
    c.send(
        &json!({ "jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": { "requestId": 1 } }),
    )
    .await
    .unwrap();
    let withdrawn = recv(&mut c).await;
    common::validate_legacy("notifications/cancelled", &withdrawn);
    assert_eq!(
        withdrawn["method"], "notifications/cancelled",
        "{withdrawn}"
    );
    assert_eq!(withdrawn["params"]["requestId"], ask["id"]);
    c.close_stdin();
    assert!(c.wait().await.unwrap().success());
}

/// A client that stopped reading stdout, then closed stdin, does not keep the server alive:
/// once its requests drained, what was left to write waits a drain period unread, and the
/// process exits, reporting it. (Its writes to stdout block on a thread of their own, which
/// the runtime no longer waits for.)
#[tokio::test]
async fn a_client_that_stops_reading_does_not_keep_the_server_alive() {
    let mut c = spawn("demo", &["--drain-secs", "1"]);
    // Far more answers than a pipe holds, none of them read.
    for id in 0..400 {
        c.request(json!(id), "tools/list", json!({})).await.unwrap();
    }
    c.close_stdin();
    let status = tokio::time::timeout(Duration::from_secs(60), c.wait())
        .await
        .expect("the server exited")
        .unwrap();
    assert!(!status.success(), "it says answers were left unwritten");
}

/// Over stdio every request acts for one anonymous principal and nothing listens on the
/// network: options that say otherwise are named on stderr as unused (they were ignored in
/// silence, and a user given `--api-key` got the anonymous principal's data).
#[test]
fn options_stdio_does_not_use_are_named() {
    let out = common::wharf(&[
        "serve",
        "--stdio",
        "--profile",
        "demo",
        "--api-key",
        "alice=0123456789abcdef",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    assert!(out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("these options are not used")
            && said.contains("--api-key/--api-keys-file, --metrics-listen"),
        "{said}"
    );
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A `subscriptions/listen` stream the server ends (here at the end of input) is announced
/// with `notifications/cancelled` naming it, then answered with its graceful result: on
/// stdio there is no stream to close (2026-07-28 basic/patterns/cancellation: a server MUST
/// send it when it tears a subscription down). A listen the client cancels gets neither.
#[tokio::test]
async fn a_listen_stream_the_server_ends_is_announced_cancelled() {
    let mut c = spawn("demo", &["--drain-secs", "60"]);
    let listen = json!({ "notifications": { "toolsListChanged": true } });
    for id in ["kept", "dropped"] {
        c.request(json!(id), "subscriptions/listen", listen.clone())
            .await
            .unwrap();
        let ack = recv(&mut c).await;
        validate_message("subscriptions/listen", &ack);
        assert_eq!(
            ack["method"], "notifications/subscriptions/acknowledged",
            "{ack}"
        );
    }
    c.send(&json!({ "jsonrpc": "2.0", "method": "notifications/cancelled", "params": { "requestId": "dropped" } }))
        .await
        .unwrap();
    c.close_stdin();
    let cancelled = recv(&mut c).await;
    validate_message("subscriptions/listen", &cancelled);
    assert_eq!(
        cancelled["method"], "notifications/cancelled",
        "{cancelled}"
    );
    assert_eq!(cancelled["params"]["requestId"], "kept", "{cancelled}");
    let ended = recv(&mut c).await;
    validate_message("subscriptions/listen", &ended);
    assert_eq!(ended["id"], "kept", "{ended}");
    assert_eq!(ended["result"]["resultType"], "complete", "{ended}");
    assert!(
        c.recv().await.unwrap().is_none(),
        "nothing for the cancelled one"
    );
    assert!(c.wait().await.unwrap().success());
}
