//! What a handler logs reaches a client that reads its stream, however slowly, and never
//! holds the call back for one that stopped reading (the handler may hold its transaction,
//! locks and turns while it logs). Time is paused: a wait on the stream would let the
//! test's own timeout fire.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use wharf::protocol::{Implementation, LoggingLevel, RequestId};
use wharf::{Context, NoArgs, Principal, Server, tool};

const MESSAGES: usize = 500;

fn server() -> Server {
    Server::builder(Implementation::new("chatty", "1.0.0"))
        .tool(tool("chatty").handler(|cx: Context, _: NoArgs| async move {
            for n in 0..MESSAGES {
                cx.log(LoggingLevel::Info, Some("rows"), json!(n)).await;
            }
            "done"
        }))
        .logging(true)
        .build()
        .unwrap()
}

/// Runs `chatty` as a stream whose channel holds `room` messages, and returns its response
/// and the channel's receiving end.
async fn run(room: usize) -> (mpsc::Receiver<Vec<u8>>, tokio::task::JoinHandle<Value>) {
    let server = server();
    let params = json!({
        "name": "chatty",
        "arguments": {},
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/logLevel": "debug",
        },
    });
    let raw = serde_json::value::RawValue::from_string(params.to_string()).unwrap();
    let req = server
        .parse_request(RequestId::Int(1), "tools/call", Some(&raw))
        .unwrap();
    let admitted = server.admit(req, Principal::anonymous()).await.unwrap();
    let (tx, rx) = mpsc::channel(room);
    let call = tokio::spawn(async move {
        let response = admitted
            .stream_then(tx, CancellationToken::new())
            .await
            .expect("not cancelled")
            .expect("a result");
        serde_json::from_slice(&response).unwrap()
    });
    (rx, call)
}

fn logged(message: &[u8]) -> Value {
    let m: Value = serde_json::from_slice(message).unwrap();
    assert_eq!(m["method"], "notifications/message", "{m}");
    m["params"]["data"].clone()
}

#[tokio::test(start_paused = true)]
async fn a_client_that_stops_reading_does_not_hold_the_call() {
    let (mut rx, call) = run(4).await;
    let response = tokio::time::timeout(Duration::from_secs(3600), call)
        .await
        .expect("the call waited for a client that does not read")
        .unwrap();
    assert_eq!(
        response["result"]["content"][0]["text"], "done",
        "{response}"
    );
    // What fit on the stream is there, in order; the rest was dropped.
    for n in 0..4 {
        assert_eq!(logged(&rx.recv().await.unwrap()), json!(n));
    }
    assert!(rx.recv().await.is_none(), "nothing more");
}

#[tokio::test(start_paused = true)]
async fn a_client_that_reads_slowly_gets_every_message() {
    let (mut rx, call) = run(4).await;
    let mut got = Vec::new();
    while let Some(m) = rx.recv().await {
        got.push(logged(&m));
        // Slower than the handler, faster than the wait for room.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let want: Vec<Value> = (0..MESSAGES).map(|n| json!(n)).collect();
    assert_eq!(got, want);
    let response = call.await.unwrap();
    assert_eq!(
        response["result"]["content"][0]["text"], "done",
        "{response}"
    );
}
