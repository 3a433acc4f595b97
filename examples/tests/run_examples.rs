//! Runs each example as a newcomer would (the built binary, a real socket) and calls it over
//! HTTP the way an MCP client does.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

/// A running example, killed when dropped.
struct Example {
    child: Child,
    url: String,
}

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn binary(name: &str) -> PathBuf {
    // This test runs from target/<profile>/deps; cargo builds examples beside it.
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name)
}

fn start(name: &str, env: &[(&str, String)]) -> Example {
    let mut cmd = Command::new(binary(name));
    cmd.env("ADDR", "127.0.0.1:0")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("{name} did not start: {e}"));
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("{name} printed {line:?}"))
        .to_owned();
    Example { child, url }
}

const META: &str = "io.modelcontextprotocol/protocolVersion";

/// A `tools/call` with the headers and `_meta` a 2026-07-28 client sends.
async fn call(
    url: &str,
    name: &str,
    mut params: Value,
    cookie: Option<&str>,
) -> (reqwest::StatusCode, Value) {
    params["name"] = json!(name);
    params["_meta"][META] = json!("2026-07-28");
    if params["_meta"]["io.modelcontextprotocol/clientCapabilities"].is_null() {
        params["_meta"]["io.modelcontextprotocol/clientCapabilities"] = json!({});
    }
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params });
    let mut req = reqwest::Client::new()
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", name)
        .json(&body);
    if let Some(cookie) = cookie {
        req = req.header("cookie", cookie);
    }
    let res = req.send().await.unwrap();
    let status = res.status();
    (status, res.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn hello_tools_greets_and_adds() {
    let ex = start("hello_tools", &[]);
    let (status, body) = call(
        &ex.url,
        "greet",
        json!({ "arguments": { "name": "Ada" } }),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["content"][0]["text"], "Hello, Ada!");
    let (_, body) = call(
        &ex.url,
        "add",
        json!({ "arguments": { "a": 2, "b": 3 } }),
        None,
    )
    .await;
    assert_eq!(body["result"]["structuredContent"]["sum"], 5.0, "{body}");
    // A sum past f64 is a result the model reads, not a protocol error.
    let (_, body) = call(
        &ex.url,
        "add",
        json!({ "arguments": { "a": 1e308, "b": 1e308 } }),
        None,
    )
    .await;
    assert_eq!(body["result"]["isError"], true, "{body}");
}

#[tokio::test]
async fn confirm_asks_then_acts_once() {
    let (dir, store) = confirm_store("wharf-example");
    let ex = start("confirm", &[("STORE", store)]);
    let caps = json!({ "elicitation": { "form": {} } });
    let ask = json!({ "arguments": { "path": "/tmp/x" },
        "_meta": { "io.modelcontextprotocol/clientCapabilities": caps } });
    let (status, body) = call(&ex.url, "delete_file", ask.clone(), None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["resultType"], "input_required", "{body}");
    let state = body["result"]["requestState"].clone();
    assert_eq!(
        body["result"]["inputRequests"]["confirm"]["method"],
        "elicitation/create"
    );

    let mut answer = ask.clone();
    answer["requestState"] = state;
    answer["inputResponses"] =
        json!({ "confirm": { "action": "accept", "content": { "delete": true } } });
    let (_, body) = call(&ex.url, "delete_file", answer.clone(), None).await;
    assert_eq!(
        body["result"]["content"][0]["text"], "Deleted /tmp/x.",
        "{body}"
    );
    // The same confirmation again: redeemed already, refused.
    let (_, body) = call(&ex.url, "delete_file", answer, None).await;
    assert_eq!(body["error"]["code"], -32602, "{body}");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn axum_mount_serves_the_app_and_trusts_its_session() {
    let ex = start("axum_mount", &[]);
    let (status, body) = call(&ex.url, "whoami", json!({ "arguments": {} }), None).await;
    assert_eq!(status, 401, "no session, no principal: {body}");
    // Ids Wharf keeps for its own principals (and an empty one) are nobody.
    for cookie in [
        "session=",
        "session=anonymous",
        "session=https://issuer#alice",
    ] {
        let (status, body) =
            call(&ex.url, "whoami", json!({ "arguments": {} }), Some(cookie)).await;
        assert_eq!(status, 401, "{cookie}: {body}");
    }
    let (status, body) = call(
        &ex.url,
        "whoami",
        json!({ "arguments": {} }),
        Some("session=alice"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["content"][0]["text"], "alice");
    // The scopes the app gave each user limit it as a token's would.
    let admin = |cookie| call(&ex.url, "admin", json!({ "arguments": {} }), Some(cookie));
    let (status, body) = admin("session=alice").await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], -31003, "{body}");
    let (status, body) = admin("session=admin").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["content"][0]["text"], "the admin's view");
    let home = ex.url.trim_end_matches("mcp");
    let page = reqwest::get(home).await.unwrap().text().await.unwrap();
    assert_eq!(page, "the app's own pages");
}

