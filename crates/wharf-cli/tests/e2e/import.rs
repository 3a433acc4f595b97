//! The import service over real HTTP, on each store: owner-checked handles, expiry,
//! idempotent appends (replays, conflicting reuse, simultaneous duplicates), commit, query.
//! Every message is schema-validated.

use crate::common;

use common::import::*;
use common::{request, validate_reply};
use serde_json::{Value, json};

async fn handles_belong_to_their_owner(store: &str) {
    let s = server(store);
    let (u42, u7) = (
        s.client().with_bearer(TOKEN_42),
        s.client().with_bearer(TOKEN_7),
    );
    let import = begin(&u42, &unique("weather")).await;
    ok(
        &u42,
        "import_append_rows",
        json!({ "import": import, "rows": rows(0, 2), "idempotency_key": "k-1" }),
    )
    .await;

    let unknown = refused(
        &u7,
        "import_status",
        json!({ "import": "imp_00000000000000000000000000000000" }),
    )
    .await;
    assert!(unknown.contains("unknown or has expired"), "{unknown}");
    assert!(unknown.contains("import_begin"), "{unknown}");
    // Another principal's handle, an unknown one and a malformed one get the same answer.
    for (tool, extra) in [
        ("import_status", json!({})),
        (
            "import_append_rows",
            json!({ "rows": rows(10, 1), "idempotency_key": "k-7" }),
        ),
        ("import_commit", json!({ "idempotency_key": "k-7" })),
        ("import_abort", json!({ "idempotency_key": "k-7" })),
    ] {
        let mut args = extra.clone();
        args["import"] = json!(import);
        assert_eq!(refused(&u7, tool, args).await, unknown, "{tool}");
        let mut args = extra;
        args["import"] = json!("not a handle at all");
        assert_eq!(refused(&u7, tool, args).await, unknown, "{tool}");
    }
    // Nothing changed for the owner.
    assert_eq!(staged(&u42, &import).await, 2);
}

async fn appends_are_applied_once_per_key(store: &str) {
    let s = server(store);
    let u42 = s.client().with_bearer(TOKEN_42);
    let import = begin(&u42, &unique("weather")).await;
    let args = json!({ "import": import, "rows": rows(0, 3), "idempotency_key": "batch-1" });
    let first = ok(&u42, "import_append_rows", args.clone()).await;
    assert_eq!(
        first["structuredContent"],
        json!({ "appended": 3, "stagedRows": 3 })
    );
    assert!(first["_meta"].get("dev.wharf/idempotentReplay").is_none());

    // The same call again (a new JSON-RPC id, as after a broken stream): the first result,
    // marked as a replay, and no second write.
    let again = ok(&u42, "import_append_rows", args.clone()).await;
    assert_eq!(again["structuredContent"], first["structuredContent"]);
    assert_eq!(again["content"], first["content"]);
    assert_eq!(again["_meta"]["dev.wharf/idempotentReplay"], true);
    assert_eq!(staged(&u42, &import).await, 3);

    // The same key with other rows is refused, and changes nothing.
    let conflict = refused(
        &u42,
        "import_append_rows",
        json!({ "import": import, "rows": rows(100, 1), "idempotency_key": "batch-1" }),
    )
    .await;
    assert!(
        conflict.contains("already used") && conflict.contains("other arguments"),
        "{conflict}"
    );
    assert_eq!(staged(&u42, &import).await, 3);

    // A new key is a new write; a bad row fails the whole call and records nothing, so the
    // corrected retry with the same key goes through.
    ok(
        &u42,
        "import_append_rows",
        json!({ "import": import, "rows": rows(3, 2), "idempotency_key": "batch-2" }),
    )
    .await;
    let bad = refused(
        &u42,
        "import_append_rows",
        json!({ "import": import, "rows": [{ "id": "x", "city": "c" }], "idempotency_key": "batch-3" }),
    )
    .await;
    assert!(
        bad.contains("Row 0") && bad.contains("\"id\"") && bad.contains("integer"),
        "{bad}"
    );
    assert_eq!(staged(&u42, &import).await, 5);
    let bad_key = call(
        &u42,
        "import_append_rows",
        json!({ "import": import, "rows": rows(0, 1) }),
    )
    .await;
    // Without its idempotency key: a result the model reads, naming the key.
    let refused = bad_key
        .result()
        .unwrap_or_else(|| panic!("{}", bad_key.body));
    assert_eq!(refused["isError"], true, "{}", bad_key.body);
    assert!(bad_key.body.contains("idempotency_key"), "{}", bad_key.body);
    assert_eq!(staged(&u42, &import).await, 5);
}

