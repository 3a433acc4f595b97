//! The HTTP transport as a tower service, one request at a time (`Router::oneshot`), no
//! socket: statuses, challenges and the app's own authentication through request extensions.

use std::collections::BTreeSet;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;
use wharf::protocol::Implementation;
use wharf::{Context, Grant, NoArgs, Principal, Server, tool};
use wharf_http::{FromExtensions, HttpConfig};

fn server() -> Server {
    Server::builder(Implementation::new("t", "1"))
        .tool(
            tool("hello").handler(|cx: Context, _: NoArgs| async move {
                format!("hello {}", cx.principal())
            }),
        )
        .tool(tool("shard").handler(|_cx: Context, a: Sharded| async move { a.shard.to_string() }))
        .tool(
            tool("tagged")
                .handler(|_cx: Context, a: Tagged| async move { a.note.unwrap_or_default() }),
        )
        .tool(
            // Leaves a task holding its context (and with it the call's stream) forever.
            tool("linger").handler(|cx: Context, _: NoArgs| async move {
                tokio::spawn(async move {
                    let _held = cx;
                    std::future::pending::<()>().await;
                });
                "done"
            }),
        )
        .tool(
            // Answers the members of `_meta` the protocol does not define, and the baggage.
            tool("own_meta").handler(|cx: Context, _: NoArgs| async move {
                json!({ "other": cx.info().other_meta, "baggage": cx.info().baggage }).to_string()
            }),
        )
        .tool(
            tool("admin")
                .scopes(&["admin"])
                .handler(|_cx: Context, _: NoArgs| async { "done" }),
        )
        .build()
        .unwrap()
}

/// A tool whose integer argument the client mirrors in a header (any JSON number that is an
/// integer: `42.0` too, as JSON Schema's `integer` allows).
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Sharded {
    #[schemars(with = "i64", extend("x-mcp-header" = "Shard"))]
    shard: serde_json::Number,
}

/// A tool with an optional argument the client mirrors in a header.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Tagged {
    #[schemars(extend("x-mcp-header" = "Note"))]
    note: Option<String>,
}

/// The endpoint behind the app's own authentication: here a layer that turns an
/// `X-User` header into a principal (a real app would read a session cookie).
fn app() -> Router {
    app_with(HttpConfig::default())
}

