//! A browser-based MCP client in a real browser (headless Chromium through WebDriver): a page
//! of an origin the deployment names (`--allowed-origin`) calls a tool with `fetch`, its
//! preflight answered, and reads the answer; a page of a localhost origin nobody named
//! cannot read it, as CORS has the browser refuse.

use crate::common;

use common::ServerProcess;
use common::chromium::browser;
use serde_json::{Value, json};

/// Serves an empty page at `/` on 127.0.0.1; its port.
async fn page_server() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(|| async {
            axum::response::Html("<!doctype html><title>a browser client</title>")
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    port
}

/// What the page at `page` reads when it calls `echo` at `endpoint`: the text, or why the
/// browser refused.
async fn call_from(browser: &fantoccini::Client, page: &str, endpoint: &str) -> String {
    browser.goto(page).await.unwrap();
    let script = r#"
        const [endpoint, done] = [arguments[0], arguments[arguments.length - 1]];
        fetch(endpoint, {
            method: "POST",
            headers: {
                "content-type": "application/json",
                "accept": "application/json, text/event-stream",
                "mcp-protocol-version": "2026-07-28",
                "mcp-method": "tools/call",
                "mcp-name": "echo",
            },
            body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "tools/call", params: {
                name: "echo", arguments: { text: "from the page" },
                _meta: { "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                         "io.modelcontextprotocol/clientCapabilities": {} } } }),
        })
            .then((r) => r.json())
            .then((b) => done(b.result.content[0].text), (e) => done("refused: " + e));
    "#;
    let read = browser
        .execute_async(script, vec![json!(endpoint)])
        .await
        .unwrap();
    match read {
        Value::String(s) => s,
        other => panic!("the page read {other}"),
    }
}

#[tokio::test]
async fn a_page_of_a_named_origin_calls_a_tool_and_reads_the_answer() {
    let (named, unnamed) = (page_server().await, page_server().await);
    let named_origin = format!("http://127.0.0.1:{named}");
    let server = ServerProcess::start(&["--allowed-origin", &named_origin]);
    let (_driver, browser) = browser().await;
    let read = call_from(&browser, &format!("{named_origin}/"), &server.url()).await;
    assert_eq!(read, "from the page");
    // Localhost passes the host policy, but nobody named this origin: its page cannot read.
    let read = call_from(
        &browser,
        &format!("http://localhost:{unnamed}/"),
        &server.url(),
    )
    .await;
    assert!(read.starts_with("refused: "), "{read}");
    browser.close().await.unwrap();
}

/// A browser-based client signs in too: the authorization server's endpoints a program calls
/// answer the preflights of a named origin (metadata, registration, token), and of no other;
/// its pages answer none.
#[tokio::test]
async fn the_authorization_servers_endpoints_answer_a_named_origins_preflight() {
    let named = "https://app.example.com";
    let server = common::authz::own_server("cors", "default", &["--allowed-origin", named]);
    let http = reqwest::Client::new();
    let preflight = |path: &str, origin: &str| {
        http.request(
            reqwest::Method::OPTIONS,
            format!("{}{path}", server.origin()),
        )
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "content-type")
        .send()
    };
    // The pages a person's browser navigates (forms with cookies) answer no other origin.
    for path in ["/authorize/consent", "/account/signout"] {
        let res = preflight(path, named).await.unwrap();
        assert!(
            res.headers().get("access-control-allow-origin").is_none(),
            "{path}"
        );
    }
    for path in [
        "/.well-known/oauth-authorization-server",
        "/register",
        "/token",
    ] {
        let res = preflight(path, named).await.unwrap();
        assert!(res.status().is_success(), "{path}: {}", res.status());
        let allowed = res.headers().get("access-control-allow-origin");
        assert_eq!(allowed.and_then(|v| v.to_str().ok()), Some(named), "{path}");
        let res = preflight(path, "https://other.example.com").await.unwrap();
        assert!(
            res.headers().get("access-control-allow-origin").is_none(),
            "{path}"
        );
    }
}
