//! Middleware: code that runs around the core's handling of every request (other than listen
//! streams), after the transport admitted it (principal known, caps taken). A layer may
//! inspect the request and its principal, refuse it, or hand it on with [`Next::run`] and
//! look at the answer.
//!
//! Cancellation is checked before each layer runs: a request cancelled while a layer awaited
//! something goes no further, and nothing after it runs. A layer that panics fails its own
//! request with -32603 (what it said goes to the log), not the connection that carries it.
//! A server without middleware pays nothing for the chain.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::error::{ErrorKind, RpcError};
use crate::request::{Caller, ParsedRequest};

/// What a layer returns: the whole JSON-RPC response message, or the error to send.
pub type MiddlewareFuture = Pin<Box<dyn Future<Output = Result<Vec<u8>, RpcError>> + Send>>;

/// A layer around request handling. Closures `Fn(ParsedRequest, Caller, Next) -> impl Future`
/// are layers.
pub trait Middleware: Send + Sync + 'static {
    /// Handles `req`, usually by awaiting `next.run(req, caller)`.
    fn call(&self, req: ParsedRequest, caller: Caller, next: Next) -> MiddlewareFuture;
}

impl<F, Fut> Middleware for F
where
    F: Fn(ParsedRequest, Caller, Next) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<u8>, RpcError>> + Send + 'static,
{
    fn call(&self, req: ParsedRequest, caller: Caller, next: Next) -> MiddlewareFuture {
        Box::pin(self(req, caller, next))
    }
}

/// What runs a request from a given layer of its chain on (the core implements it).
pub(crate) trait Chain: Send + Sync + 'static {
    /// Runs layer `index` onwards, then the method.
    fn run_from(
        self: Arc<Self>,
        index: usize,
        req: ParsedRequest,
        caller: Caller,
    ) -> MiddlewareFuture;
}

/// The rest of the chain after a layer: the next layers, then the core.
pub struct Next {
    chain: Arc<dyn Chain>,
    index: usize,
}

impl Next {
    pub(crate) fn new(chain: Arc<dyn Chain>, index: usize) -> Self {
        Next { chain, index }
    }

    /// Runs the rest of the chain, unless the request was cancelled meanwhile.
    pub fn run(self, req: ParsedRequest, caller: Caller) -> MiddlewareFuture {
        if caller.is_cancelled() {
            return Box::pin(std::future::ready(Err(cancelled())));
        }
        self.chain.run_from(self.index, req, caller)
    }
}

/// The error a cancelled request ends with (never sent: nothing is sent for a cancelled
/// request).
pub(crate) fn cancelled() -> RpcError {
    RpcError::new(ErrorKind::Internal, "Request cancelled")
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use serde_json::json;
    use tokio_util::sync::CancellationToken;
    use wharf_protocol::Implementation;

    use super::*;
    use crate::testing::Harness;
    use crate::tool::{NoArgs, tool};
    use crate::{Context, ErrorKind, Server};

    fn server(layers: Vec<Arc<dyn Middleware>>, ran: Arc<AtomicUsize>) -> Harness {
        let mut builder = Server::builder(Implementation::new("t", "1")).tool(
            tool("count").handler(move |_cx: Context, _: NoArgs| {
                let ran = Arc::clone(&ran);
                async move {
                    ran.fetch_add(1, Ordering::SeqCst);
                    "ran"
                }
            }),
        );
        for layer in layers {
            builder = builder.middleware_arc(layer);
        }
        Harness::new(builder.build().unwrap())
    }

    fn count() -> serde_json::Value {
        json!({ "name": "count", "arguments": {} })
    }

    #[tokio::test]
    async fn layers_run_in_order_around_the_core_and_may_refuse() {
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let layer = |name: &'static str, refuse: bool| -> Arc<dyn Middleware> {
            let order = Arc::clone(&order);
            Arc::new(move |req: ParsedRequest, caller: Caller, next: Next| {
                let order = Arc::clone(&order);
                async move {
                    order.lock().unwrap().push(name);
                    if refuse {
                        return Err(RpcError::invalid_params("refused by a layer"));
                    }
                    let out = next.run(req, caller).await;
                    order.lock().unwrap().push(name);
                    out
                }
            })
        };
        let ran = Arc::new(AtomicUsize::new(0));
        let h = server(
            vec![layer("outer", false), layer("inner", false)],
            Arc::clone(&ran),
        );
        let out = h.call("tools/call", count()).await.unwrap();
        assert_eq!(out["content"][0]["text"], "ran");
        assert_eq!(*order.lock().unwrap(), ["outer", "inner", "inner", "outer"]);
        assert_eq!(ran.load(Ordering::SeqCst), 1);

        let h = server(vec![layer("refuser", true)], Arc::clone(&ran));
        let e = h.call("tools/call", count()).await.unwrap_err();
        assert_eq!(e.error().kind, ErrorKind::InvalidParams);
        assert_eq!(ran.load(Ordering::SeqCst), 1, "the core never ran");
    }

    #[tokio::test]
    async fn a_request_cancelled_inside_a_layer_goes_no_further() {
        let later = Arc::new(AtomicUsize::new(0));
        let cancel = CancellationToken::new();
        let first: Arc<dyn Middleware> = {
            let cancel = cancel.clone();
            Arc::new(move |req: ParsedRequest, caller: Caller, next: Next| {
                let cancel = cancel.clone();
                async move {
                    // The client leaves while this layer awaits something.
                    cancel.cancel();
                    next.run(req, caller).await
                }
            })
        };
        let second: Arc<dyn Middleware> = {
            let later = Arc::clone(&later);
            Arc::new(move |req: ParsedRequest, caller: Caller, next: Next| {
                later.fetch_add(1, Ordering::SeqCst);
                next.run(req, caller)
            })
        };
        let ran = Arc::new(AtomicUsize::new(0));
        let h = server(vec![first, second], Arc::clone(&ran));
        let sent = h.stream("tools/call", count(), cancel).await.unwrap();
        assert!(
            sent.is_empty(),
            "nothing is sent for a cancelled request: {sent:?}"
        );
        assert_eq!(later.load(Ordering::SeqCst), 0, "the next layer never ran");
        assert_eq!(ran.load(Ordering::SeqCst), 0, "the handler never ran");
    }

    #[tokio::test]
    async fn a_layer_cannot_steer_a_request_past_admission() {
        // A layer swaps the request for a call of a tool the caller may not call.
        let h = {
            let swap: Arc<dyn Middleware> =
                Arc::new(|req: ParsedRequest, caller: Caller, next: Next| {
                    let mut req = req;
                    if let crate::RequestBody::CallTool(params) = &mut req.body {
                        params.name = "secret".into();
                    }
                    next.run(req, caller)
                });
            let server = Server::builder(Implementation::new("t", "1"))
                .tool(tool("open").handler(|_cx: Context, _: NoArgs| async { "open" }))
                .tool(
                    tool("secret")
                        .scopes(&["admin"])
                        .handler(|_cx: Context, _: NoArgs| async { "secret" }),
                )
                .middleware_arc(swap)
                .build()
                .unwrap();
            Harness::new(server).principal(crate::testing::oauth_user(&[]))
        };
        let e = h
            .call("tools/call", json!({ "name": "open", "arguments": {} }))
            .await
            .unwrap_err();
        assert_eq!(e.error().kind, ErrorKind::InsufficientScope);
    }
}
