//! Listen streams across a drain, in-process: a stream opened before the drain ends when it
//! begins (its connection, kept alive by a proxy, must be reusable while the server still
//! answers); one opened during the drain lasts until shutdown. Time is paused, so "still
//! open" means open after an hour tokio skipped over, not after a guess at a delay.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use wharf::protocol::Implementation;
use wharf::testing::Harness;
use wharf::{Context, NoArgs, Server, tool};

fn server() -> Server {
    Server::builder(Implementation::new("t", "1"))
        .tool(tool("noop").handler(|_cx: Context, _: NoArgs| async { "ok" }))
        .build()
        .unwrap()
}

/// Opens a listen stream for tool-list changes and collects its messages until it ends.
fn listen(server: &Server) -> JoinHandle<Vec<Value>> {
    let harness = Harness::new(server.clone());
    tokio::spawn(async move {
        let params = json!({ "notifications": { "toolsListChanged": true } });
        harness
            .stream("subscriptions/listen", params, CancellationToken::new())
            .await
            .unwrap()
    })
}

/// The messages of a stream expected to end: it has an hour (of paused time, skipped over
/// at once), so a stream that does not end fails the test instead of hanging it.
async fn ended(stream: JoinHandle<Vec<Value>>, what: &str) -> Vec<Value> {
    tokio::time::timeout(Duration::from_secs(3600), stream)
        .await
        .unwrap_or_else(|_| panic!("{what}"))
        .unwrap()
}

/// The acknowledgment, then the final `complete` response, and nothing else.
fn acknowledged_then_completed(sent: &[Value]) {
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(
        sent[0]["method"],
        "notifications/subscriptions/acknowledged"
    );
    assert_eq!(sent[1]["result"]["resultType"], "complete", "{sent:?}");
}

#[tokio::test(start_paused = true)]
async fn streams_opened_before_the_drain_end_when_it_begins_later_ones_at_shutdown() {
    let server = server();
    let before = listen(&server);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !before.is_finished(),
        "a listen stream stays open while the server serves"
    );

    server.drain();
    acknowledged_then_completed(
        &ended(
            before,
            "a stream opened before the drain ends when it begins",
        )
        .await,
    );

    let during = listen(&server);
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(
        !during.is_finished(),
        "a stream opened during the drain stays open until shutdown"
    );
    server.shutdown();
    acknowledged_then_completed(&ended(during, "a stream ends at shutdown").await);

    // After shutdown, a stream that gets in ends at once.
    acknowledged_then_completed(
        &ended(listen(&server), "a stream opened after shutdown ends").await,
    );
}
