//! `completion/complete`: the values a prompt argument or a template variable may take.

use wharf_protocol::{CompleteParams, CompleteResult, Completion, CompletionReference, ResultType};

use crate::context::Context;
use crate::driver::drive;
use crate::error::RpcError;
use crate::handler::HandlerError;
use crate::methods::Call;
use crate::reply::respond;

/// The most values a completion carries (the schema's cap).
const MAX_VALUES: usize = 100;

/// What a completer that asks the client for input fails with.
const CANNOT_ASK: &str = "a completer asked the client for input, which completions cannot carry";

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
            // A completion has no input_required form: a completer that asks is the server's
            // error, before its ask is sealed, where a capability the client lacks would be
            // named (-32021), and declaring it would not let the completion ask.
            let complete = |cx| async move {
                match completer(cx, argument, context).await {
                    Err(HandlerError::InputRequired(_)) => Err(HandlerError::internal(CANNOT_ASK)),
                    done => done,
                }
            };
            let ended = drive(cx, None, complete).await?;
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
                Err(_) => return Err(RpcError::internal(CANNOT_ASK)),
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

#[cfg(test)]
mod tests {
    use serde_json::json;
    use wharf_protocol::{Completion, Implementation};

    use crate::error::ErrorKind;
    use crate::prompt::prompt;
    use crate::server::Server;
    use crate::testing::Harness;

    /// A completer that asks the client for input is the server's error (-32603), whatever
    /// the client declared: it was -32021 naming `elicitation` for a client without it,
    /// which would have the client declare it and ask again, in vain.
    #[tokio::test]
    async fn a_completer_that_asks_is_the_servers_error() {
        let server = Server::builder(Implementation::new("t", "1"))
            .prompt(
                prompt("p")
                    .argument("a", "A", true)
                    .completer(|cx, _argument, _context| async move {
                        let form = crate::FormSchema::new().string("x", "X", true);
                        Err::<Completion, _>(cx.ask().elicit("x", "X?", form).into())
                    })
                    .handler(|_cx, _args| async { Ok(Default::default()) }),
            )
            .build()
            .unwrap();
        for declared in [json!({}), json!({ "elicitation": {} })] {
            let params = json!({
                "ref": { "type": "ref/prompt", "name": "p" },
                "argument": { "name": "a", "value": "" },
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": declared,
                },
            });
            let refused = Harness::new(server.clone())
                .call("completion/complete", params)
                .await
                .unwrap_err();
            assert_eq!(
                refused.error().kind,
                ErrorKind::Internal,
                "{declared}: {refused:?}"
            );
        }
    }
}
