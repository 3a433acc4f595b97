//! Every bad-input rule of the Streamable HTTP transport, over real HTTP against `wharf serve`:
//! the status, the JSON-RPC code, the id echoed, and the server still healthy afterwards.

use crate::common;

use common::{ServerProcess, validate_message};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};

fn meta() -> Value {
    json!({ "io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {} })
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_bytes(v.as_bytes()).unwrap(),
        );
    }
    h
}

fn std_headers(method: &str) -> Vec<(&'static str, String)> {
    vec![
        ("content-type", "application/json".into()),
        ("accept", "application/json, text/event-stream".into()),
        ("mcp-protocol-version", "2026-07-28".into()),
        ("mcp-method", method.into()),
    ]
}

async fn post(server: &ServerProcess, body: &[u8], hs: &[(&str, &str)]) -> wharf_client::Reply {
    server
        .client()
        .send_raw(body.to_vec(), headers(hs))
        .await
        .expect("post")
}

async fn post_std(
    server: &ServerProcess,
    method: &str,
    body: Value,
    extra: &[(&str, &str)],
) -> wharf_client::Reply {
    let mut hs: Vec<(&str, String)> = std_headers(method);
    for (k, v) in extra {
        hs.retain(|(n, _)| !n.eq_ignore_ascii_case(k));
        hs.push((k, (*v).to_owned()));
    }
    let hs: Vec<(&str, &str)> = hs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let reply = post(server, body.to_string().as_bytes(), &hs).await;
    for m in &reply.messages {
        validate_message(method, m);
    }
    reply
}

fn assert_error(reply: &wharf_client::Reply, status: u16, code: i64, id: Option<Value>) {
    assert_eq!(reply.status, status, "status of {}", reply.body);
    assert_eq!(reply.error_code(), Some(code), "code of {}", reply.body);
    assert!(
        reply.content_type().starts_with("application/json"),
        "{}",
        reply.content_type()
    );
    let resp = reply.response().unwrap();
    assert_eq!(resp.get("id").cloned(), id, "id of {}", reply.body);
    assert!(
        resp["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
    );
}

async fn assert_still_healthy(server: &ServerProcess) {
    let r = common::request(
        &server.client(),
        "tools/call",
        json!({ "name": "echo", "arguments": { "text": "still here" } }),
    )
    .await;
    assert_eq!(r.result().unwrap()["content"][0]["text"], "still here");
}

#[tokio::test]
async fn envelope_errors() {
    let server = ServerProcess::start(&[]);
    let hs = [("content-type", "application/json")];
    // Malformed JSON and invalid UTF-8: -32700, no id.
    assert_error(
        &post(&server, b"{\"jsonrpc\":", &hs).await,
        400,
        -32700,
        None,
    );
    assert_error(
        &post(
            &server,
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xff\"}",
            &hs,
        )
        .await,
        400,
        -32700,
        None,
    );
    // Batches: -32600.
    let batch = br#"[{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{}}]"#;
    assert_error(&post(&server, batch, &hs).await, 400, -32600, None);
    // Wrong jsonrpc version: -32600 with the id echoed.
    assert_error(
        &post(
            &server,
            br#"{"jsonrpc":"1.0","id":"abc","method":"server/discover"}"#,
            &hs,
        )
        .await,
        400,
        -32600,
        Some(json!("abc")),
    );
    // Null id: -32600.
    assert_error(
        &post(
            &server,
            br#"{"jsonrpc":"2.0","id":null,"method":"server/discover"}"#,
            &hs,
        )
        .await,
        400,
        -32600,
        None,
    );
    // Too deep: 400 -32600 with the id.
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"x":{}1{}}}}}"#,
        "[".repeat(100),
        "]".repeat(100)
    );
    assert_error(
        &post(&server, deep.as_bytes(), &hs).await,
        400,
        -32600,
        Some(json!(7)),
    );
    assert_still_healthy(&server).await;
}

