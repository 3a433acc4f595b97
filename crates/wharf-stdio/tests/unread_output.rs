//! A client that stops reading stdout does not keep the server alive: once its input ends,
//! the answers it left unread get one more drain period, and then the server returns.

use std::time::Duration;

use serde_json::json;
use tokio::io::AsyncWriteExt;
use wharf::protocol::Implementation;
use wharf::{Context, NoArgs, Server, tool};
use wharf_stdio::{StdioConfig, serve_with};

#[tokio::test(start_paused = true)]
async fn answers_left_unread_do_not_keep_the_server_from_ending() {
    let server = Server::builder(Implementation::new("t", "1"))
        .tool(tool("hello").handler(|_cx: Context, _: NoArgs| async { "hi" }))
        .build()
        .unwrap();
    let (mut to_server, server_in) = tokio::io::duplex(64 * 1024);
    // Room for less than one answer, and nobody reads it.
    let (server_out, _unread) = tokio::io::duplex(16);
    let mut config = StdioConfig::default();
    config.drain = Duration::from_secs(2);
    let served = tokio::spawn(serve_with(server, server_in, server_out, config));
    for id in 1..=3 {
        let request = json!({ "jsonrpc": "2.0", "id": id, "method": "tools/list", "params": {
            "_meta": { "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {} } } });
        to_server
            .write_all(format!("{request}\n").as_bytes())
            .await
            .unwrap();
    }
    drop(to_server);
    // The clock is paused: time moves on whenever every task waits, so a server stuck on
    // its output fails this at once rather than hanging the test.
    let ended = tokio::time::timeout(Duration::from_secs(3600), served)
        .await
        .expect("the server ended")
        .unwrap();
    let err = ended.expect_err("answers were left unwritten");
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
    assert!(err.to_string().contains("stdout was not read"), "{err}");
}
