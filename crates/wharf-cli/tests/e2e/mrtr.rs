//! Multi-round requests over real HTTP: the import service asks the user before it replaces or
//! deletes a dataset; the sealed `requestState` is refused when tampered with, expired, used
//! by another principal or for another request, and a one-time confirmation is refused the
//! second time even on another replica; a round answered on another replica completes.

use crate::common;

use std::time::Duration;

use common::import::{
    TOKEN_7, TOKEN_42, begin, committed_dataset, ok, on_every_store, pg_url, replica_args, rows,
    sqlite_url, unique,
};
use common::{ServerProcess, validate_reply};
use serde_json::{Value, json};
use wharf_client::{HttpClient, Reply};

const STATE_KEY: &str = "k1=AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

/// A tool call from a client that can answer elicitations.
async fn call(client: &HttpClient, name: &str, args: Value, round: Option<(&str, Value)>) -> Reply {
    let mut params = json!({
        "name": name,
        "arguments": args,
        "_meta": { "io.modelcontextprotocol/clientCapabilities": { "elicitation": {} } }
    });
    if let Some((state, responses)) = round {
        params["requestState"] = json!(state);
        params["inputResponses"] = responses;
    }
    let reply = client.request("tools/call", params).await.unwrap();
    validate_reply("tools/call", &reply);
    reply
}

fn accept(field: &str) -> Value {
    json!({ "action": "accept", "content": { field: true } })
}

async fn count(client: &HttpClient, name: &str) -> usize {
    let r = ok(
        client,
        "dataset_query",
        json!({ "dataset": name, "limit": 500 }),
    )
    .await;
    r["structuredContent"]["rows"].as_array().unwrap().len()
}

/// The `requestState` of an `input_required` result, after checking what it asks.
fn asked(reply: &Reply, key: &str) -> String {
    let result = reply.result().unwrap_or_else(|| panic!("{}", reply.body));
    assert_eq!(result["resultType"], "input_required", "{}", reply.body);
    let request = &result["inputRequests"][key];
    assert_eq!(request["method"], "elicitation/create", "{}", reply.body);
    assert_eq!(
        request["params"]["requestedSchema"]["properties"]
            .as_object()
            .unwrap()
            .len(),
        1
    );
    result["requestState"].as_str().unwrap().to_owned()
}

fn refused(reply: &Reply, why: &str) {
    assert_eq!(reply.error_code(), Some(-32602), "{}", reply.body);
    let message = reply.error().unwrap()["message"].as_str().unwrap();
    assert!(message.contains(why), "{message:?} should say {why:?}");
}