#[tokio::test]
async fn transport_limits_and_guards() {
    let server = ServerProcess::start(&["--max-body-bytes", "2048", "--max-header-bytes", "4096"]);
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": { "_meta": meta() } });
    // Body too large: 413.
    let big = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": { "_meta": meta(), "name": "echo", "arguments": { "text": "x".repeat(4000) } } });
    let r = post_std(&server, "tools/call", big, &[("mcp-name", "echo")]).await;
    assert_error(&r, 413, -32600, None);
    // Headers too large: 431.
    let huge = "h".repeat(5000);
    let r = post_std(
        &server,
        "server/discover",
        body.clone(),
        &[("x-padding", huge.as_str())],
    )
    .await;
    assert_error(&r, 431, -32600, None);
    // Not JSON: 415.
    let r = post_std(
        &server,
        "server/discover",
        body.clone(),
        &[("content-type", "text/plain")],
    )
    .await;
    assert_error(&r, 415, -32600, None);
    // DNS rebinding: foreign Origin or Host: 403.
    let r = post_std(
        &server,
        "server/discover",
        body.clone(),
        &[("origin", "http://evil.example.com")],
    )
    .await;
    assert_eq!(r.status, 403);
    let r = post_std(
        &server,
        "server/discover",
        body.clone(),
        &[("host", "evil.example.com")],
    )
    .await;
    assert_eq!(r.status, 403);
    let origin = format!("http://localhost:{}", server.port);
    let r = post_std(
        &server,
        "server/discover",
        body.clone(),
        &[("origin", origin.as_str())],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    // GET and DELETE: 405.
    let http = reqwest::Client::new();
    assert_eq!(http.get(server.url()).send().await.unwrap().status(), 405);
    assert_eq!(
        http.delete(server.url()).send().await.unwrap().status(),
        405
    );
    // A forbidden origin is told so first, whatever the method.
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let refused = http
            .request(method.clone(), server.url())
            .header("origin", "http://evil.example.com")
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 403, "{method}");
    }
    // A notification: 202 with no body.
    let r = post_std(&server, "notifications/cancelled", json!({ "jsonrpc": "2.0", "method": "notifications/cancelled", "params": { "requestId": 1 } }), &[]).await;
    assert_eq!(r.status, 202);
    assert!(r.body.is_empty());
    // Session ids are ignored, never echoed.
    let r = post_std(
        &server,
        "server/discover",
        body,
        &[("mcp-session-id", "abc"), ("last-event-id", "5")],
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.headers.get("mcp-session-id").is_none());
    assert_still_healthy(&server).await;
}

#[tokio::test]
async fn stateless_rules() {
    let server = ServerProcess::start(&[]);
    // Missing _meta, protocol version, capabilities: 400 -32602.
    for params in [
        json!({}),
        json!({ "_meta": { "io.modelcontextprotocol/clientCapabilities": {} } }),
        json!({ "_meta": { "io.modelcontextprotocol/protocolVersion": "2026-07-28" } }),
    ] {
        let r = post_std(
            &server,
            "server/discover",
            json!({ "jsonrpc": "2.0", "id": 3, "method": "server/discover", "params": params }),
            &[],
        )
        .await;
        assert_error(&r, 400, -32602, Some(json!(3)));
    }
    // Unsupported version: 400 -32022 with data.
    let mut m = meta();
    m["io.modelcontextprotocol/protocolVersion"] = json!("v999.0.0");
    let r = post_std(&server, "server/discover", json!({ "jsonrpc": "2.0", "id": 4, "method": "server/discover", "params": { "_meta": m.clone() } }), &[("mcp-protocol-version", "v999.0.0")]).await;
    assert_error(&r, 400, -32022, Some(json!(4)));
    assert_eq!(
        r.error().unwrap()["data"],
        // A dual-era server lists the legacy revisions too (basic/versioning).
        json!({ "supported": ["2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26"],
            "requested": "v999.0.0" })
    );
    // Header says one version, body another: -32020.
    let r = post_std(
        &server,
        "server/discover",
        json!({ "jsonrpc": "2.0", "id": 5, "method": "server/discover", "params": { "_meta": m } }),
        &[],
    )
    .await;
    assert_error(&r, 400, -32020, Some(json!(5)));
    // A request also wrong in its params is judged on its version, `_meta` and headers
    // first: what a transport must answer with 400 is not lost behind a method's 200.
    // The last row, with all of that in order, is the method's own refusal of a missing name.
    let later = json!({ "io.modelcontextprotocol/protocolVersion": "2027-01-01" });
    // (Mcp-Method header, params, other headers, status, code)
    type Case<'a> = (&'a str, Value, &'a [(&'a str, &'a str)], u16, i64);
    let cases: [Case; 5] = [
        ("tools/call", json!({ "arguments": {} }), &[], 400, -32602),
        (
            "tools/call",
            json!({ "_meta": later, "arguments": {} }),
            &[("mcp-protocol-version", "2027-01-01")],
            400,
            -32022,
        ),
        (
            "tools/list",
            json!({ "_meta": meta(), "arguments": {} }),
            &[],
            400,
            -32020,
        ),
        (
            "tools/call",
            json!({ "_meta": meta(), "arguments": {} }),
            &[("mcp-protocol-version", "2025-11-25")],
            400,
            -32020,
        ),
        (
            "tools/call",
            json!({ "_meta": meta(), "arguments": {} }),
            &[],
            200,
            -32602,
        ),
    ];
    for (header_method, params, extra, status, code) in cases {
        let body = json!({ "jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": params });
        let r = post_std(&server, header_method, body, extra).await;
        assert_error(&r, status, code, Some(json!(6)));
        if code == -32602 && status == 400 {
            assert!(r.body.contains("_meta is required"), "{}", r.body);
        }
    }
    // Retired and unknown methods: 404 -32601.
    for method in [
        "initialize",
        "ping",
        "logging/setLevel",
        "resources/subscribe",
        "resources/unsubscribe",
        "unknown/method",
    ] {
        let r = post_std(
            &server,
            method,
            json!({ "jsonrpc": "2.0", "id": 6, "method": method, "params": { "_meta": meta() } }),
            &[],
        )
        .await;
        assert_error(&r, 404, -32601, Some(json!(6)));
    }
    assert_still_healthy(&server).await;
}

