//! A corpus of hostile requests against the import service over real HTTP: header games,
//! malformed and deeply nested JSON, wrong types, forged cursors, states and handles, oversized
//! parts. Each gets its exact status and JSON-RPC code (or a tool error naming the problem);
//! afterwards the server still serves, and the data it held is exactly as before.

use crate::common;

use common::import::*;
use serde_json::{Value, json};
use wharf_client::Reply;
use wharf_protocol::headers::encode_value;

/// What a hostile request must get.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// This HTTP status and JSON-RPC error code.
    Rpc(u16, i64),
    /// 200 with a tool result marked `isError` whose text contains this.
    ToolError(&'static str),
}

/// A method's own refusal of its params (a forged cursor or state, a malformed call, an
/// unknown tool): a JSON-RPC error over HTTP 200. The transport answers 400 only for what it
/// checks itself (the envelope, `_meta`, mirrored headers).
const METHOD_REFUSED: Expect = Expect::Rpc(200, -32602);

/// Arguments that fail the tool's schema: a tool execution error the model can correct.
const ARGUMENTS_REFUSED: Expect = Expect::ToolError("Invalid arguments for tool");

/// A tool's own cursor argument that is forged or was issued for another query: the same.
const CURSOR_ARGUMENT_REFUSED: Expect = Expect::ToolError("Invalid cursor");

struct Case {
    what: String,
    body: Vec<u8>,
    /// Headers replacing (or, with an empty value, removing) the standard ones.
    headers: Vec<(&'static str, String)>,
    expect: Expect,
}

const VERSION: &str = "2026-07-28";

fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientCapabilities": {}
    })
}

fn envelope(method: &str, params: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params })
}

fn call_params(tool: &str, arguments: Value) -> Value {
    json!({ "_meta": meta(), "name": tool, "arguments": arguments })
}

impl Case {
    fn new(what: impl Into<String>, body: impl Into<Vec<u8>>, expect: Expect) -> Self {
        Case {
            what: what.into(),
            body: body.into(),
            headers: Vec::new(),
            expect,
        }
    }

    /// A well-formed request of `method` whose only fault is elsewhere.
    fn json(what: impl Into<String>, message: &Value, expect: Expect) -> Self {
        Case::new(what, message.to_string(), expect)
    }

    fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }
}

/// The headers a correct client sends with `body`.
fn standard_headers(body: &[u8]) -> Vec<(&'static str, String)> {
    let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let mut hs = vec![
        ("content-type", "application/json".to_owned()),
        ("accept", "application/json, text/event-stream".to_owned()),
        ("mcp-protocol-version", VERSION.to_owned()),
        ("authorization", format!("Bearer {TOKEN_42}")),
    ];
    if let Some(method) = parsed["method"].as_str() {
        hs.push(("mcp-method", encode_value(method)));
        if let Some(name) = parsed["params"]["name"].as_str() {
            hs.push(("mcp-name", encode_value(name)));
        }
    }
    hs
}

async fn send(client: &wharf_client::HttpClient, case: &Case) -> Reply {
    let mut hs = standard_headers(&case.body);
    for (name, value) in &case.headers {
        hs.retain(|(n, _)| n != name);
        if !value.is_empty() {
            hs.push((name, value.clone()));
        }
    }
    let mut map = reqwest::header::HeaderMap::new();
    for (name, value) in hs {
        map.append(
            name,
            reqwest::header::HeaderValue::from_str(&value).expect("header value"),
        );
    }
    client
        .send_raw(case.body.clone(), map)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", case.what))
}

fn check(case: &Case, reply: &Reply) -> Result<(), String> {
    let fail = |why: String| {
        Err(format!(
            "{}: {why}; got {} {}",
            case.what, reply.status, reply.body
        ))
    };
    match case.expect {
        Expect::Rpc(status, code) => {
            if reply.status != status || reply.error_code() != Some(code) {
                return fail(format!("expected {status} with code {code}"));
            }
            let message = reply.error().and_then(|e| e["message"].as_str());
            if message.is_none_or(str::is_empty) {
                return fail("the error has no message".into());
            }
        }
        Expect::ToolError(needle) => {
            let result = reply.result();
            let is_error = result.is_some_and(|r| r["isError"] == true);
            let text = result
                .and_then(|r| r["content"][0]["text"].as_str())
                .unwrap_or_default();
            if reply.status != 200 || !is_error || !text.contains(needle) {
                return fail(format!("expected a tool error containing {needle:?}"));
            }
        }
    }
    Ok(())
}

