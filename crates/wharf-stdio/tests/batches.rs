//! A 2025-03-26 session over stdio may send JSON-RPC batches, one array on a line: each
//! message is taken as if it came on a line of its own and answered on a line of its own.
//! A session of a later revision is refused them.

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use wharf::protocol::Implementation;
use wharf::{Context, Server, tool};
use wharf_stdio::{StdioConfig, serve_with};

/// The first `expected` answers to a batch sent in a session opened at `version`, by id.
async fn answers(version: &str, batch: Value, expected: usize) -> Vec<Value> {
    let server = Server::builder(Implementation::new("t", "1"))
        .tool(tool("echo").handler(
            |_cx: Context, args: serde_json::Map<String, Value>| async move {
                args["text"].as_str().unwrap_or_default().to_owned()
            },
        ))
        .build()
        .unwrap();
    let (mut to_server, server_in) = tokio::io::duplex(64 * 1024);
    let (server_out, from_server) = tokio::io::duplex(64 * 1024);
    let served = tokio::spawn(serve_with(
        server,
        server_in,
        server_out,
        StdioConfig::default(),
    ));
    let initialize = json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": {},
        "clientInfo": { "name": "t", "version": "1" } } });
    for m in [initialize, batch] {
        to_server
            .write_all(format!("{m}\n").as_bytes())
            .await
            .unwrap();
    }
    let mut lines = BufReader::new(from_server).lines();
    let mut got = Vec::new();
    while got.len() < expected + 1 {
        let line = tokio::time::timeout(std::time::Duration::from_secs(20), lines.next_line())
            .await
            .expect("an answer")
            .unwrap()
            .expect("a line");
        got.push(serde_json::from_str::<Value>(&line).unwrap());
    }
    drop(to_server);
    served.await.unwrap().unwrap();
    let opened = got
        .iter()
        .position(|m| m["id"] == 0)
        .expect("initialize answered");
    assert_eq!(got.remove(opened)["result"]["protocolVersion"], version);
    got.sort_by_key(|m| m["id"].as_i64());
    got
}

#[tokio::test]
async fn a_2025_03_26_batch_is_answered_message_by_message() {
    let batch = json!([
        { "jsonrpc": "2.0", "method": "notifications/initialized" },
        { "jsonrpc": "2.0", "id": 1, "method": "ping" },
        { "jsonrpc": "2.0", "id": 2, "method": "tools/call",
          "params": { "name": "echo", "arguments": { "text": "one" } } },
        { "jsonrpc": "2.0", "id": 3, "method": "no/such/method" },
    ]);
    let got = answers("2025-03-26", batch, 3).await;
    assert_eq!(got[0], json!({ "jsonrpc": "2.0", "id": 1, "result": {} }));
    assert_eq!(got[1]["result"]["content"][0]["text"], "one", "{}", got[1]);
    assert_eq!(got[2]["error"]["code"], -32601, "{}", got[2]);
}

#[tokio::test]
async fn a_later_revision_is_refused_a_batch() {
    let batch = json!([{ "jsonrpc": "2.0", "id": 1, "method": "ping" }]);
    // 2025-11-25 has errors without an id: the one the batch gets.
    let got = answers("2025-11-25", batch, 1).await;
    assert_eq!(got[0]["error"]["code"], -32600, "{}", got[0]);
    assert!(
        got[0]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("batches"),
        "{}",
        got[0]
    );
}