#[tokio::test]
async fn mirrored_headers() {
    let server = ServerProcess::start(&["--profile", "conformance"]);
    let call = |name: &str, args: Value| json!({ "jsonrpc": "2.0", "id": "h", "method": "tools/call", "params": { "_meta": meta(), "name": name, "arguments": args } });
    let simple = call("test_simple_text", json!({}));
    // Missing, wrong or wrong-case Mcp-Method: -32020.
    for bad in ["tools/list", "TOOLS/CALL"] {
        let r = post_std(
            &server,
            "tools/call",
            simple.clone(),
            &[("mcp-method", bad), ("mcp-name", "test_simple_text")],
        )
        .await;
        assert_error(&r, 400, -32020, Some(json!("h")));
    }
    let r = post(
        &server,
        simple.to_string().as_bytes(),
        &[
            ("content-type", "application/json"),
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-name", "test_simple_text"),
        ],
    )
    .await;
    assert_error(&r, 400, -32020, Some(json!("h")));
    // Missing protocol version header: -32020.
    let r = post(
        &server,
        simple.to_string().as_bytes(),
        &[
            ("content-type", "application/json"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "test_simple_text"),
        ],
    )
    .await;
    assert_error(&r, 400, -32020, Some(json!("h")));
    // Missing or wrong Mcp-Name: -32020; surrounding spaces and upper-case header names are fine.
    assert_error(
        &post_std(&server, "tools/call", simple.clone(), &[]).await,
        400,
        -32020,
        Some(json!("h")),
    );
    assert_error(
        &post_std(
            &server,
            "tools/call",
            simple.clone(),
            &[("mcp-name", "other")],
        )
        .await,
        400,
        -32020,
        Some(json!("h")),
    );
    assert_eq!(
        post_std(
            &server,
            "tools/call",
            simple.clone(),
            &[("MCP-NAME", "  test_simple_text  ")]
        )
        .await
        .status,
        200
    );
    // Base64-sentinel Mcp-Name is decoded before comparison.
    let encoded = wharf_protocol::headers::encode_value(" test_simple_text");
    assert!(encoded.starts_with("=?base64?"));
    let r = post_std(
        &server,
        "tools/call",
        simple.clone(),
        &[("mcp-name", "=?base64?dGVzdF9zaW1wbGVfdGV4dA==?=")],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    // Mcp-Param-Region mirrors the x-mcp-header argument.
    let region = call("test_header_param", json!({ "region": "Hello" }));
    let n = ("mcp-name", "test_header_param");
    assert_eq!(
        post_std(
            &server,
            "tools/call",
            region.clone(),
            &[n, ("mcp-param-region", "Hello")]
        )
        .await
        .status,
        200
    );
    assert_eq!(
        post_std(
            &server,
            "tools/call",
            region.clone(),
            &[n, ("Mcp-Param-Region", "=?base64?SGVsbG8=?=")]
        )
        .await
        .status,
        200
    );
    for bad in ["=?base64?SGVsbG8?=", "=?base64?SGVs!!!bG8=?=", "Bye"] {
        let r = post_std(
            &server,
            "tools/call",
            region.clone(),
            &[n, ("mcp-param-region", bad)],
        )
        .await;
        assert_error(&r, 400, -32020, Some(json!("h")));
    }
    assert_error(
        &post_std(&server, "tools/call", region, &[n]).await,
        400,
        -32020,
        Some(json!("h")),
    );
}

#[tokio::test]
async fn ids_echo_exactly() {
    let server = ServerProcess::start(&[]);
    for id in [
        "123456789012345678901234567890",
        "9007199254740993",
        "-5",
        "\"a string id\"",
    ] {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"server/discover","params":{{"_meta":{}}}}}"#,
            meta()
        );
        let hs: Vec<(&str, String)> = std_headers("server/discover");
        let hs: Vec<(&str, &str)> = hs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let r = post(&server, body.as_bytes(), &hs).await;
        assert_eq!(r.status, 200);
        assert!(
            r.body
                .starts_with(&format!(r#"{{"jsonrpc":"2.0","id":{id},"result""#)),
            "{}",
            r.body
        );
    }
}

