//! Discovery, lists with signed cursors, progress and log streams, subscriptions and the
//! shutdown drain, over real HTTP against `wharf serve`. Every message is schema-validated.

use crate::common;

use std::time::Duration;

use common::{ServerProcess, request, validate_message};
use futures_util::StreamExt;
use serde_json::{Value, json};

#[tokio::test]
async fn discover_and_cache_hints() {
    let server = ServerProcess::start(&[]);
    let r = request(&server.client(), "server/discover", json!({})).await;
    let result = r.result().unwrap();
    assert_eq!(result["resultType"], "complete");
    // The legacy revisions too: `wharf serve` opens sessions for `initialize` clients.
    assert_eq!(
        result["supportedVersions"],
        json!(["2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26"])
    );
    assert_eq!(
        result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "wharf"
    );
    assert!(result["capabilities"]["tools"].is_object());
    for method in [
        "tools/list",
        "prompts/list",
        "resources/list",
        "resources/templates/list",
    ] {
        let r = request(&server.client(), method, json!({})).await;
        let res = r.result().unwrap();
        assert!(
            res["ttlMs"].as_u64().is_some() && res["cacheScope"].is_string(),
            "{method}: {res}"
        );
        assert_eq!(
            res["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
            "wharf"
        );
    }
    let r = request(
        &server.client(),
        "resources/read",
        json!({ "uri": "echo://hello%20there" }),
    )
    .await;
    assert_eq!(r.result().unwrap()["contents"][0]["text"], "hello there");
    assert!(r.result().unwrap()["ttlMs"].is_u64());
}

async fn all_tools(client: &wharf_client::HttpClient) -> Vec<String> {
    let mut names = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let params = match &cursor {
            Some(c) => json!({ "cursor": c }),
            None => json!({}),
        };
        let r = request(client, "tools/list", params).await;
        let res = r.result().unwrap();
        names.extend(
            res["tools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["name"].as_str().unwrap().to_owned()),
        );
        match res["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return names,
        }
    }
}

#[tokio::test]
async fn signed_cursors_resume_on_another_replica_and_refuse_forgeries() {
    let key = "c2hhcmVkLWN1cnNvci1rZXktZm9yLXRlc3RzLW9ubHktMzJieXRlcyE=";
    let a = ServerProcess::start(&[
        "--profile",
        "conformance",
        "--page-size",
        "3",
        "--cursor-key",
        key,
    ]);
    let b = ServerProcess::start(&[
        "--profile",
        "conformance",
        "--page-size",
        "3",
        "--cursor-key",
        key,
    ]);
    let first = request(&a.client(), "tools/list", json!({})).await;
    let page = first.result().unwrap();
    assert_eq!(page["tools"].as_array().unwrap().len(), 3);
    let cursor = page["nextCursor"].as_str().unwrap().to_owned();
    // Replica B resumes A's cursor: same key, same list.
    let second = request(&b.client(), "tools/list", json!({ "cursor": cursor })).await;
    assert_eq!(
        second.result().unwrap()["tools"][0]["name"],
        "test_audio_content"
    );
    // The whole listing is deterministic, in registration order, and the same on both.
    let (la, lb) = (all_tools(&a.client()).await, all_tools(&b.client()).await);
    assert_eq!(la, lb);
    assert_eq!(la[0], "test_simple_text");
    assert!(la.len() > 6);
    // Garbage, forged (other key) and tampered cursors: -32602.
    let other = ServerProcess::start(&["--profile", "conformance", "--page-size", "3"]);
    let foreign = request(&other.client(), "tools/list", json!({}))
        .await
        .result()
        .unwrap()["nextCursor"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut tampered = cursor.clone().into_bytes();
    tampered[4] = if tampered[4] == b'A' { b'B' } else { b'A' };
    for bad in [
        "garbage",
        "",
        foreign.as_str(),
        std::str::from_utf8(&tampered).unwrap(),
    ] {
        let r = request(&a.client(), "tools/list", json!({ "cursor": bad })).await;
        assert_eq!(r.error_code(), Some(-32602), "cursor {bad:?}: {}", r.body);
    }
    // A cursor of one list is refused by another.
    let r = request(&a.client(), "prompts/list", json!({ "cursor": cursor })).await;
    assert_eq!(r.error_code(), Some(-32602));
}

#[tokio::test]
async fn json_without_progress_token_sse_with_one() {
    let server = ServerProcess::start(&[]);
    let client = server.client();
    let r = request(
        &client,
        "tools/call",
        json!({ "name": "slow_count", "arguments": { "steps": 3, "interval_ms": 5 } }),
    )
    .await;
    assert!(r.content_type().starts_with("application/json"));
    assert_eq!(r.result().unwrap()["content"][0]["text"], "counted 3");
    let r = request(
        &client,
        "tools/call",
        json!({ "name": "slow_count", "arguments": { "steps": 10, "interval_ms": 2 }, "_meta": { "progressToken": "tok-1" } }),
    )
    .await;
    assert!(r.is_sse(), "{}", r.content_type());
    assert_eq!(r.headers.get("x-accel-buffering").unwrap(), "no");
    let progress: Vec<f64> = r
        .notifications()
        .filter(|n| n["method"] == "notifications/progress")
        .map(|n| {
            assert_eq!(n["params"]["progressToken"], "tok-1");
            n["params"]["progress"].as_f64().unwrap()
        })
        .collect();
    // Steps 2 ms apart, progress coalesced to one message per 20 ms: the first goes out, the
    // burst after it is coalesced, and the last value is never lost.
    assert!(progress.len() >= 2, "{progress:?}");
    assert!(progress.len() < 10, "a burst is coalesced: {progress:?}");
    assert!(progress.windows(2).all(|w| w[0] < w[1]), "{progress:?}");
    assert_eq!(progress.first(), Some(&1.0));
    assert_eq!(progress.last(), Some(&10.0), "the last value is never lost");
    assert!(
        r.messages.last().unwrap().get("result").is_some(),
        "the response comes last"
    );
    assert!(
        r.notifications()
            .all(|n| n["method"] != "notifications/message"),
        "no logs unless asked"
    );
}

/// A token is echoed exactly, however large an integer the client chose (up to 64 bits).
#[tokio::test]
async fn progress_echoes_a_64_bit_token_exactly() {
    let server = ServerProcess::start(&[]);
    let r = request(
        &server.client(),
        "tools/call",
        json!({ "name": "slow_count", "arguments": { "steps": 2, "interval_ms": 1 }, "_meta": { "progressToken": u64::MAX } }),
    )
    .await;
    let tokens: Vec<&Value> = r
        .notifications()
        .filter(|n| n["method"] == "notifications/progress")
        .map(|n| &n["params"]["progressToken"])
        .collect();
    assert!(!tokens.is_empty(), "{}", r.body);
    assert!(tokens.iter().all(|t| **t == json!(u64::MAX)), "{tokens:?}");
    assert!(r.body.contains("18446744073709551615"), "{}", r.body);
}

#[tokio::test]
async fn log_messages_only_when_asked_and_at_or_above_the_level() {
    let server = ServerProcess::start(&[]);
    let r = request(
        &server.client(),
        "tools/call",
        json!({ "name": "slow_count", "arguments": { "steps": 2, "interval_ms": 1 }, "_meta": { "io.modelcontextprotocol/logLevel": "info" } }),
    )
    .await;
    let levels: Vec<&str> = r
        .notifications()
        .filter(|n| n["method"] == "notifications/message")
        .map(|n| n["params"]["level"].as_str().unwrap())
        .collect();
    assert_eq!(
        levels,
        vec!["info"],
        "debug messages are below the requested level"
    );
    let r = request(
        &server.client(),
        "tools/call",
        json!({ "name": "slow_count", "arguments": { "steps": 2, "interval_ms": 1 }, "_meta": { "io.modelcontextprotocol/logLevel": "debug" } }),
    )
    .await;
    assert_eq!(
        r.notifications()
            .filter(|n| n["method"] == "notifications/message")
            .count(),
        3
    );
}

#[tokio::test]
async fn structured_output_and_completion() {
    let server = ServerProcess::start(&[]);
    let r = request(
        &server.client(),
        "tools/call",
        json!({ "name": "add", "arguments": { "a": 2, "b": 40 } }),
    )
    .await;
    assert_eq!(
        r.result().unwrap()["structuredContent"],
        json!({ "sum": 42 })
    );
    let r = request(
        &server.client(),
        "tools/call",
        json!({ "name": "add", "arguments": { "a": i64::MAX, "b": 1 } }),
    )
    .await;
    assert_eq!(r.result().unwrap()["isError"], true);
    let list = request(&server.client(), "tools/list", json!({})).await;
    let add = list.result().unwrap()["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "add")
        .unwrap()
        .clone();
    assert_eq!(add["outputSchema"]["type"], "object");
    let conf = ServerProcess::start(&["--profile", "conformance"]);
    let r = request(
        &conf.client(),
        "completion/complete",
        json!({ "ref": { "type": "ref/prompt", "name": "test_prompt_with_arguments" }, "argument": { "name": "arg1", "value": "par" } }),
    )
    .await;
    assert_eq!(
        r.result().unwrap()["completion"]["values"],
        json!(["paris", "park", "party"])
    );
}

async fn next_message(stream: &mut (impl futures_util::Stream<Item = Value> + Unpin)) -> Value {
    tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("a message in time")
        .expect("stream open")
}

#[tokio::test]
async fn listen_streams_ack_filter_and_end_gracefully() {
    let mut server = ServerProcess::start(&[
        "--profile",
        "conformance",
        "--keep-alive-secs",
        "1",
        "--drain-grace-secs",
        "60",
    ]);
    let client = server.client();
    let mut tools = Box::pin(client.open_stream("subscriptions/listen", json!({ "notifications": { "toolsListChanged": true, "resourceSubscriptions": ["test://static-text", "test://nope"] } })).await.unwrap());
    let ack = next_message(&mut tools).await;
    validate_message("subscriptions/listen", &ack);
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    assert_eq!(
        ack["params"]["notifications"],
        json!({ "toolsListChanged": true, "resourceSubscriptions": ["test://static-text"] })
    );
    let sub_id = ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"].clone();
    assert!(sub_id.is_i64());
    let mut prompts = Box::pin(
        client
            .open_stream(
                "subscriptions/listen",
                json!({ "notifications": { "promptsListChanged": true } }),
            )
            .await
            .unwrap(),
    );
    assert_eq!(
        next_message(&mut prompts).await["method"],
        "notifications/subscriptions/acknowledged"
    );

    request(
        &client,
        "tools/call",
        json!({ "name": "test_trigger_tool_change", "arguments": {} }),
    )
    .await;
    let n = next_message(&mut tools).await;
    validate_message("subscriptions/listen", &n);
    assert_eq!(n["method"], "notifications/tools/list_changed");
    assert_eq!(
        n["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        sub_id
    );
    request(
        &client,
        "tools/call",
        json!({ "name": "test_trigger_prompt_change", "arguments": {} }),
    )
    .await;
    // The prompts stream never sees the tools change; its first notification is the prompts one.
    let n = next_message(&mut prompts).await;
    assert_eq!(n["method"], "notifications/prompts/list_changed");

    // SIGTERM: each stream ends with a complete listen response carrying its subscription
    // id, when the drain begins (in `next_message`'s five seconds, not the grace's sixty),
    // so that a proxy's next request on its connection is answered while the server serves.
    server.terminate();
    let end = next_message(&mut tools).await;
    validate_message("subscriptions/listen", &end);
    assert_eq!(end["id"], sub_id);
    assert_eq!(end["result"]["resultType"], "complete");
    assert_eq!(
        end["result"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        sub_id
    );
    assert!(
        tokio::time::timeout(Duration::from_secs(5), tools.next())
            .await
            .unwrap()
            .is_none(),
        "closed after the response"
    );
    // A stream opened during the drain closes its connection when it ends, at shutdown
    // (here a second signal, which skips the rest of the grace).
    let late = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
        .post(server.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "subscriptions/listen")
        .body(r#"{"jsonrpc":"2.0","id":9,"method":"subscriptions/listen","params":{"notifications":{"toolsListChanged":true},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(late.status(), 200);
    assert_eq!(late.headers()["connection"], "close");
    server.terminate();
    let body = tokio::time::timeout(Duration::from_secs(5), late.text())
        .await
        .expect("the late stream ends at shutdown")
        .unwrap();
    assert!(body.contains(r#""resultType":"complete""#), "{body}");
    assert!(server.wait_exit(Duration::from_secs(15)).success());
}

#[tokio::test]
async fn sigterm_lets_in_flight_requests_finish_and_exits_zero() {
    let mut server = ServerProcess::start(&["--drain-secs", "30", "--drain-grace-secs", "2"]);
    let http = reqwest::Client::new();
    let readyz = format!("http://127.0.0.1:{}/readyz", server.port);
    assert_eq!(http.get(&readyz).send().await.unwrap().status(), 200);
    // Its first progress says the request runs (for five seconds); then the signal.
    let call = common::running_count(&server.client(), 50, 100).await;
    let signalled = std::time::Instant::now();
    server.terminate();
    // Draining: from the moment the signal is handled, load balancers are told at once…
    server
        .log
        .wait_for("draining: /readyz answers 503", 1)
        .await;
    let answer = http.get(&readyz).send().await.unwrap();
    println!("/readyz 503 {:?} after SIGTERM", signalled.elapsed());
    assert_eq!(answer.status(), 503);
    assert_eq!(
        answer.json::<Value>().await.unwrap(),
        json!({ "status": "draining" })
    );
    // …while requests are still served, on connections that close after their response.
    let served = http
        .post(server.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "server/discover")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(served.status(), 200);
    assert_eq!(served.headers()["connection"], "close");
    // Every response, whatever answers it: a probe, a path nothing serves.
    for path in ["/healthz", "/nothing"] {
        let other = http
            .get(format!("http://127.0.0.1:{}{path}", server.port))
            .send()
            .await
            .unwrap();
        assert_eq!(other.headers()["connection"], "close", "{path}");
    }
    // Then it stops accepting, and the call in flight still finishes.
    server.log.wait_for("shutting down: draining", 1).await;
    let rest: Vec<Value> = call.collect().await;
    let last = rest.last().expect("an answer");
    assert_eq!(last["result"]["content"][0]["text"], "counted 50", "{last}");
    assert!(
        server.wait_exit(Duration::from_secs(15)).success(),
        "exit code 0"
    );
}

/// A signal while in-flight requests drain ends the drain at once, as the drain deadline
/// would (an operator who signals again does not want to wait for it).
#[tokio::test]
async fn a_second_signal_while_draining_stops_at_once() {
    let mut server = ServerProcess::start(&["--drain-secs", "600", "--drain-grace-secs", "0"]);
    // A call that runs for minutes holds the drain.
    let _call = common::running_count(&server.client(), 1_000, 600).await;
    server.terminate();
    server.log.wait_for("shutting down: draining", 1).await;
    server.terminate();
    server
        .log
        .wait_for("signalled again while draining", 1)
        .await;
    assert!(
        server.wait_exit(Duration::from_secs(60)).success(),
        "exit code 0, long before the drain's ten minutes"
    );
}

#[tokio::test]
async fn health_endpoints() {
    let server = ServerProcess::start(&[]);
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{}", server.port);
    assert_eq!(
        http.get(format!("{base}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        http.get(format!("{base}/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    for path in ["/healthz", "/readyz"] {
        let answer = http.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(answer.headers()["x-content-type-options"], "nosniff");
        // The probes serve the hosts the endpoint serves, no others (DNS rebinding).
        let rebound = http
            .get(format!("{base}{path}"))
            .header("Host", "attacker.example")
            .send()
            .await
            .unwrap();
        assert_eq!(rebound.status(), 403, "{path}");
    }
}

#[tokio::test]
async fn listen_echoes_ids_beyond_64_bits_exactly() {
    let server = ServerProcess::start(&["--profile", "conformance"]);
    let body = r#"{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"subscriptions/listen","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}},"notifications":{"toolsListChanged":true}}}"#;
    let client = reqwest::Client::new();
    let mut res = client
        .post(server.url())
        .header("content-type", "application/json")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "subscriptions/listen")
        .body(body)
        .send()
        .await
        .unwrap();
    let mut text = String::new();
    while !text.contains("\n\n") {
        let chunk = tokio::time::timeout(Duration::from_secs(5), res.chunk())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(
        text.contains(r#""io.modelcontextprotocol/subscriptionId":123456789012345678901234567890"#),
        "{text}"
    );
}

/// A call cancelled before it returns runs the cleanup its handler registered
/// (`cx.on_cancel`), to completion: when a plain JSON client goes away, and when a streamed
/// call's stream is closed. A call that finishes runs none.
#[tokio::test]
async fn cancelled_calls_run_their_cleanup() {
    let server = ServerProcess::start(&[]);
    let stats = async || {
        let r = request(
            &server.client(),
            "tools/call",
            json!({ "name": "demo_stats", "arguments": {} }),
        )
        .await;
        let s = &r.result().unwrap()["structuredContent"];
        (
            s["slowCountsStarted"].as_u64().unwrap(),
            s["slowCountsCancelled"].as_u64().unwrap(),
        )
    };
    let until = async |want: (u64, u64)| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let got = stats().await;
            if got == want {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "stats {got:?}, expected {want:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    // One that finishes: no cleanup.
    request(
        &server.client(),
        "tools/call",
        json!({ "name": "slow_count", "arguments": { "steps": 1, "interval_ms": 1 } }),
    )
    .await;
    until((1, 0)).await;

    // Plain JSON: the client gives up while the call runs.
    let body = json!({ "jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "slow_count", "arguments": { "steps": 1000, "interval_ms": 200 },
        "_meta": { "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                   "io.modelcontextprotocol/clientCapabilities": {} } } });
    let gave_up = reqwest::Client::new()
        .post(server.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "slow_count")
        .body(body.to_string())
        .timeout(Duration::from_millis(500))
        .send()
        .await;
    assert!(gave_up.is_err_and(|e| e.is_timeout()));
    until((2, 1)).await;

    // Streamed: the client closes the stream.
    let call = common::running_count(&server.client(), 1000, 200).await;
    drop(call);
    until((3, 2)).await;
}
