//! Long calls over the real transports: `report_generate` streams progress, stops its work
//! when its request is cancelled (closed stream, closed connection, `notifications/cancelled`),
//! and runs one at a time per dataset, also across two replicas on one PostgreSQL, while
//! reports on different datasets run in parallel.

use crate::common;

use std::time::Duration;

use common::import::{
    TOKEN_7, TOKEN_42, begin, call, ok, on_every_store, pg_url, replica_args, rows, server,
    sqlite_url, unique,
};
use common::{ServerProcess, validate_message};
use futures_util::StreamExt;
use serde_json::{Value, json};
use wharf_client::{HttpClient, StdioClient};

/// Creates dataset `name` with `n` rows (ids 0..n; temp = id / 2).
async fn dataset(client: &HttpClient, name: &str, n: i64) {
    let import = begin(client, name).await;
    for from in (0..n).step_by(1000) {
        let count = (n - from).min(1000);
        ok(
            client,
            "import_append_rows",
            json!({ "import": import, "rows": rows(from, count), "idempotency_key": unique("k") }),
        )
        .await;
    }
    ok(
        client,
        "import_commit",
        json!({ "import": import, "idempotency_key": "commit" }),
    )
    .await;
}

async fn status(client: &HttpClient, name: &str) -> Value {
    ok(client, "report_status", json!({ "dataset": name })).await["structuredContent"].clone()
}

