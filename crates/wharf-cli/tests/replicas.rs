//! Several `wharf serve` processes on one store, and processes that crash: state and
//! idempotency records live in the store, so any replica serves any call, and a write
//! retried across a crash is applied exactly once.

mod common;

use std::time::{Duration, Instant};

use common::import::*;
use common::{ServerProcess, validate_message};
use futures_util::StreamExt;
use serde_json::{Value, json};
use wharf_client::HttpClient;

fn start(port: u16, store: &str) -> ServerProcess {
    let args = replica_args(store);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ServerProcess::start_on(port, &args)
}

/// Replicas started with nothing but the store and credentials: no key handed to them.
async fn any_replica_serves_any_call(store: &str) {
    let a = start(common::free_port(), store);
    let b = start(common::free_port(), store);
    let c = start(common::free_port(), store);
    let (on_a, on_b, on_c) = (
        a.client().with_bearer(TOKEN_42),
        b.client().with_bearer(TOKEN_42),
        c.client().with_bearer(TOKEN_42),
    );
    let dataset = unique("replicated");
    // A listen stream on the third replica, subscribed to the dataset; another principal
    // subscribed to a dataset of the same name hears nothing of it.
    let uri = format!("dataset://{dataset}");
    let mut updates = Box::pin(listen(&on_c, &uri).await);
    let on_c_7 = c.client().with_bearer(TOKEN_7);
    let mut others = Box::pin(listen(&on_c_7, &uri).await);

    let import = begin(&on_a, &dataset).await;
    let args = json!({ "import": import, "rows": rows(0, 5), "idempotency_key": "r-1" });
    let first = ok(&on_a, "import_append_rows", args.clone()).await;
    // The retry lands on the other replica: it finds the record and replays.
    let replay = ok(&on_b, "import_append_rows", args).await;
    assert_eq!(replay["structuredContent"], first["structuredContent"]);
    assert_eq!(replay["_meta"]["dev.wharf/idempotentReplay"], true);
    ok(
        &on_b,
        "import_append_rows",
        json!({ "import": import, "rows": rows(5, 5), "idempotency_key": "r-2" }),
    )
    .await;
    assert_eq!(staged(&on_a, &import).await, 10);
    // Another principal is refused on either replica.
    let u7 = b.client().with_bearer(TOKEN_7);
    let no = refused(&u7, "import_status", json!({ "import": import })).await;
    assert!(no.contains("unknown or has expired"), "{no}");
    ok(
        &on_b,
        "import_commit",
        json!({ "import": import, "idempotency_key": "commit" }),
    )
    .await;
    // The commit, made through the second replica, reaches the stream on the third.
    let n = next_notification(&mut updates).await;
    validate_message("subscriptions/listen", &n);
    assert_eq!(n["method"], "notifications/resources/updated", "{n}");
    assert_eq!(n["params"]["uri"], uri.as_str());

    // A query cursor issued by one replica resumes on the others.
    let page = ok(
        &on_a,
        "dataset_query",
        json!({ "dataset": dataset, "limit": 4 }),
    )
    .await;
    let cursor = page["structuredContent"]["nextCursor"]
        .as_str()
        .unwrap()
        .to_owned();
    let middle = ok(
        &on_b,
        "dataset_query",
        json!({ "dataset": dataset, "cursor": cursor, "limit": 4 }),
    )
    .await;
    let cursor = middle["structuredContent"]["nextCursor"]
        .as_str()
        .unwrap()
        .to_owned();
    let rest = ok(
        &on_c,
        "dataset_query",
        json!({ "dataset": dataset, "cursor": cursor }),
    )
    .await;
    let ids: Vec<i64> = [&page, &middle, &rest]
        .iter()
        .flat_map(|p| p["structuredContent"]["rows"].as_array().unwrap().clone())
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, (0..10).collect::<Vec<_>>());

    // A confirmation asked by one replica is answered on another.
    let asked = confirm_round(&on_a, &dataset, None).await;
    let state = asked["requestState"].as_str().unwrap().to_owned();
    let done = confirm_round(&on_c, &dataset, Some(&state)).await;
    assert_eq!(done["structuredContent"]["deletedRows"], 10, "{done}");
    let n = next_notification(&mut updates).await;
    assert_eq!(n["method"], "notifications/resources/updated", "{n}");
    assert_eq!(n["params"]["uri"], uri.as_str());
    assert!(
        tokio::time::timeout(Duration::from_millis(500), others.next())
            .await
            .is_err(),
        "another principal's stream hears nothing of this dataset"
    );
}

/// On SQLite the shared keys live in the file: a cursor issued before a restart resumes
/// after it.
#[tokio::test]
async fn sqlite_cursors_survive_a_restart() {
    let store = sqlite_url("restart-keys");
    let port = common::free_port();
    let mut first = start(port, &store);
    let client = first.client().with_bearer(TOKEN_42);
    let dataset = unique("kept");
    committed_dataset(&client, &dataset, 6).await;
    let page = ok(
        &client,
        "dataset_query",
        json!({ "dataset": dataset, "limit": 4 }),
    )
    .await;
    let cursor = page["structuredContent"]["nextCursor"].clone();
    first.crash();
    let second = start(common::free_port(), &store);
    let rest = ok(
        &second.client().with_bearer(TOKEN_42),
        "dataset_query",
        json!({ "dataset": dataset, "cursor": cursor }),
    )
    .await;
    let ids: Vec<i64> = rest["structuredContent"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [4, 5]);
}

