//! From a parsed envelope to a response: method lookup, params, `_meta`, version, and the
//! handlers.

use std::borrow::Cow;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde::ser::SerializeMap;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use wharf_protocol::jsonrpc::write_result;
use wharf_protocol::{
    CacheHints, CallToolParams, CompleteParams, CompleteResult, Completion, CompletionReference,
    DiscoverResult, GetPromptParams, ListenParams, PaginatedParams, ReadResourceParams,
    ReadResourceResult, RequestId, RequestMeta, RequestParams, ResultMeta, ResultType, methods,
    version,
};

use crate::context::{Context, Outbox};
use crate::cursor::ListKind;
use crate::error::{ErrorKind, RpcError};
use crate::meta::{RequestInfo, capabilities_cover};
use crate::mrtr::Binding;
use crate::principal::Principal;
use crate::resource::ReadRequest;
use crate::server::Server;

/// What a request asks for, with its params read into their types.
#[derive(Debug)]
pub enum RequestBody {
    Discover,
    ListTools { cursor: Option<String> },
    CallTool(Box<CallToolParams>),
    ListResources { cursor: Option<String> },
    ListResourceTemplates { cursor: Option<String> },
    ReadResource(Box<ReadResourceParams>),
    ListPrompts { cursor: Option<String> },
    GetPrompt(Box<GetPromptParams>),
    Complete(Box<CompleteParams>),
    Listen(Box<ListenParams>),
}

impl RequestBody {
    /// The method name.
    pub fn method(&self) -> &'static str {
        match self {
            RequestBody::Discover => methods::DISCOVER,
            RequestBody::ListTools { .. } => methods::TOOLS_LIST,
            RequestBody::CallTool(_) => methods::TOOLS_CALL,
            RequestBody::ListResources { .. } => methods::RESOURCES_LIST,
            RequestBody::ListResourceTemplates { .. } => methods::RESOURCES_TEMPLATES_LIST,
            RequestBody::ReadResource(_) => methods::RESOURCES_READ,
            RequestBody::ListPrompts { .. } => methods::PROMPTS_LIST,
            RequestBody::GetPrompt(_) => methods::PROMPTS_GET,
            RequestBody::Complete(_) => methods::COMPLETION_COMPLETE,
            RequestBody::Listen(_) => methods::SUBSCRIPTIONS_LISTEN,
        }
    }

    /// The value `Mcp-Name` must mirror, for the methods that have one.
    pub fn name(&self) -> Option<&str> {
        match self {
            RequestBody::CallTool(p) => Some(&p.name),
            RequestBody::GetPrompt(p) => Some(&p.name),
            RequestBody::ReadResource(p) => Some(&p.uri),
            _ => None,
        }
    }
}

/// A request whose method is known, params typed and `_meta` complete.
#[derive(Debug)]
pub struct ParsedRequest {
    pub id: RequestId,
    /// Boxed: it is large, and moving it through every future layer costs copies.
    pub info: Box<RequestInfo>,
    pub body: RequestBody,
}

impl ParsedRequest {
    /// Whether this is a `subscriptions/listen` request.
    pub fn is_listen(&self) -> bool {
        matches!(self.body, RequestBody::Listen(_))
    }
}

/// What a transport hands the core for one request besides the request itself.
pub struct Scope {
    /// Who the request acts for, resolved by the transport before anything else ran.
    pub principal: Principal,
    /// Cancelled when the client goes away or cancels; `None` when nothing can cancel the
    /// request (a plain JSON response), which spares the bookkeeping.
    pub cancel: Option<CancellationToken>,
    /// Where notifications for this request go; `None` when the response is not a stream.
    pub outbox: Option<Outbox>,
}

trait HasMeta {
    fn take_meta(&mut self) -> Option<RequestMeta>;
}

macro_rules! has_meta {
    ($($t:ty),*) => {$(
        impl HasMeta for $t {
            fn take_meta(&mut self) -> Option<RequestMeta> { self.meta.take() }
        }
    )*};
}
has_meta!(
    RequestParams,
    PaginatedParams,
    CallToolParams,
    ReadResourceParams,
    GetPromptParams,
    CompleteParams,
    ListenParams
);

