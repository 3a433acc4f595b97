//! Streamable HTTP for Wharf: one endpoint whose POST answers with JSON or with an SSE stream
//! scoped to the request (and whose GET and DELETE serve legacy sessions), the OAuth
//! protected-resource metadata, and liveness and readiness probes.
//!
//! [`router`] gives an axum [`Router`] to serve on its own or to nest into an
//! existing application; it is also a tower `Service`.

mod authenticate;
mod call_stream;
mod config;
mod cors;
mod endpoint;
mod errors;
mod guard;
mod headers;
mod health;
mod listener;
mod request_headers;
mod serve;
mod session;
mod sse;

pub use authenticate::{AuthFuture, Authenticate, FromExtensions, Refusal};
pub use config::{EndpointError, HostPolicy, HttpConfig, ReadinessCheck, check_endpoint};
pub use cors::cors;
pub use listener::{Closer, DrainingListener};
pub use serve::{ConnectionLimits, serve};

use std::sync::Arc;

use axum::Router;
use axum::response::IntoResponse as _;
use axum::routing::{get, post};
use wharf::Server;

/// Counts a response of the MCP endpoint by its status, when the server counts.
pub(crate) fn count_response(state: &AppState, response: &axum::response::Response) {
    if let Some(m) = state.server.metrics() {
        m.http_response(response.status().as_u16());
    }
}

/// A layer under which, while `server` drains, every response closes its connection: a
/// proxy then opens a new one for its next request, which finds the listener closed once
/// draining ends and goes to another replica, instead of reusing a kept-alive connection
/// that the replica closes when its grace ends. [`serve`] does this for every response when
/// [`ConnectionLimits::close_while_draining`] names the server (at no cost per request worth
/// counting); this layer is for an app served otherwise (`axum::serve`), on the whole of
/// it, so that CORS preflights and fallbacks close too. As a router layer it costs an
/// allocation per request.
pub fn close_while_draining(
    server: Server,
) -> tower::util::MapResponseLayer<
    impl Fn(axum::response::Response) -> axum::response::Response + Clone + Send + Sync + 'static,
> {
    tower::util::MapResponseLayer::new(move |response| close_if_draining(&server, response))
}

/// `response`, made to close its connection if `server` drains.
pub(crate) fn close_if_draining(
    server: &Server,
    mut response: axum::response::Response,
) -> axum::response::Response {
    if server.is_draining() {
        response.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    response
}

pub(crate) struct AppState {
    pub(crate) server: Server,
    pub(crate) config: HttpConfig,
    /// The readiness checks' last verdict and when it was reached (see `health`).
    pub(crate) readiness: health::Verdict,
}

/// `GET /metrics`: the server's counters in the Prometheus text format, for a scraper on
/// an address of its own (operators keep it off the public listener). Answers 404 when
/// the server was built without [`ServerBuilder::metrics`](wharf::ServerBuilder::metrics).
pub fn metrics_router(server: Server) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let text = server.encode_metrics();
            async move {
                match text {
                    Some(text) => (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "text/plain; version=0.0.4; charset=utf-8",
                        )],
                        text,
                    )
                        .into_response(),
                    None => (
                        axum::http::StatusCode::NOT_FOUND,
                        "this server does not count metrics\n",
                    )
                        .into_response(),
                }
            }
        }),
    )
}

/// The MCP endpoint at `config.endpoint`, with `GET /healthz` and `GET /readyz`; with CORS
/// for the origins `config.hosts` names ([`cors()`]). Served by [`serve`], whose
/// [`ConnectionLimits::close_while_draining`] closes connections while the server drains;
/// served otherwise, add [`close_while_draining()`] to the app.
///
/// # Panics
///
/// If `config.endpoint` is not a path [`check_endpoint`] accepts (as axum's own
/// `Router::route` panics on a path it cannot route): check one read from settings first.
pub fn router(server: Server, config: HttpConfig) -> Router {
    if let Err(e) = check_endpoint(&config.endpoint) {
        panic!("HttpConfig::endpoint: {e}");
    }
    let endpoint = config.endpoint.clone();
    let cors = cors::cors(&config.hosts);
    let documents = config.auth.documents();
    let state = Arc::new(AppState {
        server,
        config,
        readiness: health::Verdict::default(),
    });
    let mut router = Router::new();
    for (path, doc) in documents {
        let doc = Arc::new(doc);
        router = router.route(
            &path,
            get(
                move |axum::extract::State(state): axum::extract::State<Arc<AppState>>,
                      headers: axum::http::HeaderMap| {
                    let doc = Arc::clone(&doc);
                    async move {
                        if let Err(refused) = guard::check_headers(&headers, &state.config) {
                            return *refused;
                        }
                        health::json(axum::http::StatusCode::OK, (*doc).clone())
                    }
                },
            ),
        );
    }
    let router = router
        .route(
            &endpoint,
            post(endpoint::handle_post)
                .get(session::get)
                .head(session::head)
                .delete(session::delete),
        )
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .with_state(state);
    match cors {
        Some(cors) => router.layer(cors),
        None => router,
    }
}
