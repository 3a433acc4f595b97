//! How `wharf serve` is run in production: keys from a file, settings from `WHARF_*`
//! variables, `/readyz` turning away traffic when the store is gone, and a drain that ends at
//! its deadline.

use crate::common;

use std::time::Duration;

use common::import::{pg_url, unique};
use common::{ServerProcess, free_port, request};
use futures_util::StreamExt;
use serde_json::{Value, json};

const ALICE: &str = "alice-token-from-file-0001";
const BOB: &str = "bob-token-from-the-env-0002";

#[tokio::test]
async fn keys_from_a_file_and_settings_from_the_environment() {
    let dir = common::scratch(format!("wharf-ops-{}", unique("keys")));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("keys");
    std::fs::write(
        &file,
        format!("# the team's keys\n\nalice = {ALICE}\n   \n# end\n"),
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let port = free_port();
    let server = ServerProcess::start_with_env(
        port,
        &[],
        &[
            ("WHARF_PROFILE", "demo"),
            ("WHARF_ENDPOINT", "/rpc"),
            ("WHARF_API_KEYS_FILE", file),
            ("WHARF_API_KEYS", &format!("bob={BOB}")),
            ("WHARF_MAX_PER_PRINCIPAL", "1"),
            // A switch turned off in the environment is off: it conflicts with nothing.
            ("WHARF_ANONYMOUS", "false"),
            ("WHARF_AUTHORIZATION_SERVER", "false"),
        ],
    );
    let at = |path: &str| wharf_client::HttpClient::new(format!("http://127.0.0.1:{port}{path}"));
    // The endpoint the environment named, and both sources of keys.
    for token in [ALICE, BOB] {
        let r = request(
            &at("/rpc").with_bearer(token),
            "tools/call",
            json!({ "name": "echo", "arguments": { "text": "hi" } }),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let r = at("/rpc")
        .with_bearer("nobody-knows-this-token")
        .request("tools/list", json!({}))
        .await
        .unwrap();
    assert_eq!(r.status, 401, "{}", r.body);
    let r = at("/mcp")
        .with_bearer(ALICE)
        .request("tools/list", json!({}))
        .await
        .unwrap();
    assert_eq!(r.status, 404, "only the configured endpoint serves MCP");

    // WHARF_MAX_PER_PRINCIPAL took effect: Alice's second call at once is refused.
    let alice = at("/rpc").with_bearer(ALICE);
    let held = common::running_count(&alice, 1000, 100).await;
    let refused = request(
        &alice,
        "tools/call",
        json!({ "name": "echo", "arguments": { "text": "again" } }),
    )
    .await;
    assert_eq!(refused.status, 503, "{}", refused.body);
    drop(held);
    drop(server);

    let refused = |args: &[&str]| {
        let listen = format!("127.0.0.1:{}", free_port());
        common::refused_start(&listen, &[&["--profile", "demo"], args].concat(), &[])
    };
    // A key file with a broken line: the server refuses to start and says which.
    std::fs::write(dir.join("broken"), format!("alice = {ALICE}\nbob {BOB}\n")).unwrap();
    let broken = dir.join("broken");
    let said = refused(&["--api-keys-file", broken.to_str().unwrap()]);
    assert!(said.contains("PRINCIPAL=TOKEN"), "{said}");
    // Two ways to authenticate at once: refused, naming both.
    let said = refused(&["--anonymous", "--api-key", &format!("bob={BOB}")]);
    assert!(
        said.contains("--anonymous and --api-key/--api-keys-file cannot be used together"),
        "{said}"
    );
}

/// A database of its own, dropped by the test while the server runs.
async fn scratch_database() -> (String, sqlx::PgPool, String) {
    let admin = sqlx::PgPool::connect(&pg_url()).await.unwrap();
    let name = unique("wharf_ready");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&admin)
        .await
        .unwrap();
    let base = pg_url();
    let url = format!("{}/{name}", &base[..base.rfind('/').unwrap()]);
    (url, admin, name)
}

async fn readyz(port: u16) -> (u16, Value) {
    let r = reqwest::get(format!("http://127.0.0.1:{port}/readyz"))
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

#[tokio::test]
async fn readyz_fails_when_the_store_is_gone_and_liveness_does_not() {
    let (url, admin, name) = scratch_database().await;
    let server = ServerProcess::start(&["--profile", "default", "--store", &url]);
    assert_eq!(
        readyz(server.port).await,
        (200, json!({ "status": "ready" }))
    );
    sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)"))
        .execute(&admin)
        .await
        .unwrap();
    // The store is asked at most once a second: its failure shows within that.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (status, body) = loop {
        let (status, body) = readyz(server.port).await;
        if !body["failures"]["store"].is_null() || std::time::Instant::now() > deadline {
            break (status, body);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["status"], "unavailable");
    // The reason goes to the log; the answer names no database, host or user.
    assert_eq!(
        body["failures"]["store"], "does not answer (see the server's log)",
        "{body}"
    );
    server.log.wait_for("readiness check failed", 1).await;
    // Liveness is about the process, not its dependencies: restarting would not help.
    let live = reqwest::get(format!("http://127.0.0.1:{}/healthz", server.port))
        .await
        .unwrap();
    assert_eq!(live.status(), 200);
}

#[tokio::test]
async fn the_drain_deadline_cuts_off_a_request_that_outlasts_it() {
    let mut server = ServerProcess::start(&["--drain-secs", "1"]);
    // A hundred seconds of work: only the deadline can end it.
    let call = common::running_count(&server.client(), 1000, 100).await;
    server.terminate();
    server.log.wait_for("drain deadline passed", 1).await;
    // The stream ends without an answer: the request was cut off, not finished.
    let rest: Vec<Value> = call.collect().await;
    assert!(
        rest.iter().all(|m| m["method"] == "notifications/progress"),
        "{rest:?}"
    );
    assert!(
        server.wait_exit(Duration::from_secs(30)).success(),
        "a drain that ends at its deadline is still an orderly exit"
    );
}

/// Options the chosen way of authenticating does not use are named at startup (they were
/// ignored in silence: `--oauth-required-scope` beside API keys required nothing), and
/// those it uses are not.
#[tokio::test]
async fn options_the_server_does_not_use_are_named() {
    let server = ServerProcess::start(&[
        "--api-key",
        &format!("alice={ALICE}"),
        "--oauth-required-scope",
        "admin",
        "--public-url",
        "https://mcp.example.com",
        "--trusted-proxy",
        "10.0.0.0/8",
    ]);
    let warned: Vec<String> = server
        .log
        .lines()
        .into_iter()
        .filter(|l| l.contains("these options are not used"))
        .collect();
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(
        warned[0].contains("--oauth-required-scope, --public-url, --trusted-proxy"),
        "{warned:?}"
    );
    assert!(!warned[0].contains("--api-key"), "{warned:?}");
}

/// One `wharf serve` per SQLite file: a second one is refused at start, naming the file,
/// while the first serves (calls in steps take turns and changes are heard only within one
/// process); `wharf user` still runs beside it, and once the first stopped the file is free.
#[tokio::test]
async fn a_sqlite_file_is_served_by_one_process() {
    let store = common::import::sqlite_url(&unique("one-process"));
    let args = ["--profile", "default", "--store", &store, "--anonymous"];
    let first = ServerProcess::start_exact(&args);
    let listen = format!("127.0.0.1:{}", free_port());
    let said = common::refused_start(&listen, &args, &[]);
    assert!(
        said.contains("another wharf serve is serving the SQLite store"),
        "{said}"
    );
    common::authz::add_user(&store, "alice");
    drop(first);
    let again = ServerProcess::start_exact(&args);
    assert_eq!(
        request(&again.client(), "tools/list", json!({}))
            .await
            .status,
        200
    );
}