/// [`app`] with `config` (its authentication replaced).
fn app_with(mut config: HttpConfig) -> Router {
    config.auth = std::sync::Arc::new(
        FromExtensions::new().challenge(HeaderValue::from_static(r#"Cookie realm="app""#)),
    );
    wharf_http::router(server(), config).layer(axum::middleware::from_fn(
        |mut req: Request<Body>, next: axum::middleware::Next| async move {
            let user = req
                .headers()
                .get("x-user")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            if let Some(user) = user {
                let scopes: BTreeSet<String> = req
                    .headers()
                    .get("x-scopes")
                    .and_then(|v| v.to_str().ok())
                    .map(|s| s.split(' ').map(str::to_owned).collect())
                    .unwrap_or_default();
                let mut principal = Principal::oauth(Grant {
                    issuer: "https://app.example".into(),
                    subject: user,
                    client_id: None,
                    scopes,
                });
                // Credentials that expire (an access token's `exp`), in seconds from now.
                let life = req
                    .headers()
                    .get("x-valid-for-secs")
                    .and_then(|v| v.to_str().ok()?.parse().ok());
                if let Some(secs) = life {
                    principal = principal.valid_until(
                        std::time::SystemTime::now() + std::time::Duration::from_secs(secs),
                    );
                }
                req.extensions_mut().insert(principal);
            }
            next.run(req).await
        },
    ))
}

fn call(name: &str) -> Request<Body> {
    call_with(name, json!({}))
}

fn call_with(name: &str, arguments: Value) -> Request<Body> {
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": name, "arguments": arguments,
        "_meta": { "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                   "io.modelcontextprotocol/clientCapabilities": {} } } });
    Request::post("/mcp")
        .header(header::HOST, "localhost")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", name)
        .body(Body::from(body.to_string()))
        .unwrap()
}

async fn send(req: Request<Body>) -> (StatusCode, Value) {
    let (status, _, body) = send_whole(req).await;
    (status, body)
}

/// The status, the headers and the JSON body of the app's answer to `req`.
async fn send_whole(req: Request<Body>) -> (StatusCode, axum::http::HeaderMap, Value) {
    let res = app().oneshot(req).await.unwrap();
    let status = res.status();
    let headers = res.headers().clone();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        headers,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn the_apps_own_authentication_decides_who_calls() {
    let mut req = call("hello");
    req.headers_mut().insert("x-user", "alice".parse().unwrap());
    let (status, body) = send(req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let text = body["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with("hello ") && text.contains("alice"),
        "{text}"
    );

    // No principal in the extensions: refused before the body is read, with the app's
    // challenge.
    let (status, headers, body) = send_whole(call("hello")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(body["error"]["code"], wharf::UNAUTHORIZED);
    assert_eq!(headers[header::WWW_AUTHENTICATE], r#"Cookie realm="app""#);
}

#[tokio::test]
async fn scopes_are_checked_in_admission_whatever_authenticated_the_principal() {
    let mut req = call("admin");
    req.headers_mut().insert("x-user", "bob".parse().unwrap());
    let (status, body) = send(req).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["data"]["requiredScopes"], json!(["admin"]));

    let mut req = call("admin");
    req.headers_mut().insert("x-user", "bob".parse().unwrap());
    req.headers_mut()
        .insert("x-scopes", "admin".parse().unwrap());
    let (status, body) = send(req).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["result"]["content"][0]["text"], "done");
}

#[tokio::test]
async fn a_get_is_405_and_a_mismatched_header_is_400() {
    let get = Request::get("/mcp")
        .header(header::HOST, "localhost")
        .body(Body::empty())
        .unwrap();
    let res = app().oneshot(get).await.unwrap();
    assert_eq!(res.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(res.headers()[header::ALLOW], "POST");

    let mut req = call("hello");
    req.headers_mut().insert("x-user", "alice".parse().unwrap());
    req.headers_mut()
        .insert("mcp-name", "other".parse().unwrap());
    let (status, body) = send(req).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], -32020);
}

#[tokio::test]
async fn a_mirror_header_without_its_argument_is_ignored_unless_malformed() {
    let with_note = |value: &[u8]| {
        let mut req = call("tagged");
        req.headers_mut().insert("x-user", "alice".parse().unwrap());
        req.headers_mut().insert(
            "mcp-param-note",
            header::HeaderValue::from_bytes(value).unwrap(),
        );
        req
    };
    // The body has no `note`: a stray header is not compared with anything...
    let (status, body) = send(with_note(b"hello")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // ...but one that no header value may be (raw UTF-8, broken Base64) is refused.
    for bad in [&b"caf\xc3\xa9"[..], b"=?base64?!!!?="] {
        let (status, body) = send(with_note(bad)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(body["error"]["code"], -32020, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("Mcp-Param-Note"), "{message}");
    }
}

/// A server that opens no legacy sessions ignores `Mcp-Session-Id` like any stateless
/// server: GET and DELETE are not allowed, whatever session they name.
#[tokio::test]
async fn without_legacy_sessions_a_session_id_names_nothing() {
    let mut config = wharf::ServerConfig::default();
    config.legacy.enabled = false;
    let server = Server::builder(Implementation::new("t", "1"))
        .tool(tool("hello").handler(|_cx: Context, _: NoArgs| async { "hello" }))
        .config(config)
        .build()
        .unwrap();
    let app = wharf_http::router(server, HttpConfig::default());
    for method in ["GET", "DELETE"] {
        let req = Request::builder()
            .method(method)
            .uri("/mcp")
            .header(header::HOST, "localhost")
            .header("mcp-session-id", "mcs_0123456789abcdef")
            .body(Body::empty())
            .unwrap();
        let res = app.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::METHOD_NOT_ALLOWED, "{method}");
    }
    // A POST is read as a stateless request: served when it is one, and otherwise refused
    // for what it lacks, not sent to look for a session.
    let post = |version: Option<&str>| {
        let mut req = call("hello");
        req.headers_mut()
            .insert("mcp-session-id", "mcs_0123456789abcdef".parse().unwrap());
        match version {
            Some(v) => req
                .headers_mut()
                .insert("mcp-protocol-version", v.parse().unwrap()),
            None => req.headers_mut().remove("mcp-protocol-version"),
        };
        req
    };
    let served = app.clone().oneshot(post(Some("2026-07-28"))).await.unwrap();
    assert_eq!(served.status(), StatusCode::OK);
    for version in [None, Some("2025-11-25")] {
        let res = app.clone().oneshot(post(version)).await.unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{version:?}");
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        let body: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(body["error"]["code"], -32020, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("MCP-Protocol-Version"), "{message}");
    }
}

#[tokio::test]
async fn an_integer_written_as_a_float_mirrors_its_integer() {
    let shard = |header: &str| {
        let mut req = call_with("shard", json!({ "shard": 42.0 }));
        req.headers_mut().insert("x-user", "alice".parse().unwrap());
        req.headers_mut()
            .insert("mcp-param-shard", header.parse().unwrap());
        req
    };
    for same in ["42", "42.0"] {
        let (status, body) = send(shard(same)).await;
        assert_eq!(status, StatusCode::OK, "{same}: {body}");
    }
    let (status, body) = send(shard("43")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], -32020, "{body}");
}

/// A POST of `body` with the content headers only, plus `headers` (no `_meta` mirrors).
fn post(body: &Value, headers: &[(&str, &str)]) -> Request<Body> {
    let mut req = Request::post("/mcp")
        .header(header::HOST, "localhost")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.body(Body::from(body.to_string())).unwrap()
}

/// The params of a 2025-11-25 client's `initialize`.
fn initialize_params() -> Value {
    json!({ "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": { "name": "t", "version": "1" } })
}

/// An `initialize` whose params are larger than a session may keep (64 KiB: capabilities
/// made up to fill the store and every replica's copies) is refused -32602, and opens
/// nothing; one just under it opens its session.
#[tokio::test]
async fn an_initialize_too_large_to_keep_is_refused() {
    let app = app();
    let with_padding = |bytes: usize| {
        let mut params = initialize_params();
        params["capabilities"]["experimental"] = json!({ "padding": { "x": "a".repeat(bytes) } });
        json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params })
    };
    let res = app
        .clone()
        .oneshot(post(&with_padding(64 * 1024), &[("x-user", "alice")]))
        .await
        .unwrap();
    assert!(res.headers().get("mcp-session-id").is_none(), "opened");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let m: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(m["error"]["code"], -32602, "{m}");
    assert!(
        m["error"]["message"].as_str().unwrap().contains("64 KiB"),
        "{m}"
    );
    let res = app
        .oneshot(post(&with_padding(60 * 1024), &[("x-user", "alice")]))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers().get("mcp-session-id").is_some());
}

/// What the endpoint answers without running a method of this revision (`initialize`, a
/// notification) is refused too when an `Mcp-Method` it was sent with names another method
/// (a gateway may have routed on it), before anything is opened.
#[tokio::test]
async fn initialize_and_notifications_are_refused_under_another_methods_header() {
    let post = |body: &Value, mcp_method: Option<&str>| match mcp_method {
        Some(m) => post(body, &[("x-user", "alice"), ("mcp-method", m)]),
        None => post(body, &[("x-user", "alice")]),
    };
    let initialize =
        json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": initialize_params() });
    let (status, headers, body) = send_whole(post(&initialize, Some("tools/call"))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], -32020, "{body}");
    assert_eq!(body["id"], 1, "{body}");
    assert!(
        !headers.contains_key("mcp-session-id"),
        "a session was opened"
    );
    for sent in [None, Some("initialize")] {
        let (status, headers, body) = send_whole(post(&initialize, sent)).await;
        assert_eq!(status, StatusCode::OK, "{sent:?}: {body}");
        assert!(headers.contains_key("mcp-session-id"), "{sent:?}");
    }

    let note = json!({ "jsonrpc": "2.0", "method": "notifications/progress", "params": {
        "progressToken": 1, "progress": 1 } });
    let (status, _, body) = send_whole(post(&note, Some("tools/call"))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], -32020, "{body}");
    let (status, _, _) = send_whole(post(&note, None)).await;
    assert_eq!(status, StatusCode::ACCEPTED);
}

