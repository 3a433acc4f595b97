//! The client library against a scripted server over real HTTP: what it sends when a call
//! is retried, answered in rounds, or listed twice.

use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use wharf_client::{
    Answerer, CallError, Client, Event, HttpClient, Prepared, Refuse, ToolCall, Unanswered,
    new_idempotency_key,
};
use wharf_protocol::InputRequest;

/// Every request the server received, and what it answers next.
#[derive(Clone, Default)]
struct Script {
    seen: Arc<Mutex<Vec<Value>>>,
    /// How many `tools/call`s to answer as a gateway whose upstream is gone.
    drops: Arc<Mutex<u32>>,
    /// Requests of any method to refuse first, as a busy server does (a JSON-RPC error
    /// with an HTTP status and, maybe, `Retry-After`), one per request.
    refusals: Arc<Mutex<std::collections::VecDeque<Refusal>>>,
    ttl_ms: u64,
}

/// An HTTP status to refuse a request with, and the `Retry-After` to send with it.
type Refusal = (StatusCode, Option<&'static str>);

impl Script {
    /// Refuses the next request with `status` and `Retry-After: retry_after`.
    fn refuse_next(&self, status: StatusCode, retry_after: Option<&'static str>) {
        self.refusals
            .lock()
            .unwrap()
            .push_back((status, retry_after));
    }
}

async fn mcp(State(script): State<Script>, Json(request): Json<Value>) -> Response {
    script.seen.lock().unwrap().push(request.clone());
    let id = request["id"].clone();
    let refusal = script.refusals.lock().unwrap().pop_front();
    if let Some((status, retry_after)) = refusal {
        let error = json!({ "code": -32603, "message": "Server busy; try again" });
        let body = Json(json!({ "jsonrpc": "2.0", "id": id, "error": error }));
        let mut response = (status, body).into_response();
        if let Some(after) = retry_after {
            response
                .headers_mut()
                .insert("retry-after", after.parse().unwrap());
        }
        return response;
    }
    let params = &request["params"];
    let result = match request["method"].as_str() {
        Some("server/discover") => json!({
            "resultType": "complete", "supportedVersions": ["2026-07-28"], "capabilities": {},
        }),
        Some("tools/list") => json!({
            "resultType": "complete", "ttlMs": script.ttl_ms, "cacheScope": "public",
            "tools": [{ "name": "confirm", "inputSchema": { "type": "object" } }],
        }),
        Some("tools/call") => {
            {
                let mut drops = script.drops.lock().unwrap();
                if *drops > 0 {
                    *drops -= 1;
                    return (StatusCode::BAD_GATEWAY, "upstream connect error").into_response();
                }
            }
            match params["inputResponses"]["ok"]["content"]["sure"].as_bool() {
                None => json!({
                    "resultType": "input_required",
                    "requestState": "round-1",
                    "inputRequests": { "ok": { "method": "elicitation/create", "params": {
                        "message": "Sure?",
                        "requestedSchema": { "type": "object", "properties": { "sure": { "type": "boolean" } } },
                    } } },
                }),
                Some(sure) => json!({
                    "resultType": "complete",
                    "content": [{ "type": "text", "text": format!("sure={sure} state={}", params["requestState"]) }],
                }),
            }
        }
        _ => {
            let error = json!({ "code": -32601, "message": "no such method" });
            return Json(json!({ "jsonrpc": "2.0", "id": id, "error": error })).into_response();
        }
    };
    Json(json!({ "jsonrpc": "2.0", "id": id, "result": result })).into_response()
}

/// Serves `app` on a port of its own: its `/mcp` URL.
async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

async fn connect(script: &Script) -> Client {
    let app = axum::Router::new()
        .route("/mcp", axum::routing::post(mcp))
        .with_state(script.clone());
    Client::connect(HttpClient::new(serve(app).await))
        .await
        .unwrap()
}

fn sent(script: &Script, method: &str) -> Vec<Value> {
    let seen = script.seen.lock().unwrap();
    seen.iter()
        .filter(|r| r["method"] == method)
        .cloned()
        .collect()
}

fn yes() -> Prepared<Refuse> {
    let answer = json!({ "action": "accept", "content": { "sure": true } });
    Prepared::new([("ok".to_owned(), answer)].into(), Refuse)
}

/// Says yes, and has the server lose the next two calls: the retry of the answered round.
struct LoseTheNextTwo(Arc<Mutex<u32>>);

impl Answerer for LoseTheNextTwo {
    async fn answer(&mut self, key: &str, request: &InputRequest) -> Result<Value, Unanswered> {
        *self.0.lock().unwrap() = 2;
        yes().answer(key, request).await
    }
}

#[tokio::test]
async fn a_broken_exchange_is_retried_under_the_same_key_and_request_state() {
    let script = Script::default();
    let client = connect(&script).await;
    let key = new_idempotency_key();
    let call = ToolCall::new("confirm", json!({})).idempotency_key(key.clone());
    // The round that carries the answer meets two gateway errors before it gets through.
    let mut retries = Vec::new();
    let mut on_event = |e: Event| {
        if let Event::Retrying { attempt, .. } = e {
            retries.push(attempt);
        }
    };
    let mut answerer = LoseTheNextTwo(script.drops.clone());
    let result = client
        .call_tool(&call, &mut answerer, &mut on_event)
        .await
        .unwrap();
    assert_eq!(result["content"][0]["text"], "sure=true state=\"round-1\"");
    assert_eq!(retries, vec![2, 3], "two retries were announced");
    let calls = sent(&script, "tools/call");
    // Round one, then round two three times (two lost), each a new request.
    assert_eq!(calls.len(), 4, "{calls:#?}");
    for request in &calls {
        assert_eq!(
            request["params"]["arguments"]["idempotency_key"],
            key.as_str()
        );
    }
    for retry in &calls[1..] {
        assert_eq!(retry["params"]["requestState"], "round-1");
        assert_eq!(retry["params"]["inputResponses"]["ok"]["action"], "accept");
    }
    let ids: std::collections::HashSet<String> =
        calls.iter().map(|r| r["id"].to_string()).collect();
    assert_eq!(ids.len(), 4, "a retry reused a request id");
}

#[tokio::test]
async fn a_call_without_a_key_is_never_resent() {
    let script = Script::default();
    *script.drops.lock().unwrap() = 1;
    let client = connect(&script).await;
    let error = client
        .call_tool(
            &ToolCall::new("confirm", json!({})),
            &mut yes(),
            &mut |_| {},
        )
        .await
        .unwrap_err();
    assert!(matches!(error, CallError::Transport(_)), "{error:?}");
    assert!(error.to_string().contains("HTTP 502"), "{error}");
    assert_eq!(
        sent(&script, "tools/call").len(),
        1,
        "a write without a key was sent twice"
    );
}

/// A key for a tool whose definition has no such argument makes no retry safe (the server
/// may ignore it): the call is sent once.
#[tokio::test]
async fn a_key_the_tool_does_not_take_does_not_make_it_resent() {
    let script = Script::default();
    *script.drops.lock().unwrap() = 1;
    let client = connect(&script).await;
    let confirm = json!({ "name": "confirm", "inputSchema": { "type": "object" } });
    let call = ToolCall::for_tool(&confirm, json!({})).idempotency_key(new_idempotency_key());
    let error = client
        .call_tool(&call, &mut yes(), &mut |_| {})
        .await
        .unwrap_err();
    assert!(matches!(error, CallError::Transport(_)), "{error:?}");
    assert_eq!(sent(&script, "tools/call").len(), 1, "resent");
}

#[tokio::test]
async fn an_unanswered_question_names_its_key() {
    let client = connect(&Script::default()).await;
    let error = client
        .call_tool(
            &ToolCall::new("confirm", json!({})),
            &mut Refuse,
            &mut |_| {},
        )
        .await
        .unwrap_err();
    let CallError::Unanswered(unanswered) = error else {
        panic!("{error:?}");
    };
    assert_eq!(unanswered.key, "ok");
    assert_eq!(unanswered.what, "a form: Sure?");
}

#[tokio::test]
async fn lists_are_reused_for_their_ttl_and_no_longer() {
    for (ttl_ms, expected) in [(60_000, 1), (0, 2)] {
        let script = Script {
            ttl_ms,
            ..Script::default()
        };
        let client = connect(&script).await;
        for _ in 0..2 {
            assert_eq!(client.list_tools().await.unwrap()[0]["name"], "confirm");
        }
        assert_eq!(
            sent(&script, "tools/list").len(),
            expected,
            "ttlMs {ttl_ms}"
        );
        client.forget_lists();
        client.list_tools().await.unwrap();
        assert_eq!(
            sent(&script, "tools/list").len(),
            expected + 1,
            "a forgotten list was not read again"
        );
    }
}

/// A server of a later revision that also speaks 2025-06-18 (it refuses 2026-07-28 with
/// -32022 listing what it speaks): the client opens a session at the legacy revision listed,
/// where any other -32022 is an error.
#[tokio::test]
async fn a_later_dual_era_server_is_met_in_the_legacy_revision_it_lists() {
    use wharf_client::Connection;

    async fn later(Json(request): Json<Value>) -> Response {
        let id = request["id"].clone();
        match request["method"].as_str() {
            Some("server/discover") => {
                let error = json!({ "code": -32022, "message": "Unsupported protocol version",
                    "data": { "supported": ["2027-01-01", "2025-06-18"], "requested": "2026-07-28" } });
                let body = json!({ "jsonrpc": "2.0", "id": id, "error": error });
                (StatusCode::BAD_REQUEST, Json(body)).into_response()
            }
            Some("initialize") => {
                let result = json!({ "protocolVersion": request["params"]["protocolVersion"],
                    "capabilities": {}, "serverInfo": { "name": "later", "version": "1" } });
                let body = json!({ "jsonrpc": "2.0", "id": id, "result": result });
                ([("mcp-session-id", "s-1")], Json(body)).into_response()
            }
            _ => StatusCode::ACCEPTED.into_response(),
        }
    }
    let ended = Arc::new(Mutex::new(Vec::new()));
    let end = {
        let ended = Arc::clone(&ended);
        move |headers: axum::http::HeaderMap| async move {
            let session = headers["mcp-session-id"].to_str().unwrap().to_owned();
            ended.lock().unwrap().push(session);
            StatusCode::OK
        }
    };
    let app = axum::Router::new().route("/mcp", axum::routing::post(later).delete(end));
    let url = serve(app).await;
    let connection = HttpClient::new(url).connect(json!({})).await.unwrap();
    match &connection {
        Connection::Legacy(session) => assert_eq!(session.version(), "2025-06-18"),
        Connection::Modern(_) => panic!("a server that refused 2026-07-28 is not modern"),
    }
    // Closed, the client ends its session rather than leave it to idle out.
    Client::over(connection).close().await.unwrap();
    assert_eq!(*ended.lock().unwrap(), ["s-1"]);
}

/// A stateless server of the 2025 era answers the unknown `server/discover` with 200 and
/// -32602 (the Python SDK's does): not an error only a modern server sends, so the client
/// opens a session.
#[tokio::test]
async fn a_legacy_server_refusing_discover_with_any_other_error_gets_initialize() {
    use wharf_client::Connection;

    async fn stateless_legacy(Json(request): Json<Value>) -> Response {
        let id = request["id"].clone();
        match request["method"].as_str() {
            Some("initialize") => {
                let result = json!({ "protocolVersion": "2025-11-25", "capabilities": {},
                    "serverInfo": { "name": "old", "version": "1" } });
                Json(json!({ "jsonrpc": "2.0", "id": id, "result": result })).into_response()
            }
            Some(method) if method.starts_with("notifications/") => {
                StatusCode::ACCEPTED.into_response()
            }
            _ => {
                let error = json!({ "code": -32602, "message": "Invalid request parameters" });
                Json(json!({ "jsonrpc": "2.0", "id": id, "error": error })).into_response()
            }
        }
    }
    let app = axum::Router::new().route("/mcp", axum::routing::post(stateless_legacy));
    let url = serve(app).await;
    match HttpClient::new(url).connect(json!({})).await.unwrap() {
        Connection::Legacy(session) => assert_eq!(session.version(), "2025-11-25"),
        Connection::Modern(_) => panic!("the server does not know server/discover"),
    }
}

/// A server answering `server/discover` with its own error (-32603 here, at 200) is not
/// taken for a legacy one: the client reports the error rather than open a 2025 session.
#[tokio::test]
async fn a_discover_refused_for_another_reason_is_an_error_not_a_fallback() {
    async fn failing(Json(request): Json<Value>) -> Response {
        let error = json!({ "code": -32603, "message": "Internal error" });
        Json(json!({ "jsonrpc": "2.0", "id": request["id"], "error": error })).into_response()
    }
    let url = serve(axum::Router::new().route("/mcp", axum::routing::post(failing))).await;
    let refused = HttpClient::new(url).connect(json!({})).await.unwrap_err();
    assert!(refused.to_string().contains("-32603"), "{refused}");
}

/// A `server/discover` answered 503 (a proxy whose upstream restarts) is sent again, and
/// when it stays 503 it is a status the caller may retry later (`wharf listen` does), not a
/// protocol error.
#[tokio::test]
async fn a_discover_answered_503_is_asked_again_then_a_status_to_retry() {
    async fn restarting(State(count): State<Arc<Mutex<u32>>>) -> Response {
        *count.lock().unwrap() += 1;
        let mut response = (StatusCode::SERVICE_UNAVAILABLE, "upstream restarting").into_response();
        response
            .headers_mut()
            .insert("retry-after", "0".parse().unwrap());
        response
    }
    let count = Arc::new(Mutex::new(0));
    let app = axum::Router::new()
        .route("/mcp", axum::routing::post(restarting))
        .with_state(count.clone());
    let refused = HttpClient::new(serve(app).await)
        .connect(json!({}))
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused,
            wharf_client::ClientError::Status { status: 503, .. }
        ),
        "{refused:?}"
    );
    assert_eq!(refused.retry_after(), Some(std::time::Duration::ZERO));
    assert_eq!(*count.lock().unwrap(), 3, "discover is asked three times");
}

