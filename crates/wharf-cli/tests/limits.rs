//! Load shedding over real HTTP: with small caps, the request beyond caps plus queue gets 503
//! with `Retry-After` at once and the server stays healthy; a request cancelled while queued
//! never runs.

mod common;

use std::time::{Duration, Instant};

use common::{ServerProcess, request, validate_reply};
use serde_json::json;

fn slow(ms: u64) -> serde_json::Value {
    json!({ "name": "slow_count", "arguments": { "steps": 1, "interval_ms": ms } })
}

async fn started(server: &ServerProcess) -> u64 {
    let r = request(
        &server.client(),
        "tools/call",
        json!({ "name": "demo_stats", "arguments": {} }),
    )
    .await;
    r.result().unwrap()["structuredContent"]["slowCountsStarted"]
        .as_u64()
        .unwrap()
}

#[tokio::test]
async fn beyond_caps_and_queue_the_answer_is_503_at_once() {
    let server = ServerProcess::start(&["--max-in-flight", "1", "--max-queue", "1"]);
    let running = tokio::spawn({
        let c = server.client();
        async move { c.request("tools/call", slow(1500)).await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let queued = tokio::spawn({
        let c = server.client();
        async move { c.request("tools/call", slow(10)).await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;

    let t = Instant::now();
    let refused = server
        .client()
        .request("tools/call", slow(10))
        .await
        .unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(1000),
        "refused at once, not after a wait"
    );
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert_eq!(refused.headers["retry-after"], "1");
    assert_eq!(refused.error_code(), Some(-31000));
    validate_reply("tools/call", &refused);

    // The server stays healthy: liveness answers, and the others complete in turn.
    let health = reqwest::get(format!("http://127.0.0.1:{}/healthz", server.port))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    for job in [running, queued] {
        let r = job.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.result().unwrap()["content"][0]["text"], "counted 1");
    }
    let after = request(&server.client(), "tools/call", slow(1)).await;
    assert_eq!(after.status, 200);
}

#[tokio::test]
async fn a_request_cancelled_while_queued_never_runs() {
    let server = ServerProcess::start(&["--max-in-flight", "1", "--max-queue", "4"]);
    let before = started(&server).await;
    let running = tokio::spawn({
        let c = server.client();
        async move { c.request("tools/call", slow(1200)).await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Queued behind it, then the client goes away (its connection closes).
    let queued = tokio::spawn({
        let c = server.client();
        async move { c.request("tools/call", slow(10)).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    queued.abort();
    let _ = queued.await;
    running.await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        started(&server).await - before,
        1,
        "only the first call ever ran"
    );
}

#[tokio::test]
async fn each_principal_has_its_own_cap() {
    let server = ServerProcess::start(&["--max-per-principal", "1"]);
    let running = tokio::spawn({
        let c = server.client();
        async move { c.request("tools/call", slow(800)).await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let refused = server
        .client()
        .request("tools/call", slow(1))
        .await
        .unwrap();
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert!(running.await.unwrap().result().is_some());
}

#[tokio::test]
async fn a_call_past_its_time_limit_is_stopped_with_504() {
    let server = ServerProcess::start(&["--max-call-secs", "1"]);
    let t = Instant::now();
    let r = server
        .client()
        .request("tools/call", slow(5000))
        .await
        .unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(3000),
        "stopped at the limit, not at the end"
    );
    assert_eq!(r.status, 504, "{}", r.body);
    assert_eq!(r.error_code(), Some(-31002));
    assert!(
        r.error().unwrap()["message"]
            .as_str()
            .unwrap()
            .contains("1 s")
    );
    validate_reply("tools/call", &r);
    // The server goes on serving.
    assert_eq!(
        request(&server.client(), "tools/call", slow(1))
            .await
            .status,
        200
    );
}