/// A request or notification whose version header names this revision must carry
/// `Mcp-Method` (streamable HTTP: every request and notification), an unknown method's
/// too; without one it is refused as a header mismatch. A notification without a version
/// header may be a legacy client's, which sends none: it is taken.
#[tokio::test]
async fn a_message_of_this_revision_without_mcp_method_is_refused() {
    let modern = [("x-user", "alice"), ("mcp-protocol-version", "2026-07-28")];
    let note = json!({ "jsonrpc": "2.0", "method": "notifications/progress", "params": {
        "progressToken": 1, "progress": 1 } });
    let (status, _, body) = send_whole(post(&note, &modern)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], -32020, "{body}");
    let mut named = modern.to_vec();
    named.push(("mcp-method", "notifications/progress"));
    let (status, _, _) = send_whole(post(&note, &named)).await;
    assert_eq!(status, StatusCode::ACCEPTED);

    let unknown =
        json!({ "jsonrpc": "2.0", "id": 3, "method": "no/such", "params": { "_meta": meta() } });
    let (status, _, body) = send_whole(post(&unknown, &modern)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], -32020, "{body}");
    assert_eq!(body["id"], 3, "{body}");
    let mut named = modern.to_vec();
    named.push(("mcp-method", "no/such"));
    let (status, _, body) = send_whole(post(&unknown, &named)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], -32601, "{body}");
}

/// Opens a 2025-11-25 session of `app` for alice: its id.
async fn open_session(app: &Router) -> String {
    let initialize =
        json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": initialize_params() });
    let res = app
        .clone()
        .oneshot(post(&initialize, &[("x-user", "alice")]))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    res.headers()["mcp-session-id"].to_str().unwrap().to_owned()
}

/// A legacy call's stream ends with its response, though a task its handler left running
/// still holds the call's context (and with it a sender of the stream).
#[tokio::test]
async fn a_legacy_calls_stream_ends_with_its_response() {
    let app = app();
    let session = open_session(&app).await;

    // A progress token asks for a stream.
    let call = json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "linger", "arguments": {}, "_meta": { "progressToken": "p" } } });
    let in_session = [
        ("x-user", "alice"),
        ("mcp-session-id", session.as_str()),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    let res = app.oneshot(post(&call, &in_session)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()[header::CONTENT_TYPE], "text/event-stream");
    // Bounded only so that a regression fails instead of hanging.
    let body = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        res.into_body().collect(),
    )
    .await
    .expect("the stream did not end after the response")
    .unwrap()
    .to_bytes();
    let body = String::from_utf8(body.to_vec()).unwrap();
    let events: Vec<Value> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let last = events.last().expect("no event");
    assert_eq!(last["id"], 2, "{body}");
    assert_eq!(last["result"]["content"][0]["text"], "done", "{body}");
}

