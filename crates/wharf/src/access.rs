//! What a request may do, decided before it runs: the protocol version, the scopes of what
//! it reaches (a tool, a prompt, a resource; a completion those of its prompt or template, a
//! `subscriptions/listen` those of each resource it subscribes to), and for a tool call the
//! client capabilities the tool needs. Pure checks over the registry; admission runs them
//! once for every request.

use crate::error::RpcError;
use crate::meta::capabilities_cover;
use crate::principal::Principal;
use crate::registry::Registry;
use crate::request::{ParsedRequest, RequestBody};
use wharf_protocol::CompletionReference;

/// A request that may not run, and the scopes it would need when that is why.
#[derive(Debug)]
pub(crate) struct Denial {
    pub(crate) error: RpcError,
    /// Every scope the refused request needs (empty unless scopes are what it lacks).
    pub(crate) required_scopes: Vec<String>,
}

impl From<RpcError> for Denial {
    fn from(error: RpcError) -> Self {
        Denial {
            error,
            required_scopes: Vec::new(),
        }
    }
}

impl From<Denial> for RpcError {
    fn from(denial: Denial) -> Self {
        denial.error
    }
}

/// Every check a request must pass before it runs.
pub(crate) fn check(
    registry: &Registry,
    req: &ParsedRequest,
    principal: &Principal,
) -> Result<(), Denial> {
    req.info.check_version(registry.versions)?;
    match &req.body {
        RequestBody::CallTool(params) => {
            if let Some(entry) = registry.tool(&params.name) {
                scopes(principal, &entry.def.scopes, "tool", &params.name)?;
                if let Some(required) = &entry.def.requires {
                    if !capabilities_cover(&req.info.client_capabilities, required) {
                        return Err(RpcError::missing_capability(
                            required,
                            &format!("tool {:?}", params.name),
                        )
                        .into());
                    }
                }
            }
        }
        RequestBody::GetPrompt(params) => {
            if let Some(prompt) = registry.prompt(&params.name) {
                scopes(principal, &prompt.scopes, "prompt", &params.name)?;
            }
        }
        RequestBody::ReadResource(params) => resource(registry, principal, &params.uri)?,
        // A completer lists values of its prompt or template: it needs what they need.
        RequestBody::Complete(params) => match &params.reference {
            CompletionReference::Prompt { name, .. } => {
                if let Some(prompt) = registry.prompt(name) {
                    scopes(principal, &prompt.scopes, "prompt", name)?;
                }
            }
            CompletionReference::Resource { uri } => match registry.template(uri) {
                Some(t) => {
                    let bound = params.context.as_ref().and_then(|c| c.arguments.as_ref());
                    let needed = t.completion_scopes(bound.unwrap_or(&Default::default()));
                    scopes(principal, &needed, "resource template", uri)?;
                }
                None => resource(registry, principal, uri)?,
            },
        },
        // A subscription to a resource tells when it changes: it needs what a read needs.
        RequestBody::Listen(params) => {
            for uri in params.notifications.resource_subscriptions.iter().flatten() {
                resource(registry, principal, uri)?;
            }
        }
        RequestBody::Discover
        | RequestBody::ListTools { .. }
        | RequestBody::ListPrompts { .. }
        | RequestBody::ListResources { .. }
        | RequestBody::ListResourceTemplates { .. } => {}
    }
    Ok(())
}

/// The scopes a read of `uri` needs, checked (none for a URI no definition serves).
pub(crate) fn resource(
    registry: &Registry,
    principal: &Principal,
    uri: &str,
) -> Result<(), Denial> {
    match registry.resource(uri) {
        Some(target) => scopes(principal, &target.scopes(), "resource", uri),
        None => Ok(()),
    }
}

/// Refuses a principal whose token lacks a scope `kind name` needs.
fn scopes(
    principal: &Principal,
    required: &[String],
    kind: &str,
    name: &str,
) -> Result<(), Denial> {
    let missing = principal.missing_scopes(required);
    if missing.is_empty() {
        return Ok(());
    }
    Err(Denial {
        error: RpcError::insufficient_scope(&format!("{kind} {name:?}"), required, &missing),
        required_scopes: required.to_vec(),
    })
}
