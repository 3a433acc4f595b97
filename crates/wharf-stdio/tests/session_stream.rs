//! A legacy session over stdio keeps hearing of the resources it subscribed to after its
//! stream of changes ended for missing some (the bus ran ahead of a slow reader): nobody
//! else would listen again, so the transport does.

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use wharf::ChangeEvent;
use wharf::protocol::{Implementation, ResourceContents};
use wharf::{Server, resource};
use wharf_stdio::{StdioConfig, serve_with};

const URI: &str = "notes://index";

fn server() -> Server {
    Server::builder(Implementation::new("t", "1"))
        .resource(resource(URI, "index").handler(|_cx, req| async move {
            Ok(vec![ResourceContents::text(req.uri, "text/plain", "x")])
        }))
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_subscription_outlives_a_stream_that_missed_changes() {
    let server = server();
    // A pipe far smaller than what is announced below: the reader falls behind the bus.
    let (mut to_server, server_in) = tokio::io::duplex(64 * 1024);
    let (server_out, from_server) = tokio::io::duplex(1024);
    let served = tokio::spawn(serve_with(
        server.clone(),
        server_in,
        server_out,
        StdioConfig::default(),
    ));
    let mut lines = BufReader::new(from_server).lines();
    let send = async |to_server: &mut tokio::io::DuplexStream, m: Value| {
        to_server
            .write_all(format!("{m}\n").as_bytes())
            .await
            .unwrap();
    };
    send(
        &mut to_server,
        json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": { "name": "t", "version": "1" } } }),
    )
    .await;
    send(
        &mut to_server,
        json!({ "jsonrpc": "2.0", "method": "notifications/initialized" }),
    )
    .await;
    send(
        &mut to_server,
        json!({ "jsonrpc": "2.0", "id": 1, "method": "resources/subscribe",
        "params": { "uri": URI } }),
    )
    .await;
    let mut answered = 0;
    while answered < 2 {
        let line = lines.next_line().await.unwrap().expect("an answer");
        let m: Value = serde_json::from_str(&line).unwrap();
        if m.get("id").is_some() {
            answered += 1;
        }
    }
    // Far more changes than the bus keeps for a reader that does not keep up.
    for _ in 0..2_000 {
        server
            .announce(ChangeEvent::ResourceUpdated { uri: URI.into() })
            .await;
    }
    // Whatever came of them is read (the stream said what it missed and ended)...
    let drained = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        loop {
            let next = tokio::time::timeout(std::time::Duration::from_secs(3), lines.next_line());
            match next.await {
                Ok(line) => assert!(line.unwrap().is_some(), "the output ended"),
                Err(_) => break,
            }
        }
    });
    drained.await.expect("the output went quiet");
    // ...and a change announced now is still heard.
    server
        .announce(ChangeEvent::ResourceUpdated { uri: URI.into() })
        .await;
    let line = tokio::time::timeout(std::time::Duration::from_secs(30), lines.next_line())
        .await
        .expect("the subscription still hears of changes")
        .unwrap()
        .expect("a line");
    let m: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(m["method"], "notifications/resources/updated", "{m}");
    assert_eq!(m["params"]["uri"], URI);
    drop(to_server);
    served.await.unwrap().unwrap();
}
