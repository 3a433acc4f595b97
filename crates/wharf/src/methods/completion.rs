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
    // The completer, and the names of the arguments it may be asked about: completion
    // inputs are checked like any other (a completer given a name it does not expect may
    // answer values meant for another argument).
    let (completer, names): (_, Vec<&str>) = match &params.reference {
        CompletionReference::Prompt { name, .. } => {
            let prompt = registry
                .prompt(name)
                .ok_or_else(|| RpcError::invalid_params(format!("Unknown prompt: {name}")))?;
            let names = prompt.prompt.arguments.iter().flatten();
            (
                prompt.complete.clone(),
                names.map(|a| a.name.as_str()).collect(),
            )
        }
        CompletionReference::Resource { uri } => match registry.template(uri) {
            Some(t) => (t.def.complete.clone(), t.parsed.variables().collect()),
            // A static resource has no arguments.
            None if registry.is_static_resource(uri) => (None, Vec::new()),
            None => {
                return Err(RpcError::invalid_params(format!(
                    "Unknown resource template: {uri}"
                )));
            }
        },
    };
    let context_names = params
        .context
        .as_ref()
        .and_then(|c| c.arguments.as_ref())
        .into_iter()
        .flat_map(|a| a.keys());
    for given in std::iter::once(&params.argument.name).chain(context_names) {
        if !names.contains(&given.as_str()) {
            return Err(RpcError::invalid_params(format!(
                "Invalid params: {given:?} is not an argument of {}; it has {}",
                named(&params.reference),
                match names.as_slice() {
                    [] => "none".to_owned(),
                    names => names.join(", "),
                }
            )));
        }
    }
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
                    // The total counts at least the values the completer gave; more than
                    // are sent means there are more.
                    let given = c.values.len() as u64;
                    if c.total.is_some() || given > MAX_VALUES as u64 {
                        c.total = Some(c.total.unwrap_or(0).max(given));
                    }
                    c.values.truncate(MAX_VALUES);
                    if c.total.is_some_and(|total| total > c.values.len() as u64) {
                        c.has_more = Some(true);
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

/// What a completion refers to, as its refusals name it.
fn named(reference: &CompletionReference) -> String {
    match reference {
        CompletionReference::Prompt { name, .. } => format!("prompt {name:?}"),
        CompletionReference::Resource { uri } => format!("resource {uri:?}"),
    }
}
