//! From an admitted request to its response: the middleware chain, then the method.

use std::sync::Arc;

use tracing::{Instrument, Span};

use crate::access;
use crate::error::{ErrorKind, RpcError};
use crate::methods::lists::{self, List};
use crate::methods::{Call, completion, prompts, resources, tools};
use crate::metrics::{Outcome, OutcomeCell};
use crate::middleware::{Chain, Middleware, MiddlewareFuture, Next, cancelled};
use crate::registry::Registry;
use crate::request::{Caller, ParsedRequest, RequestBody};
use crate::runtime::Runtime;
use crate::trace;

/// Everything a built server runs requests with.
pub(crate) struct Core {
    pub(crate) registry: Registry,
    pub(crate) runtime: Arc<Runtime>,
    pub(crate) middleware: Vec<Arc<dyn Middleware>>,
}

/// Runs an admitted request (other than `subscriptions/listen`) to its whole response,
/// inside `span` (the request's, or the round's of a legacy call), and says how it ended,
/// on the span too when it is recorded. The method reports a tool's `isError` or a
/// handler's ask for input only when `counted` or the span is recorded: otherwise the
/// outcome is only `ok`, `error` or `cancelled`. When `caller.cancel` fires, the work is
/// dropped at its next await and the outcome is an error that must not be sent.
pub(crate) async fn execute(
    core: &Arc<Core>,
    req: ParsedRequest,
    mut caller: Caller,
    span: &Span,
    counted: bool,
) -> (Result<Vec<u8>, RpcError>, Outcome) {
    let traced = !span.is_disabled();
    // Only a request someone counts or traces pays for the cell.
    let cell = (counted || traced).then(|| Arc::new(OutcomeCell::default()));
    caller.outcome = cell.clone();
    let cancel = caller.cancel.clone();
    // The method's state, boxed once here: the layers above (admission's count, the
    // transport's handler, a legacy round) hold and move a pointer instead of copying it
    // at each level.
    let work = Box::pin(chain(core, req, caller)).instrument(span.clone());
    let out = match cancel.clone() {
        Some(cancel) => {
            tokio::select! {
                biased;
                () = cancel.cancelled() => Err(cancelled()),
                out = work => out,
            }
        }
        None => work.await,
    };
    let outcome = match (&out, cell) {
        (Ok(_), Some(cell)) => cell.get(),
        (Ok(_), None) => Outcome::Ok,
        (Err(_), _) if cancel.is_some_and(|c| c.is_cancelled()) => Outcome::Cancelled,
        (Err(_), _) => Outcome::Error,
    };
    if traced {
        trace::finish(span, outcome, out.as_ref().err());
    }
    (out, outcome)
}

/// [`execute`] where a panic in the core's own code still answers the request: -32603,
/// counted and traced as the error it is, naming `what` panicked in the log (the handler's
/// panics, and on a server with middleware everything under the chain, are caught nearer
/// and named there). For streamed calls and legacy rounds, whose clients would otherwise
/// wait for a response that never comes; on the plain JSON path of a server without
/// middleware a catch around the whole call would cost every call (see
/// `context::guarded`), and a panic there ends only its connection.
pub(crate) async fn execute_catching(
    core: &Arc<Core>,
    req: ParsedRequest,
    caller: Caller,
    span: &Span,
    counted: bool,
    what: &str,
) -> (Result<Vec<u8>, RpcError>, Outcome) {
    let execute = execute(core, req, caller, span, counted);
    match futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(execute)).await {
        Ok(done) => done,
        Err(panic) => {
            let e = RpcError::panicked(what, &*panic);
            if !span.is_disabled() {
                trace::finish(span, Outcome::Error, Some(&e));
            }
            (Err(e), Outcome::Error)
        }
    }
}

/// The middleware chain, then the method; straight to the method when there is no chain.
/// A layer that panics fails its request with -32603 (outer layers unwind with it), not the
/// connection that carries it, and so does the core's code below the layers: the catch
/// costs only servers with a chain, whose layers are boxed futures anyway (the handler's
/// own panics are caught where it is boxed).
async fn chain(core: &Arc<Core>, req: ParsedRequest, caller: Caller) -> Result<Vec<u8>, RpcError> {
    if core.middleware.is_empty() {
        return run(core, req, caller).await;
    }
    // In a block, so that a layer's synchronous part (before its future) is inside too.
    let layers =
        std::panic::AssertUnwindSafe(async { Arc::clone(core).run_from(0, req, caller).await });
    futures_util::FutureExt::catch_unwind(layers)
        .await
        .unwrap_or_else(|panic| Err(RpcError::panicked("the middleware chain", &*panic)))
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