#[tokio::test]
async fn replacing_a_dataset_asks_the_user_first() {
    let server = common::import::server(&sqlite_url("mrtr-replace"));
    let client = server.client().with_bearer(TOKEN_42);
    let name = unique("ds");
    committed_dataset(&client, &name, 3).await;
    let import = begin(&client, &name).await;
    ok(
        &client,
        "import_append_rows",
        json!({ "import": import, "rows": rows(100, 2), "idempotency_key": unique("k") }),
    )
    .await;
    let args = json!({ "import": import, "mode": "replace", "idempotency_key": "commit" });

    let first = call(&client, "import_commit", args.clone(), None).await;
    let state = asked(&first, "confirm_replace");
    let message = first.result().unwrap()["inputRequests"]["confirm_replace"]["params"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains("3 rows") && message.contains("2 rows"),
        "{message}"
    );
    assert_eq!(count(&client, &name).await, 3, "nothing changed yet");

    // A malformed answer is asked again; a refusal commits nothing.
    let again = call(
        &client,
        "import_commit",
        args.clone(),
        Some((
            &state,
            json!({ "confirm_replace": { "action": "accept", "content": { "replace": "yes" } } }),
        )),
    )
    .await;
    asked(&again, "confirm_replace");
    let no = call(
        &client,
        "import_commit",
        args.clone(),
        Some((
            &state,
            json!({ "confirm_replace": { "action": "decline" } }),
        )),
    )
    .await;
    assert_eq!(no.result().unwrap()["isError"], true, "{}", no.body);
    assert_eq!(count(&client, &name).await, 3);

    let done = call(
        &client,
        "import_commit",
        args.clone(),
        Some((&state, json!({ "confirm_replace": accept("replace") }))),
    )
    .await;
    let result = done.result().unwrap();
    assert_eq!(result["resultType"], "complete", "{}", done.body);
    assert_eq!(result["structuredContent"]["totalRows"], 2);
    assert_eq!(count(&client, &name).await, 2);
    // Its answer lost, the client sends the last round again: the commit, which retired
    // the import, is replayed; nothing is replaced twice.
    let replayed = call(
        &client,
        "import_commit",
        args.clone(),
        Some((&state, json!({ "confirm_replace": accept("replace") }))),
    )
    .await;
    let replay = replayed.result().unwrap();
    assert_eq!(replay["structuredContent"], result["structuredContent"]);
    assert_eq!(
        replay["_meta"]["dev.wharf/idempotentReplay"], true,
        "{}",
        replayed.body
    );
    assert_eq!(count(&client, &name).await, 2);

    // A client that cannot answer elicitations is told what it lacks.
    let other = unique("ds");
    committed_dataset(&client, &other, 1).await;
    let import = begin(&client, &other).await;
    let r = client
        .request(
            "tools/call",
            json!({ "name": "import_commit", "arguments": { "import": import, "mode": "replace", "idempotency_key": "commit" } }),
        )
        .await
        .unwrap();
    assert_eq!(r.error_code(), Some(-32021), "{}", r.body);
    assert!(r.error().unwrap()["data"]["requiredCapabilities"]["elicitation"].is_object());
}