/// A legacy session's results hold nothing only 2026-07-28 defines: no `resultType`, and no
/// server info in `_meta` (a key of MCP's reserved prefix that no earlier revision has).
#[tokio::test]
async fn legacy_results_hold_nothing_of_2026_07_28() {
    let app = app();
    let session = open_session(&app).await;
    let in_session = [
        ("x-user", "alice"),
        ("mcp-session-id", session.as_str()),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    for (id, method, params) in [
        (2, "tools/list", json!({})),
        (3, "tools/call", json!({ "name": "hello", "arguments": {} })),
    ] {
        let request = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        let res = app
            .clone()
            .oneshot(post(&request, &in_session))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{method}");
        let body = res.into_body().collect().await.unwrap().to_bytes();
        let answer: Value = serde_json::from_slice(&body).unwrap();
        let result = answer["result"].as_object().expect("a result");
        assert!(!result.contains_key("resultType"), "{answer}");
        assert!(!result.contains_key("_meta"), "{answer}");
    }
}

/// A handler reads what the client sent in `_meta` under its own prefix, in both eras; the
/// members the protocol defines are not among them.
#[tokio::test]
async fn a_handler_reads_the_clients_own_meta() {
    let app = app();
    let mut stateless = meta();
    stateless["com.example/tenant"] = json!({ "id": "acme" });
    stateless["tracestate"] = json!("vendor=1");
    stateless["baggage"] = json!("user=ada");
    let params = json!({ "name": "own_meta", "arguments": {}, "_meta": stateless });
    let (status, _, body) = send_whole(with(call("own_meta"), params, &[])).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let text = body["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(
        text, r#"{"baggage":"user=ada","other":{"com.example/tenant":{"id":"acme"}}}"#,
        "{body}"
    );
    // One member twice is refused: two readers could take two different values.
    let mut twice = with(call("own_meta"), json!({}), &[]);
    *twice.body_mut() = Body::from(
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"own_meta","arguments":{},
            "_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",
                     "io.modelcontextprotocol/clientCapabilities":{},
                     "com.example/tenant":{"id":"acme","id":"beta"}}}}"#,
    );
    let (status, _, body) = send_whole(twice).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], -32602, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(r#"the member "id" is there twice"#),
        "{body}"
    );

    let session = open_session(&app).await;
    let in_session = [
        ("x-user", "alice"),
        ("mcp-session-id", session.as_str()),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    for (meta, own) in [
        (
            json!({ "com.example/tenant": "beta", "traceparent": null, "baggage": "b=1" }),
            r#"{"baggage":"b=1","other":{"com.example/tenant":"beta"}}"#,
        ),
        (json!({}), r#"{"baggage":null,"other":{}}"#),
    ] {
        let request = json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": { "name": "own_meta", "arguments": {}, "_meta": meta } });
        let res = app
            .clone()
            .oneshot(post(&request, &in_session))
            .await
            .unwrap();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        let answer: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(answer["result"]["content"][0]["text"], own, "{answer}");
    }
}

/// An `initialize` carrying this revision's `_meta` is a stateless request whatever else
/// its `_meta` holds (a member named twice included): it opens no session.
#[tokio::test]
async fn an_initialize_with_this_revisions_meta_opens_no_session() {
    let mut req = with(
        call("hello"),
        json!({}),
        &[("mcp-method", "initialize"), ("mcp-name", "")],
    );
    *req.body_mut() = Body::from(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{
            "protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"c","version":"1"},
            "_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",
                     "io.modelcontextprotocol/clientCapabilities":{},
                     "com.example/x":{"a":1,"a":2}}}}"#,
    );
    let (status, headers, body) = send_whole(req).await;
    assert!(!headers.contains_key("mcp-session-id"), "{status} {body}");
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], -32601, "{body}");
}

/// A call of `hello` whose client asks for progress: its answer is a stream.
fn hello_with_progress() -> Request<Body> {
    let mut meta = meta();
    meta["progressToken"] = json!("p");
    with(
        call("hello"),
        json!({ "name": "hello", "arguments": {}, "_meta": meta }),
        &[],
    )
}

/// A keep-alive interval of any length is taken (one near `Duration::MAX` overflowed the
/// timer the stream resets after each event, which panicked the connection).
#[tokio::test]
async fn a_streamed_answer_survives_an_endless_keep_alive() {
    let mut config = HttpConfig::default();
    config.keep_alive = std::time::Duration::MAX;
    let req = hello_with_progress();
    let res = app_with(config).oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()[header::CONTENT_TYPE], "text/event-stream");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8(body.to_vec()).unwrap();
    assert!(body.contains("hello https://app.example#alice"), "{body}");
}

/// A call whose middleware panics (outside the handler, whose panics the core catches) is
/// still answered -32603 with its id: as a plain JSON answer, whether the layer panics in
/// its future or before it, and as a stream.
#[tokio::test]
async fn a_call_that_panics_outside_its_handler_is_answered_with_its_id() {
    /// Where the layer panics, from the tool's one argument.
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct Where {
        #[allow(dead_code)]
        panic: String,
    }
    let server = Server::builder(Implementation::new("t", "1"))
        .tool(tool("hello").handler(|_cx: Context, _: Where| async { "hello" }))
        .middleware(
            |req: wharf::ParsedRequest, caller: wharf::Caller, next: wharf::Next| {
                let at = match &req.body {
                    wharf::RequestBody::CallTool(p) => p
                        .arguments
                        .as_ref()
                        .and_then(|a| a.get("panic").and_then(|v| v.as_str()).map(str::to_owned)),
                    _ => None,
                };
                if at.as_deref() == Some("before") {
                    panic!("a middleware's bug, before its future");
                }
                async move {
                    if at.as_deref() == Some("in") {
                        panic!("a middleware's bug");
                    }
                    next.run(req, caller).await
                }
            },
        )
        .build()
        .unwrap();
    let app = wharf_http::router(server, HttpConfig::default());
    let plain = |at: &str| call_with("hello", json!({ "panic": at }));
    let mut streamed = hello_with_progress();
    *streamed.body_mut() = Body::from(
        json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "hello", "arguments": { "panic": "in" },
            "_meta": { "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                       "io.modelcontextprotocol/clientCapabilities": {},
                       "progressToken": "p" } } })
        .to_string(),
    );
    for (what, req) in [
        ("plain, in the future", plain("in")),
        ("plain, before the future", plain("before")),
        ("streamed", streamed),
    ] {
        let res = app.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR, "{what}");
        let body = res.into_body().collect().await.unwrap().to_bytes();
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["id"], 1, "{what}: {body}");
        assert_eq!(body["error"]["code"], -32603, "{what}: {body}");
    }
    // The layer lets a call that asks for no panic through.
    let res = app.oneshot(plain("no")).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["result"]["content"][0]["text"], "hello", "{body}");
}