fn read_params<T: DeserializeOwned + HasMeta>(
    params: Option<&RawValue>,
) -> Result<(T, Option<RequestMeta>), RpcError> {
    let text = params.map_or("{}", RawValue::get);
    let mut value: T = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return Err(params_error::<T>(text, e)),
    };
    let meta = value.take_meta();
    Ok((value, meta))
}

/// Names what is wrong with params that did not parse. Only the failure path pays for
/// tracking where the error is: a malformed `_meta` is refused before dispatch (HTTP 400),
/// anything else is an invalid param of the method.
fn params_error<T: DeserializeOwned>(text: &str, e: serde_json::Error) -> RpcError {
    let mut de = serde_json::Deserializer::from_str(text);
    let path = match serde_path_to_error::deserialize::<_, T>(&mut de) {
        Err(err) => err.path().to_string(),
        Ok(_) => String::new(),
    };
    if path == "_meta" || path.starts_with("_meta.") {
        RpcError::new(
            ErrorKind::MalformedMeta,
            format!("Invalid params: malformed {path}: {e}"),
        )
    } else if path.is_empty() || path == "." {
        RpcError::invalid_params(format!("Invalid params: {e}"))
    } else {
        RpcError::invalid_params(format!("Invalid params: {path}: {e}"))
    }
}

impl Server {
    /// Reads a request: the method must exist (and its capability be offered), the params
    /// must have their type, and `_meta` its required fields. The version is checked
    /// separately ([`RequestInfo::check_version`]) so a transport can first compare headers.
    ///
    /// On failure the id is handed back so the error can echo it.
    pub fn parse_request(
        &self,
        id: RequestId,
        method: &str,
        params: Option<&RawValue>,
    ) -> Result<ParsedRequest, (RpcError, RequestId)> {
        match self.read_request(method, params) {
            Ok((info, body)) => Ok(ParsedRequest { id, info, body }),
            Err(e) => Err((e, id)),
        }
    }

    fn read_request(
        &self,
        method: &str,
        params: Option<&RawValue>,
    ) -> Result<(Box<RequestInfo>, RequestBody), RpcError> {
        let caps = &self.inner.capabilities;
        let offered = |present: bool| {
            if present {
                Ok(())
            } else {
                Err(RpcError::method_not_found(method))
            }
        };
        let (body, meta) = match method {
            methods::DISCOVER => (
                RequestBody::Discover,
                read_params::<RequestParams>(params)?.1,
            ),
            methods::TOOLS_LIST => {
                offered(caps.tools.is_some())?;
                let (p, m) = read_params::<PaginatedParams>(params)?;
                (RequestBody::ListTools { cursor: p.cursor }, m)
            }
            methods::TOOLS_CALL => {
                offered(caps.tools.is_some())?;
                let (p, m) = read_params::<CallToolParams>(params)?;
                (RequestBody::CallTool(Box::new(p)), m)
            }
            methods::PROMPTS_LIST => {
                offered(caps.prompts.is_some())?;
                let (p, m) = read_params::<PaginatedParams>(params)?;
                (RequestBody::ListPrompts { cursor: p.cursor }, m)
            }
            methods::PROMPTS_GET => {
                offered(caps.prompts.is_some())?;
                let (p, m) = read_params::<GetPromptParams>(params)?;
                (RequestBody::GetPrompt(Box::new(p)), m)
            }
            methods::RESOURCES_LIST => {
                offered(caps.resources.is_some())?;
                let (p, m) = read_params::<PaginatedParams>(params)?;
                (RequestBody::ListResources { cursor: p.cursor }, m)
            }
            methods::RESOURCES_TEMPLATES_LIST => {
                offered(caps.resources.is_some())?;
                let (p, m) = read_params::<PaginatedParams>(params)?;
                (RequestBody::ListResourceTemplates { cursor: p.cursor }, m)
            }
            methods::RESOURCES_READ => {
                offered(caps.resources.is_some())?;
                let (p, m) = read_params::<ReadResourceParams>(params)?;
                (RequestBody::ReadResource(Box::new(p)), m)
            }
            methods::COMPLETION_COMPLETE => {
                offered(caps.completions.is_some())?;
                let (p, m) = read_params::<CompleteParams>(params)?;
                (RequestBody::Complete(Box::new(p)), m)
            }
            methods::SUBSCRIPTIONS_LISTEN => {
                let (p, m) = read_params::<ListenParams>(params)?;
                (RequestBody::Listen(Box::new(p)), m)
            }
            _ => return Err(RpcError::method_not_found(method)),
        };
        Ok((Box::new(RequestInfo::from_meta(meta)?), body))
    }

