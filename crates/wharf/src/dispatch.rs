//! From an admitted request to its response: the middleware chain, then the method.

use std::sync::Arc;

use tracing::Instrument;

use crate::access;
use crate::error::{ErrorKind, RpcError};
use crate::methods::lists::{self, List};
use crate::methods::{Call, completion, prompts, resources, tools};
use crate::middleware::{Chain, Middleware, MiddlewareFuture, Next, cancelled};
use crate::registry::Registry;
use crate::request::{Caller, ParsedRequest, RequestBody};
use crate::runtime::Runtime;

/// Everything a built server runs requests with.
pub(crate) struct Core {
    pub(crate) registry: Registry,
    pub(crate) runtime: Arc<Runtime>,
    pub(crate) middleware: Vec<Arc<dyn Middleware>>,
}

/// Runs an admitted request (other than `subscriptions/listen`) to its whole response.
/// When `caller.cancel` fires, the work is dropped at its next await and the outcome is an
/// error that must not be sent.
pub(crate) async fn execute(
    core: &Arc<Core>,
    req: ParsedRequest,
    caller: Caller,
) -> Result<Vec<u8>, RpcError> {
    // A request that carries W3C trace context gets an info-level span holding it, so the
    // trace joins the client's; others get a debug-level span, free unless enabled.
    let span = match &req.info.traceparent {
        Some(tp) => tracing::info_span!(
            "mcp.request",
            method = req.body.method(),
            // Debug: a string id quoted and escaped, so no client writes raw text into logs.
            id = ?req.id,
            traceparent = tp.as_str(),
            tracestate = req.info.tracestate.as_deref().unwrap_or(""),
        ),
        None => tracing::debug_span!("mcp.request", method = req.body.method(), id = ?req.id),
    };
    // Each branch builds its own future: one built before the match would be kept beside
    // its instrumented copy, doubling the state every request carries.
    match caller.cancel.clone() {
        Some(cancel) => {
            let work = chain(core, req, caller).instrument(span);
            tokio::select! {
                biased;
                () = cancel.cancelled() => Err(cancelled()),
                out = work => out,
            }
        }
        None => chain(core, req, caller).instrument(span).await,
    }
}

/// The middleware chain, then the method; straight to the method when there is no chain.
async fn chain(core: &Arc<Core>, req: ParsedRequest, caller: Caller) -> Result<Vec<u8>, RpcError> {
    if core.middleware.is_empty() {
        run(core, req, caller).await
    } else {
        Arc::clone(core).run_from(0, req, caller).await
    }
}

impl Chain for Core {
    fn run_from(
        self: Arc<Self>,
        index: usize,
        req: ParsedRequest,
        caller: Caller,
    ) -> MiddlewareFuture {
        match self.middleware.get(index).cloned() {
            Some(layer) => layer.call(req, caller, Next::new(self, index + 1)),
            None => Box::pin(async move {
                // A layer may have changed the request: what reaches a method is what
                // admission would let through.
                access::check(&self.registry, &req, &caller.principal)?;
                run(&self, req, caller).await
            }),
        }
    }
}

/// The method.
async fn run(core: &Core, req: ParsedRequest, caller: Caller) -> Result<Vec<u8>, RpcError> {
    let ParsedRequest { id, info, body } = req;
    let (registry, runtime) = (&core.registry, &core.runtime);
    let call = Call {
        registry,
        runtime,
        id,
        info,
        params: (),
        caller,
    };
    let list = |list, cursor| {
        lists::page(
            registry,
            runtime,
            &call.id,
            list,
            cursor,
            &call.caller.principal,
        )
    };
    match body {
        RequestBody::Discover => lists::discover(registry, runtime, &call.id),
        RequestBody::ListTools { cursor } => list(List::Tools, cursor),
        RequestBody::ListPrompts { cursor } => list(List::Prompts, cursor),
        RequestBody::ListResources { cursor } => list(List::Resources, cursor),
        RequestBody::ListResourceTemplates { cursor } => list(List::ResourceTemplates, cursor),
        RequestBody::CallTool(params) => tools::call(call.with(params)).await,
        RequestBody::ReadResource(params) => resources::read(call.with(params)).await,
        RequestBody::GetPrompt(params) => prompts::get(call.with(params)).await,
        RequestBody::Complete(params) => completion::complete(call.with(params)).await,
        RequestBody::Listen(_) => Err(RpcError::new(
            ErrorKind::InvalidRequest,
            "subscriptions/listen is a stream: it is served by admission, not here",
        )),
    }
}