fn malformed_json() -> Vec<Case> {
    let bodies: &[&[u8]] = &[
        b"",
        b" ",
        b"{",
        b"}",
        b"[",
        b"nul",
        b"{\"jsonrpc\":",
        b"{\"jsonrpc\":\"2.0\",}",
        b"{'jsonrpc':'2.0'}",
        b"{\"jsonrpc\" \"2.0\"}",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}x",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}{}",
        b"{\"jsonrpc\":\"2.0\",\"id\":01,\"method\":\"tools/list\"}",
        b"{\"jsonrpc\":\"2.0\",\"id\":NaN,\"method\":\"tools/list\"}",
        b"{\"jsonrpc\":\"2.0\",\"id\":Infinity,\"method\":\"tools/list\"}",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xff\"}",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xc3\x28\"}",
        b"\xef\xbb\xbf{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"params\":{\"a\":\"\\u12\"}}",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"params\":{\"a\":\"\x01\"}}",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"params\":{\"a\":\"\\x41\"}}",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"params\":{\"a\":1.e5}}",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"params\":{\"a\":-}}",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"params\":{\"a\":tru}}",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"params\":{\"a\" 1}}",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"params\":{1:2}}",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"",
        b"\x00\x00\x00\x00",
        b"<?xml version=\"1.0\"?><jsonrpc/>",
        b"jsonrpc=2.0&id=1&method=tools/list",
    ];
    bodies
        .iter()
        .enumerate()
        .map(|(i, body)| {
            Case::new(
                format!("malformed JSON #{i}: {}", String::from_utf8_lossy(body)),
                *body,
                Expect::Rpc(400, -32700),
            )
        })
        .collect()
}

fn wrong_envelopes() -> Vec<Case> {
    let mut cases = Vec::new();
    let base = envelope("tools/list", json!({ "_meta": meta() }));
    let invalid = Expect::Rpc(400, -32600);
    for bad in [
        json!("1.0"),
        json!(2),
        json!(2.0),
        Value::Null,
        json!(true),
        json!([]),
        json!({}),
    ] {
        let mut m = base.clone();
        m["jsonrpc"] = bad.clone();
        cases.push(Case::json(format!("jsonrpc = {bad}"), &m, invalid));
    }
    let mut m = base.clone();
    m.as_object_mut().unwrap().remove("jsonrpc");
    cases.push(Case::json("jsonrpc missing", &m, invalid));
    for bad in [Value::Null, json!(true), json!([1]), json!({ "a": 1 })] {
        let mut m = base.clone();
        m["id"] = bad.clone();
        cases.push(Case::json(format!("id = {bad}"), &m, invalid));
    }
    for bad in [
        json!(1),
        Value::Null,
        json!(true),
        json!(["tools/list"]),
        json!({}),
    ] {
        let mut m = base.clone();
        m["method"] = bad.clone();
        cases.push(Case::json(format!("method = {bad}"), &m, invalid));
    }
    // A response sent to the server, and batches.
    cases.push(Case::json(
        "a response",
        &json!({ "jsonrpc": "2.0", "id": 1, "result": {} }),
        invalid,
    ));
    cases.push(Case::json("a batch", &json!([base.clone()]), invalid));
    cases.push(Case::json("an empty batch", &json!([]), invalid));
    for scalar in [json!(1), json!("x"), json!(true), Value::Null] {
        cases.push(Case::json(format!("a bare {scalar}"), &scalar, invalid));
    }
    cases
}

fn too_deep() -> Vec<Case> {
    let mut cases = Vec::new();
    for depth in [65, 80, 128, 500, 5_000, 50_000] {
        let nested = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{{"_meta":{},"name":"import_status","arguments":{{"import":{nested}}}}}}}"#,
            meta()
        );
        cases.push(
            Case::new(
                format!("arrays {depth} deep"),
                body,
                Expect::Rpc(400, -32600),
            )
            .header("mcp-method", "tools/call")
            .header("mcp-name", "import_status"),
        );
        let objects = format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth));
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":9,"method":"tools/list","params":{{"_meta":{},"x":{objects}}}}}"#,
            meta()
        );
        cases.push(
            Case::new(
                format!("objects {depth} deep"),
                body,
                Expect::Rpc(400, -32600),
            )
            .header("mcp-method", "tools/list"),
        );
    }
    cases
}