/// A legacy session's call whose middleware panics is answered -32603 under its id, as a
/// plain JSON answer and as a stream, and the session goes on.
#[tokio::test]
async fn a_legacy_call_that_panics_outside_its_handler_is_answered_with_its_id() {
    let armed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(2));
    let server = Server::builder(Implementation::new("t", "1"))
        .tool(tool("hello").handler(|_cx: Context, _: NoArgs| async { "hello" }))
        .middleware({
            let armed = std::sync::Arc::clone(&armed);
            move |req: wharf::ParsedRequest, caller: wharf::Caller, next: wharf::Next| {
                let armed = std::sync::Arc::clone(&armed);
                async move {
                    let calls = req.body.method() == "tools/call";
                    if calls && armed.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) > 0 {
                        panic!("a middleware's bug");
                    }
                    next.run(req, caller).await
                }
            }
        })
        .build()
        .unwrap();
    let mut config = HttpConfig::default();
    config.auth = std::sync::Arc::new(FromExtensions::new());
    let app = wharf_http::router(server, config).layer(axum::middleware::from_fn(
        |mut req: Request<Body>, next: axum::middleware::Next| async move {
            req.extensions_mut()
                .insert(Principal::new("alice").unwrap());
            next.run(req).await
        },
    ));
    let session = open_session(&app).await;
    let in_session = [
        ("mcp-session-id", session.as_str()),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    let call = |id: i64, meta: Value| {
        json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "hello", "arguments": {}, "_meta": meta } })
    };
    let answer = |body: &[u8]| -> Value {
        let text = String::from_utf8(body.to_vec()).unwrap();
        let last = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .next_back()
            .map_or(text.clone(), str::to_owned);
        serde_json::from_str(&last).unwrap()
    };
    for (id, meta) in [(2, json!({})), (3, json!({ "progressToken": "p" }))] {
        let res = app
            .clone()
            .oneshot(post(&call(id, meta), &in_session))
            .await
            .unwrap();
        let body = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            res.into_body().collect(),
        )
        .await
        .expect("answered")
        .unwrap()
        .to_bytes();
        let m = answer(&body);
        assert_eq!(m["id"], id, "{m}");
        assert_eq!(m["error"]["code"], -32603, "{m}");
    }
    let res = app
        .oneshot(post(&call(4, json!({})), &in_session))
        .await
        .unwrap();
    let m = answer(&res.into_body().collect().await.unwrap().to_bytes());
    assert_eq!(m["result"]["content"][0]["text"], "hello", "{m}");
}

