//! A client that stops reading stdout does not keep the server alive: once its input ends,
//! the answers it left unread get one more drain period, and then the server returns.

use std::time::Duration;

use serde_json::json;
use tokio::io::AsyncWriteExt;
use wharf::protocol::Implementation;
use wharf::{Context, NoArgs, Server, tool};
use wharf_stdio::{StdioConfig, serve_with};

/// A server with one tool, served over stdio with `drain`, its output a pipe of `out`
/// bytes, sent three `tools/list` requests and then the end of its input: what reads its
/// output, and the serving task.
fn three_requests_then_eof(
    drain: Duration,
    out: usize,
) -> (
    tokio::io::DuplexStream,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let server = Server::builder(Implementation::new("t", "1"))
        .tool(tool("hello").handler(|_cx: Context, _: NoArgs| async { "hi" }))
        .build()
        .unwrap();
    let (mut to_server, server_in) = tokio::io::duplex(64 * 1024);
    let (server_out, from_server) = tokio::io::duplex(out);
    let mut config = StdioConfig::default();
    config.drain = drain;
    let served = tokio::spawn(serve_with(server, server_in, server_out, config));
    tokio::spawn(async move {
        for id in 1..=3 {
            let request = json!({ "jsonrpc": "2.0", "id": id, "method": "tools/list", "params": {
                "_meta": { "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {} } } });
            to_server
                .write_all(format!("{request}\n").as_bytes())
                .await
                .unwrap();
        }
    });
    (from_server, served)
}

#[tokio::test(start_paused = true)]
async fn answers_left_unread_do_not_keep_the_server_from_ending() {
    // Room for less than one answer, and nobody reads it.
    let (_unread, served) = three_requests_then_eof(Duration::from_secs(2), 16);
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

/// A client that reads slowly, but reads, gets every answer: the last ones wait as long as
/// some of them are read every drain period, however long that takes in all.
#[tokio::test(start_paused = true)]
async fn a_slow_reader_gets_every_answer() {
    use tokio::io::AsyncBufReadExt;
    let (from_server, served) = three_requests_then_eof(Duration::from_secs(1), 16);
    // Sixteen bytes at a time, one read every 0.9 s of the paused clock (no real time
    // passes: the runtime moves the clock on when every task waits).
    let mut reader = tokio::io::BufReader::with_capacity(16, from_server);
    let mut answers = 0;
    loop {
        let chunk = reader.fill_buf().await.unwrap();
        if chunk.is_empty() {
            break;
        }
        answers += chunk.iter().filter(|b| **b == b'\n').count();
        let n = chunk.len();
        reader.consume(n);
        tokio::time::sleep(Duration::from_millis(900)).await;
    }
    let ended = served.await.unwrap();
    assert_eq!(answers, 3, "{ended:?}");
    ended.unwrap();
}
