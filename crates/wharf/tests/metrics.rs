//! What a server built with `metrics(true)` counts, read back through its public API: calls
//! by tool and outcome, other methods by method, and nothing at all when it is off.

use serde_json::json;
use tokio_util::sync::CancellationToken;

use wharf::protocol::{GetPromptResult, Implementation};
use wharf::testing::Harness;
use wharf::{Context, FormSchema, HandlerError, NoArgs, Server, prompt, tool};

fn server(metrics: bool) -> Server {
    Server::builder(Implementation::new("counted", "1.0.0"))
        .tool(tool("works").handler(|_cx: Context, _: NoArgs| async { "done" }))
        .tool(tool("fails").handler(|_cx: Context, _: NoArgs| async {
            Err::<&str, _>(HandlerError::execution("the disk is full"))
        }))
        .tool(tool("sleeps").handler(|_cx: Context, _: NoArgs| async {
            // Runs until the call is cancelled.
            std::future::pending::<()>().await;
            "never"
        }))
        .prompt(prompt("confirm").handler(|cx: Context, _args| async move {
            let form = FormSchema::new().boolean("ok", "Go ahead?", true);
            match cx.elicited::<serde_json::Value>("ok", &form) {
                Some(_) => Ok(GetPromptResult::default()),
                None => Err(cx.ask().elicit("ok", "Go ahead?", form).into()),
            }
        }))
        .metrics(metrics)
        .build()
        .unwrap()
}

fn line(text: &str, series: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn calls_are_counted_by_tool_and_outcome() {
    let harness = Harness::new(server(true));
    let call = |name: &str| json!({ "name": name, "arguments": {} });
    harness.call("tools/call", call("works")).await.unwrap();
    harness.call("tools/call", call("works")).await.unwrap();
    let failed = harness.call("tools/call", call("fails")).await.unwrap();
    assert_eq!(failed["isError"], true);
    harness
        .call("tools/call", call("missing"))
        .await
        .unwrap_err();
    harness.call("tools/list", json!({})).await.unwrap();
    // A streamed call counts the same way.
    harness
        .stream("tools/call", call("works"), CancellationToken::new())
        .await
        .unwrap();

    let metrics = harness.server().metrics().expect("counting is on");
    assert_eq!(metrics.requests("tools/call", Some("works")), 3);
    assert_eq!(metrics.requests("tools/call", Some("fails")), 1);
    assert_eq!(metrics.requests("tools/list", None), 1);

    let text = harness.server().encode_metrics().unwrap();
    let total = |labels: &str| line(&text, &format!("wharf_requests_total{{{labels}}}"));
    assert_eq!(
        total(r#"method="tools/call",tool="works",outcome="ok""#),
        Some(3)
    );
    assert_eq!(
        total(r#"method="tools/call",tool="fails",outcome="tool_error""#),
        Some(1)
    );
    assert_eq!(
        total(r#"method="tools/call",tool="",outcome="error""#),
        Some(1),
        "a tool the server does not have is counted apart: {text}"
    );
    assert_eq!(
        total(r#"method="tools/list",tool="",outcome="ok""#),
        Some(1)
    );
    assert_eq!(line(&text, "wharf_requests_in_flight"), Some(0));
    assert_eq!(
        line(
            &text,
            r#"wharf_request_duration_seconds_count{method="tools/call",tool="works"}"#
        ),
        Some(3)
    );
}

#[tokio::test]
async fn a_prompt_that_asks_for_input_and_a_cancelled_call_are_counted_as_such() {
    let harness = Harness::new(server(true));
    let asks = json!({ "name": "confirm", "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": { "elicitation": {} },
    } });
    let asked = harness.call("prompts/get", asks).await.unwrap();
    assert_eq!(asked["resultType"], "input_required", "{asked}");

    let cancel = CancellationToken::new();
    let call = harness.stream(
        "tools/call",
        json!({ "name": "sleeps", "arguments": {} }),
        cancel.clone(),
    );
    let metrics = harness.server().metrics().unwrap();
    let (_, ()) = tokio::join!(call, async {
        // Cancelled once it runs (the in-flight gauge says so), not before.
        while !harness
            .server()
            .encode_metrics()
            .unwrap()
            .contains("wharf_requests_in_flight 1\n")
        {
            tokio::task::yield_now().await;
        }
        cancel.cancel();
    });

    let text = harness.server().encode_metrics().unwrap();
    let total = |labels: &str| line(&text, &format!("wharf_requests_total{{{labels}}}"));
    assert_eq!(
        total(r#"method="prompts/get",tool="",outcome="input_required""#),
        Some(1),
        "{text}"
    );
    assert_eq!(
        total(r#"method="tools/call",tool="sleeps",outcome="cancelled""#),
        Some(1),
        "{text}"
    );
    assert_eq!(line(&text, "wharf_mrtr_rounds_total"), Some(1));
    assert_eq!(metrics.requests("tools/call", None), 1);
    assert_eq!(line(&text, "wharf_requests_in_flight"), Some(0));
}

#[tokio::test]
async fn a_server_built_without_metrics_counts_nothing() {
    let harness = Harness::new(server(false));
    harness
        .call("tools/call", json!({ "name": "works", "arguments": {} }))
        .await
        .unwrap();
    assert!(harness.server().metrics().is_none());
    assert!(harness.server().encode_metrics().is_none());
}
