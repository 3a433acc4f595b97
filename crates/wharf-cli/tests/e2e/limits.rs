//! Load shedding over real HTTP: with small caps, the request beyond caps plus queue gets 503
//! with `Retry-After` at once and the server stays healthy; a request cancelled while queued
//! never runs; a call past its time limit is stopped with 504.
//!
//! Nothing here is decided by a sleep: a call holds its slot until the test drops it (its
//! first progress notification says it runs), and the server's debug log says when a request
//! queues or leaves the queue.

use crate::common;

use common::{ServerProcess, request, validate_reply};
use futures_util::Stream;
use serde_json::{Value, json};

const QUEUED: &str = "request queued for a slot";
const LEFT_QUEUE: &str = "queued request cancelled; it left the queue";

fn slow(steps: u32, ms: u64) -> Value {
    json!({ "name": "slow_count", "arguments": { "steps": steps, "interval_ms": ms } })
}

/// A call that runs for minutes unless dropped: it holds its slots until the test drops the
/// stream (closing the connection cancels it). Returns once the handler runs.
async fn holding(server: &ServerProcess) -> impl Stream<Item = Value> + use<> {
    common::running_count(&server.client(), 1000, 200).await
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
    let held = holding(&server).await;
    let queued = tokio::spawn({
        let c = server.client();
        async move { c.request("tools/call", slow(1, 1)).await.unwrap() }
    });
    server.log.wait_for(QUEUED, 1).await;

    // The slot is held until the test lets go, so an answer now was not a turn in the queue.
    let refused = server
        .client()
        .request("tools/call", slow(1, 1))
        .await
        .unwrap();
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert_eq!(refused.headers["retry-after"], "1");
    assert_eq!(refused.error_code(), Some(-31000));
    assert!(
        refused.error().unwrap()["message"]
            .as_str()
            .unwrap()
            .contains("queue is full"),
        "{}",
        refused.body
    );
    validate_reply("tools/call", &refused);
    assert!(!queued.is_finished(), "the queued request still waits");
    assert_eq!(server.log.count(QUEUED), 1, "the refused one never queued");

    // The server stays healthy: liveness answers while it is full.
    let health = reqwest::get(format!("http://127.0.0.1:{}/healthz", server.port))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    // Letting go of the slot lets the queued request run.
    drop(held);
    let r = queued.await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.result().unwrap()["content"][0]["text"], "counted 1");
    let after = request(&server.client(), "tools/call", slow(1, 1)).await;
    assert_eq!(after.status, 200);
}

#[tokio::test]
async fn a_request_cancelled_while_queued_never_runs() {
    let server = ServerProcess::start(&["--max-in-flight", "1", "--max-queue", "4"]);
    let before = started(&server).await;
    let held = holding(&server).await;
    // Queued behind it, then the client goes away (its connection closes).
    let queued = tokio::spawn({
        let c = server.client();
        async move { c.request("tools/call", slow(1, 1)).await }
    });
    server.log.wait_for(QUEUED, 1).await;
    queued.abort();
    let _ = queued.await;
    server.log.wait_for(LEFT_QUEUE, 1).await;
    drop(held);
    // The slot is a fair queue: had the cancelled request stayed in it, it would run before
    // this one, and the count would show it.
    assert_eq!(
        started(&server).await - before,
        1,
        "only the held call ever ran"
    );
}

/// The demo server with API keys for Alice and Bob, and `caps`.
fn alice_and_bob(caps: &[&str]) -> ServerProcess {
    let keys = [
        "--profile",
        "demo",
        "--api-key",
        "alice=alice-key-0123456789",
        "--api-key",
        "bob=bob-key-0123456789ab",
    ];
    ServerProcess::start_exact(&[&keys[..], caps].concat())
}

#[tokio::test]
async fn each_principal_has_its_own_cap() {
    let server = alice_and_bob(&["--max-per-principal", "1"]);
    let alice = server.client().with_bearer("alice-key-0123456789");
    let held = common::running_count(&alice, 1000, 200).await;

    let refused = alice.request("tools/call", slow(1, 1)).await.unwrap();
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert_eq!(refused.error_code(), Some(-31000));
    validate_reply("tools/call", &refused);
    // Another principal is not held up by Alice's cap.
    let bob = server.client().with_bearer("bob-key-0123456789ab");
    let other = bob.request("tools/call", slow(1, 1)).await.unwrap();
    assert_eq!(other.status, 200, "{}", other.body);
    drop(held);
}

#[tokio::test]
async fn a_call_past_its_time_limit_is_stopped_with_504() {
    let server = ServerProcess::start(&["--max-call-secs", "1"]);
    let before = started(&server).await;
    // Minutes of work: only the limit can end it with an answer.
    let r = server
        .client()
        .request("tools/call", slow(1000, 200))
        .await
        .unwrap();
    assert_eq!(r.status, 504, "{}", r.body);
    assert_eq!(r.error_code(), Some(-31002));
    assert!(
        r.error().unwrap()["message"]
            .as_str()
            .unwrap()
            .contains("1 s")
    );
    validate_reply("tools/call", &r);
    assert_eq!(started(&server).await - before, 1);
    // The server goes on serving.
    assert_eq!(
        request(&server.client(), "tools/call", slow(1, 1))
            .await
            .status,
        200
    );
}

/// `subscriptions/listen` streams beyond a principal's share get 503 with `Retry-After` at
/// once, whatever else runs; another principal has its own share, and a closed stream
/// frees its slot.
#[tokio::test]
async fn listen_streams_are_capped_per_principal() {
    let server = alice_and_bob(&["--max-listen-per-principal", "2"]);
    let alice = server.client().with_bearer("alice-key-0123456789");
    let listen = json!({ "notifications": { "toolsListChanged": true } });
    let open = |client: &wharf_client::HttpClient| {
        let (client, listen) = (client.clone(), listen.clone());
        async move {
            let mut stream = Box::pin(
                client
                    .open_stream("subscriptions/listen", listen)
                    .await
                    .unwrap(),
            );
            let ack = futures_util::StreamExt::next(&mut stream).await.unwrap();
            assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
            stream
        }
    };
    let first = open(&alice).await;
    let _second = open(&alice).await;
    let refused = alice
        .request("subscriptions/listen", listen.clone())
        .await
        .unwrap();
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert!(refused.headers.get("retry-after").is_some());
    assert_eq!(refused.error_code(), Some(-31000));
    let message = refused.error().unwrap()["message"].as_str().unwrap();
    assert!(
        message.contains("2 subscriptions/listen streams"),
        "{message}"
    );
    validate_reply("subscriptions/listen", &refused);

    let bob = server.client().with_bearer("bob-key-0123456789ab");
    let _theirs = open(&bob).await;
    drop(first);
    // The slot frees once the server sees the stream closed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let mut stream = Box::pin(
            alice
                .open_stream("subscriptions/listen", listen.clone())
                .await
                .unwrap(),
        );
        // A refusal is a JSON reply: its one message is the error.
        let first = futures_util::StreamExt::next(&mut stream).await;
        if first
            .as_ref()
            .is_some_and(|m| m["method"] == "notifications/subscriptions/acknowledged")
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never freed: {first:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