/// A HEAD is refused and opens nothing: run as a GET (axum's default), it would open the
/// session's stream and so end the one its client holds.
#[tokio::test]
async fn a_head_request_leaves_the_sessions_stream_open() {
    let app = app();
    let session = open_session(&app).await;
    let on_session = |method: &str| {
        Request::builder()
            .method(method)
            .uri("/mcp")
            .header(header::HOST, "localhost")
            .header("x-user", "alice")
            .header("mcp-session-id", session.as_str())
            .header("mcp-protocol-version", "2025-11-25")
            .body(Body::empty())
            .unwrap()
    };
    let stream = app.clone().oneshot(on_session("GET")).await.unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    let mut stream = stream.into_body();

    let head = app.clone().oneshot(on_session("HEAD")).await.unwrap();
    assert_eq!(head.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(head.headers()[header::ALLOW], "GET, POST, DELETE");
    // A foreign origin is forbidden, as on every method.
    let mut foreign = on_session("HEAD");
    foreign
        .headers_mut()
        .insert(header::ORIGIN, "https://evil.example".parse().unwrap());
    let res = app.clone().oneshot(foreign).await.unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    // The client's stream goes on: no end within half a second (frames it sends are fine).
    let quiet = std::time::Duration::from_millis(500);
    while let Ok(frame) = tokio::time::timeout(quiet, stream.frame()).await {
        assert!(frame.is_some(), "the session's stream was ended by a HEAD");
    }
}

/// A session's stream opened with credentials that expire ends then, as a listen stream
/// does: a token not renewed hears no more of the session's changes. Time is paused: the
/// hour tokio skips over is the credentials' life.
#[tokio::test(start_paused = true)]
async fn a_sessions_stream_ends_when_its_credentials_expire() {
    let app = app();
    let session = open_session(&app).await;
    let life = std::time::Duration::from_secs(3600);
    let get = Request::builder()
        .method("GET")
        .uri("/mcp")
        .header(header::HOST, "localhost")
        .header("x-user", "alice")
        .header("x-valid-for-secs", life.as_secs().to_string())
        .header("mcp-session-id", session.as_str())
        .header("mcp-protocol-version", "2025-11-25")
        .body(Body::empty())
        .unwrap();
    let opened = tokio::time::Instant::now();
    let stream = app.oneshot(get).await.unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    let mut stream = stream.into_body();
    // Keep-alives come and go; the end must come within the day tokio may skip.
    let ended = tokio::time::timeout(std::time::Duration::from_secs(24 * 3600), async {
        while let Some(frame) = stream.frame().await {
            frame.unwrap();
        }
    })
    .await;
    assert!(ended.is_ok(), "the stream outlived its credentials");
    // Not before the credentials' end (the wall clock moved a little since they were made).
    assert!(
        opened.elapsed() >= life - std::time::Duration::from_secs(60),
        "{:?}",
        opened.elapsed()
    );
}

/// A request as [`call_with`] builds it, with its `params` replaced and some headers set
/// (an empty value removes the header).
fn with(mut req: Request<Body>, params: Value, headers: &[(&str, &str)]) -> Request<Body> {
    let method = req.headers()["mcp-method"].to_str().unwrap().to_owned();
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
    *req.body_mut() = Body::from(body.to_string());
    req.headers_mut().insert("x-user", "alice".parse().unwrap());
    for (name, value) in headers {
        if value.is_empty() {
            req.headers_mut().remove(*name);
        } else {
            let name = header::HeaderName::from_bytes(name.as_bytes()).unwrap();
            req.headers_mut().insert(name, value.parse().unwrap());
        }
    }
    req
}

fn meta() -> Value {
    json!({ "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {} })
}

/// A version this server does not speak, named only by the header (the body has no
/// `_meta`, as a client of a later revision may send it), is refused as that: with the
/// versions it supports, not as missing `_meta`.
#[tokio::test]
async fn a_version_named_only_by_the_header_is_refused_with_the_supported_ones() {
    let req = with(
        call("hello"),
        json!({ "name": "hello", "arguments": {} }),
        &[("mcp-protocol-version", "2027-01-01")],
    );
    let (status, body) = send(req).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], -32022, "{body}");
    assert_eq!(body["error"]["data"]["requested"], "2027-01-01", "{body}");
    // A dual-era server lists the legacy revisions too (basic/versioning).
    let dual_era = json!(["2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26"]);
    assert_eq!(body["error"]["data"]["supported"], dual_era);

    // A method it does not have, at a version it does not speak: the version first (a
    // client of a later revision renegotiates); at one it speaks, 404.
    let unknown = |version: &str| {
        let mut meta = meta();
        meta["io.modelcontextprotocol/protocolVersion"] = json!(version);
        let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tasks/list",
            "params": { "_meta": meta } });
        post(
            &body,
            &[
                ("x-user", "alice"),
                ("mcp-method", "tasks/list"),
                ("mcp-protocol-version", version),
            ],
        )
    };
    let (status, body) = send(unknown("2027-01-01")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], -32022, "{body}");
    assert_eq!(body["error"]["data"]["supported"], dual_era);
    // A call that reads well at a version it does not speak, without the headers this
    // revision asks for (a later one may ask for others): the version, first.
    let mut later_meta = meta();
    later_meta["io.modelcontextprotocol/protocolVersion"] = json!("2027-01-01");
    let later_call = json!({ "jsonrpc": "2.0", "id": 4, "method": "tools/call",
        "params": { "name": "hello", "arguments": {}, "_meta": later_meta } });
    // Its params unreadable to this revision, too (arguments no object).
    let mut unreadable_call = later_call.clone();
    unreadable_call["params"]["arguments"] = json!([1]);
    for call in [&later_call, &unreadable_call] {
        for headers in [
            &[("x-user", "alice"), ("mcp-protocol-version", "2027-01-01")][..],
            &[
                ("x-user", "alice"),
                ("mcp-protocol-version", "2027-01-01"),
                ("mcp-method", "tools/call"),
            ][..],
        ] {
            let (status, body) = send(post(call, headers)).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{headers:?}: {body}");
            assert_eq!(body["error"]["code"], -32022, "{headers:?}: {body}");
            assert_eq!(body["error"]["data"]["supported"], dual_era);
        }
    }
    let (status, body) = send(unknown("2026-07-28")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], -32601, "{body}");
    // The header naming another version than the body is that mismatch, first.
    let mut mismatched = unknown("2027-01-01");
    mismatched
        .headers_mut()
        .insert("mcp-protocol-version", "2026-07-28".parse().unwrap());
    let (status, body) = send(mismatched).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], -32020, "{body}");
    // A legacy version it lists, sent without a session: the client is told to initialize,
    // not that the version is unsupported.
    let mut legacy_meta = meta();
    legacy_meta["io.modelcontextprotocol/protocolVersion"] = json!("2025-11-25");
    let listing = json!({ "jsonrpc": "2.0", "id": 3, "method": "tools/list",
        "params": { "_meta": legacy_meta } });
    let headers = [
        ("x-user", "alice"),
        ("mcp-method", "tools/list"),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    let (status, body) = send(post(&listing, &headers)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], -32600, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("send initialize first"), "{message}");

    // `server/discover` lists the same versions.
    let discover = json!({ "jsonrpc": "2.0", "id": 2, "method": "server/discover",
        "params": { "_meta": meta() } });
    let headers = [
        ("x-user", "alice"),
        ("mcp-method", "server/discover"),
        ("mcp-protocol-version", "2026-07-28"),
    ];
    let (status, body) = send(post(&discover, &headers)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["result"]["supportedVersions"], dual_era);

    // A version it speaks, without `_meta`: the missing `_meta` is what is wrong.
    let req = with(
        call("hello"),
        json!({ "name": "hello", "arguments": {} }),
        &[],
    );
    let (status, body) = send(req).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], -32602, "{body}");
}

