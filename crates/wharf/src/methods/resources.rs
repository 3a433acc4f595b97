//! `resources/read`.

use std::sync::Arc;

use wharf_protocol::{
    CacheHints, CacheScope, ReadResourceParams, ReadResourceResult, ResultType, methods,
};

use crate::context::Context;
use crate::driver::{drive, open_turn};
use crate::error::RpcError;
use crate::methods::Call;
use crate::mrtr::Binding;
use crate::registry::ResourceTarget;
use crate::reply::respond;
use crate::resource::ReadRequest;
use crate::uri_template;

/// Reads the resource `params.uri`, static or through a template.
pub(crate) async fn read(call: Call<'_, Box<ReadResourceParams>>) -> Result<Vec<u8>, RpcError> {
    let Call {
        registry,
        runtime,
        id,
        info,
        params,
        caller,
    } = call;
    let uri = params.uri;
    // Its scopes were checked in admission.
    let Some(target) = registry.resource(&uri) else {
        return Err(RpcError::resource_not_found(&uri));
    };
    // What needs scopes is for those who hold them: a shared cache (a gateway) must not
    // hand it to anyone else, whatever the resource's own hints say.
    let scoped = !target.scopes().is_empty();
    let (handler, hints, vars) = match target {
        ResourceTarget::Static(r) => (Arc::clone(&r.read), r.cache, Default::default()),
        ResourceTarget::Template(t, vars) => (Arc::clone(&t.def.read), t.def.cache, vars),
    };
    // The answer to a request that carries answers depends on them: never cached.
    let answered = params
        .input_responses
        .as_ref()
        .is_some_and(|r| !r.is_empty());
    let turn = open_turn(
        runtime,
        &info,
        &caller.principal,
        params.request_state.as_deref(),
        params.input_responses,
        || Binding::new(methods::RESOURCES_READ, &uri, &serde_json::Map::new()),
    )?;
    let retried = answered || turn.as_ref().is_some_and(|t| t.round.number > 0);
    let cx = Context::new(runtime, id.clone(), info, caller);
    let request = ReadRequest {
        uri: uri.clone(),
        vars,
    };
    let contents = match drive(cx, turn, |cx| handler(cx, request))
        .await?
        .or_error()?
    {
        Ok(contents) => contents,
        Err(asked) => return Ok(asked),
    };
    if contents.is_empty() {
        // A resource with no contents does not exist (SEP-2164): never answer empty.
        return Err(RpcError::resource_not_found(&uri));
    }
    if let Some(bad) = uri_template::bad_contents_uri(&contents) {
        return Err(RpcError::internal(format!(
            "the resource {uri} was read as contents whose URI {bad:?} is not a URI (RFC 3986)"
        )));
    }
    respond(
        &id,
        &ReadResourceResult {
            result_type: ResultType::Complete,
            contents,
            cache: Some(if retried {
                CacheHints {
                    ttl_ms: 0,
                    cache_scope: CacheScope::Private,
                }
            } else {
                let mut hints = hints.unwrap_or(runtime.config.cache.resource_read);
                if scoped {
                    hints.cache_scope = CacheScope::Private;
                }
                hints
            }),
            meta: runtime.result_meta(),
        },
    )
}
