//! The one sequence that invokes any handler (tool, prompt, resource, completer): the
//! request's MRTR round handed to its context, progress opened, the handler called, its
//! kept progress sent before the response, and what it returned sorted into a value, an
//! execution failure, a protocol error, or an `input_required` answer.

use std::future::Future;

use tracing::Instrument as _;

use wharf_protocol::{InputRequiredResult, InputResponses, RequestId, ResultType};

use crate::context::Context;
use crate::error::{ErrorKind, RpcError};
use crate::handler::HandlerError;
use crate::meta::RequestInfo;
use crate::metrics::Outcome;
use crate::mrtr::{Ask, Binding, Resume, StateRefused, Turn, open_round, seal_round};
use crate::principal::Principal;
use crate::reply::respond;
use crate::runtime::Runtime;
use crate::trace;

/// How a handler's run ended, other than with a protocol error.
pub(crate) enum Ended<T> {
    /// It produced its value.
    Value(T),
    /// It failed in a way the model can read ([`HandlerError::Execution`]).
    Failed(String),
    /// It asked the client for input: the whole `input_required` response.
    Asked(Vec<u8>),
}

impl<T> Ended<T> {
    /// For methods whose result has no error form: an execution failure is a JSON-RPC
    /// error that carries its message.
    pub(crate) fn or_error(self) -> Result<Result<T, Vec<u8>>, RpcError> {
        match self {
            Ended::Value(v) => Ok(Ok(v)),
            Ended::Asked(response) => Ok(Err(response)),
            Ended::Failed(message) => Err(RpcError::new(ErrorKind::Internal, message)),
        }
    }
}

/// Opens the MRTR round of a `tools/call`, `prompts/get` or `resources/read`. Only a
/// request that carries a state, or whose client could answer input requests, pays for the
/// digest of its params.
pub(crate) fn open_turn(
    runtime: &Runtime,
    info: &RequestInfo,
    principal: &Principal,
    request_state: Option<&str>,
    responses: Option<InputResponses>,
    binding: impl FnOnce() -> Binding,
) -> Result<Option<Turn>, StateRefused> {
    let caps = &info.client_capabilities;
    let may_answer = caps.elicitation.is_some() || caps.sampling.is_some() || caps.roots.is_some();
    if request_state.is_none() && !may_answer {
        return Ok(None);
    }
    let binding = binding();
    let round = open_round(
        &runtime.keys.get().states,
        &binding,
        principal,
        request_state,
        responses,
    )?;
    Ok(Some(Turn { binding, round }))
}

/// Runs `call` with `cx`, which serves the request `turn` belongs to.
pub(crate) async fn drive<T, F, Fut>(
    mut cx: Context,
    turn: Option<Turn>,
    call: F,
) -> Result<Ended<T>, RpcError>
where
    F: FnOnce(Context) -> Fut,
    Fut: Future<Output = Result<T, HandlerError>>,
{
    let runtime = std::sync::Arc::clone(cx.runtime());
    let id = cx.request_id().clone();
    let resume = cx.enter_turn(turn);
    let progress = cx.progress_stream();
    let cleanup = cx.cleanup_guard();
    let outcome = cx.outcome.clone();
    // A request that answers an earlier round's input requests says which round it is.
    let span = trace::handler(resume.as_ref().map(|r| r.round));
    let got = call(cx).instrument(span).await;
    cleanup.disarm();
    // Kept progress goes out now, and nothing after: the response follows.
    if let Some(progress) = progress {
        progress.finish().await;
    }
    match got {
        Ok(value) => Ok(Ended::Value(value)),
        Err(HandlerError::Execution(message)) => Ok(Ended::Failed(message)),
        Err(HandlerError::Protocol(e)) => Err(e.sendable_from_handler()),
        Err(HandlerError::InputRequired(ask)) => {
            let asked = input_required(&runtime, &id, resume.as_ref(), *ask)?;
            if let Some(outcome) = outcome {
                outcome.set(Outcome::InputRequired);
            }
            Ok(Ended::Asked(asked))
        }
    }
}

/// The `input_required` result for `ask`, with the sealed state of the next round.
fn input_required(
    runtime: &Runtime,
    id: &RequestId,
    resume: Option<&Resume>,
    ask: Ask,
) -> Result<Vec<u8>, RpcError> {
    let (input_requests, token) = seal_round(
        &runtime.config.request_state,
        &runtime.keys.get().states,
        resume.map(|r| (&r.binding, &r.principal)),
        resume.map_or(0, |r| r.round),
        ask,
    )?;
    if let Some(m) = &runtime.metrics {
        m.mrtr_round();
    }
    respond(
        id,
        &InputRequiredResult {
            result_type: ResultType::InputRequired,
            input_requests,
            request_state: Some(token),
            meta: runtime.result_meta(),
        },
    )
}