/// A call whose params do not read (its arguments are not an object, or its `_meta` is
/// malformed) is still refused as a header mismatch when `Mcp-Name` or an `Mcp-Param-*`
/// header disagrees with what the body does say, or is missing.
#[tokio::test]
async fn a_call_whose_params_do_not_read_still_mirrors_its_name_and_arguments() {
    let unreadable = json!({ "name": "hello", "arguments": [1], "_meta": meta() });
    for (headers, what) in [
        (&[("mcp-name", "other")][..], "a name that disagrees"),
        (&[("mcp-name", "")][..], "no name"),
    ] {
        let (status, body) = send(with(call("hello"), unreadable.clone(), headers)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{what}: {body}");
        assert_eq!(body["error"]["code"], -32020, "{what}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("Mcp-Name")),
            "{what}: {body}"
        );
    }
    // The name mirrored: the params are what is refused.
    let (_, body) = send(with(call("hello"), unreadable, &[])).await;
    assert_eq!(body["error"]["code"], -32602, "{body}");

    // Arguments that read, beside a `_meta` that does not.
    let bad_meta = json!({ "name": "shard", "arguments": { "shard": 7 },
        "_meta": { "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                   "io.modelcontextprotocol/clientCapabilities": [] } });
    let shard = |value: &'static str| [("mcp-param-shard", value)];
    let (status, body) = send(with(call("shard"), bad_meta.clone(), &shard("8"))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], -32020, "{body}");
    let (_, body) = send(with(call("shard"), bad_meta, &shard("7"))).await;
    assert_eq!(body["error"]["code"], -32602, "{body}");
}

/// An argument of another type than its `x-mcp-header` declares, mirrored as it was sent,
/// is refused by the argument check (a tool execution error naming it, which the model can
/// correct), not as a header mismatch, which would send a client to list the tools again
/// for nothing; a header that says something else than the body still is a mismatch.
#[tokio::test]
async fn an_argument_of_another_type_is_refused_as_an_argument() {
    let params = json!({ "name": "shard", "arguments": { "shard": "7" }, "_meta": meta() });
    let (status, body) = send(with(
        call("shard"),
        params.clone(),
        &[("mcp-param-shard", "7")],
    ))
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["result"]["isError"], true, "{body}");
    assert!(
        body["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|m| m.contains("Invalid arguments for tool shard") && m.contains("shard")),
        "{body}"
    );
    let (status, body) = send(with(call("shard"), params, &[("mcp-param-shard", "8")])).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], -32020, "{body}");
}

/// A server that serves only 2026-07-28 names the versions it supports in every error it
/// returns to `initialize`: its params malformed, or carrying this revision's `_meta`.
#[tokio::test]
async fn initialize_on_a_modern_only_server_names_the_supported_versions() {
    let mut config = wharf::ServerConfig::default();
    config.legacy.enabled = false;
    let server = Server::builder(Implementation::new("t", "1"))
        .config(config)
        .tool(tool("hello").handler(|_cx: Context, _: NoArgs| async { "hi" }))
        .build()
        .unwrap();
    let app = wharf_http::router(server, HttpConfig::default());
    let initialize = |params: Value| {
        let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params });
        post(&body, &[])
    };
    let cases = [
        (json!({}), "malformed params"),
        (initialize_params(), "a legacy client"),
        (
            json!({ "protocolVersion": "2026-07-28", "capabilities": {},
                "clientInfo": { "name": "t", "version": "1" } }),
            "this revision's version, asked as a legacy client would",
        ),
        (json!({ "_meta": meta() }), "this revision's _meta"),
    ];
    for (params, what) in cases {
        let res = app.clone().oneshot(initialize(params)).await.unwrap();
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        let body: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            body["error"]["data"]["supported"],
            json!(["2026-07-28"]),
            "{what}: {body}"
        );
    }
}

/// Only `Mcp-Name` and `Mcp-Param-*` may come Base64-encoded (`=?base64?…?=`): an encoded
/// `MCP-Protocol-Version` or `Mcp-Method` is refused as a mismatch (an intermediary routes
/// on them as sent), even when it decodes to the body's value.
#[tokio::test]
async fn encoded_version_and_method_headers_are_refused() {
    // "2026-07-28" and "tools/call", encoded.
    for (name, encoded, display) in [
        (
            "mcp-protocol-version",
            "=?base64?MjAyNi0wNy0yOA==?=",
            "MCP-Protocol-Version",
        ),
        ("mcp-method", "=?base64?dG9vbHMvY2FsbA==?=", "Mcp-Method"),
    ] {
        let req = with(
            call("hello"),
            json!({ "name": "hello", "arguments": {}, "_meta": meta() }),
            &[(name, encoded)],
        );
        let (status, body) = send(req).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{name}: {body}");
        assert_eq!(body["error"]["code"], -32020, "{name}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(display) && message.contains("only Mcp-Name and Mcp-Param-*"),
            "{message}"
        );
    }
    // On a method the server lacks too, where the version is judged before the method.
    let unknown = post(
        &json!({ "jsonrpc": "2.0", "id": 1, "method": "nothing/here", "params": { "_meta": meta() } }),
        &[
            ("mcp-protocol-version", "=?base64?MjAyNi0wNy0yOA==?="),
            ("mcp-method", "nothing/here"),
            ("x-user", "alice"),
        ],
    );
    let (status, body) = send(unknown).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], -32020, "{body}");
}

