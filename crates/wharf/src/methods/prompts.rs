//! `prompts/get`.

use std::sync::Arc;

use wharf_protocol::{GetPromptParams, ResultType, methods};

use crate::context::Context;
use crate::driver::{drive, open_turn};
use crate::error::RpcError;
use crate::methods::Call;
use crate::mrtr::Binding;
use crate::reply::respond;
use crate::uri_template;

/// Gets prompt `params.name` with its arguments.
pub(crate) async fn get(call: Call<'_, Box<GetPromptParams>>) -> Result<Vec<u8>, RpcError> {
    let Call {
        registry,
        runtime,
        id,
        info,
        params,
        caller,
    } = call;
    let prompt = registry
        .prompt(&params.name)
        .ok_or_else(|| RpcError::invalid_params(format!("Unknown prompt: {}", params.name)))?;
    let args = params.arguments.unwrap_or_default();
    prompt.check_args(&args)?;
    let turn = open_turn(
        runtime,
        &info,
        &caller.principal,
        params.request_state.as_deref(),
        params.input_responses,
        || {
            let map = args
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect();
            Binding::new(methods::PROMPTS_GET, &params.name, &map)
        },
    )?;
    let cx = Context::new(runtime, id.clone(), info, caller);
    let get = Arc::clone(&prompt.get);
    match drive(cx, turn, |cx| get(cx, args)).await?.or_error()? {
        Ok(mut result) => {
            if let Some(uri) =
                uri_template::bad_content_uri(result.messages.iter().map(|m| &m.content))
            {
                return Err(RpcError::internal(format!(
                    "prompt {} returned content whose URI {uri:?} is not a URI (RFC 3986)",
                    params.name
                )));
            }
            // A handler asks for input through its error, never through this field.
            result.result_type = ResultType::Complete;
            result.meta.server_info = Some(runtime.info.clone());
            respond(&id, &result)
        }
        Err(asked) => Ok(asked),
    }
}
