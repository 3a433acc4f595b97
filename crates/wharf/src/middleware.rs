//! Middleware: code that runs around the core's handling of every request (other than listen
//! streams), after the transport admitted it (principal known, caps taken). A layer may
//! inspect the request and its principal, refuse it, or hand it on with [`Next::run`] and
//! look at the answer.
//!
//! Cancellation is checked before each layer runs: a request cancelled while a layer awaited
//! something goes no further, and nothing after it runs. A server without middleware pays
//! nothing for the chain.

use std::future::Future;
use std::pin::Pin;

use crate::dispatch::{ParsedRequest, Scope};
use crate::error::{ErrorKind, RpcError};
use crate::server::Server;

/// What a layer returns: the whole JSON-RPC response message, or the error to send.
pub type MiddlewareFuture = Pin<Box<dyn Future<Output = Result<Vec<u8>, RpcError>> + Send>>;

/// A layer around request handling. Closures `Fn(ParsedRequest, Scope, Next) -> impl Future`
/// are layers.
pub trait Middleware: Send + Sync + 'static {
    /// Handles `req`, usually by awaiting `next.run(req, scope)`.
    fn call(&self, req: ParsedRequest, scope: Scope, next: Next) -> MiddlewareFuture;
}

impl<F, Fut> Middleware for F
where
    F: Fn(ParsedRequest, Scope, Next) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<u8>, RpcError>> + Send + 'static,
{
    fn call(&self, req: ParsedRequest, scope: Scope, next: Next) -> MiddlewareFuture {
        Box::pin(self(req, scope, next))
    }
}

/// The rest of the chain after a layer: the next layers, then the core.
pub struct Next {
    server: Server,
    index: usize,
}

impl Next {
    /// Runs the rest of the chain, unless the request was cancelled meanwhile.
    pub fn run(self, req: ParsedRequest, scope: Scope) -> MiddlewareFuture {
        self.server.run_from(self.index, req, scope)
    }
}

/// The error a cancelled request ends with (never sent: nothing is sent for a cancelled
/// request).
pub(crate) fn cancelled() -> RpcError {
    RpcError::new(ErrorKind::Internal, "Request cancelled")
}

impl Server {
    /// Runs layer `index` onwards, then the core.
    pub(crate) fn run_from(
        &self,
        index: usize,
        req: ParsedRequest,
        scope: Scope,
    ) -> MiddlewareFuture {
        if scope.cancel.as_ref().is_some_and(|c| c.is_cancelled()) {
            return Box::pin(std::future::ready(Err(cancelled())));
        }
        match self.inner.middleware.get(index) {
            Some(layer) => layer.call(
                req,
                scope,
                Next {
                    server: self.clone(),
                    index: index + 1,
                },
            ),
            None => {
                let server = self.clone();
                Box::pin(async move { server.run(req, scope).await })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use serde_json::value::RawValue;
    use tokio_util::sync::CancellationToken;
    use wharf_protocol::{Implementation, RequestId};

    use super::*;
    use crate::principal::Principal;
    use crate::tool::{NoArgs, tool};
    use crate::{Context, ErrorKind};

    fn server(layers: Vec<Arc<dyn Middleware>>, ran: Arc<AtomicUsize>) -> Server {
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
        builder.build().unwrap()
    }

    fn call(server: &Server) -> ParsedRequest {
        let params = RawValue::from_string(
            r#"{"name":"count","arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}"#.into(),
        )
        .unwrap();
        server
            .parse_request(RequestId::Int(1), "tools/call", Some(&params))
            .map_err(|(e, _)| e)
            .unwrap()
    }

    fn scope(cancel: Option<CancellationToken>) -> Scope {
        Scope {
            principal: Principal::anonymous(),
            cancel,
            outbox: None,
        }
    }

    #[tokio::test]
    async fn layers_run_in_order_around_the_core_and_may_refuse() {
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let layer = |name: &'static str, refuse: bool| -> Arc<dyn Middleware> {
            let order = Arc::clone(&order);
            Arc::new(move |req: ParsedRequest, scope: Scope, next: Next| {
                let order = Arc::clone(&order);
                async move {
                    order.lock().unwrap().push(name);
                    if refuse {
                        return Err(RpcError::invalid_params("refused by a layer"));
                    }
                    let out = next.run(req, scope).await;
                    order.lock().unwrap().push(name);
                    out
                }
            })
        };
        let ran = Arc::new(AtomicUsize::new(0));
        let s = server(
            vec![layer("outer", false), layer("inner", false)],
            Arc::clone(&ran),
        );
        let out = s.execute(call(&s), scope(None)).await.unwrap();
        assert!(String::from_utf8(out).unwrap().contains("\"ran\""));
        assert_eq!(*order.lock().unwrap(), ["outer", "inner", "inner", "outer"]);
        assert_eq!(ran.load(Ordering::SeqCst), 1);

        let s = server(vec![layer("refuser", true)], Arc::clone(&ran));
        let e = s.execute(call(&s), scope(None)).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidParams);
        assert_eq!(ran.load(Ordering::SeqCst), 1, "the core never ran");
    }

    #[tokio::test]
    async fn a_request_cancelled_inside_a_layer_goes_no_further() {
        let later = Arc::new(AtomicUsize::new(0));
        let cancel = CancellationToken::new();
        let first: Arc<dyn Middleware> = {
            let cancel = cancel.clone();
            Arc::new(move |req: ParsedRequest, scope: Scope, next: Next| {
                let cancel = cancel.clone();
                async move {
                    // The client leaves while this layer awaits something.
                    cancel.cancel();
                    next.run(req, scope).await
                }
            })
        };
        let second: Arc<dyn Middleware> = {
            let later = Arc::clone(&later);
            Arc::new(move |req: ParsedRequest, scope: Scope, next: Next| {
                later.fetch_add(1, Ordering::SeqCst);
                next.run(req, scope)
            })
        };
        let ran = Arc::new(AtomicUsize::new(0));
        let s = server(vec![first, second], Arc::clone(&ran));
        // Straight through the chain (a transport's execute would also stop at the token).
        let out = s.run_from(0, call(&s), scope(Some(cancel))).await;
        assert!(out.is_err());
        assert_eq!(later.load(Ordering::SeqCst), 0, "the next layer never ran");
        assert_eq!(ran.load(Ordering::SeqCst), 0, "the handler never ran");
    }
}
