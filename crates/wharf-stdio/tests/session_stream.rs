//! A legacy session over stdio keeps hearing of the resources it subscribed to: after its
//! stream of changes ended for missing some (the bus ran ahead of a slow reader), nobody
//! else would listen again, so the transport does; and while a subscription made or dropped
//! moves it to a new stream, no change falls between the two.

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use wharf::ChangeEvent;
use wharf::protocol::{Implementation, ResourceContents};
use wharf::{Server, resource, template};
use wharf_stdio::{StdioConfig, serve_with};

const URI: &str = "notes://index";

/// A server with one resource, `URI`, and a template of many, `items://{n}`.
fn server() -> Server {
    Server::builder(Implementation::new("t", "1"))
        .resource(resource(URI, "index").handler(|_cx, req| async move {
            Ok(vec![ResourceContents::text(req.uri, "text/plain", "x")])
        }))
        .template(
            template("items://{n}", "item").handler(|_cx, req| async move {
                Ok(vec![ResourceContents::text(req.uri, "text/plain", "x")])
            }),
        )
        .build()
        .unwrap()
}

/// `server` served over stdio whose output pipe holds `out` bytes, with a legacy session
/// opened (its `initialize` sent, its answer not read): what the client writes to, what it
/// reads, and the serving task.
async fn serving(
    server: &Server,
    out: usize,
) -> (
    tokio::io::DuplexStream,
    tokio::io::Lines<BufReader<tokio::io::DuplexStream>>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let (mut to_server, server_in) = tokio::io::duplex(64 * 1024);
    let (server_out, from_server) = tokio::io::duplex(out);
    let served = tokio::spawn(serve_with(
        server.clone(),
        server_in,
        server_out,
        StdioConfig::default(),
    ));
    send(
        &mut to_server,
        json!({ "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": { "name": "t", "version": "1" } } }),
    )
    .await;
    (to_server, BufReader::new(from_server).lines(), served)
}

/// Writes one JSON-RPC message as a line.
async fn send(to_server: &mut tokio::io::DuplexStream, m: Value) {
    to_server
        .write_all(format!("{m}\n").as_bytes())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_subscription_outlives_a_stream_that_missed_changes() {
    let server = server();
    // A pipe far smaller than what is announced below: the reader falls behind the bus.
    let (mut to_server, mut lines, served) = serving(&server, 1024).await;
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

/// Each subscription moves the session to a new stream of changes. A change announced
/// while it moves (the subscription sent, the old stream not yet past the change) is still
/// written, by the old stream or the new one. On this single-threaded runtime every line
/// below is written and every change announced before the server reads the first line, so
/// the old stream holds all the changes when the first subscription moves the session off
/// it. Each change names another resource, so a change written twice cannot stand in for
/// one that was lost.
#[tokio::test]
async fn no_change_is_lost_while_a_subscription_moves_the_stream() {
    const ROUNDS: usize = 10;
    let server = server();
    let (mut to_server, mut lines, served) = serving(&server, 64 * 1024).await;
    let subscribe = |n: usize| {
        json!({ "jsonrpc": "2.0", "id": n + 1, "method": "resources/subscribe",
            "params": { "uri": format!("items://{n}") } })
    };
    for n in 0..ROUNDS {
        send(&mut to_server, subscribe(n)).await;
    }
    for _ in 0..=ROUNDS {
        let line = lines.next_line().await.unwrap().expect("an answer");
        let m: Value = serde_json::from_str(&line).unwrap();
        assert!(m.get("result").is_some(), "{m}");
    }
    for n in 0..ROUNDS {
        // A subscription that moves the session to a new stream, then a change of a
        // resource it listened to all along.
        send(&mut to_server, subscribe(100 + n)).await;
        server
            .announce(ChangeEvent::ResourceUpdated {
                uri: format!("items://{n}"),
            })
            .await;
    }
    // Bounded only so that a regression fails instead of hanging.
    let heard = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        let mut answered = 0;
        let mut updated = std::collections::BTreeSet::new();
        while answered < ROUNDS || updated.len() < ROUNDS {
            let line = lines.next_line().await.unwrap().expect("a line");
            let m: Value = serde_json::from_str(&line).unwrap();
            if let Some(error) = m.get("error") {
                panic!("refused: {error}");
            }
            if m.get("id").is_some() {
                answered += 1;
            } else if m["method"] == "notifications/resources/updated" {
                updated.insert(m["params"]["uri"].as_str().unwrap().to_owned());
            }
        }
        updated
    });
    let updated = heard
        .await
        .expect("a change announced while the stream moved was lost");
    let expected: std::collections::BTreeSet<String> =
        (0..ROUNDS).map(|n| format!("items://{n}")).collect();
    assert_eq!(updated, expected);
    drop(to_server);
    served.await.unwrap().unwrap();
}
