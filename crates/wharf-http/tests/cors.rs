//! CORS, in-process: a page of an origin the deployment names may call the endpoint and read
//! its answers (its preflight answered with what it asked for); a localhost origin the host
//! policy lets through unnamed gets its answer but no header that lets a page read it; a
//! deployment that names no origin answers no preflight.

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;
use wharf::protocol::Implementation;
use wharf::{Context, NoArgs, Server, tool};
use wharf_http::{HostPolicy, HttpConfig};

const NAMED: &str = "https://app.example.com";

fn app(hosts: HostPolicy) -> Router {
    let server = Server::builder(Implementation::new("t", "1"))
        .tool(tool("hello").handler(|_cx: Context, _: NoArgs| async { "hi" }))
        .build()
        .unwrap();
    let mut config = HttpConfig::default();
    config.hosts = hosts;
    wharf_http::router(server, config)
}

fn named() -> Router {
    app(HostPolicy::localhost().allow_origin(NAMED))
}

fn preflight(origin: &str) -> Request<Body> {
    Request::builder()
        .method(Method::OPTIONS)
        .uri("/mcp")
        .header(header::HOST, "localhost")
        .header(header::ORIGIN, origin)
        .header(header::ACCESS_CONTROL_REQUEST_METHOD, "POST")
        .header(
            header::ACCESS_CONTROL_REQUEST_HEADERS,
            "content-type,mcp-protocol-version,mcp-method,mcp-name,mcp-param-region",
        )
        .body(Body::empty())
        .unwrap()
}

fn call(origin: &str) -> Request<Body> {
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "hello", "arguments": {},
        "_meta": { "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                   "io.modelcontextprotocol/clientCapabilities": {} } } });
    Request::post("/mcp")
        .header(header::HOST, "localhost")
        .header(header::ORIGIN, origin)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "hello")
        .body(Body::from(body.to_string()))
        .unwrap()
}

async fn send(app: Router, req: Request<Body>) -> (StatusCode, axum::http::HeaderMap, Value) {
    let res = app.oneshot(req).await.unwrap();
    let (status, headers) = (res.status(), res.headers().clone());
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, headers, body)
}

fn header(headers: &axum::http::HeaderMap, name: header::HeaderName) -> &str {
    headers
        .get(&name)
        .map_or("", |v| v.to_str().unwrap_or_default())
}

#[tokio::test]
async fn a_named_origins_page_may_call_and_read_the_answer() {
    let (status, headers, _) = send(named(), preflight(NAMED)).await;
    assert!(status.is_success(), "{status}");
    assert_eq!(header(&headers, header::ACCESS_CONTROL_ALLOW_ORIGIN), NAMED);
    assert!(header(&headers, header::ACCESS_CONTROL_ALLOW_METHODS).contains("POST"));
    // Whatever headers the page's client sends, its tools' `Mcp-Param-*` among them.
    assert!(
        header(&headers, header::ACCESS_CONTROL_ALLOW_HEADERS).contains("mcp-param-region"),
        "{headers:?}"
    );
    assert_eq!(
        header(&headers, header::ACCESS_CONTROL_ALLOW_CREDENTIALS),
        ""
    );

    let (status, headers, body) = send(named(), call(NAMED)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["result"]["content"][0]["text"], "hi");
    assert_eq!(header(&headers, header::ACCESS_CONTROL_ALLOW_ORIGIN), NAMED);
    let exposed = header(&headers, header::ACCESS_CONTROL_EXPOSE_HEADERS);
    for name in ["mcp-session-id", "www-authenticate", "retry-after"] {
        assert!(exposed.contains(name), "{exposed}");
    }
}

#[tokio::test]
async fn an_unnamed_origin_gets_no_header_that_lets_a_page_read() {
    // Localhost passes the host policy, but no deployment named it.
    let other = "http://localhost:6274";
    let (_, headers, _) = send(named(), preflight(other)).await;
    assert_eq!(header(&headers, header::ACCESS_CONTROL_ALLOW_ORIGIN), "");
    let (status, headers, body) = send(named(), call(other)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(header(&headers, header::ACCESS_CONTROL_ALLOW_ORIGIN), "");
    // An origin the policy refuses is refused, as ever.
    let (status, _, _) = send(named(), call("https://evil.example.com")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn a_deployment_that_names_no_origin_answers_no_preflight() {
    let (status, headers, _) = send(app(HostPolicy::localhost()), preflight(NAMED)).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(header(&headers, header::ACCESS_CONTROL_ALLOW_ORIGIN), "");
    let (status, headers, _) = send(app(HostPolicy::localhost()), call("http://localhost:1")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers.get(header::VARY).is_none(), "{headers:?}");
}
