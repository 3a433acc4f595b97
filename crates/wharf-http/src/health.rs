//! Liveness and readiness.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::AppState;

/// Liveness: the process serves HTTP. Touches nothing else.
pub(crate) async fn healthz(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(refused) = crate::guard::check_headers(&headers, &state.config) {
        return *refused;
    }
    json(StatusCode::OK, serde_json::json!({ "status": "ok" }))
}

/// What `/readyz` says of a dependency that does not answer: its error goes to the log
/// only (it may name hosts, users or paths).
const NOT_ANSWERING: &str = "does not answer (see the server's log)";

/// Readiness: every dependency answers and the server is not draining.
pub(crate) async fn readyz(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(refused) = crate::guard::check_headers(&headers, &state.config) {
        return *refused;
    }
    if state.server.is_draining() {
        return draining();
    }
    let mut failures = serde_json::Map::new();
    if !state.server.bus().is_connected() {
        // Listen streams here would miss what other replicas announce.
        failures.insert(
            "bus".to_owned(),
            "not listening for change notifications".into(),
        );
    }
    failures.extend(checked(&state).await);
    // The checks may have taken a while: a drain begun meanwhile is what to say.
    if state.server.is_draining() {
        return draining();
    }
    if failures.is_empty() {
        json(StatusCode::OK, serde_json::json!({ "status": "ready" }))
    } else {
        json(
            StatusCode::SERVICE_UNAVAILABLE,
            serde_json::json!({ "status": "unavailable", "failures": failures }),
        )
    }
}

/// What `/readyz` answers once the server drains.
fn draining() -> Response {
    json(
        StatusCode::SERVICE_UNAVAILABLE,
        serde_json::json!({ "status": "draining" }),
    )
}

/// The readiness checks' last verdict (the dependencies that failed) and when it was reached.
pub(crate) type Verdict = tokio::sync::Mutex<
    Option<(
        tokio::time::Instant,
        serde_json::Map<String, serde_json::Value>,
    )>,
>;

/// How long one readiness check may take before it counts as failed.
const CHECK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How long the readiness checks' verdict stands: the probe needs no unauthenticated store
/// round trip per request (a flood of probes would keep the store busy, and where the
/// check goes through the calls' connections, take them from calls).
const CHECKS_STAND: std::time::Duration = std::time::Duration::from_secs(1);

/// The dependencies that failed their check: asked at most once per [`CHECKS_STAND`]
/// (probes that arrive while they are asked wait for that verdict).
async fn checked(state: &AppState) -> serde_json::Map<String, serde_json::Value> {
    if state.config.readiness.is_empty() {
        return serde_json::Map::new();
    }
    let mut verdict = state.readiness.lock().await;
    if let Some((at, failures)) = &*verdict {
        if at.elapsed() < CHECKS_STAND {
            return failures.clone();
        }
    }
    let mut failures = serde_json::Map::new();
    for check in &state.config.readiness {
        // A dependency that hangs fails its check (and every probe waits for this one).
        let answer = tokio::time::timeout(CHECK_WAIT, check.check()).await;
        let reason = match answer {
            Ok(Ok(())) => continue,
            Ok(Err(reason)) => reason,
            Err(_) => format!("no answer in {} s", CHECK_WAIT.as_secs()),
        };
        tracing::warn!(check = check.name(), %reason, "readiness check failed");
        failures.insert(check.name().to_owned(), NOT_ANSWERING.into());
    }
    *verdict = Some((tokio::time::Instant::now(), failures.clone()));
    failures
}

/// A JSON document, never sniffed as anything else by a browser.
pub(crate) fn json(status: StatusCode, body: serde_json::Value) -> Response {
    (
        status,
        [
            (axum::http::header::CONTENT_TYPE, "application/json"),
            (axum::http::header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body.to_string(),
    )
        .into_response()
}
