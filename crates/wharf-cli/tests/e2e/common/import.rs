//! Helpers for tests of the import service: a server with two users, calls that must
//! succeed or fail, rows, listen streams, confirmation rounds, and time travel for handles.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value, json};
use wharf_client::{HttpClient, Reply};

use super::{ServerProcess, request, validate_reply};

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
    let dir = super::scratch(format!("wharf-import-{}-{tag}", std::process::id()));
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
        json!({ "dataset": dataset, "columns": columns(), "idempotency_key": unique("begin") }),
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

/// A `subscriptions/listen` stream subscribed to `uri`, past its acknowledgment.
pub(crate) async fn listen(
    client: &HttpClient,
    uri: &str,
) -> impl futures_util::Stream<Item = Value> + use<> {
    let mut stream = Box::pin(
        client
            .open_stream(
                "subscriptions/listen",
                json!({ "notifications": { "resourceSubscriptions": [uri] } }),
            )
            .await
            .unwrap(),
    );
    let ack = next_notification(&mut stream).await;
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    assert_eq!(
        ack["params"]["notifications"]["resourceSubscriptions"],
        json!([uri])
    );
    stream
}

pub(crate) async fn next_notification(
    stream: &mut (impl futures_util::Stream<Item = Value> + Unpin),
) -> Value {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("a message in time")
        .expect("the stream is open")
}

/// `dataset_delete` of `dataset`: the question, or with `state` the confirmed answer.
pub(crate) async fn confirm_round(
    client: &HttpClient,
    dataset: &str,
    state: Option<&str>,
) -> Value {
    let mut params = json!({
        "name": "dataset_delete",
        "arguments": { "dataset": dataset, "idempotency_key": format!("delete-{dataset}") },
        "_meta": { "io.modelcontextprotocol/clientCapabilities": { "elicitation": {} } }
    });
    if let Some(state) = state {
        params["requestState"] = json!(state);
        params["inputResponses"] =
            json!({ "confirm_delete": { "action": "accept", "content": { "delete": true } } });
    }
    let reply = client.request("tools/call", params).await.unwrap();
    validate_reply("tools/call", &reply);
    let result = reply
        .result()
        .unwrap_or_else(|| panic!("{}", reply.body))
        .clone();
    let expected = if state.is_some() {
        "complete"
    } else {
        "input_required"
    };
    assert_eq!(result["resultType"], expected, "{}", reply.body);
    result
}

/// Dataset `name` of `n` rows (ids 0 to n-1), committed through one import.
pub(crate) async fn committed_dataset(client: &HttpClient, name: &str, n: i64) {
    let import = begin(client, name).await;
    ok(
        client,
        "import_append_rows",
        json!({ "import": import, "rows": rows(0, n), "idempotency_key": unique("k") }),
    )
    .await;
    ok(
        client,
        "import_commit",
        json!({ "import": import, "idempotency_key": "commit" }),
    )
    .await;
}

/// Every row id of `dataset`, read `limit` at a time, and how many pages that took.
pub(crate) async fn read_pages(
    client: &HttpClient,
    dataset: &str,
    limit: u32,
) -> (Vec<i64>, usize) {
    let mut ids = Vec::new();
    let mut cursor = Value::Null;
    let mut pages = 0;
    loop {
        let mut args = json!({ "dataset": dataset, "limit": limit });
        if !cursor.is_null() {
            args["cursor"] = cursor.clone();
        }
        let page = ok(client, "dataset_query", args).await;
        pages += 1;
        ids.extend(
            page["structuredContent"]["rows"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["id"].as_i64().unwrap()),
        );
        cursor = page["structuredContent"]["nextCursor"].clone();
        if cursor.is_null() {
            return (ids, pages);
        }
    }
}

/// Runs each of the named `async fn(store: &str)` tests on SQLite (a file of its own),
/// PostgreSQL and Redis, as `sqlite::name`, `postgres::name` and `redis::name`. (Not every
/// test file that includes these helpers uses it.)
#[allow(unused_macros)]
macro_rules! on_every_store {
    ($($test:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test] async fn $test() { super::$test(&super::common::import::sqlite_url(stringify!($test))).await; })*
        }
        mod postgres {
            $(#[tokio::test] async fn $test() { super::$test(&super::common::import::pg_url()).await; })*
        }
        mod redis {
            $(#[tokio::test] async fn $test() { super::$test(&super::common::import::redis_url()).await; })*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use on_every_store;
