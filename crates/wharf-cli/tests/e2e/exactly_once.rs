//! Idempotent writes over HTTP when another replica still runs the same write: the retry
//! waits `--lock-wait-secs`, is answered 503 / -31000 with `Retry-After` (safe to retry),
//! and, once the other replica committed, replays its result; nothing is written twice.
//! The other replica is this test process, on the same store through `wharf-store`.

use crate::common;

use std::time::{Duration, Instant};

use common::ServerProcess;
use common::import::*;
use serde_json::{Map, Value, json};
use wharf::store::{Begin, Claim, Digest, now_millis};
use wharf_reference::data::Data;
use wharf_store::StoreOptions;

const TOOL: &str = "import_append_rows";

/// The other replica's store, opened as `wharf serve` opens it.
fn options() -> StoreOptions {
    let mut options = StoreOptions::default();
    options.max_connections = 2;
    options.lock_wait = Duration::from_secs(60);
    options.app_migrations = Some(std::sync::Arc::new(wharf_reference::data::migrations()));
    options
}

async fn a_duplicate_of_a_write_running_elsewhere_is_503_then_replays(store: &str) {
    let mut args = replica_args(store);
    args.extend(["--lock-wait-secs", "1"].map(str::to_owned));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = ServerProcess::start_on(common::free_port(), &args);
    let client = server.client().with_bearer(TOKEN_42);
    let import = begin(&client, &unique("busy")).await;
    let call_args = json!({ "import": import, "rows": rows(0, 3), "idempotency_key": "dup-1" });

    // The other replica claims the write and is still running it (its claim, on Redis, is
    // good for a minute).
    let other = wharf_store::open(store, &options()).await.unwrap();
    let Value::Object(map) = &call_args else {
        unreachable!("arguments are an object")
    };
    let claim = Claim {
        scope: format!("h:{import}"),
        key: "dup-1".into(),
        digest: Digest::of(TOOL, map),
        expires_at: now_millis() + 3_600_000,
        owner: "user-42".into(),
    };
    let Begin::Run(mut first) = other.begin_idempotent(&claim, now_millis()).await.unwrap() else {
        panic!("the other replica's attempt is the first")
    };
    let staged_rows: Vec<Map<String, Value>> = serde_json::from_value(rows(0, 3)).unwrap();
    let record = other.load_handle(&import).await.unwrap().unwrap();
    Data::of(first.as_mut())
        .unwrap()
        .append_staged(&record, &staged_rows, 3, u64::MAX)
        .await
        .unwrap();

    let started = Instant::now();
    let busy = call(&client, TOOL, call_args.clone()).await;
    let waited = started.elapsed();
    assert_eq!(busy.status, 503, "{}", busy.body);
    assert_eq!(busy.error_code(), Some(-31000), "{}", busy.body);
    assert_eq!(
        busy.headers
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    assert!(
        waited >= Duration::from_secs(1),
        "answered busy after {waited:?}, before its --lock-wait-secs"
    );

    // The other replica finishes; the retry gets its result.
    let result = json!({
        "resultType": "complete",
        "content": [{ "type": "text", "text": "{\"appended\":3,\"stagedRows\":3}" }],
        "structuredContent": { "appended": 3, "stagedRows": 3 },
    });
    first
        .complete_claim(&claim, &result.to_string())
        .await
        .unwrap();
    first.commit().await.unwrap();
    let retry = ok(&client, TOOL, call_args).await;
    assert_eq!(
        retry["_meta"]["dev.wharf/idempotentReplay"], true,
        "{retry}"
    );
    assert_eq!(retry["structuredContent"], result["structuredContent"]);
    assert_eq!(staged(&client, &import).await, 3, "written once");
}

on_every_store!(a_duplicate_of_a_write_running_elsewhere_is_503_then_replays,);
