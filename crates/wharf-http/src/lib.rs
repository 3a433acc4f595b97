//! Streamable HTTP for Wharf: one POST endpoint that answers with JSON or with an SSE stream
//! scoped to the request, plus liveness and readiness probes.
//!
//! [`router`] gives an axum [`Router`] to serve on its own or to nest into an
//! existing application; it is also a tower `Service`.

mod authenticate;
mod config;
mod endpoint;
mod errors;
mod guard;
mod headers;
mod health;

pub use authenticate::{AuthFuture, Authenticate, FromExtensions, Refusal};
pub use config::{HostPolicy, HttpConfig};
pub use health::ReadinessCheck;

use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};
use wharf::Server;

pub(crate) struct AppState {
    pub(crate) server: Server,
    pub(crate) config: HttpConfig,
}

/// The MCP endpoint at `config.endpoint`, with `GET /healthz` and `GET /readyz`.
pub fn router(server: Server, config: HttpConfig) -> Router {
    let endpoint = config.endpoint.clone();
    let documents = config.auth.documents();
    let state = Arc::new(AppState { server, config });
    let mut router = Router::new();
    for (path, doc) in documents {
        let doc = Arc::new(doc);
        router = router.route(
            &path,
            get(move || {
                let doc = Arc::clone(&doc);
                async move { axum::Json((*doc).clone()) }
            }),
        );
    }
    router
        .route(
            &endpoint,
            post(endpoint::handle_post)
                .get(endpoint::method_not_allowed)
                .delete(endpoint::method_not_allowed),
        )
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .with_state(state)
}
