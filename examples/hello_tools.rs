//! The smallest useful server: two tools over Streamable HTTP.
//!
//! ```text
//! cargo run -p wharf-examples --example hello_tools        # ADDR=127.0.0.1:8080 by default
//! ```

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use wharf::protocol::Implementation;
use wharf::{Context, HandlerError, Server, Structured, tool};
use wharf_http::{ConnectionLimits, HttpConfig};

#[derive(Deserialize, JsonSchema)]
struct Greet {
    /// Who to greet.
    name: String,
}

#[derive(Deserialize, JsonSchema)]
struct Add {
    a: f64,
    b: f64,
}

/// Structured output: its schema becomes the tool's `outputSchema`.
#[derive(Serialize, JsonSchema)]
struct Sum {
    sum: f64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let server =
        Server::builder(Implementation::new("hello", "1.0.0"))
            .tool(tool("greet").description("Say hello to someone.").handler(
                |_cx: Context, args: Greet| async move { format!("Hello, {}!", args.name) },
            ))
            .tool(tool("add").description("Add two numbers.").handler(
                |_cx: Context, args: Add| async move {
                    let sum = args.a + args.b;
                    // JSON has no infinity: the model is told, and can call again.
                    if !sum.is_finite() {
                        return Err(HandlerError::execution("the sum is too large for a number"));
                    }
                    Ok(Structured(Sum { sum }))
                },
            ))
            .build()?;
    let app = wharf_http::router(server.clone(), HttpConfig::default());
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:8080".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{}/mcp", listener.local_addr()?);
    // Wharf's accept loop rather than `axum::serve`, which sets no timer: a time limit on
    // each request's head, caps on connections and header fields, and a drain on Ctrl-C
    // (requests in flight finish, streams end).
    let shutdown = async move {
        let _ = tokio::signal::ctrl_c().await;
        // Listen and session streams end, so that their connections close too.
        server.shutdown();
    };
    wharf_http::serve(listener, app, ConnectionLimits::default(), shutdown).await?;
    Ok(())
}