/// Sends one append until some replica answers it, whatever happens to the processes.
async fn append_until_answered(client: &HttpClient, import: &str, batch: i64, size: i64) -> Value {
    let args = json!({
        "import": import,
        "rows": rows(batch * size, size),
        "idempotency_key": format!("batch-{batch}"),
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let sent = client.call_tool("import_append_rows", args.clone()).await;
        if let Ok(reply) = sent {
            if let Some(result) = reply.result() {
                assert_ne!(result["isError"], true, "{}", reply.body);
                return result.clone();
            }
            // A JSON-RPC error (a busy store while the other attempt's lock is released).
            assert!(reply.status >= 500, "unexpected refusal: {}", reply.body);
        }
        assert!(
            Instant::now() < deadline,
            "batch {batch} never got an answer"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn writes_survive_crashes_exactly_once(store: &str) {
    const BATCHES: i64 = 150;
    const SIZE: i64 = 20;
    let port = common::free_port();
    let mut server = start(port, store);
    let client = server.client().with_bearer(TOKEN_42);
    let dataset = unique("crashy");
    let import = begin(&client, &dataset).await;

    let writer = {
        let client = client.clone();
        let import = import.clone();
        tokio::spawn(async move {
            let mut answers = Vec::new();
            for batch in 0..BATCHES {
                let r = append_until_answered(&client, &import, batch, SIZE).await;
                assert_eq!(r["structuredContent"]["appended"], SIZE);
                answers.push(r);
            }
            answers
        })
    };
    // Kill the server with SIGKILL at uneven moments while the writer runs, and restart it.
    let mut kills = 0;
    for pause in [40u64, 95, 25, 130, 60, 15, 80, 45, 70, 30, 110, 20] {
        if writer.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(pause)).await;
        server.crash();
        kills += 1;
        server = start(port, store);
    }
    let answers = writer.await.unwrap();
    assert!(
        kills >= 3,
        "the writer finished before the server was killed enough ({kills})"
    );
    let replays = answers
        .iter()
        .filter(|r| r["_meta"]["dev.wharf/idempotentReplay"] == true)
        .count();
    let backend = store.split(':').next().unwrap_or_default();
    eprintln!("{backend}: {kills} crashes, {replays} batches answered by a replay");
    // The old client's pooled connections died with the processes.
    let client = server.client().with_bearer(TOKEN_42);
    assert_eq!(staged(&client, &import).await, (BATCHES * SIZE) as u64);

    // A client that never saw its answers retries every batch with its key: each retry is a
    // replay of the first result, and appends nothing.
    for (batch, first) in (0..BATCHES).zip(&answers) {
        let args = json!({
            "import": import,
            "rows": rows(batch * SIZE, SIZE),
            "idempotency_key": format!("batch-{batch}"),
        });
        let retry = ok(&client, "import_append_rows", args).await;
        assert_eq!(
            retry["_meta"]["dev.wharf/idempotentReplay"], true,
            "batch {batch} ran again: {retry}"
        );
        assert_eq!(
            retry["structuredContent"], first["structuredContent"],
            "batch {batch} replays its first result"
        );
        assert_eq!(retry["content"], first["content"]);
    }
    assert_eq!(
        staged(&client, &import).await,
        (BATCHES * SIZE) as u64,
        "the retries appended nothing"
    );
    let done = ok(
        &client,
        "import_commit",
        json!({ "import": import, "idempotency_key": "commit" }),
    )
    .await;
    assert_eq!(done["structuredContent"]["totalRows"], BATCHES * SIZE);
    let (mut ids, _) = read_pages(&client, &dataset, 500).await;
    ids.sort_unstable();
    assert_eq!(
        ids,
        (0..BATCHES * SIZE).collect::<Vec<_>>(),
        "every row exactly once"
    );
}

#[tokio::test]
async fn postgres_any_replica_serves_any_call() {
    any_replica_serves_any_call(&pg_url()).await;
}

#[tokio::test]
async fn redis_any_replica_serves_any_call() {
    any_replica_serves_any_call(&redis_url()).await;
}

#[tokio::test]
async fn postgres_writes_survive_crashes_exactly_once() {
    writes_survive_crashes_exactly_once(&pg_url()).await;
}

#[tokio::test]
async fn sqlite_writes_survive_crashes_exactly_once() {
    writes_survive_crashes_exactly_once(&sqlite_url("crash")).await;
}

#[tokio::test]
async fn redis_writes_survive_crashes_exactly_once() {
    writes_survive_crashes_exactly_once(&redis_url()).await;
}