/// Polls the report of `name` until `done` holds for its recorded state (a generous deadline
/// only turns a hang into a failure).
async fn status_until(client: &HttpClient, name: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        // Before the run records its start, the dataset has no report: that is Null here.
        let reply = call(client, "report_status", json!({ "dataset": name })).await;
        let now = reply.result().unwrap()["structuredContent"].clone();
        if done(&now) {
            return now;
        }
        assert!(std::time::Instant::now() < deadline, "never reached: {now}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the report of `name` runs and has scanned a chunk.
async fn running(client: &HttpClient, name: &str) -> Value {
    status_until(client, name, |s| {
        s["state"] == "running" && s["scannedRows"].as_u64() > Some(0)
    })
    .await
}

/// Waits until the report of `name` is cancelled, then checks that nothing more is written
/// for it: the recorded state stays exactly as it was over several of the run's pauses (an
/// absence can only be watched for a while; a broken build fails it, a slow one does not).
async fn assert_stopped(client: &HttpClient, name: &str, pause_ms: u64) -> Value {
    let last = status_until(client, name, |s| s["state"] == "cancelled").await;
    tokio::time::sleep(Duration::from_millis(pause_ms * 8)).await;
    let later = status(client, name).await;
    assert_eq!(later, last, "nothing was written after the cancellation");
    assert!(
        later["scannedRows"].as_u64().unwrap() < later["totalRows"].as_u64().unwrap(),
        "the scan stopped part-way: {later}"
    );
    later
}

fn generate(name: &str, chunk: u64, pause_ms: u64) -> Value {
    json!({
        "name": "report_generate",
        "arguments": {
            "dataset": name,
            "chunk_rows": chunk,
            "pause_ms": pause_ms,
            "idempotency_key": unique("report"),
        },
    })
}

#[tokio::test]
async fn progress_streams_only_when_asked_then_the_result() {
    let server = server(&sqlite_url("reports-progress"));
    let client = server.client().with_bearer(TOKEN_42);
    let name = unique("ds");
    dataset(&client, &name, 2500).await;

    let plain = client
        .request("tools/call", generate(&name, 1000, 0))
        .await
        .unwrap();
    assert!(plain.content_type().starts_with("application/json"));
    let report = &plain.result().unwrap()["structuredContent"];
    assert_eq!(report["state"], "done");
    assert_eq!(report["scannedRows"], 2500);
    let id = &report["columns"][0];
    assert_eq!(
        (&id["name"], &id["min"], &id["max"], &id["mean"]),
        (&json!("id"), &json!(0.0), &json!(2499.0), &json!(1249.5))
    );
    assert_eq!(report["columns"][1]["nonNull"], 2500);
    assert!(
        report["columns"][1].get("mean").is_none(),
        "strings have no mean"
    );

    let mut params = generate(&name, 500, 30);
    params["_meta"] = json!({ "progressToken": "rep" });
    let streamed = client.request("tools/call", params).await.unwrap();
    assert!(streamed.is_sse());
    let progress: Vec<(f64, f64)> = streamed
        .notifications()
        .map(|n| {
            validate_message("tools/call", n);
            assert_eq!(n["params"]["progressToken"], "rep");
            (
                n["params"]["progress"].as_f64().unwrap(),
                n["params"]["total"].as_f64().unwrap(),
            )
        })
        .collect();
    assert!(progress.len() >= 2, "{progress:?}");
    assert!(progress.windows(2).all(|w| w[0].0 < w[1].0), "{progress:?}");
    assert_eq!(progress.last(), Some(&(2500.0, 2500.0)));
    let last = streamed.messages.last().unwrap();
    validate_message("tools/call", last);
    assert_eq!(last["result"]["structuredContent"]["run"], 2);
}

/// Closing the SSE stream in the middle of a report stops it: no further chunk is recorded,
/// and the drop guard marks it cancelled.
async fn closing_the_stream_stops_the_report(store: &str) {
    let server = server(store);
    let client = server.client().with_bearer(TOKEN_42);
    let name = unique("ds");
    dataset(&client, &name, 10_000).await;
    // 100 chunks with a pause after each: twenty seconds of work, far beyond the test.
    let mut params = generate(&name, 100, 200);
    params["_meta"] = json!({ "progressToken": 1 });
    let mut stream = Box::pin(client.open_stream("tools/call", params).await.unwrap());
    let mut seen = 0;
    while seen < 3 {
        let m = stream.next().await.expect("progress before the end");
        assert_eq!(m["method"], "notifications/progress", "{m}");
        seen += 1;
    }
    let running = status(&client, &name).await;
    assert_eq!(running["state"], "running");
    assert!(running["scannedRows"].as_u64().unwrap() >= 200, "{running}");
    drop(stream);
    // How soon it stops is measured by bench/cancel-latency, not here.
    assert_stopped(&client, &name, 200).await;
}

/// `report_generate` retried with its key returns the report the first call made, without
/// a second run: after it finished, and while it still runs (the retry waits, then
/// replays). The same key is another principal's own, and another call under it is refused;
/// a run cut short before it finished is started again.
async fn a_retried_report_is_the_first_report(store: &str) {
    let server = server(store);
    let (u42, u7) = (
        server.client().with_bearer(TOKEN_42),
        server.client().with_bearer(TOKEN_7),
    );
    let name = unique("ds");
    dataset(&u42, &name, 1200).await;
    let replayed = |r: &Value| r["_meta"]["dev.wharf/idempotentReplay"] == true;

    // Finished, then retried.
    let args = generate(&name, 100, 0)["arguments"].clone();
    let first = ok(&u42, "report_generate", args.clone()).await;
    assert!(!replayed(&first), "{first}");
    assert_eq!(first["structuredContent"]["state"], "done");
    let again = ok(&u42, "report_generate", args.clone()).await;
    assert!(replayed(&again), "{again}");
    assert_eq!(again["structuredContent"], first["structuredContent"]);
    let run = first["structuredContent"]["run"].clone();
    assert_eq!(status(&u42, &name).await["run"], run, "no second run");

    // The key is u42's: u7, who has no such dataset, gets nothing of u42's report.
    let theirs = call(&u7, "report_generate", args.clone()).await;
    let theirs = theirs.result().unwrap();
    assert!(!replayed(theirs), "{theirs}");
    assert_eq!(theirs["isError"], true, "{theirs}");
    assert!(
        theirs["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("does not exist"),
        "{theirs}"
    );
    let mut other = args.clone();
    other["chunk_rows"] = json!(200);
    let mismatch = call(&u42, "report_generate", other).await;
    let text = mismatch.result().unwrap()["content"][0]["text"].clone();
    assert!(
        text.as_str()
            .unwrap()
            .contains("already used for a different call"),
        "{text}"
    );

    // Retried while it runs: the retry waits for the first call, then replays its report.
    // Meanwhile, a retry of the finished report is answered at once, though the running one
    // holds the dataset (12 chunks, 300 ms apart).
    let slow = generate(&name, 100, 300)["arguments"].clone();
    let running_call = {
        let u42 = u42.clone();
        let slow = slow.clone();
        tokio::spawn(async move { ok(&u42, "report_generate", slow).await })
    };
    let mid = running(&u42, &name).await;
    let earlier = ok(&u42, "report_generate", args.clone()).await;
    assert!(replayed(&earlier), "{earlier}");
    let meanwhile = status(&u42, &name).await;
    assert_eq!(
        (&meanwhile["state"], &meanwhile["run"]),
        (&json!("running"), &mid["run"]),
        "the replay did not wait for the running report"
    );
    let retry = ok(&u42, "report_generate", slow.clone()).await;
    let first = running_call.await.unwrap();
    assert!(replayed(&retry), "{retry}");
    assert_eq!(retry["structuredContent"], first["structuredContent"]);
    assert_eq!(first["structuredContent"]["run"], mid["run"]);
    assert_eq!(
        status(&u42, &name).await["run"],
        mid["run"],
        "no second run"
    );

    // Cut short (the client went away): nothing was recorded, so the retry runs again.
    let cut = generate(&name, 100, 200);
    let mut params = cut.clone();
    params["_meta"] = json!({ "progressToken": 1 });
    let mut stream = Box::pin(u42.open_stream("tools/call", params).await.unwrap());
    let progress = stream.next().await.expect("progress before the end");
    assert_eq!(progress["method"], "notifications/progress", "{progress}");
    drop(stream);
    let stopped = status_until(&u42, &name, |s| s["state"] == "cancelled").await;
    let rerun = ok(&u42, "report_generate", cut["arguments"].clone()).await;
    assert!(!replayed(&rerun), "{rerun}");
    assert_eq!(rerun["structuredContent"]["state"], "done");
    assert!(rerun["structuredContent"]["run"].as_u64() > stopped["run"].as_u64());
}

/// Without a progress token the answer is a JSON body; a client that goes away before it
/// stops the work all the same.
#[tokio::test]
async fn closing_the_connection_of_a_plain_call_stops_the_report() {
    let server = server(&sqlite_url("reports-plain"));
    let client = server.client().with_bearer(TOKEN_42);
    let name = unique("ds");
    dataset(&client, &name, 10_000).await;
    let call = tokio::spawn({
        let client = client.clone();
        let params = generate(&name, 100, 200);
        async move { client.request("tools/call", params).await }
    });
    running(&client, &name).await;
    call.abort();
    let _ = call.await;
    assert_stopped(&client, &name, 200).await;
}

/// A call waiting for its turn on a dataset, cancelled, never runs: the report's run count
/// shows only the first run, and the next call is the second.
#[tokio::test]
async fn a_call_cancelled_while_waiting_for_its_turn_never_runs() {
    let server = server(&sqlite_url("reports-turn"));
    let client = server.client().with_bearer(TOKEN_42);
    let name = unique("ds");
    dataset(&client, &name, 5000).await;
    // Fifty seconds of work, ended by the test.
    let first = tokio::spawn({
        let client = client.clone();
        let params = generate(&name, 100, 1000);
        async move { client.request("tools/call", params).await }
    });
    running(&client, &name).await;
    // The waiting call's JSON-RPC id tries to forge a log line and colour the terminal: the
    // log shows it quoted and escaped, on the line of the event it belongs to.
    let forged_id = "w\nINJECTED forged log line \u{1b}[31m";
    let waiting = tokio::spawn({
        let client = server.client();
        let mut params = generate(&name, 100, 1000);
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}
        });
        let body =
            json!({ "jsonrpc": "2.0", "id": forged_id, "method": "tools/call", "params": params });
        let mut headers = reqwest::header::HeaderMap::new();
        for (k, v) in [
            ("content-type", "application/json".to_owned()),
            ("accept", "application/json, text/event-stream".to_owned()),
            ("mcp-protocol-version", "2026-07-28".to_owned()),
            ("mcp-method", "tools/call".to_owned()),
            ("mcp-name", "report_generate".to_owned()),
            ("authorization", format!("Bearer {TOKEN_42}")),
        ] {
            headers.insert(k, v.parse().unwrap());
        }
        async move {
            client
                .send_raw(body.to_string().into_bytes(), headers)
                .await
        }
    });
    server
        .log
        .wait_for("call waits for its turn on its key", 1)
        .await;
    assert_eq!(status(&client, &name).await["run"], 1, "the second waits");
    assert_eq!(
        server
            .log
            .count(r#"id="w\nINJECTED forged log line \u{1b}[31m""#),
        1,
        "the id is logged escaped, with its event"
    );
    assert_eq!(
        server.log.count("\u{1b}"),
        0,
        "no raw escape reached the log"
    );
    assert!(
        server
            .log
            .lines()
            .iter()
            .all(|l| !l.starts_with("INJECTED")),
        "no forged line"
    );
    waiting.abort();
    let _ = waiting.await;
    server
        .log
        .wait_for("call cancelled while waiting for its turn", 1)
        .await;
    first.abort();
    let _ = first.await;
    status_until(&client, &name, |s| s["state"] == "cancelled").await;
    // The line is first come, first served: had the cancelled call stayed in it, it would
    // have run before this one, as run 2.
    let next = ok(
        &client,
        "report_generate",
        json!({ "dataset": name, "idempotency_key": unique("report") }),
    )
    .await;
    assert_eq!(next["structuredContent"]["run"], 2);
    assert_eq!(next["structuredContent"]["state"], "done");
}

#[tokio::test]
async fn stdio_notifications_cancelled_stops_the_report() {
    let store = sqlite_url("reports-stdio");
    // The dataset is made over HTTP on the same store, then reported on over stdio.
    let name = unique("ds");
    {
        let http =
            ServerProcess::start_exact(&["--profile", "default", "--store", &store, "--anonymous"]);
        dataset(&http.client(), &name, 10_000).await;
    }
    let mut c = StdioClient::spawn(
        env!("CARGO_BIN_EXE_wharf"),
        &[
            "serve",
            "--stdio",
            "--profile",
            "default",
            "--store",
            &store,
        ],
    )
    .unwrap();
    // Twenty seconds of work, far beyond the test.
    let mut params = generate(&name, 100, 200);
    params["_meta"] = json!({ "progressToken": "p" });
    c.request(json!("rep"), "tools/call", params).await.unwrap();
    let mut progress = 0;
    while progress < 3 {
        let m = recv(&mut c).await;
        assert_eq!(m["method"], "notifications/progress", "{m}");
        progress += 1;
    }
    c.send(&json!({ "jsonrpc": "2.0", "method": "notifications/cancelled", "params": { "requestId": "rep" } }))
        .await
        .unwrap();
    let mut next_id = 0;
    let mut status = async |c: &mut StdioClient| {
        next_id += 1;
        let id = next_id;
        c.request(
            json!(id),
            "tools/call",
            json!({ "name": "report_status", "arguments": { "dataset": name } }),
        )
        .await
        .unwrap();
        loop {
            let m = recv(c).await;
            assert_ne!(m["id"], "rep", "a cancelled request gets no response: {m}");
            if m["id"] == id {
                break m["result"]["structuredContent"].clone();
            }
        }
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let last = loop {
        let report = status(&mut c).await;
        if report["state"] == "cancelled" {
            break report;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never cancelled: {report}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Several pauses later, it must be exactly the same (an absence is watched for a while).
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert_eq!(status(&mut c).await, last, "written after the cancellation");
    assert_eq!(last["state"], "cancelled", "{last}");
    assert!(last["scannedRows"].as_u64().unwrap() < 10_000, "{last}");
    c.close_stdin();
    assert!(c.wait().await.unwrap().success());
}

async fn recv(c: &mut StdioClient) -> Value {
    tokio::time::timeout(Duration::from_secs(10), c.recv())
        .await
        .expect("in time")
        .expect("read")
        .expect("a message")
}

/// Two replicas on one PostgreSQL: reports on one dataset never overlap, whichever replica
/// runs them (the handlers' own start and end times say so); on two datasets they overlap.
#[tokio::test]
async fn two_replicas_run_one_report_per_dataset_at_a_time() {
    let args = replica_args(&pg_url());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let a = ServerProcess::start_exact(&args);
    let b = ServerProcess::start_exact(&args);
    let (ca, cb) = (
        a.client().with_bearer(TOKEN_42),
        b.client().with_bearer(TOKEN_42),
    );
    let (one, two, long) = (unique("ds"), unique("ds"), unique("ds"));
    dataset(&ca, &one, 500).await;
    dataset(&cb, &two, 500).await;
    dataset(&ca, &long, 5000).await;

    let run = |client: &HttpClient, name: &str| {
        let (client, params) = (client.clone(), generate(name, 100, 30));
        tokio::spawn(async move {
            let r = client.request("tools/call", params).await.unwrap();
            let report =
                r.result().unwrap_or_else(|| panic!("{}", r.body))["structuredContent"].clone();
            (
                report["startedAt"].as_i64().unwrap(),
                report["finishedAt"].as_i64().unwrap(),
                report["run"].as_u64().unwrap(),
            )
        })
    };
    let calls = [
        run(&ca, &one),
        run(&cb, &one),
        run(&ca, &one),
        run(&cb, &one),
    ];
    let mut spans = Vec::new();
    for c in calls {
        spans.push(c.await.unwrap());
    }
    spans.sort_unstable();
    let runs: Vec<u64> = spans.iter().map(|s| s.2).collect();
    assert_eq!(runs, vec![1, 2, 3, 4], "each ran once, in turn: {spans:?}");
    for w in spans.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "reports on one dataset overlapped: {spans:?}"
        );
    }

    // Reports on two datasets run side by side: while a long report (fifty seconds) runs on
    // one on replica A, a whole report on another completes on replica B.
    let slow = tokio::spawn({
        let (client, params) = (ca.clone(), generate(&long, 100, 1000));
        async move { client.request("tools/call", params).await }
    });
    running(&ca, &long).await;
    let other = ok(
        &cb,
        "report_generate",
        json!({ "dataset": two, "idempotency_key": unique("report") }),
    )
    .await;
    assert_eq!(other["structuredContent"]["state"], "done");
    assert_eq!(
        status(&ca, &long).await["state"],
        "running",
        "the long report still runs"
    );
    slow.abort();
    let _ = slow.await;
}

on_every_store!(
    closing_the_stream_stops_the_report,
    a_retried_report_is_the_first_report,
);
