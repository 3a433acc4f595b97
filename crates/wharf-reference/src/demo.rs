//! The default reference tools: small, real, and enough to exercise every path of the
//! framework (plain JSON, progress streams, logs, structured output, resources, prompts).

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use wharf::{Context, HandlerError, ServerBuilder, Structured, prompt, resource, template, tool};
use wharf_protocol::{Content, GetPromptResult, LoggingLevel, PromptMessage, ResourceContents};

/// Arguments of `echo`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct EchoArgs {
    /// The text to send back.
    pub text: String,
}

/// How many `slow_count` calls have started in this process (see `demo_stats`).
static SLOW_COUNTS_STARTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// How many of them were cancelled, counted by their cleanup (see `Context::on_cancel`).
static SLOW_COUNTS_CANCELLED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Result of `demo_stats`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Stats {
    /// `slow_count` calls started since the process began.
    pub slow_counts_started: u64,
    /// Of those, the ones cancelled before they finished (their cleanup ran).
    pub slow_counts_cancelled: u64,
}

/// Arguments of `slow_count`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct CountArgs {
    /// How many steps to count, 1 to 1000.
    #[schemars(range(min = 1, max = 1000))]
    pub steps: u32,
    /// Milliseconds between steps (default 20, at most 60,000).
    #[serde(default)]
    pub interval_ms: Option<u64>,
}

/// Arguments of `add`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct AddArgs {
    /// The first addend.
    pub a: i64,
    /// The second addend.
    pub b: i64,
}

/// Result of `add`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Sum {
    /// `a + b`.
    pub sum: i64,
}

/// Registers the reference tools.
pub fn register(builder: ServerBuilder) -> ServerBuilder {
    builder
        .instructions(
            "Wharf reference server. `echo` returns its text; `slow_count` counts with progress.",
        )
        .tool(
            tool("demo_stats")
                .description("How many slow_count calls this process has started (for tests of queues and cancellation).")
                .handler(|_cx: Context, _: wharf::NoArgs| async move {
                    Structured(Stats {
                        slow_counts_started: SLOW_COUNTS_STARTED
                            .load(std::sync::atomic::Ordering::Relaxed),
                        slow_counts_cancelled: SLOW_COUNTS_CANCELLED
                            .load(std::sync::atomic::Ordering::Relaxed),
                    })
                }),
        )
        .tool(
            tool("echo")
                .description("Return the given text unchanged.")
                .handler(|_cx: Context, args: EchoArgs| async move { args.text }),
        )
        .tool(
            tool("slow_count")
                .description(
                    "Count to `steps`, reporting progress at each step, then return \"counted N\".",
                )
                .handler(|cx: Context, args: CountArgs| async move {
                    SLOW_COUNTS_STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    cx.on_cancel(async {
                        // Cleanup may await: it runs to completion on its own task.
                        tokio::task::yield_now().await;
                        SLOW_COUNTS_CANCELLED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    });
                    let interval =
                        Duration::from_millis(args.interval_ms.unwrap_or(20).min(60_000));
                    for i in 1..=args.steps {
                        tokio::time::sleep(interval).await;
                        cx.progress(
                            f64::from(i),
                            Some(f64::from(args.steps)),
                            Some(&format!("step {i}")),
                        )
                        .await;
                        cx.log(
                            LoggingLevel::Debug,
                            Some("slow_count"),
                            serde_json::json!({ "step": i }),
                        )
                        .await;
                    }
                    cx.log(
                        LoggingLevel::Info,
                        Some("slow_count"),
                        serde_json::json!("done"),
                    )
                    .await;
                    format!("counted {}", args.steps)
                }),
        )
        .tool(
            tool("add")
                .description("Add two integers; the sum is returned as structured content.")
                .handler(|_cx: Context, args: AddArgs| async move {
                    args.a
                        .checked_add(args.b)
                        .map(|sum| Structured(Sum { sum }))
                        .ok_or_else(|| {
                            HandlerError::execution(format!(
                                "{} + {} overflows a 64-bit integer; use smaller numbers",
                                args.a, args.b
                            ))
                        })
                }),
        )
        .resource(
            resource("wharf://about", "about")
                .description("What this server is.")
                .mime_type("text/plain")
                .handler(|_cx, req| async move {
                    Ok(vec![ResourceContents::text(
                        req.uri,
                        "text/plain",
                        "Wharf: stateless MCP 2026-07-28 server.",
                    )])
                }),
        )
        .template(
            template("echo://{text}", "echo")
                .description("A resource whose content is its own name.")
                .mime_type("text/plain")
                .handler(|_cx, req| async move {
                    let text = req.vars.get("text").cloned().unwrap_or_default();
                    Ok(vec![ResourceContents::text(req.uri, "text/plain", text)])
                }),
        )
        .prompt(
            prompt("greet")
                .description("Greet someone by name.")
                .argument("name", "Who to greet", true)
                .handler(|_cx, args| async move {
                    let name = args.get("name").cloned().unwrap_or_default();
                    Ok(GetPromptResult {
                        messages: vec![PromptMessage::user(Content::text(format!(
                            "Please greet {name} warmly."
                        )))],
                        ..Default::default()
                    })
                }),
        )
}