#[tokio::test]
async fn pg_orders_writes_its_own_table_once_per_key() {
    let pg = std::env::var("WHARF_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let ex = start("pg_orders", &[("STORE", pg.clone())]);
    let item = format!("widget-{}-{}", std::process::id(), rand_suffix());
    let args = json!({ "arguments": { "item": item, "quantity": 3, "idempotency_key": item } });
    let (status, first) = call(&ex.url, "place_order", args.clone(), None).await;
    assert_eq!(status, 200, "{first}");
    let order = first["result"]["structuredContent"]["order"].clone();
    assert!(order.is_i64(), "{first}");
    // The client lost the answer and retries: the same order, replayed, nothing inserted.
    let (_, again) = call(&ex.url, "place_order", args, None).await;
    assert_eq!(
        again["result"]["structuredContent"]["order"], order,
        "{again}"
    );
    assert_eq!(
        again["result"]["_meta"]["dev.wharf/idempotentReplay"], true,
        "{again}"
    );
    let pool = sqlx::PgPool::connect(&pg).await.unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM example_orders WHERE item = $1")
        .bind(&item)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 1, "one row for one key");
}

/// A SQLite store for the `confirm` example, in a directory of its own under the target's
/// directory for test files: the directory (the test removes it) and the store's URL.
fn confirm_store(tag: &str) -> (std::path::PathBuf, String) {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("confirm.db").display());
    (dir, url)
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

#[tokio::test]
async fn the_client_example_approves_the_confirm_example() {
    let (dir, store) = confirm_store("wharf-example-client");
    let server = start("confirm", &[("STORE", store)]);
    let out = Command::new(binary("client"))
        .args([&server.url, "delete_file", r#"{"path":"/tmp/x"}"#])
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        printed.lines().collect::<Vec<_>>(),
        [
            "speaking 2026-07-28",
            "tool delete_file",
            "approving: Delete /tmp/x?",
            "Deleted /tmp/x.",
        ]
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Ctrl-C (SIGINT) stops an example that holds a listen stream open: the stream ends (the
/// shutdown ends the server's streams) and the process exits, where it would wait for the
/// stream's connection for ever.
#[tokio::test]
async fn ctrl_c_stops_an_example_with_a_stream_open() {
    let mut ex = start("hello_tools", &[]);
    let listen = json!({ "jsonrpc": "2.0", "id": 1, "method": "subscriptions/listen",
        "params": { "notifications": { "toolsListChanged": true },
            "_meta": { META: "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {} } } });
    let mut stream = reqwest::Client::new()
        .post(&ex.url)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "subscriptions/listen")
        .json(&listen)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    // The acknowledgment: the stream is open.
    let first = stream.chunk().await.unwrap().expect("acknowledged");
    assert!(
        String::from_utf8_lossy(&first).contains("acknowledged"),
        "{first:?}"
    );
    let killed = Command::new("kill")
        .args(["-INT", &ex.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let exited = tokio::task::spawn_blocking(move || ex.child.wait().unwrap());
    // The deadline only turns a hang into a failure.
    let status = tokio::time::timeout(std::time::Duration::from_secs(20), exited)
        .await
        .expect("the example exited after Ctrl-C")
        .unwrap();
    assert!(status.success(), "{status:?}");
    while stream.chunk().await.ok().flatten().is_some() {}
}