    /// Runs a request (other than `subscriptions/listen`) and returns the whole JSON-RPC
    /// response message. Notifications go to `scope.outbox` while it runs.
    pub async fn execute(&self, req: ParsedRequest, scope: Scope) -> Result<Vec<u8>, RpcError> {
        // A request that carries W3C trace context gets an info-level span holding it, so the
        // trace joins the client's; others get a debug-level span, free unless enabled.
        let span = match &req.info.traceparent {
            Some(tp) => tracing::info_span!(
                "mcp.request",
                method = req.body.method(),
                id = %req.id,
                traceparent = tp.as_str(),
                tracestate = req.info.tracestate.as_deref().unwrap_or(""),
            ),
            None => tracing::debug_span!("mcp.request", method = req.body.method(), id = %req.id),
        };
        match scope.cancel.clone() {
            Some(cancel) => {
                let work = self.run_chain(req, scope).instrument(span);
                tokio::select! {
                    biased;
                    () = cancel.cancelled() => Err(crate::middleware::cancelled()),
                    out = work => out,
                }
            }
            None => self.run_chain(req, scope).instrument(span).await,
        }
    }

    /// The middleware chain, then the core; straight to the core when there is no chain.
    async fn run_chain(&self, req: ParsedRequest, scope: Scope) -> Result<Vec<u8>, RpcError> {
        if self.inner.middleware.is_empty() {
            self.run(req, scope).await
        } else {
            self.run_from(0, req, scope).await
        }
    }

    /// Runs a request whose answer is a stream: notifications go to `outbox` while it runs,
    /// then the final response (result or error) is returned, unless `cancel` fired, in
    /// which case nothing more may be sent and `None` is returned.
    pub async fn execute_streamed(
        &self,
        req: ParsedRequest,
        principal: Principal,
        cancel: CancellationToken,
        outbox: Outbox,
    ) -> Option<Vec<u8>> {
        let id = req.id.clone();
        let outcome = self
            .execute(
                req,
                Scope {
                    principal,
                    cancel: Some(cancel.clone()),
                    outbox: Some(outbox),
                },
            )
            .await;
        if cancel.is_cancelled() {
            return None;
        }
        Some(outcome.unwrap_or_else(|e| {
            let mut buf = Vec::with_capacity(128);
            let _ = wharf_protocol::jsonrpc::write_error(&mut buf, Some(&id), &e.to_object());
            buf
        }))
    }

    /// The checks a request must pass before anything is sent for it: the version, the
    /// scopes of what it calls (a tool, a prompt, a resource; a completion needs those of its
    /// prompt or template, a `subscriptions/listen` those of each resource it subscribes
    /// to), and for a tool call the client capabilities the tool needs. A transport that
    /// streams its answer (and every `subscriptions/listen`) calls this first, so these
    /// refusals keep their HTTP status; [`Server::execute`] runs it for every request, and
    /// the methods themselves check nothing of this again.
    pub fn admit(&self, req: &ParsedRequest, principal: &Principal) -> Result<(), RpcError> {
        req.info.check_version()?;
        if let RequestBody::CallTool(params) = &req.body {
            let entry = self
                .inner
                .tool_index
                .get(&params.name)
                .map(|&i| &self.inner.tools[i]);
            if let Some(entry) = entry {
                check_scopes(principal, &entry.def.scopes, "tool", &params.name)?;
            }
            if let Some(required) = entry.and_then(|e| e.def.requires.as_ref()) {
                if !capabilities_cover(&req.info.client_capabilities, required) {
                    return Err(RpcError::missing_capability(
                        required,
                        &format!("tool {:?}", params.name),
                    ));
                }
            }
        }
        if let RequestBody::GetPrompt(params) = &req.body {
            if let Some(&i) = self.inner.prompt_index.get(&params.name) {
                let scopes = &self.inner.prompts[i].scopes;
                check_scopes(principal, scopes, "prompt", &params.name)?;
            }
        }
        if let RequestBody::ReadResource(params) = &req.body {
            self.check_resource_scopes(principal, &params.uri)?;
        }
        // A completer lists values of its prompt or template: it needs what they need.
        if let RequestBody::Complete(params) = &req.body {
            match &params.reference {
                CompletionReference::Prompt { name, .. } => {
                    if let Some(&i) = self.inner.prompt_index.get(name) {
                        check_scopes(principal, &self.inner.prompts[i].scopes, "prompt", name)?;
                    }
                }
                CompletionReference::Resource { uri } => {
                    if let Some(t) = self
                        .inner
                        .templates
                        .iter()
                        .find(|t| t.def.template.uri_template == *uri)
                    {
                        // Per-item scopes name no item yet: the template's fixed ones apply.
                        let fixed: Vec<String> = t
                            .def
                            .scopes
                            .iter()
                            .filter(|s| !s.contains('{'))
                            .cloned()
                            .collect();
                        check_scopes(principal, &fixed, "resource template", uri)?;
                    } else {
                        self.check_resource_scopes(principal, uri)?;
                    }
                }
            }
        }
        // A subscription to a resource tells when it changes: it needs what a read needs.
        if let RequestBody::Listen(params) = &req.body {
            for uri in params.notifications.resource_subscriptions.iter().flatten() {
                self.check_resource_scopes(principal, uri)?;
            }
        }
        Ok(())
    }