/// A busy server's 503 says when to come back: a keyed call is sent again after that long
/// (here at once), not after the client's own backoff.
#[tokio::test]
async fn a_retry_waits_for_what_retry_after_asks() {
    let script = Script::default();
    let client = connect(&script).await;
    script.refuse_next(StatusCode::SERVICE_UNAVAILABLE, Some("0"));
    let call = ToolCall::new("confirm", json!({})).idempotency_key(new_idempotency_key());
    let mut waits = Vec::new();
    let mut on_event = |e: Event| {
        if let Event::Retrying { after, .. } = e {
            waits.push(after);
        }
    };
    let asked = client.call_tool(&call, &mut Refuse, &mut on_event).await;
    // Sent again, it got through to the question (which `Refuse` does not answer).
    assert!(matches!(asked, Err(CallError::Unanswered(_))), "{asked:?}");
    assert_eq!(waits, vec![std::time::Duration::ZERO]);
    assert_eq!(sent(&script, "tools/call").len(), 2);
}

/// A server asking for a longer wait than the client keeps a command waiting gets the
/// error back, with the delay it asked for, and the call is not sent again.
#[tokio::test]
async fn a_retry_after_beyond_the_longest_wait_returns_the_error() {
    let script = Script::default();
    let client = connect(&script).await;
    script.refuse_next(StatusCode::SERVICE_UNAVAILABLE, Some("120"));
    let call = ToolCall::new("confirm", json!({})).idempotency_key(new_idempotency_key());
    let refused = client
        .call_tool(&call, &mut Refuse, &mut |_| {})
        .await
        .unwrap_err();
    assert!(
        matches!(refused, CallError::Rpc { status: 503, .. }),
        "{refused:?}"
    );
    assert_eq!(
        refused.retry_after(),
        Some(std::time::Duration::from_secs(120))
    );
    assert_eq!(sent(&script, "tools/call").len(), 1);
}

