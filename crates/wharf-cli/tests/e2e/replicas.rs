//! Several `wharf serve` processes on one store, and processes that crash: state and
//! idempotency records live in the store, so any replica serves any call, and a write
//! retried across a crash is applied exactly once.

use crate::common;

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

/// Sends one call until some replica answers it, whatever happens to the processes; the
/// answer, and whether it took more than one attempt.
async fn until_answered(client: &HttpClient, tool: &str, args: &Value) -> (Value, bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut resent = false;
    loop {
        let sent = client.call_tool(tool, args.clone()).await;
        if let Ok(reply) = sent {
            if let Some(result) = reply.result() {
                assert_ne!(result["isError"], true, "{tool}: {}", reply.body);
                return (result.clone(), resent);
            }
            // A JSON-RPC error (a busy store while the other attempt's lock is released).
            assert!(reply.status >= 500, "unexpected refusal: {}", reply.body);
        }
        assert!(Instant::now() < deadline, "{tool} never got an answer");
        resent = true;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The writes of one import in the crash test, each with its own key: begin, the appends of
/// `BATCHES_PER_IMPORT` batches of `BATCH` rows, commit. (A key of `import_begin` is the
/// principal's, kept in stores that outlive test runs: it names the run.)
fn import_writes(run: &str, n: i64) -> Vec<(&'static str, Value)> {
    let dataset = format!("{run}-{n}");
    let mut writes = vec![(
        "import_begin",
        json!({ "dataset": dataset, "columns": columns(), "idempotency_key": format!("{run}-begin-{n}") }),
    )];
    for b in 0..BATCHES_PER_IMPORT {
        let first = (n * BATCHES_PER_IMPORT + b) * BATCH;
        writes.push((
            "import_append_rows",
            json!({ "rows": rows(first, BATCH), "idempotency_key": format!("batch-{n}-{b}") }),
        ));
    }
    writes.push((
        "import_commit",
        json!({ "idempotency_key": format!("commit-{n}") }),
    ));
    writes
}

// Small imports, so that begins and commits are a third of the writes the crashes hit.
const IMPORTS: i64 = 30;
const BATCHES_PER_IMPORT: i64 = 4;
const BATCH: i64 = 50;

/// Live import handles whose import names one of the datasets of run `run`, read straight
/// from the store: a second `import_begin` that ran would leave one behind.
async fn live_imports(store: &str, run: &str) -> usize {
    let needle = format!("\"{run}-");
    if store.starts_with("redis") {
        let client = ::redis::Client::open(store).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let ids: Vec<String> = ::redis::cmd("ZRANGE")
            .arg("wharf:handles:expiry")
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .unwrap();
        let mut live = 0;
        for id in ids {
            let (kind, data): (Option<String>, Option<String>) = ::redis::cmd("HMGET")
                .arg(format!("wharf:h:{id}"))
                .arg("kind")
                .arg("data")
                .query_async(&mut conn)
                .await
                .unwrap();
            live += usize::from(
                kind.as_deref() == Some("import") && data.is_some_and(|d| d.contains(&needle)),
            );
        }
        live
    } else {
        let sql = "SELECT COUNT(*) FROM wharf_handles WHERE kind = 'import' AND data LIKE $1";
        let pattern = format!("%{needle}%");
        let n: i64 = if store.starts_with("sqlite") {
            let pool = sqlx::SqlitePool::connect(&format!("{store}?mode=ro"))
                .await
                .unwrap();
            sqlx::query_scalar(sql)
                .bind(pattern)
                .fetch_one(&pool)
                .await
                .unwrap()
        } else {
            let pool = sqlx::PgPool::connect(store).await.unwrap();
            sqlx::query_scalar(sql)
                .bind(pattern)
                .fetch_one(&pool)
                .await
                .unwrap()
        };
        usize::try_from(n).unwrap()
    }
}

/// Imports begun, filled and committed by a client that retries every write with its key
/// while the server is SIGKILLed and restarted under it: every row lands once, no import is
/// begun or committed twice, and every write retried afterwards replays its first answer.
async fn writes_survive_crashes_exactly_once(store: &str) {
    let port = common::free_port();
    let mut server = start(port, store);
    let client = server.client().with_bearer(TOKEN_42);
    let run = unique("crashy");

    // The writer says which write it is about to send, so that half of the crashes can
    // aim at a begin or a commit in flight (or just landed, its answer not yet sent).
    let (sending, mut sent) = tokio::sync::watch::channel("");
    let writer = {
        let client = client.clone();
        let run = run.clone();
        tokio::spawn(async move {
            // Every write with the arguments it was sent with (the import filled in) and its
            // first answer.
            let mut answered = Vec::new();
            for n in 0..IMPORTS {
                let mut import = Value::Null;
                for (tool, mut args) in import_writes(&run, n) {
                    if tool != "import_begin" {
                        args["import"] = import.clone();
                    }
                    sending.send_replace(tool);
                    let (answer, resent) = until_answered(&client, tool, &args).await;
                    if tool == "import_begin" {
                        import = answer["structuredContent"]["import"].clone();
                    }
                    answered.push((tool, args, answer, resent));
                }
            }
            answered
        })
    };
    // Kill the server with SIGKILL at uneven moments while the writer runs, and restart it.
    let mut kills = 0;
    let pauses = [
        40u64, 95, 25, 130, 60, 15, 80, 45, 70, 30, 110, 20, 55, 35, 90, 25,
    ];
    for (i, pause) in pauses.into_iter().cycle().take(40).enumerate() {
        if writer.is_finished() {
            break;
        }
        if i % 2 == 0 {
            tokio::time::sleep(Duration::from_millis(pause)).await;
        } else {
            // The next begin or commit the writer sends.
            let aimed = async {
                while sent.changed().await.is_ok() {
                    if *sent.borrow_and_update() != "import_append_rows" {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(2), aimed).await;
            tokio::time::sleep(Duration::from_millis(pause % 5)).await;
        }
        server.crash();
        kills += 1;
        server = start(port, store);
    }
    let answered = writer.await.unwrap();
    assert!(
        kills >= 3,
        "the writer finished before the server was killed enough ({kills})"
    );
    let backend = store.split(':').next().unwrap_or_default();
    let count = |tool: &str, replayed: bool| {
        answered
            .iter()
            .filter(|(t, _, r, resent)| {
                *t == tool
                    && if replayed {
                        r["_meta"]["dev.wharf/idempotentReplay"] == true
                    } else {
                        *resent
                    }
            })
            .count()
    };
    eprintln!("{backend}: {kills} crashes");
    for tool in ["import_begin", "import_append_rows", "import_commit"] {
        eprintln!(
            "  {tool}: {} sent again after a crash, {} answered by a replay",
            count(tool, false),
            count(tool, true)
        );
    }
    // The old client's pooled connections died with the processes.
    let client = server.client().with_bearer(TOKEN_42);
    let per_import = BATCHES_PER_IMPORT * BATCH;
    for n in 0..IMPORTS {
        let (mut ids, _) = read_pages(&client, &format!("{run}-{n}"), 500).await;
        ids.sort_unstable();
        assert_eq!(
            ids,
            (n * per_import..(n + 1) * per_import).collect::<Vec<_>>(),
            "dataset {n}: every row exactly once"
        );
    }
    let commits = answered.iter().filter(|(t, ..)| *t == "import_commit");
    for (_, _, answer, _) in commits {
        assert_eq!(answer["structuredContent"]["totalRows"], per_import);
    }
    assert_eq!(
        live_imports(store, &run).await,
        0,
        "an import was begun twice: a second handle outlived the commits"
    );

    // A client that never saw its answers retries every write with its key: each retry is a
    // replay of the first answer, and changes nothing.
    for (tool, args, first, _) in &answered {
        let retry = ok(&client, tool, args.clone()).await;
        assert_eq!(
            retry["_meta"]["dev.wharf/idempotentReplay"], true,
            "{tool} ran again: {retry}"
        );
        assert_eq!(
            retry["structuredContent"], first["structuredContent"],
            "{tool}"
        );
        assert_eq!(retry["content"], first["content"]);
    }
    assert_eq!(live_imports(store, &run).await, 0);
    for n in 0..IMPORTS {
        let (ids, _) = read_pages(&client, &format!("{run}-{n}"), 500).await;
        assert_eq!(ids.len() as i64, per_import, "the retries wrote nothing");
    }
}

#[tokio::test]
async fn postgres_any_replica_serves_any_call() {
    any_replica_serves_any_call(&pg_url()).await;
}

#[tokio::test]
async fn redis_any_replica_serves_any_call() {
    any_replica_serves_any_call(&redis_url()).await;
}

on_every_store!(writes_survive_crashes_exactly_once,);