    /// The scopes a read of `uri` needs, checked (none for a URI no definition serves).
    fn check_resource_scopes(&self, principal: &Principal, uri: &str) -> Result<(), RpcError> {
        let scopes = match self.inner.resource_index.get(uri) {
            Some(&i) => Some(Cow::Borrowed(self.inner.resources[i].scopes.as_slice())),
            None => self
                .inner
                .templates
                .iter()
                .find_map(|t| t.parsed.match_uri(uri).map(|vars| t.scopes_for(&vars))),
        };
        match scopes {
            Some(scopes) => check_scopes(principal, &scopes, "resource", uri),
            None => Ok(()),
        }
    }

    pub(crate) async fn run(&self, req: ParsedRequest, scope: Scope) -> Result<Vec<u8>, RpcError> {
        // Whatever path led here, nothing runs that admission would refuse.
        self.admit(&req, &scope.principal)?;
        let ParsedRequest { id, info, body } = req;
        let inner = &self.inner;
        let meta = || ResultMeta::server(inner.info.clone());
        let cache = &inner.config.cache;
        match body {
            RequestBody::Discover => respond(
                &id,
                &DiscoverResult {
                    result_type: ResultType::Complete,
                    supported_versions: version::SUPPORTED
                        .iter()
                        .map(|v| (*v).to_owned())
                        .collect(),
                    capabilities: inner.capabilities.clone(),
                    instructions: inner.instructions.clone(),
                    cache: Some(cache.discover),
                    meta: meta(),
                },
            ),
            RequestBody::ListTools { cursor } => {
                // Filtered per principal, the list is private to it.
                let filter =
                    inner.config.list_permitted_tools_only && scope.principal.grant().is_some();
                let items: Vec<_> = inner
                    .tools
                    .iter()
                    .filter(|t| !filter || scope.principal.missing_scopes(&t.def.scopes).is_empty())
                    .map(|t| &t.def.tool)
                    .collect();
                let hints = if filter {
                    CacheHints {
                        cache_scope: wharf_protocol::CacheScope::Private,
                        ..cache.tools_list
                    }
                } else {
                    cache.tools_list
                };
                self.page(
                    &id,
                    "tools",
                    &items,
                    cursor,
                    ListKind::Tools,
                    inner.fingerprints.tools,
                    hints,
                )
            }
            RequestBody::ListPrompts { cursor } => {
                let items: Vec<_> = inner.prompts.iter().map(|p| &p.prompt).collect();
                self.page(
                    &id,
                    "prompts",
                    &items,
                    cursor,
                    ListKind::Prompts,
                    inner.fingerprints.prompts,
                    cache.prompts_list,
                )
            }
            RequestBody::ListResources { cursor } => {
                let items: Vec<_> = inner.resources.iter().map(|r| &r.resource).collect();
                let fp = inner.fingerprints.resources;
                self.page(
                    &id,
                    "resources",
                    &items,
                    cursor,
                    ListKind::Resources,
                    fp,
                    cache.resources_list,
                )
            }
            RequestBody::ListResourceTemplates { cursor } => {
                let items: Vec<_> = inner.templates.iter().map(|t| &t.def.template).collect();
                let fp = inner.fingerprints.templates;
                self.page(
                    &id,
                    "resourceTemplates",
                    &items,
                    cursor,
                    ListKind::ResourceTemplates,
                    fp,
                    cache.templates_list,
                )
            }
            RequestBody::CallTool(params) => self.call_tool(id, info, params, scope).await,
            RequestBody::ReadResource(params) => self.read_resource(id, info, params, scope).await,
            RequestBody::GetPrompt(params) => {
                let prompt = inner
                    .prompt_index
                    .get(&params.name)
                    .map(|&i| &inner.prompts[i])
                    .ok_or_else(|| {
                        RpcError::invalid_params(format!("Unknown prompt: {}", params.name))
                    })?;
                let args = params.arguments.unwrap_or_default();
                prompt.check_args(&args)?;
                let turn = self.open_turn(
                    &info,
                    &scope.principal,
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
                let mut cx = Context::new(id.clone(), info, scope, self.clone());
                let resume = cx.enter_turn(turn);
                let progress = cx.progress_stream();
                let got = (prompt.get)(cx, args).await;
                finish_progress(progress).await;
                let mut result = match got {
                    Ok(r) => r,
                    Err(e) => return self.answer_ask(&id, e, resume.as_ref()),
                };
                result.meta.server_info = Some(inner.info.clone());
                respond(&id, &result)
            }
            RequestBody::Complete(params) => {
                let handler = match &params.reference {
                    CompletionReference::Prompt { name, .. } => inner
                        .prompt_index
                        .get(name)
                        .map(|&i| inner.prompts[i].complete.clone())
                        .ok_or_else(|| {
                            RpcError::invalid_params(format!("Unknown prompt: {name}"))
                        })?,
                    CompletionReference::Resource { uri } => inner
                        .templates
                        .iter()
                        .find(|t| t.def.template.uri_template == *uri)
                        .map(|t| t.def.complete.clone())
                        .or_else(|| inner.resource_index.get(uri).map(|_| None))
                        .ok_or_else(|| {
                            RpcError::invalid_params(format!("Unknown resource template: {uri}"))
                        })?,
                };
                let completion = match handler {
                    Some(h) => {
                        let cx = Context::new(id.clone(), info, scope, self.clone());
                        let progress = cx.progress_stream();
                        let got = h(cx, params.argument, params.context.unwrap_or_default()).await;
                        finish_progress(progress).await;
                        let mut c = got?;
                        if c.values.len() > 100 {
                            // The schema caps values at 100: say that there were more.
                            c.total.get_or_insert(c.values.len() as u64);
                            c.has_more = Some(true);
                            c.values.truncate(100);
                        }
                        c
                    }
                    None => Completion::default(),
                };
                respond(
                    &id,
                    &CompleteResult {
                        result_type: ResultType::Complete,
                        completion,
                        meta: meta(),
                    },
                )
            }
            RequestBody::Listen(_) => Err(RpcError::new(
                ErrorKind::InvalidRequest,
                "subscriptions/listen needs a streaming transport",
            )),
        }
    }

    async fn read_resource(
        &self,
        id: RequestId,
        info: Box<RequestInfo>,
        params: Box<ReadResourceParams>,
        scope: Scope,
    ) -> Result<Vec<u8>, RpcError> {
        let inner = &self.inner;
        let uri = params.uri;
        // Its scopes were checked in admission (`Server::admit`).
        let (handler, hints, vars) = if let Some(&i) = inner.resource_index.get(&uri) {
            let r = &inner.resources[i];
            (r.read.clone(), r.cache, Default::default())
        } else if let Some((t, vars)) = inner
            .templates
            .iter()
            .find_map(|t| t.parsed.match_uri(&uri).map(|v| (t, v)))
        {
            (t.def.read.clone(), t.def.cache, vars)
        } else {
            return Err(not_found(&uri));
        };
        // An answer that carries answers depends on them: never cached.
        let answered = params
            .input_responses
            .as_ref()
            .is_some_and(|r| !r.is_empty());
        let turn = self.open_turn(
            &info,
            &scope.principal,
            params.request_state.as_deref(),
            params.input_responses,
            || Binding::new(methods::RESOURCES_READ, &uri, &serde_json::Map::new()),
        )?;
        let mut cx = Context::new(id.clone(), info, scope, self.clone());
        let resume = cx.enter_turn(turn);
        let retried = resume.as_ref().is_some_and(|r| r.round > 0) || answered;
        let progress = cx.progress_stream();
        let read = handler(
            cx,
            ReadRequest {
                uri: uri.clone(),
                vars,
            },
        )
        .await;
        finish_progress(progress).await;
        let contents = match read {
            Ok(c) => c,
            Err(e) => return self.answer_ask(&id, e, resume.as_ref()),
        };
        if contents.is_empty() {
            // A resource with no contents does not exist (SEP-2164): never answer empty.
            return Err(not_found(&uri));
        }
        respond(
            &id,
            &ReadResourceResult {
                result_type: ResultType::Complete,
                contents,
                // The answer to a retry depends on the answers it carried: never cached.
                cache: Some(if retried {
                    CacheHints {
                        ttl_ms: 0,
                        cache_scope: wharf_protocol::CacheScope::Private,
                    }
                } else {
                    hints.unwrap_or(inner.config.cache.resource_read)
                }),
                meta: ResultMeta::server(inner.info.clone()),
            },
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn page<T: Serialize>(
        &self,
        id: &RequestId,
        key: &'static str,
        items: &[&T],
        cursor: Option<String>,
        kind: ListKind,
        fingerprint: u64,
        hints: CacheHints,
    ) -> Result<Vec<u8>, RpcError> {
        let codec = &self.inner.cursors;
        let start = match cursor {
            Some(c) => usize::try_from(codec.decode(&c, kind, fingerprint)?).unwrap_or(usize::MAX),
            None => 0,
        };
        if start > items.len() {
            return Err(RpcError::invalid_params(
                "Invalid cursor: it points past the end of the list",
            ));
        }
        let end = start
            .saturating_add(self.inner.config.page_size)
            .min(items.len());
        let next_cursor = (end < items.len()).then(|| codec.encode(kind, end as u64, fingerprint));
        respond(
            id,
            &Page {
                key,
                items: &items[start..end],
                next_cursor,
                hints,
                meta: ResultMeta::server(self.inner.info.clone()),
            },
        )
    }
}

/// Refuses a principal whose token lacks a scope `what` needs.
pub(crate) fn check_scopes(
    principal: &Principal,
    required: &[String],
    kind: &str,
    name: &str,
) -> Result<(), RpcError> {
    let missing = principal.missing_scopes(required);
    if missing.is_empty() {
        Ok(())
    } else {
        Err(RpcError::insufficient_scope(
            &format!("{kind} {name:?}"),
            required,
            &missing,
        ))
    }
}

/// Sends a request's kept progress and closes its stream before the response goes out.
async fn finish_progress(progress: Option<std::sync::Arc<crate::progress::ProgressStream>>) {
    if let Some(progress) = progress {
        progress.finish().await;
    }
}

/// `-32602` for an unknown resource, with its URI in `data`.
pub fn not_found(uri: &str) -> RpcError {
    RpcError::invalid_params(format!("Resource not found: {uri}"))
        .with_data(serde_json::json!({ "uri": uri }))
}

/// One page of a list, serialized straight from the registry without copying definitions.
struct Page<'a, T> {
    key: &'static str,
    items: &'a [&'a T],
    next_cursor: Option<String>,
    hints: CacheHints,
    meta: ResultMeta,
}

impl<T: Serialize> Serialize for Page<'_, T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("resultType", &ResultType::Complete)?;
        map.serialize_entry(self.key, self.items)?;
        if let Some(c) = &self.next_cursor {
            map.serialize_entry("nextCursor", c)?;
        }
        map.serialize_entry("ttlMs", &self.hints.ttl_ms)?;
        map.serialize_entry("cacheScope", &self.hints.cache_scope)?;
        map.serialize_entry("_meta", &self.meta)?;
        map.end()
    }
}

pub(crate) fn respond<T: Serialize>(id: &RequestId, result: &T) -> Result<Vec<u8>, RpcError> {
    let mut buf = Vec::with_capacity(512);
    write_result(&mut buf, id, result).map_err(RpcError::internal)?;
    Ok(buf)
}
