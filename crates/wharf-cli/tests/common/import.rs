//! Helpers for tests of the import service: a server with two users, calls that must
//! succeed or fail, rows, and time travel for handles.

use serde_json::{Value, json};
use wharf_client::{HttpClient, Reply};

use super::{ServerProcess, request};

pub(crate) const TOKEN_42: &str = "token-of-user-42-aaaaaaaa";
pub(crate) const TOKEN_7: &str = "token-of-user-7-bbbbbbbbbb";

pub(crate) fn pg_url() -> String {
    std::env::var("WHARF_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

pub(crate) fn redis_url() -> String {
    std::env::var("WHARF_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
}

pub(crate) fn sqlite_url(tag: &str) -> String {
    let dir = std::env::temp_dir().join(format!("wharf-import-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    format!("sqlite://{}/wharf.db", dir.display())
}

/// `wharf serve` with the import service on `store`, knowing users 42 and 7.
pub(crate) fn server(store: &str) -> ServerProcess {
    let args = replica_args(store);
    ServerProcess::start_exact(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// What every replica of one deployment is started with: the same store, keys and cursor
/// key.
pub(crate) fn replica_args(store: &str) -> Vec<String> {
    [
        "--profile",
        "default",
        "--store",
        store,
        "--api-key",
        &format!("user-42={TOKEN_42}"),
        "--api-key",
        &format!("user-7={TOKEN_7}"),
    ]
    .map(str::to_owned)
    .to_vec()
}

pub(crate) fn unique(prefix: &str) -> String {
    use std::hash::{BuildHasher, RandomState};
    let n = RandomState::new().hash_one(std::time::Instant::now());
    format!("{prefix}_{n:x}")
}

pub(crate) async fn call(client: &HttpClient, name: &str, args: Value) -> Reply {
    request(
        client,
        "tools/call",
        json!({ "name": name, "arguments": args }),
    )
    .await
}

/// The result of a call that must succeed (no JSON-RPC error, no `isError`).
pub(crate) async fn ok(client: &HttpClient, name: &str, args: Value) -> Value {
    let r = call(client, name, args).await;
    let result = r
        .result()
        .unwrap_or_else(|| panic!("{name}: {}", r.body))
        .clone();
    assert_ne!(result["isError"], true, "{name}: {}", r.body);
    result
}

/// The text of a call that must fail with `isError: true`.
pub(crate) async fn refused(client: &HttpClient, name: &str, args: Value) -> String {
    let r = call(client, name, args).await;
    let result = r.result().unwrap_or_else(|| panic!("{name}: {}", r.body));
    assert_eq!(
        result["isError"], true,
        "{name} should have failed: {}",
        r.body
    );
    result["content"][0]["text"].as_str().unwrap().to_owned()
}

pub(crate) fn columns() -> Value {
    json!([
        { "name": "id", "type": "integer" },
        { "name": "city", "type": "string" },
        { "name": "temp", "type": "number", "nullable": true }
    ])
}

pub(crate) fn rows(from: i64, n: i64) -> Value {
    (from..from + n)
        .map(|i| json!({ "id": i, "city": format!("c{i}"), "temp": i as f64 / 2.0 }))
        .collect()
}

pub(crate) async fn staged(client: &HttpClient, import: &str) -> u64 {
    ok(client, "import_status", json!({ "import": import })).await["structuredContent"]
        ["stagedRows"]
        .as_u64()
        .unwrap()
}

pub(crate) async fn begin(client: &HttpClient, dataset: &str) -> String {
    let r = ok(
        client,
        "import_begin",
        json!({ "dataset": dataset, "columns": columns() }),
    )
    .await;
    let import = r["structuredContent"]["import"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(import.starts_with("imp_") && import.len() == 36, "{import}");
    import
}

/// Makes time pass for a handle, straight in the store: 25 h for its whole life, or 2 h
/// since its last use.
pub(crate) async fn expire(store: &str, handle: &str, idle: bool) {
    let hour: i64 = 3_600_000;
    if idle {
        shift_times(store, handle, 2 * hour, &["last_used_at"]).await;
    } else {
        shift_times(
            store,
            handle,
            25 * hour,
            &["created_at", "expires_at", "last_used_at"],
        )
        .await;
    }
}

/// Moves some of a handle's timestamps `shift` milliseconds into the past.
pub(crate) async fn shift_times(store: &str, handle: &str, shift: i64, fields: &[&str]) {
    if store.starts_with("redis") {
        let client = ::redis::Client::open(store).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        for f in fields {
            let _: i64 = ::redis::cmd("HINCRBY")
                .arg(format!("wharf:h:{handle}"))
                .arg(f)
                .arg(-shift)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    } else {
        let set: Vec<String> = fields.iter().map(|f| format!("{f} = {f} - $1")).collect();
        let sql = format!("UPDATE wharf_handles SET {} WHERE id = $2", set.join(", "));
        let n = if store.starts_with("sqlite") {
            let pool = sqlx::SqlitePool::connect(&format!("{store}?mode=rw"))
                .await
                .unwrap();
            let done = sqlx::query(&sql).bind(shift).bind(handle).execute(&pool);
            done.await.unwrap().rows_affected()
        } else {
            let pool = sqlx::PgPool::connect(store).await.unwrap();
            let done = sqlx::query(&sql).bind(shift).bind(handle).execute(&pool);
            done.await.unwrap().rows_affected()
        };
        assert_eq!(n, 1);
    }
}