#[tokio::test]
async fn params_errors() {
    let server = ServerProcess::start(&["--profile", "conformance"]);
    let client = server.client();
    let r = common::request(
        &client,
        "tools/call",
        json!({ "name": "no_such_tool", "arguments": {} }),
    )
    .await;
    assert_eq!(r.error_code(), Some(-32602));
    assert!(
        r.error().unwrap()["message"]
            .as_str()
            .unwrap()
            .contains("no_such_tool")
    );
    let args = json!({ "name": 5, "email": "a@example.com" });
    let r = common::request(
        &client,
        "tools/call",
        json!({ "name": "json_schema_2020_12_tool", "arguments": args }),
    )
    .await;
    // Arguments the schema refuses are a tool execution error naming the place, which the
    // model can correct.
    let refused_at = |r: &wharf_client::Reply, place: &str| {
        assert_eq!(r.status, 200, "{}", r.body);
        let result = r.result().unwrap_or_else(|| panic!("a result: {}", r.body));
        assert_eq!(result["isError"], true, "{}", r.body);
        let text = result["content"][0]["text"].as_str().unwrap();
        assert!(text.contains(place), "{text:?} should name {place:?}");
    };
    refused_at(&r, "/name");
    let args = json!({ "name": "n", "email": "a@example.com", "extra": 1 });
    let r = common::request(
        &client,
        "tools/call",
        json!({ "name": "json_schema_2020_12_tool", "arguments": args }),
    )
    .await;
    // additionalProperties: false is enforced.
    refused_at(&r, "extra");
    let r = common::request(&client, "prompts/get", json!({ "name": "nope" })).await;
    assert_eq!(r.error_code(), Some(-32602));
    let r = common::request(
        &client,
        "prompts/get",
        json!({ "name": "test_prompt_with_arguments", "arguments": { "arg1": "x" } }),
    )
    .await;
    assert_eq!(r.error_code(), Some(-32602));
    assert!(
        r.error().unwrap()["message"]
            .as_str()
            .unwrap()
            .contains("arg2")
    );
    let r = common::request(
        &client,
        "resources/read",
        json!({ "uri": "test://nonexistent" }),
    )
    .await;
    assert_eq!(r.error_code(), Some(-32602));
    assert_eq!(r.error().unwrap()["data"]["uri"], "test://nonexistent");
    // The capability the tool needs is missing: 400 -32021.
    let r = common::request(
        &client,
        "tools/call",
        json!({ "name": "test_missing_capability", "arguments": {} }),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.error_code(), Some(-32021));
    assert_eq!(
        r.error().unwrap()["data"]["requiredCapabilities"],
        json!({ "sampling": {} })
    );
    // Model-actionable failure: a result with isError.
    let r = common::request(
        &client,
        "tools/call",
        json!({ "name": "test_error_handling", "arguments": {} }),
    )
    .await;
    assert_eq!(r.result().unwrap()["isError"], true);
}