async fn simultaneous_duplicates_write_once(store: &str) {
    let s = server(store);
    let u42 = s.client().with_bearer(TOKEN_42);
    let import = begin(&u42, &unique("weather")).await;
    for round in 0..5 {
        let args = json!({ "import": import, "rows": rows(round * 10, 10), "idempotency_key": format!("dup-{round}") });
        let calls = (0..4).map(|_| call(&u42, "import_append_rows", args.clone()));
        let replies = futures_util::future::join_all(calls).await;
        let results: Vec<&Value> = replies
            .iter()
            .map(|r| r.result().unwrap_or_else(|| panic!("{}", r.body)))
            .collect();
        for r in &results {
            assert_eq!(r["structuredContent"], results[0]["structuredContent"]);
        }
        let replays = results
            .iter()
            .filter(|r| r["_meta"]["dev.wharf/idempotentReplay"] == true)
            .count();
        assert_eq!(replays, 3, "exactly one of four identical calls ran");
    }
    assert_eq!(staged(&u42, &import).await, 50);
}

async fn commit_query_and_read(store: &str) {
    let s = server(store);
    let u42 = s.client().with_bearer(TOKEN_42);
    let dataset = unique("weather");
    let import = begin(&u42, &dataset).await;
    for b in 0..3 {
        ok(&u42, "import_append_rows", json!({ "import": import, "rows": rows(b * 100, 100), "idempotency_key": format!("b{b}") })).await;
    }
    let done = ok(
        &u42,
        "import_commit",
        json!({ "import": import, "idempotency_key": "commit" }),
    )
    .await;
    assert_eq!(done["structuredContent"]["committedRows"], 300);
    assert_eq!(done["structuredContent"]["totalRows"], 300);
    // The commit retried (its answer lost) replays; the rows are not committed twice. The
    // same handle and key are nothing to another principal.
    let commit = json!({ "import": import, "idempotency_key": "commit" });
    let again = ok(&u42, "import_commit", commit.clone()).await;
    assert_eq!(again["structuredContent"], done["structuredContent"]);
    assert_eq!(
        again["_meta"]["dev.wharf/idempotentReplay"], true,
        "{again}"
    );
    let u7 = s.client().with_bearer(TOKEN_7);
    let stranger = refused(&u7, "import_commit", commit).await;
    assert!(stranger.contains("unknown or has expired"), "{stranger}");
    // The handle is retired with the commit.
    let gone = refused(&u42, "import_status", json!({ "import": import })).await;
    assert!(gone.contains("unknown or has expired"), "{gone}");

    // Paging with signed cursors, filters applied across pages.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut args = json!({ "dataset": dataset, "filters": [{ "column": "id", "op": "gte", "value": 250 }], "limit": 20 });
        if let Some(c) = &cursor {
            args["cursor"] = json!(c);
        }
        let page = ok(&u42, "dataset_query", args).await;
        let sc = &page["structuredContent"];
        seen.extend(
            sc["rows"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["id"].as_i64().unwrap()),
        );
        match sc["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen, (250..300).collect::<Vec<_>>());
    // A forged cursor, and a cursor used for another query, are tool errors the model can
    // act on (list again), naming the cursor.
    let cursor_refused = |r: &wharf_client::Reply| {
        let result = r.result().unwrap_or_else(|| panic!("{}", r.body));
        assert_eq!(result["isError"], true, "{}", r.body);
        assert!(r.body.contains("Invalid cursor"), "{}", r.body);
    };
    let forged = call(
        &u42,
        "dataset_query",
        json!({ "dataset": dataset, "cursor": "AAAA" }),
    )
    .await;
    cursor_refused(&forged);
    let first = ok(
        &u42,
        "dataset_query",
        json!({ "dataset": dataset, "limit": 1 }),
    )
    .await;
    let c = first["structuredContent"]["nextCursor"].as_str().unwrap();
    let moved = call(&u42, "dataset_query", json!({ "dataset": dataset, "limit": 1, "cursor": c, "filters": [{ "column": "id", "op": "eq", "value": 1 }] })).await;
    cursor_refused(&moved);
    assert!(moved.body.contains("another listing"), "{}", moved.body);
    // Another principal does not see the dataset.
    let u7 = s.client().with_bearer(TOKEN_7);
    let hidden = refused(&u7, "dataset_query", json!({ "dataset": dataset })).await;
    assert!(hidden.contains("does not exist"), "{hidden}");

    let read = request(
        &u42,
        "resources/read",
        json!({ "uri": format!("dataset://{dataset}") }),
    )
    .await;
    let text = read.result().unwrap()["contents"][0]["text"]
        .as_str()
        .unwrap();
    let body: Value = serde_json::from_str(text).unwrap();
    assert_eq!(body["rowCount"], 300);
    assert_eq!(body["firstRows"][0]["id"], 0);
    let missing = request(
        &u7,
        "resources/read",
        json!({ "uri": format!("dataset://{dataset}") }),
    )
    .await;
    assert_eq!(missing.error_code(), Some(-32602));
}

async fn aborted_imports_are_gone(store: &str) {
    let s = server(store);
    let u42 = s.client().with_bearer(TOKEN_42);
    let import = begin(&u42, &unique("weather")).await;
    ok(
        &u42,
        "import_append_rows",
        json!({ "import": import, "rows": rows(0, 4), "idempotency_key": "a" }),
    )
    .await;
    let abort = json!({ "import": import, "idempotency_key": "abort-1" });
    let r = ok(&u42, "import_abort", abort.clone()).await;
    assert_eq!(r["structuredContent"]["discardedRows"], 4);
    assert!(
        r["_meta"].get("dev.wharf/idempotentReplay").is_none(),
        "{r}"
    );
    let gone = refused(
        &u42,
        "import_append_rows",
        json!({ "import": import, "rows": rows(0, 1), "idempotency_key": "b" }),
    )
    .await;
    assert!(gone.contains("unknown or has expired"), "{gone}");
    // The abort retried (its answer was lost, say) replays the first result, though the
    // import is gone; nothing is discarded twice.
    let again = ok(&u42, "import_abort", abort.clone()).await;
    assert_eq!(again["structuredContent"], r["structuredContent"]);
    assert_eq!(
        again["_meta"]["dev.wharf/idempotentReplay"], true,
        "{again}"
    );
    // Other arguments under the key, or a new key, find the import gone; another principal
    // with the same handle and key gets nothing of the first caller's.
    let other_key = json!({ "import": import, "idempotency_key": "abort-2" });
    let other = refused(&u42, "import_abort", other_key).await;
    assert!(other.contains("unknown or has expired"), "{other}");
    let u7 = s.client().with_bearer(TOKEN_7);
    let stranger = refused(&u7, "import_abort", abort).await;
    assert!(stranger.contains("unknown or has expired"), "{stranger}");
}

/// `import_begin` retried with its key returns the import the first call began (no second
/// import); the same key is another principal's own.
async fn begin_is_applied_once_per_key(store: &str) {
    let s = server(store);
    let (u42, u7) = (
        s.client().with_bearer(TOKEN_42),
        s.client().with_bearer(TOKEN_7),
    );
    let args = json!({ "dataset": unique("once"), "columns": columns(), "idempotency_key": unique("begin") });
    let before = now_ms();
    let first = ok(&u42, "import_begin", args.clone()).await;
    // An import unused for an hour expires (its 24 h lifetime is the later limit): the
    // time it gives is the hour's end.
    let expires = first["structuredContent"]["expiresAt"].as_i64().unwrap();
    assert!(
        (before + 3_600_000..=now_ms() + 3_600_000).contains(&expires),
        "{first}"
    );
    let again = ok(&u42, "import_begin", args.clone()).await;
    assert_eq!(again["structuredContent"], first["structuredContent"]);
    assert_eq!(
        again["_meta"]["dev.wharf/idempotentReplay"], true,
        "{again}"
    );
    let import = first["structuredContent"]["import"].as_str().unwrap();
    assert_eq!(staged(&u42, import).await, 0);
    let theirs = ok(&u7, "import_begin", args.clone()).await;
    assert_ne!(theirs["structuredContent"]["import"], import);
    assert!(
        theirs["_meta"].get("dev.wharf/idempotentReplay").is_none(),
        "{theirs}"
    );
    let mut other = args;
    other["columns"] = json!([{ "name": "label", "type": "string" }]);
    let mismatch = refused(&u42, "import_begin", other).await;
    assert!(
        mismatch.contains("already used for a different call"),
        "{mismatch}"
    );
}

async fn expired_handles_tell_their_owner(store: &str) {
    let s = server(store);
    let (u42, u7) = (
        s.client().with_bearer(TOKEN_42),
        s.client().with_bearer(TOKEN_7),
    );
    let dataset = unique("weather");
    for idle in [false, true] {
        let import = begin(&u42, &dataset).await;
        ok(
            &u42,
            "import_append_rows",
            json!({ "import": import, "rows": rows(0, 2), "idempotency_key": "e1" }),
        )
        .await;
        expire(store, &import, idle).await;
        let told = refused(
            &u42,
            "import_append_rows",
            json!({ "import": import, "rows": rows(2, 2), "idempotency_key": "e2" }),
        )
        .await;
        assert!(told.contains("has expired"), "{told}");
        let why = if idle {
            "it was not used for 1 h"
        } else {
            "its lifetime of 24 h ran out"
        };
        assert!(told.contains(why), "{told}");
        assert!(told.contains("import_begin"), "{told}");
        // Anyone else is told only that it is unknown or expired.
        let other = refused(&u7, "import_status", json!({ "import": import })).await;
        assert!(other.contains("unknown or has expired"), "{other}");
        // And the expired import cannot be committed.
        let commit = refused(
            &u42,
            "import_commit",
            json!({ "import": import, "idempotency_key": "commit" }),
        )
        .await;
        assert!(commit.contains("has expired"), "{commit}");
    }
    let q = refused(&u42, "dataset_query", json!({ "dataset": dataset })).await;
    assert!(q.contains("does not exist"), "nothing was committed: {q}");
}

async fn a_pause_between_appends_is_recorded_not_refused(store: &str) {
    // A use after more than 1 % of the idle lifetime is recorded, inside the call's own
    // transaction: on SQLite a second writer there would wait on the first forever.
    let s = server(store);
    let u42 = s.client().with_bearer(TOKEN_42);
    let import = begin(&u42, &unique("paused")).await;
    for (i, pause) in [(0, 40_000), (1, 50 * 60_000)] {
        shift_times(store, &import, pause, &["last_used_at"]).await;
        let r = ok(
            &u42,
            "import_append_rows",
            json!({ "import": import, "rows": rows(i, 1), "idempotency_key": format!("p{i}") }),
        )
        .await;
        assert_eq!(r["structuredContent"]["stagedRows"], i + 1);
    }
    // The use was recorded: 50 more minutes later the import is still alive (it would have
    // idled out at 60 had the last use not been written).
    shift_times(store, &import, 50 * 60_000, &["last_used_at"]).await;
    assert_eq!(staged(&u42, &import).await, 2);
}

async fn a_dataset_keeps_the_columns_it_was_created_with(store: &str) {
    let s = server(store);
    let u42 = s.client().with_bearer(TOKEN_42);
    let dataset = unique("shared");
    let a = begin(&u42, &dataset).await;
    let b = ok(
        &u42,
        "import_begin",
        json!({ "dataset": dataset, "columns": [{ "name": "label", "type": "string" }], "idempotency_key": unique("b") }),
    )
    .await["structuredContent"]["import"]
        .as_str()
        .unwrap()
        .to_owned();
    ok(
        &u42,
        "import_append_rows",
        json!({ "import": a, "rows": rows(0, 2), "idempotency_key": "a" }),
    )
    .await;
    ok(
        &u42,
        "import_append_rows",
        json!({ "import": b, "rows": [{ "label": "x" }], "idempotency_key": "b" }),
    )
    .await;
    ok(
        &u42,
        "import_commit",
        json!({ "import": a, "idempotency_key": "commit" }),
    )
    .await;
    let refused_commit = refused(
        &u42,
        "import_commit",
        json!({ "import": b, "idempotency_key": "commit" }),
    )
    .await;
    assert!(refused_commit.contains("other columns"), "{refused_commit}");
    // Nothing of b reached the dataset, and b is still there to abort.
    let q = ok(&u42, "dataset_query", json!({ "dataset": dataset })).await;
    assert_eq!(q["structuredContent"]["rows"].as_array().unwrap().len(), 2);
    assert_eq!(staged(&u42, &b).await, 1);
    ok(
        &u42,
        "import_abort",
        json!({ "import": b, "idempotency_key": "abort-b" }),
    )
    .await;
}

on_every_store!(
    handles_belong_to_their_owner,
    appends_are_applied_once_per_key,
    simultaneous_duplicates_write_once,
    commit_query_and_read,
    aborted_imports_are_gone,
    begin_is_applied_once_per_key,
    expired_handles_tell_their_owner,
    a_pause_between_appends_is_recorded_not_refused,
    a_dataset_keeps_the_columns_it_was_created_with,
);

/// The server's SQLite store, opened beside it, to write what many calls would.
async fn sqlite_pool(store: &str) -> sqlx::SqlitePool {
    sqlx::SqlitePool::connect(&format!("{store}?mode=rw"))
        .await
        .unwrap()
}

/// A row beyond 64 KiB (a 200 KiB string) is refused with an `isError` naming the limit and
/// the row, and nothing of the call is appended; a row just under it goes in.
#[tokio::test]
async fn an_oversized_row_is_refused_and_nothing_is_appended() {
    let s = server(&sqlite_url("row-size"));
    let u42 = s.client().with_bearer(TOKEN_42);
    let import = begin(&u42, &unique("big")).await;
    let row = |id: i64, city_bytes: usize| json!({ "id": id, "city": "x".repeat(city_bytes), "temp": 1.5 });
    let too_big = json!({
        "import": import,
        "rows": [row(0, 10), row(1, 200 * 1024)],
        "idempotency_key": unique("k"),
    });
    let message = refused(&u42, "import_append_rows", too_big).await;
    assert!(
        message.contains("Row 1:") && message.contains("at most 65536 bytes (64 KiB)"),
        "{message}"
    );
    assert_eq!(staged(&u42, &import).await, 0, "nothing appended");
    let fits = json!({
        "import": import,
        "rows": [row(2, 60 * 1024)],
        "idempotency_key": unique("k"),
    });
    ok(&u42, "import_append_rows", fits).await;
    assert_eq!(staged(&u42, &import).await, 1);
}

/// A user holds at most 1,000 datasets: the commit that would create one more is refused
/// with an `isError` naming the limit, the import stays open, and committing into a dataset
/// the user already holds still works.
#[tokio::test]
async fn a_user_holds_at_most_a_thousand_datasets() {
    let store = sqlite_url("dataset-cap");
    let s = server(&store);
    let u42 = s.client().with_bearer(TOKEN_42);
    committed_dataset(&u42, "first", 1).await;
    // 999 more, written straight into the store: the same rows 999 commits would leave.
    let pool = sqlite_pool(&store).await;
    let (owner, cols): (String, String) =
        sqlx::query_as("SELECT owner, columns FROM ref_datasets WHERE name = 'first'")
            .fetch_one(&pool)
            .await
            .unwrap();
    for i in 1..1000 {
        sqlx::query("INSERT INTO ref_datasets (owner, name, columns) VALUES ($1, $2, $3)")
            .bind(&owner)
            .bind(format!("filler_{i}"))
            .bind(&cols)
            .execute(&pool)
            .await
            .unwrap();
    }
    let import = begin(&u42, "one_too_many").await;
    let commit = json!({ "import": import, "idempotency_key": "commit-new" });
    let message = refused(&u42, "import_commit", commit).await;
    assert!(
        message.contains("you hold 1000 datasets") && message.contains("(1000)"),
        "{message}"
    );
    assert_eq!(staged(&u42, &import).await, 0, "the import is still open");
    // Another user is not held to this one's count; an existing dataset still takes rows.
    let u7 = s.client().with_bearer(TOKEN_7);
    committed_dataset(&u7, "theirs", 1).await;
    committed_dataset(&u42, "first", 2).await;
}

/// A user has at most 100 imports open at once: the next `import_begin` is refused with an
/// `isError` naming the limit; an import that goes idle too long, or is aborted, frees its
/// place; another user is not held to this one's count.
#[tokio::test]
async fn a_user_has_at_most_a_hundred_open_imports() {
    let store = sqlite_url("open-imports");
    let s = server(&store);
    let u42 = s.client().with_bearer(TOKEN_42);
    let mut open = Vec::new();
    for i in 0..100 {
        open.push(begin(&u42, &format!("many_{i}")).await);
    }
    let one_more = || json!({ "dataset": "one_more", "columns": columns(), "idempotency_key": unique("begin") });
    let message = refused(&u42, "import_begin", one_more()).await;
    assert!(
        message.contains("You hold 100 open import handles")
            && message.contains("at once (100)")
            && message.contains("import_begin"),
        "{message}"
    );
    let u7 = s.client().with_bearer(TOKEN_7);
    begin(&u7, "theirs").await;

    expire(&store, &open[0], true).await;
    begin(&u42, "after_an_idle_one").await;
    ok(
        &u42,
        "import_abort",
        json!({ "import": open[1], "idempotency_key": unique("abort") }),
    )
    .await;
    begin(&u42, "after_an_abort").await;
    refused(&u42, "import_begin", one_more()).await;
}

/// A user stores at most 1 GiB of rows, staged and committed together: an append that would
/// go beyond is refused with an `isError` naming the limit and appends nothing; aborting an
/// import frees what it staged.
#[tokio::test]
async fn a_user_stores_at_most_a_gibibyte_of_rows() {
    const MAX: i64 = 1 << 30;
    let store = sqlite_url("stored-bytes");
    let s = server(&store);
    let u42 = s.client().with_bearer(TOKEN_42);
    committed_dataset(&u42, "first", 1).await;
    // Nearly a gibibyte, written straight into the store: what a dataset of that size counts.
    let pool = sqlite_pool(&store).await;
    sqlx::query("UPDATE ref_datasets SET bytes = $1 WHERE name = 'first'")
        .bind(MAX - 100_000)
        .execute(&pool)
        .await
        .unwrap();
    let row = |id: i64| json!({ "id": id, "city": "z".repeat(60 * 1024), "temp": 2.5 });
    let append = |import: &str, id: i64| json!({ "import": import, "rows": [row(id)], "idempotency_key": unique("k") });
    let import = begin(&u42, "roomy").await;
    ok(&u42, "import_append_rows", append(&import, 0)).await;
    let message = refused(&u42, "import_append_rows", append(&import, 1)).await;
    assert!(
        message.starts_with("Nothing was appended")
            && message.contains("one user may store at most 1073741824 bytes (1 GiB)"),
        "{message}"
    );
    assert_eq!(
        staged(&u42, &import).await,
        1,
        "the refused row is not staged"
    );
    ok(
        &u42,
        "import_abort",
        json!({ "import": import, "idempotency_key": unique("abort") }),
    )
    .await;
    let again = begin(&u42, "roomy").await;
    ok(&u42, "import_append_rows", append(&again, 2)).await;
    assert_eq!(staged(&u42, &again).await, 1);
}

/// Large rows end a page early: a reply holds about 1 MiB of rows whatever the limit, and
/// the cursor goes on from the last row returned, so paging still returns every row once.
#[tokio::test]
async fn a_page_of_large_rows_ends_at_the_byte_limit() {
    let s = server(&sqlite_url("reply-bytes"));
    let u42 = s.client().with_bearer(TOKEN_42);
    let dataset = unique("wide");
    let import = begin(&u42, &dataset).await;
    // 40 rows of 60 KiB: 2.4 MiB, which a limit of 500 rows would return at once.
    let wide: Vec<Value> = (0..40)
        .map(|id| json!({ "id": id, "city": "y".repeat(60 * 1024), "temp": 0.5 }))
        .collect();
    for (n, part) in wide.chunks(10).enumerate() {
        ok(
            &u42,
            "import_append_rows",
            json!({ "import": import, "rows": part, "idempotency_key": format!("part-{n}") }),
        )
        .await;
    }
    ok(
        &u42,
        "import_commit",
        json!({ "import": import, "idempotency_key": "commit" }),
    )
    .await;
    let (seen, pages) = read_pages(&u42, &dataset, 500).await;
    assert_eq!(pages, 3, "about 17 rows of 60 KiB per 1 MiB page");
    assert_eq!(
        seen,
        (0..40).collect::<Vec<_>>(),
        "every row once, in order"
    );
}

#[tokio::test]
async fn requests_without_a_known_token_get_401_with_a_challenge() {
    let s = server(&sqlite_url("auth"));
    for (client, challenge) in [
        (s.client(), "Bearer realm=\"wharf\""),
        (
            s.client().with_bearer("not-a-known-token-at-all"),
            "Bearer realm=\"wharf\", error=\"invalid_token\"",
        ),
    ] {
        let r = client.request("tools/list", json!({})).await.unwrap();
        assert_eq!(r.status, 401, "{}", r.body);
        assert_eq!(r.headers["www-authenticate"], challenge);
        assert_eq!(r.error_code(), Some(-31001));
        validate_reply("tools/list", &r);
    }
    let r = request(&s.client().with_bearer(TOKEN_7), "tools/list", json!({})).await;
    assert_eq!(r.status, 200);
}

/// Milliseconds since the Unix epoch, as the server counts them.
fn now_ms() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}
