//! A handler that panics fails its own request with -32603, in-process: the server goes on
//! serving, the panic's message stays out of the reply, and what the handler registered with
//! `on_cancel` runs, since it never returned.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::Notify;
use wharf::protocol::Implementation;
use wharf::testing::Harness;
use wharf::{Context, ErrorKind, NoArgs, Server, prompt, tool};

#[tokio::test]
async fn a_panicking_handler_fails_its_request_and_nothing_else() {
    let cleaned = Arc::new(Notify::new());
    let panics = {
        let cleaned = Arc::clone(&cleaned);
        move |cx: Context, _: NoArgs| {
            let cleaned = Arc::clone(&cleaned);
            async move {
                cx.on_cancel(async move {
                    cleaned.notify_one();
                });
                tokio::task::yield_now().await;
                if cx.request_id().to_string().is_empty() {
                    return "unreachable";
                }
                panic!("secret-detail-42");
            }
        }
    };
    let server = Server::builder(Implementation::new("t", "1"))
        .tool(tool("boom").handler(panics))
        .tool(tool("fine").handler(|_cx: Context, _: NoArgs| async { "fine" }))
        .prompt(
            // A `String` payload, as `panic!` with arguments gives.
            prompt("boom_prompt").handler(|_cx: Context, _args| async move {
                std::panic::panic_any(String::from("a prompt that panics too"))
            }),
        )
        .build()
        .unwrap();
    let harness = Harness::new(server);
    for (method, params) in [
        ("tools/call", json!({ "name": "boom", "arguments": {} })),
        (
            "prompts/get",
            json!({ "name": "boom_prompt", "arguments": {} }),
        ),
    ] {
        let refused = harness.call(method, params).await.unwrap_err();
        let error = refused.error();
        assert_eq!(error.kind, ErrorKind::Internal, "{method}");
        assert_eq!(error.code(), -32603);
        assert!(
            !error.message.contains("secret-detail") && !error.message.contains("panics too"),
            "{}",
            error.message
        );
    }
    let fine = harness
        .call("tools/call", json!({ "name": "fine", "arguments": {} }))
        .await
        .unwrap();
    assert_eq!(fine["content"][0]["text"], "fine");
    tokio::time::timeout(Duration::from_secs(10), cleaned.notified())
        .await
        .expect("the cleanup ran");
}