/// Under `close_while_draining`, while the server drains, every response closes its
/// connection, whoever answers it: the endpoint, the probes, a CORS preflight, axum's 404
/// and 405. A proxy then keeps no connection the replica will close when its grace ends.
#[tokio::test]
async fn every_response_closes_its_connection_while_draining() {
    let server = server();
    let mut config = HttpConfig::default();
    config.hosts = wharf_http::HostPolicy::localhost().allow_origin("https://app.example");
    config.auth = std::sync::Arc::new(
        FromExtensions::new().challenge(HeaderValue::from_static(r#"Cookie realm="app""#)),
    );
    // As an app served by `axum::serve` adds it (`wharf_http::serve` does the same itself).
    let app = wharf_http::router(server.clone(), config)
        .layer(wharf_http::close_while_draining(server.clone()));
    let requests = || {
        let get = |path: &str| {
            Request::get(path)
                .header(header::HOST, "localhost")
                .body(Body::empty())
                .unwrap()
        };
        let preflight = Request::options("/mcp")
            .header(header::HOST, "localhost")
            .header(header::ORIGIN, "https://app.example")
            .header(header::ACCESS_CONTROL_REQUEST_METHOD, "POST")
            .body(Body::empty())
            .unwrap();
        let put = Request::put("/mcp")
            .header(header::HOST, "localhost")
            .body(Body::empty())
            .unwrap();
        let mut hello = call("hello");
        hello.extensions_mut().insert(Principal::oauth(Grant {
            issuer: "https://app.example".into(),
            subject: "alice".into(),
            client_id: None,
            scopes: BTreeSet::new(),
        }));
        [
            ("a call", hello),
            ("readyz", get("/readyz")),
            ("healthz", get("/healthz")),
            ("a path nothing serves", get("/nothing")),
            ("a preflight", preflight),
            ("PUT", put),
        ]
    };
    let closes = |res: &axum::response::Response| {
        res.headers()
            .get(header::CONNECTION)
            .is_some_and(|v| v == "close")
    };
    for (what, req) in requests() {
        let res = app.clone().oneshot(req).await.unwrap();
        assert!(
            !closes(&res),
            "{what} before the drain: {:?}",
            res.headers()
        );
    }
    server.drain();
    for (what, req) in requests() {
        let res = app.clone().oneshot(req).await.unwrap();
        assert!(
            closes(&res),
            "{what} while draining: {} {:?}",
            res.status(),
            res.headers()
        );
    }
}

/// A client must not POST a response in this revision: refused (400, -32600) with an error
/// that has no id, which the client cannot take for the answer to a request of its own.
#[tokio::test]
async fn a_response_posted_by_a_client_is_refused_without_its_id() {
    let mut req = post(
        &json!({ "jsonrpc": "2.0", "id": 5, "result": {} }),
        &[("mcp-protocol-version", "2026-07-28")],
    );
    req.headers_mut().insert("x-user", "alice".parse().unwrap());
    let (status, body) = send(req).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], -32600, "{body}");
    assert!(body.get("id").is_none_or(Value::is_null), "{body}");
}

/// A dependency check that counts how often it is asked, and fails when told to.
struct Counted {
    asked: std::sync::atomic::AtomicUsize,
    failing: std::sync::atomic::AtomicBool,
    hanging: std::sync::atomic::AtomicBool,
}

impl wharf_http::ReadinessCheck for Counted {
    fn name(&self) -> &str {
        "store"
    }

    fn check(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send + '_>> {
        use std::sync::atomic::Ordering::SeqCst;
        self.asked.fetch_add(1, SeqCst);
        let (failing, hanging) = (self.failing.load(SeqCst), self.hanging.load(SeqCst));
        Box::pin(async move {
            if hanging {
                std::future::pending::<()>().await;
            }
            if failing { Err("down".into()) } else { Ok(()) }
        })
    }
}

/// `/readyz` asks the dependencies at most once a second, however many probes arrive (an
/// unauthenticated flood would otherwise take the store's connections from calls); a
/// failure shows within that second, a dependency that hangs within a few.
#[tokio::test(start_paused = true)]
async fn readiness_asks_the_dependencies_at_most_once_a_second() {
    use std::sync::atomic::Ordering::SeqCst;
    let check = std::sync::Arc::new(Counted {
        asked: 0.into(),
        failing: false.into(),
        hanging: false.into(),
    });
    let mut config = HttpConfig::default();
    config.readiness = vec![check.clone()];
    let app = wharf_http::router(server(), config);
    let probe = || async {
        let req = Request::get("/readyz")
            .header(header::HOST, "localhost")
            .body(Body::empty())
            .unwrap();
        app.clone().oneshot(req).await.unwrap().status()
    };
    let probes = futures_util::future::join_all((0..20).map(|_| probe())).await;
    assert!(probes.iter().all(|s| *s == StatusCode::OK), "{probes:?}");
    assert_eq!(check.asked.load(SeqCst), 1);
    check.failing.store(true, SeqCst);
    tokio::time::advance(std::time::Duration::from_millis(900)).await;
    assert_eq!(
        probe().await,
        StatusCode::OK,
        "the verdict stands for a second"
    );
    tokio::time::advance(std::time::Duration::from_millis(200)).await;
    assert_eq!(probe().await, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(check.asked.load(SeqCst), 2);
    // A dependency that does not answer fails its check in time (the clock runs on by
    // itself while everything waits).
    check.failing.store(false, SeqCst);
    check.hanging.store(true, SeqCst);
    tokio::time::advance(std::time::Duration::from_millis(1_100)).await;
    assert_eq!(probe().await, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(check.asked.load(SeqCst), 3);
}

#[tokio::test]
async fn an_endpoint_that_is_no_plain_path_is_refused_by_name() {
    for endpoint in ["mcp", "/healthz", "/api/{tenant}", "/.well-known/mcp"] {
        let mut config = HttpConfig::default();
        config.endpoint = endpoint.into();
        let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            wharf_http::router(server(), config)
        }));
        let said = made
            .err()
            .and_then(|p| p.downcast::<String>().ok())
            .map(|s| *s);
        assert!(
            said.as_deref()
                .is_some_and(|s| s.starts_with("HttpConfig::endpoint: ") && s.contains(endpoint)),
            "{endpoint}: {said:?}"
        );
    }
    // A path of the app's own choosing serves.
    let mut config = HttpConfig::default();
    config.endpoint = "/api/mcp".into();
    let res = wharf_http::router(server(), config)
        .oneshot(
            Request::post("/api/mcp")
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from("{}"))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_ne!(res.status(), StatusCode::NOT_FOUND);
}

/// What a connection limit of "never" is written as still serves: hyper adds the head's read
/// timeout to the clock, where `Duration::MAX` would overflow in every connection's task.
#[tokio::test]
async fn a_head_read_timeout_of_never_still_serves() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut limits = wharf_http::ConnectionLimits::default();
    limits.header_read_timeout = std::time::Duration::MAX;
    let app = wharf_http::router(server(), HttpConfig::default());
    tokio::spawn(wharf_http::serve(
        listener,
        app,
        limits,
        std::future::pending(),
    ));
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}