/// A page of a list refused by a gateway is asked for again (a read changes nothing); an
/// error the server means (a 500) is not.
#[tokio::test]
async fn a_list_page_refused_by_a_gateway_is_asked_again() {
    let script = Script::default();
    let client = connect(&script).await;
    script.refuse_next(StatusCode::BAD_GATEWAY, Some("0"));
    assert_eq!(client.list_tools().await.unwrap()[0]["name"], "confirm");
    assert_eq!(sent(&script, "tools/list").len(), 2);

    let script = Script::default();
    let client = connect(&script).await;
    script.refuse_next(StatusCode::INTERNAL_SERVER_ERROR, None);
    let refused = client.list_tools().await.unwrap_err();
    assert!(
        matches!(refused, CallError::Rpc { status: 500, .. }),
        "{refused:?}"
    );
    assert_eq!(sent(&script, "tools/list").len(), 1);
}

/// Says yes, counting the questions it answered.
struct Counting(u32);

impl Answerer for Counting {
    async fn answer(&mut self, key: &str, request: &InputRequest) -> Result<Value, Unanswered> {
        self.0 += 1;
        yes().answer(key, request).await
    }
}

#[tokio::test]
async fn a_round_beyond_max_rounds_is_not_answered() {
    let script = Script::default();
    let client = connect(&script).await;
    let mut answerer = Counting(0);
    let call = ToolCall::new("confirm", json!({})).max_rounds(0);
    let error = client
        .call_tool(&call, &mut answerer, &mut |_| {})
        .await
        .unwrap_err();
    assert!(matches!(error, CallError::TooManyRounds(0)), "{error:?}");
    assert_eq!(answerer.0, 0, "nobody was asked for a round never sent");
    assert_eq!(sent(&script, "tools/call").len(), 1);
    // One round allowed: answered once, sent, and the call completes.
    let call = ToolCall::new("confirm", json!({})).max_rounds(1);
    let result = client
        .call_tool(&call, &mut answerer, &mut |_| {})
        .await
        .unwrap();
    assert_eq!(answerer.0, 1);
    assert!(
        result["content"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("sure=true"),
        "{result}"
    );
}

#[tokio::test]
async fn a_stream_answered_without_one_yields_its_message_or_an_error() {
    use futures_util::StreamExt;

    let script = Script::default();
    let app = axum::Router::new()
        .route("/mcp", axum::routing::post(mcp))
        .with_state(script.clone());
    let http = HttpClient::new(serve(app).await);
    let listen = json!({ "notifications": { "toolsListChanged": true } });
    // A refusal (a busy server's 503) is the stream's one message, not an empty stream.
    script.refuse_next(StatusCode::SERVICE_UNAVAILABLE, Some("1"));
    let refused: Vec<Value> = http
        .open_stream("subscriptions/listen", listen.clone())
        .await
        .unwrap()
        .collect()
        .await;
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0]["error"]["code"], -32603, "{refused:?}");
    // So is an answer sent as JSON.
    let answered: Vec<Value> = http
        .open_stream("subscriptions/listen", listen)
        .await
        .unwrap()
        .collect()
        .await;
    assert_eq!(answered[0]["error"]["code"], -32601, "{answered:?}");
    // A reply that is no JSON-RPC at all (a gateway's page) is an error with its status.
    *script.drops.lock().unwrap() = 1;
    let gone = http
        .open_stream("tools/call", json!({ "name": "confirm", "arguments": {} }))
        .await
        .err();
    assert!(
        matches!(
            gone,
            Some(wharf_client::ClientError::Status { status: 502, .. })
        ),
        "{gone:?}"
    );
}
