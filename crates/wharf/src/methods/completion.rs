//! `completion/complete`: the values a prompt argument or a template variable may take.

use wharf_protocol::{CompleteParams, CompleteResult, Completion, CompletionReference, ResultType};

use crate::context::Context;
use crate::driver::drive;
use crate::error::RpcError;
use crate::methods::Call;
use crate::reply::respond;

/// The most values a completion carries (the schema's cap).
const MAX_VALUES: usize = 100;

/// Completes an argument of what `params.reference` names.
pub(crate) async fn complete(call: Call<'_, Box<CompleteParams>>) -> Result<Vec<u8>, RpcError> {
    let Call {
        registry,
        runtime,
        id,
        info,
        params,
        caller,
    } = call;
    let completer = match &params.reference {
        CompletionReference::Prompt { name, .. } => registry
            .prompt(name)
            .map(|p| p.complete.clone())
            .ok_or_else(|| RpcError::invalid_params(format!("Unknown prompt: {name}")))?,
        CompletionReference::Resource { uri } => registry
            .template(uri)
            .map(|t| t.def.complete.clone())
            .or_else(|| registry.is_static_resource(uri).then_some(None))
            .ok_or_else(|| RpcError::invalid_params(format!("Unknown resource template: {uri}")))?,
    };
    let completion = match completer {
        Some(completer) => {
            let cx = Context::new(runtime, id.clone(), info, caller);
            let CompleteParams {
                argument, context, ..
            } = *params;
            let context = context.unwrap_or_default();
            // A completion has no input_required form: a completer that asks is refused
            // when its ask is sealed (it holds no round).
            let ended = drive(cx, None, |cx| completer(cx, argument, context)).await?;
            match ended.or_error()? {
                Ok(mut c) => {
                    if c.values.len() > MAX_VALUES {
                        // Say that there were more.
                        c.total.get_or_insert(c.values.len() as u64);
                        c.has_more = Some(true);
                        c.values.truncate(MAX_VALUES);
                    }
                    c
                }
                Err(_) => {
                    return Err(RpcError::internal(
                        "a completer asked the client for input, which completions cannot carry",
                    ));
                }
            }
        }
        None => Completion::default(),
    };
    respond(
        &id,
        &CompleteResult {
            result_type: ResultType::Complete,
            completion,
            meta: runtime.result_meta(),
        },
    )
}