/// `message` sent with header `name` set to each of `values` (an empty value: left out).
fn with_header(
    message: &Value,
    name: &'static str,
    values: &[&str],
    expect: Expect,
) -> impl Iterator<Item = Case> {
    values
        .iter()
        .map(move |v| Case::json(format!("{name}: {:.60?}", v), message, expect).header(name, *v))
}

fn header_games() -> Vec<Case> {
    let list = envelope("tools/list", json!({ "_meta": meta() }));
    let call = envelope(
        "tools/call",
        call_params(
            "import_status",
            json!({ "import": "imp_00000000000000000000000000000000" }),
        ),
    );
    let padding = "p".repeat(17 * 1024);
    let mismatch = Expect::Rpc(400, -32020);
    // (Trailing spaces are not a mismatch: HTTP strips them from every field value.)
    let table: [(&Value, &'static str, Vec<&str>, Expect); 10] = [
        (
            &list,
            "content-type",
            vec![
                "text/plain",
                "application/x-www-form-urlencoded",
                "multipart/form-data; boundary=x",
                "application/xml",
                "application/jsonx",
                "text/json-ish",
                "",
            ],
            Expect::Rpc(415, -32600),
        ),
        (
            &list,
            "host",
            vec![
                "evil.example.com",
                "localhost.evil.example.com",
                "127.0.0.2",
                "[::2]:80",
            ],
            Expect::Rpc(403, -32600),
        ),
        (
            &list,
            "origin",
            vec![
                "http://evil.example.com",
                "null",
                "https://localhost.evil.example.com",
                "file://",
                "http://127.0.0.1.nip.io",
            ],
            Expect::Rpc(403, -32600),
        ),
        (&list, "x-padding", vec![&padding], Expect::Rpc(431, -32600)),
        (
            &list,
            "authorization",
            // No bearer credentials (another scheme counts as none), or a token the server
            // does not know: 401.
            vec![
                "",
                "Bearer not-a-known-token-at-all",
                "Basic dXNlcjpwYXNz",
                "bearer token-of-user-42-aaaaaaa",
                "Token token-of-user-42-aaaaaaaa",
            ],
            Expect::Rpc(401, -31001),
        ),
        (
            &list,
            "authorization",
            // A bearer header without exactly one token: a malformed authorization request.
            vec!["Bearer", "Bearer ", "Bearer token-of-user-42-aaaaaaaa x"],
            Expect::Rpc(400, -31001),
        ),
        (
            &list,
            "mcp-protocol-version",
            vec![
                "2025-11-25",
                "2026-07-29",
                "v999.0.0",
                "2026-07-2",
                "garbage",
            ],
            mismatch,
        ),
        (
            &list,
            "mcp-method",
            vec![
                "tools/call",
                "resources/list",
                "TOOLS/LIST",
                "tools/lis",
                "",
            ],
            mismatch,
        ),
        // Another name, plainly or in the sentinel form, and the right one with a byte more.
        (
            &call,
            "mcp-name",
            vec![
                "import_begin",
                "IMPORT_STATUS",
                "import_statu",
                "=?base64?aW1wb3J0X2JlZ2lu?=",
                "=?base64?aW1wb3J0X3N0YXR1c3M=?=",
                "",
            ],
            mismatch,
        ),
        // Sentinels that are not valid Base64 of a name.
        (
            &call,
            "mcp-name",
            vec![
                "=?base64?!!!!?=",
                "=?base64??=",
                "=?base64?aW1wb3J0?",
                "=?BASE64?aW1wb3J0X3N0YXR1cw?=",
            ],
            mismatch,
        ),
    ];
    table
        .into_iter()
        .flat_map(|(message, name, values, expect)| {
            with_header(message, name, &values, expect).collect::<Vec<_>>()
        })
        .collect()
}

fn stateless_rules() -> Vec<Case> {
    let mut cases = Vec::new();
    let invalid_params = Expect::Rpc(400, -32602);
    for params in [
        json!({}),
        json!({ "_meta": {} }),
        json!({ "_meta": "x" }),
        json!({ "_meta": [] }),
        json!({ "_meta": { "io.modelcontextprotocol/protocolVersion": VERSION } }),
        json!({ "_meta": { "io.modelcontextprotocol/clientCapabilities": {} } }),
        json!({ "_meta": { "io.modelcontextprotocol/protocolVersion": 20260728, "io.modelcontextprotocol/clientCapabilities": {} } }),
        json!({ "_meta": { "io.modelcontextprotocol/protocolVersion": VERSION, "io.modelcontextprotocol/clientCapabilities": "all" } }),
        json!({ "_meta": { "io.modelcontextprotocol/protocolVersion": VERSION, "io.modelcontextprotocol/clientCapabilities": [] } }),
    ] {
        cases.push(Case::json(
            format!("tools/list with params {params}"),
            &envelope("tools/list", params),
            invalid_params,
        ));
    }
    for params in [json!([]), json!("x"), json!(1)] {
        cases.push(Case::json(
            format!("params {params}"),
            &envelope("tools/list", params),
            Expect::Rpc(400, -32600),
        ));
    }
    for method in [
        "initialized",
        "tools/lis",
        "tools/list/",
        "sampling/createMessage",
        "roots/list",
        "elicitation/create",
        "rpc.discover",
        "",
        "a".repeat(300).as_str(),
        "tools/call\u{0}",
    ] {
        let m = envelope(method, json!({ "_meta": meta() }));
        // A method no header value can hold as it is (a NUL) cannot be mirrored: Mcp-Method
        // may not be Base64-encoded, so the header a client can send mismatches.
        let expect = if encode_value(method) == method {
            Expect::Rpc(404, -32601)
        } else {
            Expect::Rpc(400, -32020)
        };
        cases.push(Case::json(
            format!("unknown method {:.40}", method),
            &m,
            expect,
        ));
    }
    cases
}

fn forged_cursors(genuine: &str) -> Vec<Case> {
    let mut forged = vec![
        "".to_owned(),
        "x".to_owned(),
        "AAAA".to_owned(),
        "=".repeat(40),
        "not a cursor at all".to_owned(),
        "A".repeat(10_000),
        "../../../etc/passwd".to_owned(),
        "eyJhbGciOiJub25lIn0.eyJvIjowfQ.".to_owned(),
        "null".to_owned(),
        "0".to_owned(),
        "100".to_owned(),
    ];
    // The genuine cursor with one character changed, cut short, or extended.
    let mut flipped = genuine.as_bytes().to_vec();
    flipped[genuine.len() / 2] = if flipped[genuine.len() / 2] == b'A' {
        b'B'
    } else {
        b'A'
    };
    forged.push(String::from_utf8(flipped).unwrap());
    forged.push(genuine[..genuine.len() - 2].to_owned());
    forged.push(format!("{genuine}AA"));
    let mut cases = Vec::new();
    for cursor in &forged {
        let m = envelope("tools/list", json!({ "_meta": meta(), "cursor": cursor }));
        cases.push(Case::json(
            format!("tools/list cursor {:.40}", cursor),
            &m,
            METHOD_REFUSED,
        ));
        let q = envelope(
            "tools/call",
            call_params(
                "dataset_query",
                json!({ "dataset": "hostile", "cursor": cursor }),
            ),
        );
        cases.push(Case::json(
            format!("dataset_query cursor {:.40}", cursor),
            &q,
            CURSOR_ARGUMENT_REFUSED,
        ));
    }
    // The genuine query cursor used on another query (other filters) is refused too.
    let q = envelope(
        "tools/call",
        call_params(
            "dataset_query",
            json!({ "dataset": "hostile", "cursor": genuine, "filters": [{ "column": "id", "op": "gt", "value": 0 }] }),
        ),
    );
    cases.push(Case::json(
        "a genuine cursor on another query",
        &q,
        CURSOR_ARGUMENT_REFUSED,
    ));
    cases
}

fn forged_states() -> Vec<Case> {
    let mut cases = Vec::new();
    for state in [
        "",
        "x",
        "AAAA",
        "eyJhbGciOiJub25lIn0.e30.",
        &"B".repeat(4096),
        "{\"dataset\":\"hostile\"}",
    ] {
        let mut params = call_params(
            "dataset_delete",
            json!({ "dataset": "hostile", "idempotency_key": "hostile-delete" }),
        );
        params["requestState"] = json!(state);
        params["inputResponses"] =
            json!({ "confirm_delete": { "action": "accept", "content": { "confirm": true } } });
        cases.push(Case::json(
            format!("requestState {:.40}", state),
            &envelope("tools/call", params),
            METHOD_REFUSED,
        ));
    }
    for state in [json!(1), json!({}), json!([]), json!(true)] {
        let mut params = call_params(
            "dataset_delete",
            json!({ "dataset": "hostile", "idempotency_key": "hostile-delete" }),
        );
        params["requestState"] = state.clone();
        cases.push(Case::json(
            format!("requestState of type {state}"),
            &envelope("tools/call", params),
            METHOD_REFUSED,
        ));
    }
    cases
}

fn forged_handles(other_principals: &str) -> Vec<Case> {
    let unknown = Expect::ToolError("unknown or has expired");
    let mut handles = vec![
        "imp_00000000000000000000000000000000".to_owned(),
        "imp_ffffffffffffffffffffffffffffffff".to_owned(),
        "imp_".to_owned(),
        "imp".to_owned(),
        "".to_owned(),
        "imp_0000000000000000000000000000000".to_owned(),
        "imp_000000000000000000000000000000000".to_owned(),
        "IMP_00000000000000000000000000000000".to_owned(),
        "rep_00000000000000000000000000000000".to_owned(),
        "imp_gggggggggggggggggggggggggggggggg".to_owned(),
        "imp_../../../../../../../../../../..".to_owned(),
        "imp_0000000000000000000000000000000\u{e9}".to_owned(),
        "imp_%30000000000000000000000000000000".to_owned(),
        "imp_*".to_owned(),
        "x".repeat(10_000),
        other_principals.to_owned(),
    ];
    handles.push(format!("{other_principals} "));
    let mut cases = Vec::new();
    for handle in &handles {
        for (tool, extra) in [
            ("import_status", json!({})),
            (
                "import_append_rows",
                json!({ "rows": [], "idempotency_key": "hostile-append" }),
            ),
            (
                "import_commit",
                json!({ "idempotency_key": "hostile-commit" }),
            ),
        ] {
            let mut args = extra;
            args["import"] = json!(handle);
            let m = envelope("tools/call", call_params(tool, args));
            cases.push(Case::json(
                format!("{tool} on handle {:.40}", handle),
                &m,
                unknown,
            ));
        }
    }
    cases
}

fn wrong_arguments(import: &str) -> Vec<Case> {
    let invalid = METHOD_REFUSED;
    let arguments = ARGUMENTS_REFUSED;
    let mut cases = Vec::new();
    for (tool, args) in [
        ("import_status", json!({})),
        ("import_status", json!({ "import": 1 })),
        ("import_status", json!({ "import": [import] })),
        ("import_status", json!({ "import": { "id": import } })),
        ("import_status", json!({ "import": null })),
        (
            "import_append_rows",
            json!({ "import": import, "rows": "x", "idempotency_key": "k" }),
        ),
        (
            "import_append_rows",
            json!({ "import": import, "rows": [1, 2], "idempotency_key": "k" }),
        ),
        (
            "import_append_rows",
            json!({ "import": import, "rows": {}, "idempotency_key": "k" }),
        ),
        (
            "import_append_rows",
            json!({ "import": import, "rows": [] }),
        ),
        (
            "import_append_rows",
            json!({ "import": import, "rows": [], "idempotency_key": 5 }),
        ),
        (
            "import_begin",
            json!({ "dataset": 5, "idempotency_key": "k" }),
        ),
        (
            "import_begin",
            json!({ "dataset": "d", "columns": "id", "idempotency_key": "k" }),
        ),
        (
            "import_begin",
            json!({ "dataset": "d", "columns": [{ "name": "id", "type": "uuid" }], "idempotency_key": "k" }),
        ),
        (
            "dataset_query",
            json!({ "dataset": "hostile", "limit": "ten" }),
        ),
        (
            "dataset_query",
            json!({ "dataset": "hostile", "limit": -1 }),
        ),
        (
            "dataset_query",
            json!({ "dataset": "hostile", "filters": [{ "column": "id", "op": "like", "value": 1 }] }),
        ),
        (
            "dataset_query",
            json!({ "dataset": "hostile", "filters": "id > 1" }),
        ),
        ("dataset_query", json!({})),
        ("dataset_delete", json!({ "dataset": "hostile" })),
        (
            "dataset_delete",
            json!({ "dataset": ["hostile"], "idempotency_key": "k" }),
        ),
    ] {
        let m = envelope("tools/call", call_params(tool, args.clone()));
        cases.push(Case::json(format!("{tool} with {args}"), &m, arguments));
    }
    for (what, params) in [
        ("no name", json!({ "_meta": meta(), "arguments": {} })),
        (
            "name 5",
            json!({ "_meta": meta(), "name": 5, "arguments": {} }),
        ),
        (
            "arguments a string",
            json!({ "_meta": meta(), "name": "import_status", "arguments": "x" }),
        ),
        (
            "arguments an array",
            json!({ "_meta": meta(), "name": "import_status", "arguments": [] }),
        ),
    ] {
        cases.push(Case::json(
            format!("tools/call with {what}"),
            &envelope("tools/call", params),
            invalid,
        ));
    }
    for name in ["no_such_tool", "import_status\u{0}", "../import_status"] {
        let m = envelope("tools/call", call_params(name, json!({})));
        cases.push(Case::json(format!("unknown tool {name:?}"), &m, invalid));
    }
    cases
}

fn oversized(import: &str) -> Vec<Case> {
    let mut cases = Vec::new();
    let text = "z".repeat(1024 * 1024 + 1);
    let m = envelope(
        "tools/call",
        call_params("dataset_query", json!({ "dataset": text })),
    );
    cases.push(Case::json(
        "a body beyond 1 MiB",
        &m,
        Expect::Rpc(413, -32600),
    ));
    let many: Vec<Value> = (0..1001)
        .map(|i| json!({ "id": i, "city": "c", "temp": 1 }))
        .collect();
    let m = envelope(
        "tools/call",
        call_params(
            "import_append_rows",
            json!({ "import": import, "rows": many, "idempotency_key": "too-many" }),
        ),
    );
    cases.push(Case::json(
        "1,001 rows in one append",
        &m,
        Expect::ToolError("send at most 1000 per call"),
    ));
    let wide = json!({ "id": 1, "city": "w".repeat(100 * 1024), "temp": 1 });
    let m = envelope(
        "tools/call",
        call_params(
            "import_append_rows",
            json!({ "import": import, "rows": [wide], "idempotency_key": "too-wide" }),
        ),
    );
    cases.push(Case::json(
        "a 100 KiB row",
        &m,
        Expect::ToolError("at most 65536 bytes"),
    ));
    for name in [
        "n".repeat(65),
        "bad name".to_owned(),
        "x/y".to_owned(),
        String::new(),
    ] {
        let m = envelope(
            "tools/call",
            call_params("dataset_query", json!({ "dataset": name })),
        );
        cases.push(Case::json(
            format!("dataset name {:.20}", name),
            &m,
            Expect::ToolError("Invalid dataset name"),
        ));
    }
    cases
}

/// What the test principal holds: the dataset's rows and the open import's staged count.
async fn holdings(client: &wharf_client::HttpClient, import: &str) -> (Value, u64) {
    let rows = ok(
        client,
        "dataset_query",
        json!({ "dataset": "hostile", "limit": 500 }),
    )
    .await["structuredContent"]["rows"]
        .clone();
    (rows, staged(client, import).await)
}

#[tokio::test]
async fn hostile_requests_get_precise_errors_and_change_nothing() {
    let s = server(&sqlite_url("hostile"));
    let u42 = s.client().with_bearer(TOKEN_42);
    let u7 = s.client().with_bearer(TOKEN_7);
    committed_dataset(&u42, "hostile", 130).await;
    let import = begin(&u42, "hostile").await;
    ok(
        &u42,
        "import_append_rows",
        json!({ "import": import, "rows": rows(500, 2), "idempotency_key": "held" }),
    )
    .await;
    let theirs = begin(&u7, &unique("theirs")).await;
    let page = ok(&u42, "dataset_query", json!({ "dataset": "hostile" })).await;
    let genuine = page["structuredContent"]["nextCursor"]
        .as_str()
        .unwrap()
        .to_owned();
    let before = holdings(&u42, &import).await;

    let corpus: Vec<Case> = [
        malformed_json(),
        wrong_envelopes(),
        too_deep(),
        header_games(),
        stateless_rules(),
        forged_cursors(&genuine),
        forged_states(),
        forged_handles(&theirs),
        wrong_arguments(&import),
        oversized(&import),
    ]
    .into_iter()
    .flatten()
    .collect();
    assert!(
        corpus.len() >= 200,
        "the corpus holds {} requests",
        corpus.len()
    );
    let client = s.client();
    let mut failures = Vec::new();
    for case in &corpus {
        let reply = send(&client, case).await;
        if let Err(why) = check(case, &reply) {
            failures.push(why);
        }
        if let Some(m) = reply.response() {
            common::validate_message("tools/call", m);
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        corpus.len(),
        failures.join("\n")
    );

    // Still serving, and nothing changed: the dataset, the open import, the other's import.
    assert_eq!(holdings(&u42, &import).await, before);
    assert_eq!(staged(&u7, &theirs).await, 0);
    let after = ok(
        &u42,
        "dataset_query",
        json!({ "dataset": "hostile", "cursor": genuine }),
    )
    .await;
    assert_eq!(after["structuredContent"]["rows"][0]["id"], 100);
}