#[tokio::test]
async fn bad_states_are_refused_with_the_reason() {
    let store = sqlite_url("mrtr-states");
    let mut args = replica_args(&store);
    args.extend(["--state-key", STATE_KEY].map(str::to_owned));
    let server = ServerProcess::start_exact(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let user42 = server.client().with_bearer(TOKEN_42);
    let user7 = server.client().with_bearer(TOKEN_7);
    let (one, two) = (unique("ds"), unique("ds"));
    committed_dataset(&user42, &one, 2).await;
    committed_dataset(&user42, &two, 2).await;
    let delete = |name: &str| json!({ "dataset": name, "idempotency_key": unique("del") });
    let state = asked(
        &call(&user42, "dataset_delete", delete(&one), None).await,
        "confirm_delete",
    );
    let yes = json!({ "confirm_delete": accept("delete") });

    // One character changed.
    let mut tampered = state.clone().into_bytes();
    let i = tampered.len() / 2;
    tampered[i] = if tampered[i] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    let r = call(
        &user42,
        "dataset_delete",
        delete(&one),
        Some((&tampered, yes.clone())),
    )
    .await;
    refused(
        &r,
        "was not issued by this server to this caller, or was altered",
    );
    let forged_message = r.error().unwrap()["message"].clone();

    // Another principal, with a dataset of the same name.
    committed_dataset(&user7, &one, 1).await;
    let r = call(
        &user7,
        "dataset_delete",
        delete(&one),
        Some((&state, yes.clone())),
    )
    .await;
    // Refused in the words a forged state gets: nothing confirms that it is genuine.
    refused(&r, "was not issued by this server to this caller");
    assert_eq!(r.error().unwrap()["message"], forged_message);

    // Another request: the same tool on another dataset.
    let r = call(
        &user42,
        "dataset_delete",
        delete(&two),
        Some((&state, yes.clone())),
    )
    .await;
    refused(&r, "issued for another request");
    assert_eq!(count(&user42, &one).await, 2, "nothing was deleted");
    assert_eq!(count(&user42, &two).await, 2);

    // A confirmation sent without any state (as if the question had been asked) is refused:
    // a step answered once needs the state of the round that asked.
    let r = call(&user42, "dataset_delete", delete(&one), None).await;
    let mut params = json!({ "name": "dataset_delete", "arguments": delete(&one),
        "inputResponses": yes.clone(),
        "_meta": { "io.modelcontextprotocol/clientCapabilities": { "elicitation": {} } } });
    assert_eq!(r.result().unwrap()["resultType"], "input_required");
    let forged = user42.request("tools/call", params.take()).await.unwrap();
    refused(
        &forged,
        "only with the requestState of the round that asked",
    );
    assert_eq!(count(&user42, &one).await, 2);

    // Expired: a server whose states live one second, on the same store and keys (this one
    // stopped first: one process serves a SQLite file).
    drop(server);
    args.extend(["--state-max-age-secs", "1"].map(str::to_owned));
    let short = ServerProcess::start_exact(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let user42 = short.client().with_bearer(TOKEN_42);
    let state = asked(
        &call(&user42, "dataset_delete", delete(&one), None).await,
        "confirm_delete",
    );
    // The state was sealed before its answer arrived: a second after the answer it has
    // expired, however slow the machine (waiting for the expiry is the event itself).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let r = call(
        &user42,
        "dataset_delete",
        delete(&one),
        Some((&state, yes.clone())),
    )
    .await;
    refused(&r, "expired");
    // Another principal's expired state: still not told that it was genuine.
    let r = call(
        &short.client().with_bearer(TOKEN_7),
        "dataset_delete",
        delete(&one),
        Some((&state, yes.clone())),
    )
    .await;
    assert_eq!(r.error().unwrap()["message"], forged_message);
    assert_eq!(count(&user42, &one).await, 2);
}

/// Two replicas on one PostgreSQL, sharing nothing but configuration and the store: a round
/// asked by one is answered on the other, and the confirmation cannot be replayed anywhere.
#[tokio::test]
async fn a_round_completes_on_another_replica_and_a_confirmation_is_used_once() {
    let mut args = replica_args(&pg_url());
    args.extend(["--state-key", STATE_KEY].map(str::to_owned));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let a = ServerProcess::start_exact(&args);
    let b = ServerProcess::start_exact(&args);
    let (ca, cb) = (
        a.client().with_bearer(TOKEN_42),
        b.client().with_bearer(TOKEN_42),
    );
    let name = unique("ds");
    committed_dataset(&ca, &name, 4).await;
    let delete = json!({ "dataset": name, "idempotency_key": unique("del") });
    let state = asked(
        &call(&ca, "dataset_delete", delete.clone(), None).await,
        "confirm_delete",
    );
    let yes = json!({ "confirm_delete": accept("delete") });

    let done = call(
        &cb,
        "dataset_delete",
        delete.clone(),
        Some((&state, yes.clone())),
    )
    .await;
    assert_eq!(
        done.result().unwrap()["structuredContent"]["deletedRows"],
        4,
        "{}",
        done.body
    );

    // The dataset is made again. The confirmed round retried (its answer lost) replays the
    // deletion it made, on either replica; the confirmation sent with another key is not
    // this request's (the state binds the request's params). Neither deletes the new
    // dataset.
    committed_dataset(&ca, &name, 1).await;
    for client in [&ca, &cb] {
        let replay = call(
            client,
            "dataset_delete",
            delete.clone(),
            Some((&state, yes.clone())),
        )
        .await;
        let result = replay.result().unwrap();
        assert_eq!(
            result["structuredContent"]["deletedRows"], 4,
            "{}",
            replay.body
        );
        assert_eq!(result["_meta"]["dev.wharf/idempotentReplay"], true);
        let mut other_key = delete.clone();
        other_key["idempotency_key"] = json!(unique("del"));
        let used = call(
            client,
            "dataset_delete",
            other_key,
            Some((&state, yes.clone())),
        )
        .await;
        refused(&used, "issued for another request");
    }
    assert_eq!(count(&ca, &name).await, 1);
}

/// A confirmed `dataset_delete` retried with its key replays the deletion it made, to its
/// owner alone: also as a fresh request (its answer and the round's state both lost), and
/// after the dataset was made again, which the replay leaves alone. Another principal's call
/// with the same key and arguments is their own: asked first, and their dataset kept until
/// they confirm.
async fn a_confirmed_delete_replays_to_its_owner_alone(store: &str) {
    let server = common::import::server(store);
    let (u42, u7) = (
        server.client().with_bearer(TOKEN_42),
        server.client().with_bearer(TOKEN_7),
    );
    let name = unique("ds");
    committed_dataset(&u42, &name, 3).await;
    committed_dataset(&u7, &name, 2).await;
    let delete = json!({ "dataset": name, "idempotency_key": unique("del") });
    let state = asked(
        &call(&u42, "dataset_delete", delete.clone(), None).await,
        "confirm_delete",
    );
    let yes = json!({ "confirm_delete": accept("delete") });
    let done = call(
        &u42,
        "dataset_delete",
        delete.clone(),
        Some((&state, yes.clone())),
    )
    .await;
    let first = done.result().unwrap().clone();
    assert_eq!(
        first["structuredContent"]["deletedRows"], 3,
        "{}",
        done.body
    );
    assert!(first["_meta"].get("dev.wharf/idempotentReplay").is_none());

    committed_dataset(&u42, &name, 1).await;
    for round in [Some((state.as_str(), yes.clone())), None] {
        let again = call(&u42, "dataset_delete", delete.clone(), round).await;
        let again = again.result().unwrap();
        assert_eq!(
            again["_meta"]["dev.wharf/idempotentReplay"], true,
            "{again}"
        );
        assert_eq!(again["structuredContent"], first["structuredContent"]);
    }
    assert_eq!(count(&u42, &name).await, 1, "the replays deleted nothing");

    let theirs = call(&u7, "dataset_delete", delete.clone(), None).await;
    let their_state = asked(&theirs, "confirm_delete");
    assert_eq!(count(&u7, &name).await, 2);
    let confirmed = call(&u7, "dataset_delete", delete, Some((&their_state, yes))).await;
    let confirmed = confirmed.result().unwrap();
    assert!(
        confirmed["_meta"]
            .get("dev.wharf/idempotentReplay")
            .is_none()
    );
    assert_eq!(
        confirmed["structuredContent"]["deletedRows"], 2,
        "{confirmed}"
    );
    assert_eq!(count(&u42, &name).await, 1, "u42's dataset is theirs alone");
}

on_every_store!(a_confirmed_delete_replays_to_its_owner_alone);

/// A server on a SQLite file of its own (`tag`), user 42's client, and a dataset of theirs
/// with `rows` rows: its name.
async fn with_dataset(tag: &str, rows: i64) -> (ServerProcess, HttpClient, String) {
    let args = replica_args(&sqlite_url(tag));
    let server = ServerProcess::start_exact(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let user42 = server.client().with_bearer(TOKEN_42);
    let name = unique("ds");
    committed_dataset(&user42, &name, rows).await;
    (server, user42, name)
}

/// A query's cursor belongs to its dataset as it was: once the dataset is deleted (after
/// the confirmation) and made again under its name, numbering its rows from the start, the
/// cursor is refused instead of resuming past rows it never saw.
#[tokio::test]
async fn a_cursor_does_not_outlive_its_dataset() {
    let (_server, user42, name) = with_dataset("mrtr-cursor", 3).await;
    let page = call(
        &user42,
        "dataset_query",
        json!({ "dataset": name, "limit": 1 }),
        None,
    )
    .await;
    let cursor = page.result().unwrap()["structuredContent"]["nextCursor"].clone();
    assert!(cursor.is_string(), "{}", page.body);
    let resume = json!({ "dataset": name, "limit": 1, "cursor": cursor });
    let next = call(&user42, "dataset_query", resume.clone(), None).await;
    assert_eq!(
        next.result().unwrap()["isError"],
        Value::Null,
        "{}",
        next.body
    );

    let delete = json!({ "dataset": name, "idempotency_key": unique("del") });
    let state = asked(
        &call(&user42, "dataset_delete", delete.clone(), None).await,
        "confirm_delete",
    );
    let yes = json!({ "confirm_delete": accept("delete") });
    let deleted = call(&user42, "dataset_delete", delete, Some((&state, yes))).await;
    assert_eq!(
        deleted.result().unwrap()["isError"],
        Value::Null,
        "{}",
        deleted.body
    );
    committed_dataset(&user42, &name, 3).await;

    let stale = call(&user42, "dataset_query", resume, None).await;
    let result = stale.result().unwrap();
    assert_eq!(result["isError"], true, "{}", stale.body);
    let text = result["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("Invalid cursor"), "{text}");
}

/// A confirmation holds for the dataset as its user saw it: grown since (another import
/// committed into it while the question waited), the dataset is not deleted on the old
/// answer; the user is asked again, with the new count, and that answer deletes it.
#[tokio::test]
async fn a_confirmation_holds_only_for_what_was_shown() {
    let (_server, user42, name) = with_dataset("mrtr-shown", 2).await;
    let delete = json!({ "dataset": name, "idempotency_key": unique("del") });
    let first = call(&user42, "dataset_delete", delete.clone(), None).await;
    let state = asked(&first, "confirm_delete");
    committed_dataset(&user42, &name, 3).await;

    let yes = json!({ "confirm_delete": accept("delete") });
    let again = call(
        &user42,
        "dataset_delete",
        delete.clone(),
        Some((&state, yes.clone())),
    )
    .await;
    let renewed = asked(&again, "confirm_delete");
    let question = again.result().unwrap()["inputRequests"]["confirm_delete"]["params"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        question.contains("changed since you were asked"),
        "{question}"
    );
    assert!(question.contains("its 5 rows"), "{question}");
    let page = call(&user42, "dataset_query", json!({ "dataset": name }), None).await;
    let rows = page.result().unwrap()["structuredContent"]["rows"].clone();
    assert_eq!(rows.as_array().map(Vec::len), Some(5), "{}", page.body);

    let deleted = call(&user42, "dataset_delete", delete, Some((&renewed, yes))).await;
    let result = deleted.result().unwrap();
    assert_eq!(
        result["structuredContent"]["deletedRows"], 5,
        "{}",
        deleted.body
    );
}

/// PostgreSQL: a delete the user confirmed for the rows they were shown, while a commit into
/// the dataset holds it, waits for that commit and sees it: the user is asked again about
/// the rows there are now. (The check read the dataset as it was before the commit, and the
/// delete, run once the commit landed, took the new rows with it.)
#[tokio::test]
async fn a_confirmed_delete_sees_a_commit_that_held_the_dataset() {
    let server = common::import::server(&pg_url());
    let client = server.client().with_bearer(TOKEN_42);
    let name = unique("ds");
    committed_dataset(&client, &name, 2).await;
    let delete = json!({ "dataset": name, "idempotency_key": unique("del") });
    let state = asked(
        &call(&client, "dataset_delete", delete.clone(), None).await,
        "confirm_delete",
    );

    // A commit into the dataset under way: it holds the dataset's row, and adds 3 rows.
    let pg = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&pg_url())
        .await
        .unwrap();
    let mut committing = pg.begin().await.unwrap();
    let holder: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *committing)
        .await
        .unwrap();
    sqlx::query("UPDATE ref_datasets SET row_count = row_count + 3 WHERE name = $1")
        .bind(&name)
        .execute(&mut *committing)
        .await
        .unwrap();
    let confirmed = tokio::spawn({
        let (client, delete, state) = (client.clone(), delete.clone(), state.clone());
        async move {
            let yes = json!({ "confirm_delete": accept("delete") });
            call(&client, "dataset_delete", delete, Some((&state, yes))).await
        }
    });
    // The confirmed delete waits for the commit's row.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let blocked: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
        )
        .bind(holder)
        .fetch_one(&pg)
        .await
        .unwrap();
        if blocked > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the delete never waited"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    committing.commit().await.unwrap();

    let again = confirmed.await.unwrap();
    let result = again.result().unwrap_or_else(|| panic!("{}", again.body));
    assert_eq!(result["resultType"], "input_required", "{}", again.body);
    let message = result["inputRequests"]["confirm_delete"]["params"]["message"]
        .as_str()
        .unwrap();
    assert!(
        message.contains("changed since") && message.contains("5 rows"),
        "{message}"
    );
    let there: i64 = sqlx::query_scalar("SELECT count(*) FROM ref_datasets WHERE name = $1")
        .bind(&name)
        .fetch_one(&pg)
        .await
        .unwrap();
    assert_eq!(there, 1, "the dataset was deleted");
}