#[tokio::test]
async fn refusals_keep_their_status_when_a_stream_was_asked_for() {
    let server = ServerProcess::start(&["--profile", "conformance"]);
    // A progress token asks for SSE, but a refused request must still be a 400 JSON error
    // that answers the request's own id.
    let mut m = meta();
    m["progressToken"] = json!("p");
    let body = json!({ "jsonrpc": "2.0", "id": "refused-8", "method": "tools/call",
        "params": { "_meta": m, "name": "test_missing_capability", "arguments": {} } });
    let r = post_std(
        &server,
        "tools/call",
        body,
        &[("mcp-name", "test_missing_capability")],
    )
    .await;
    assert_error(&r, 400, -32021, Some(json!("refused-8")));
    // Refused once the handler runs (it asks for an elicitation the client cannot answer),
    // before the stream sent anything: the same 400, not a 200 stream carrying the error.
    let mut m = meta();
    m["progressToken"] = json!("p");
    let body = json!({ "jsonrpc": "2.0", "id": "refused-9", "method": "tools/call",
        "params": { "_meta": m, "name": "test_elicitation", "arguments": { "message": "x" } } });
    let r = post_std(
        &server,
        "tools/call",
        body,
        &[("mcp-name", "test_elicitation")],
    )
    .await;
    assert_error(&r, 400, -32021, Some(json!("refused-9")));
    let mut m = meta();
    m["io.modelcontextprotocol/protocolVersion"] = json!("2025-01-01");
    m["progressToken"] = json!(1);
    let body = json!({ "jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": { "_meta": m, "name": "test_simple_text" } });
    let r = post_std(
        &server,
        "tools/call",
        body,
        &[
            ("mcp-protocol-version", "2025-01-01"),
            ("mcp-name", "test_simple_text"),
        ],
    )
    .await;
    assert_error(&r, 400, -32022, Some(json!(9)));
}

#[tokio::test]
async fn malformed_meta_and_params_shapes() {
    let server = ServerProcess::start(&[]);
    // A required _meta field of the wrong type: 400 -32602 naming it.
    let mut m = meta();
    m["io.modelcontextprotocol/protocolVersion"] = json!(20260728);
    let r = post_std(
        &server,
        "server/discover",
        json!({ "jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": { "_meta": m } }),
        &[],
    )
    .await;
    assert_error(&r, 400, -32602, Some(json!(1)));
    assert!(
        r.error().unwrap()["message"]
            .as_str()
            .unwrap()
            .contains("protocolVersion"),
        "{}",
        r.body
    );
    let mut m = meta();
    m["io.modelcontextprotocol/clientCapabilities"] = json!([]);
    let r = post_std(
        &server,
        "server/discover",
        json!({ "jsonrpc": "2.0", "id": 2, "method": "server/discover", "params": { "_meta": m } }),
        &[],
    )
    .await;
    assert_error(&r, 400, -32602, Some(json!(2)));
    // A progress token with a fraction, or beyond 64 bits, could not be echoed as sent.
    for (id, token) in [(4, json!(1.5)), (5, json!(1e20))] {
        let mut m = meta();
        m["progressToken"] = token;
        let body = json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": { "_meta": m, "name": "echo", "arguments": { "text": "x" } } });
        let r = post_std(&server, "tools/call", body, &[("mcp-name", "echo")]).await;
        assert_error(&r, 400, -32602, Some(json!(id)));
        let message = r.error().unwrap()["message"].as_str().unwrap().to_owned();
        assert!(
            message.contains("progressToken")
                && message.contains("a string or an integer of at most 64 bits"),
            "{message}"
        );
    }
    // Positional (array) params: -32600.
    let r = post_std(&server, "server/discover", json!({ "jsonrpc": "2.0", "id": 3, "method": "server/discover", "params": [ { "_meta": meta() } ] }), &[]).await;
    assert_error(&r, 400, -32600, Some(json!(3)));
    assert_still_healthy(&server).await;
}

#[tokio::test]
async fn any_host_still_checks_origin() {
    let server = ServerProcess::start(&[
        "--allowed-host",
        "*",
        "--allowed-origin",
        "https://app.example.com",
    ]);
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": { "_meta": meta() } });
    let ok = post_std(
        &server,
        "server/discover",
        body.clone(),
        &[("host", "mcp.example.net")],
    )
    .await;
    assert_eq!(ok.status, 200, "any Host is served: {}", ok.body);
    let ok = post_std(
        &server,
        "server/discover",
        body.clone(),
        &[("origin", "https://app.example.com")],
    )
    .await;
    assert_eq!(ok.status, 200);
    let refused = post_std(
        &server,
        "server/discover",
        body,
        &[("origin", "http://evil.example.com")],
    )
    .await;
    assert_error(&refused, 403, -32600, None);
}

#[tokio::test]
async fn short_cursor_keys_are_refused_at_startup() {
    let out = common::wharf(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--anonymous",
        "--cursor-key",
        "c2hvcnQ=",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 32 bytes"));
}
