//! Wharf inside an existing axum application that authenticates with its own middleware:
//! the app's layer turns a session cookie into a [`Principal`] in the request's extensions,
//! and the MCP endpoint trusts it ([`FromExtensions`]). Handles and idempotency then work
//! for that principal as for any other; scopes limit it once the app gives it some
//! ([`Principal::with_scopes`]): here the `admin` user may use the `admin` tool, which
//! everyone else is refused (-31003, HTTP 403).
//!
//! ```text
//! cargo run -p wharf-examples --example axum_mount  # ADDR=127.0.0.1:8080
//! curl -b session=alice …/mcp                        # a request as alice
//! ```

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use wharf::protocol::Implementation;
use wharf::{Context, NoArgs, Principal, Server, tool};
use wharf_http::{ConnectionLimits, FromExtensions, HttpConfig};

/// The app's own authentication. A real app checks a signed session (or looks it up);
/// this one trusts the cookie's value, which is enough to show where the principal comes
/// from. An id Wharf refuses as a principal (empty, or reserved for its own sign-ins)
/// leaves the request unauthenticated: it is answered 401.
async fn session(mut req: Request, next: Next) -> Response {
    let user = req
        .headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix("session="))
        .and_then(|user| Principal::new(user).ok())
        .map(|user| {
            // What each user may do, as the app decides it.
            let scopes: &[&str] = if user.id() == "admin" {
                &["admin"]
            } else {
                &[]
            };
            user.with_scopes(scopes.iter().copied())
        });
    if let Some(user) = user {
        req.extensions_mut().insert(user);
    }
    next.run(req).await
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mcp = Server::builder(Implementation::new("app", "1.0.0"))
        .tool(
            tool("whoami")
                .description("Who the app says you are.")
                .handler(|cx: Context, _: NoArgs| async move { cx.principal().id().to_owned() }),
        )
        .tool(
            tool("admin")
                .description("What only an admin may see.")
                .scopes(&["admin"])
                .handler(|_cx: Context, _: NoArgs| async { "the admin's view" }),
        )
        .build()?;
    let mut config = HttpConfig::default();
    // A request without a session is answered 401 naming the app's scheme.
    config.auth = Arc::new(
        FromExtensions::new().challenge(HeaderValue::from_static(r#"Cookie realm="app""#)),
    );
    let app = Router::new()
        .route("/", get(|| async { "the app's own pages" }))
        .merge(wharf_http::router(mcp.clone(), config))
        .layer(middleware::from_fn(session));
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:8080".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{}/mcp", listener.local_addr()?);
    // As in hello_tools: head read timeout, connection and header caps, drain on Ctrl-C.
    let shutdown = async move {
        let _ = tokio::signal::ctrl_c().await;
        // Listen and session streams end, so that their connections close too.
        mcp.shutdown();
    };
    wharf_http::serve(listener, app, ConnectionLimits::default(), shutdown).await?;
    Ok(())
}
