//! The server: everything registered, built once and shared behind an `Arc`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use wharf_protocol::{
    CacheHints, CacheScope, Implementation, JsonObject, ListCapability, ResourcesCapability,
    ServerCapabilities, ServerInfo,
};

use crate::bus::{ChangeEvent, InProcessBus, NotificationBus};
use crate::cursor::{CursorCodec, CursorKey};
use crate::limits::{Gate, Limits, Permit};
use crate::prompt::PromptDef;
use crate::resource::{CompiledTemplate, ResourceDef, TemplateDef};
use crate::schema::{self, HeaderParam};
use crate::state::Store;
use crate::state::handle::SCHEMA_KEYWORD;
use crate::tool::ToolDef;

/// Caching hints per kind of result.
#[derive(Debug, Clone, Copy)]
pub struct CachePolicy {
    pub discover: CacheHints,
    pub tools_list: CacheHints,
    pub prompts_list: CacheHints,
    pub resources_list: CacheHints,
    pub templates_list: CacheHints,
    /// Default for `resources/read` when a resource sets none.
    pub resource_read: CacheHints,
}

impl Default for CachePolicy {
    fn default() -> Self {
        let public = |ttl_ms| CacheHints {
            ttl_ms,
            cache_scope: CacheScope::Public,
        };
        CachePolicy {
            discover: public(60_000),
            tools_list: public(60_000),
            prompts_list: public(60_000),
            resources_list: public(60_000),
            templates_list: public(60_000),
            resource_read: CacheHints {
                ttl_ms: 0,
                cache_scope: CacheScope::Private,
            },
        }
    }
}

/// Tunables of the core.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Items per page of a list.
    pub page_size: usize,
    /// Key that signs cursors; share it between replicas.
    pub cursor_key: CursorKey,
    /// How long a cursor stays valid.
    pub cursor_max_age: Duration,
    /// Caching hints.
    pub cache: CachePolicy,
    /// How long an idempotency record (a write's first result) is kept for replays.
    pub idempotency_retention: Duration,
    /// Caps on requests in flight and the wait queue.
    pub limits: Limits,
    /// The longest a tool call may run; a tool's own limit can only be shorter.
    pub max_call_duration: Duration,
    /// Progress messages of one request go out at most once per this interval (bursts are
    /// coalesced; the last value is always sent).
    pub progress_interval: Duration,
    /// Sealing of multi-round request states (MRTR): keys, lifetime, round cap.
    pub request_state: crate::mrtr::StateConfig,
    /// Whether `tools/list` shows an OAuth principal only the tools its token's scopes
    /// permit (the list is then `cacheScope: "private"`); otherwise it shows every tool.
    pub list_permitted_tools_only: bool,
    /// Store-level mutation locks (PostgreSQL sessions, Redis leases) one principal may hold
    /// or wait for at once in this process; its other mutating calls wait in turn, so one
    /// principal cannot take every lock session of the store.
    pub max_store_locks_per_principal: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            page_size: 100,
            cursor_key: CursorKey::random(),
            cursor_max_age: Duration::from_secs(3600),
            cache: CachePolicy::default(),
            idempotency_retention: Duration::from_secs(24 * 3600),
            limits: Limits::default(),
            max_call_duration: Duration::from_secs(300),
            progress_interval: Duration::from_millis(20),
            request_state: crate::mrtr::StateConfig::default(),
            list_permitted_tools_only: false,
            max_store_locks_per_principal: 8,
        }
    }
}

/// Why a server could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("tool {0:?}: the name must be 1 to 128 characters of A-Z, a-z, 0-9, '_', '-' and '.'")]
    ToolName(String),
    #[error("{kind} {name:?} is registered twice")]
    Duplicate { kind: &'static str, name: String },
    #[error("tool {tool:?}: inputSchema must be a JSON Schema object with \"type\": \"object\"")]
    InputNotObject { tool: String },
    #[error("tool {tool:?}: invalid {which}: {reason}")]
    Schema {
        tool: String,
        which: &'static str,
        reason: String,
    },
    #[error("tool {tool:?}: invalid x-mcp-header: {reason}")]
    HeaderParam { tool: String, reason: String },
    #[error("resource template {uri:?}: {reason}")]
    Template { uri: String, reason: String },
    #[error(
        "tool {tool:?} takes handles or is idempotent, which needs a store: call ServerBuilder::store"
    )]
    NeedsStore { tool: String },
    #[error(
        "tool {tool:?} mutates the value of {argument:?}, which must be a required string property of its inputSchema"
    )]
    MutatesArgument { tool: String, argument: String },
    #[error("page size must be at least 1")]
    PageSize,
}

/// A tool argument that is a handle, found through its schema marker.
#[derive(Debug, Clone)]
pub(crate) struct HandleParam {
    pub(crate) name: String,
    pub(crate) kind: String,
    pub(crate) created_by: String,
}

pub(crate) struct ToolEntry {
    pub(crate) def: ToolDef,
    /// The tool's own cap on calls at once.
    pub(crate) limit: Option<Arc<tokio::sync::Semaphore>>,
    pub(crate) handles: Vec<HandleParam>,
    pub(crate) input: Option<jsonschema::Validator>,
    pub(crate) output: Option<jsonschema::Validator>,
    pub(crate) header_params: Vec<HeaderParam>,
}

pub(crate) struct Inner {
    pub(crate) info: ServerInfo,
    pub(crate) instructions: Option<String>,
    pub(crate) capabilities: ServerCapabilities,
    pub(crate) tools: Vec<ToolEntry>,
    pub(crate) tool_index: HashMap<String, usize>,
    pub(crate) prompts: Vec<PromptDef>,
    pub(crate) prompt_index: HashMap<String, usize>,
    pub(crate) resources: Vec<ResourceDef>,
    pub(crate) resource_index: HashMap<String, usize>,
    pub(crate) templates: Vec<CompiledTemplate>,
    pub(crate) fingerprints: Fingerprints,
    pub(crate) config: ServerConfig,
    pub(crate) cursors: CursorCodec,
    pub(crate) bus: Arc<dyn NotificationBus>,
    pub(crate) store: Option<Arc<dyn Store>>,
    pub(crate) gate: Gate,
    pub(crate) lines: Arc<crate::serialize::Lines>,
    pub(crate) middleware: Vec<Arc<dyn crate::middleware::Middleware>>,
    pub(crate) shutdown: CancellationToken,
}

#[derive(Default)]
pub(crate) struct Fingerprints {
    pub(crate) tools: u64,
    pub(crate) prompts: u64,
    pub(crate) resources: u64,
    pub(crate) templates: u64,
}

/// A built MCP server. Cheap to clone; every clone is the same server.
#[derive(Clone)]
pub struct Server {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("name", &self.inner.info.name)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Starts building a server that calls itself `info`.
    pub fn builder(info: Implementation) -> ServerBuilder {
        ServerBuilder {
            info,
            instructions: None,
            tools: Vec::new(),
            prompts: Vec::new(),
            resources: Vec::new(),
            templates: Vec::new(),
            config: ServerConfig::default(),
            bus: None,
            store: None,
            logging: true,
            middleware: Vec::new(),
        }
    }

    /// Who this server is.
    pub fn info(&self) -> &ServerInfo {
        &self.inner.info
    }

    /// What this server offers.
    pub fn capabilities(&self) -> &ServerCapabilities {
        &self.inner.capabilities
    }

    /// The `x-mcp-header` arguments of tool `name` (empty for unknown tools).
    pub fn tool_header_params(&self, name: &str) -> &[HeaderParam] {
        self.inner
            .tool_index
            .get(name)
            .map(|&i| self.inner.tools[i].header_params.as_slice())
            .unwrap_or_default()
    }

    /// Announces a change to every listen stream that opted into it.
    pub async fn announce(&self, event: ChangeEvent) {
        if let Err(e) = self.inner.bus.publish(event).await {
            tracing::warn!(error = %e, "could not publish a change notification");
        }
    }

    /// Takes the slots a request needs to run (see [`Limits`]): waits in the queue when
    /// there is room, and refuses with `RetryLater` (HTTP 503) when there is none. A
    /// transport calls this before it answers anything, holds the permit while the request
    /// runs, and drops this future to take a cancelled request out of the queue.
    pub async fn enter(
        &self,
        req: &crate::dispatch::ParsedRequest,
        principal: &crate::principal::Principal,
    ) -> Result<Permit, crate::error::RpcError> {
        if req.is_listen() || self.inner.gate.is_open() {
            // Listen streams live long by design: they are not requests in flight. With no
            // caps at all there is nothing to take.
            return Ok(Permit::default());
        }
        let tool = match &req.body {
            crate::dispatch::RequestBody::CallTool(params) => self
                .inner
                .tool_index
                .get(&params.name)
                .and_then(|&i| self.inner.tools[i].limit.as_ref()),
            _ => None,
        };
        self.inner.gate.enter(principal.id(), tool).await
    }

    /// The store, if one was configured.
    pub fn store(&self) -> Option<&Arc<dyn Store>> {
        self.inner.store.as_ref()
    }

    /// Starts a graceful shutdown: open listen streams send their final response and end.
    pub fn shutdown(&self) {
        self.inner.shutdown.cancel();
    }

    /// Cancelled once [`Server::shutdown`] is called.
    pub fn shutdown_token(&self) -> &CancellationToken {
        &self.inner.shutdown
    }
}

/// Collects tools, resources and prompts, then builds an immutable [`Server`].
pub struct ServerBuilder {
    info: Implementation,
    instructions: Option<String>,
    tools: Vec<ToolDef>,
    prompts: Vec<PromptDef>,
    resources: Vec<ResourceDef>,
    templates: Vec<TemplateDef>,
    config: ServerConfig,
    bus: Option<Arc<dyn NotificationBus>>,
    store: Option<Arc<dyn Store>>,
    logging: bool,
    middleware: Vec<Arc<dyn crate::middleware::Middleware>>,
}

impl ServerBuilder {
    /// Instructions for the model, sent by `server/discover`.
    pub fn instructions(mut self, text: impl Into<String>) -> Self {
        self.instructions = Some(text.into());
        self
    }

    /// Registers a tool. Tools are listed in registration order.
    pub fn tool(mut self, tool: ToolDef) -> Self {
        self.tools.push(tool);
        self
    }

    /// Registers a prompt.
    pub fn prompt(mut self, prompt: PromptDef) -> Self {
        self.prompts.push(prompt);
        self
    }

    /// Registers a static resource.
    pub fn resource(mut self, resource: ResourceDef) -> Self {
        self.resources.push(resource);
        self
    }

    /// Registers a resource template.
    pub fn template(mut self, template: TemplateDef) -> Self {
        self.templates.push(template);
        self
    }

    /// Replaces the configuration.
    pub fn config(mut self, config: ServerConfig) -> Self {
        self.config = config;
        self
    }

    /// Uses `bus` for change notifications (the in-process bus otherwise).
    pub fn bus(mut self, bus: Arc<dyn NotificationBus>) -> Self {
        self.bus = Some(bus);
        self
    }

    /// Uses `store` for handles, idempotency records and app data.
    pub fn store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// Adds a layer around request handling (see [`crate::middleware`]); the first added is
    /// the outermost.
    pub fn middleware(self, layer: impl crate::middleware::Middleware) -> Self {
        self.middleware_arc(Arc::new(layer))
    }

    /// Adds a shared layer.
    pub fn middleware_arc(mut self, layer: Arc<dyn crate::middleware::Middleware>) -> Self {
        self.middleware.push(layer);
        self
    }

    /// Whether to declare the `logging` capability (on by default).
    pub fn logging(mut self, enabled: bool) -> Self {
        self.logging = enabled;
        self
    }

    /// Checks every definition and compiles every schema, once.
    pub fn build(self) -> Result<Server, BuildError> {
        if self.config.page_size == 0 {
            return Err(BuildError::PageSize);
        }
        let mut tools = Vec::with_capacity(self.tools.len());
        let mut tool_index = HashMap::new();
        for def in self.tools {
            let name = def.tool.name.clone();
            let valid_name = (1..=128).contains(&name.len())
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
            if !valid_name {
                return Err(BuildError::ToolName(name));
            }
            if def.tool.input_schema.get("type").and_then(|t| t.as_str()) != Some("object") {
                return Err(BuildError::InputNotObject { tool: name });
            }
            let input =
                schema::compile(&def.tool.input_schema).map_err(|reason| BuildError::Schema {
                    tool: name.clone(),
                    which: "inputSchema",
                    reason,
                })?;
            let output = match &def.tool.output_schema {
                Some(s) => schema::compile(s).map_err(|reason| BuildError::Schema {
                    tool: name.clone(),
                    which: "outputSchema",
                    reason,
                })?,
                None => None,
            };
            let header_params =
                schema::header_params(&def.tool.input_schema).map_err(|reason| {
                    BuildError::HeaderParam {
                        tool: name.clone(),
                        reason,
                    }
                })?;
            let handles = handle_params(&def.tool.input_schema);
            if (def.idempotent || !handles.is_empty()) && self.store.is_none() {
                return Err(BuildError::NeedsStore { tool: name });
            }
            if let Some(argument) = &def.mutates {
                if !required_string(&def.tool.input_schema, argument) {
                    return Err(BuildError::MutatesArgument {
                        tool: name,
                        argument: argument.clone(),
                    });
                }
            }
            if tool_index.insert(name.clone(), tools.len()).is_some() {
                return Err(BuildError::Duplicate { kind: "tool", name });
            }
            let limit = def
                .max_concurrency
                .map(|n| Arc::new(tokio::sync::Semaphore::new(n)));
            tools.push(ToolEntry {
                def,
                limit,
                handles,
                input,
                output,
                header_params,
            });
        }
        let mut prompt_index = HashMap::new();
        for (i, p) in self.prompts.iter().enumerate() {
            if prompt_index.insert(p.prompt.name.clone(), i).is_some() {
                return Err(BuildError::Duplicate {
                    kind: "prompt",
                    name: p.prompt.name.clone(),
                });
            }
        }
        let mut resource_index = HashMap::new();
        for (i, r) in self.resources.iter().enumerate() {
            if resource_index.insert(r.resource.uri.clone(), i).is_some() {
                return Err(BuildError::Duplicate {
                    kind: "resource",
                    name: r.resource.uri.clone(),
                });
            }
        }
        let mut templates = Vec::with_capacity(self.templates.len());
        for def in self.templates {
            let uri = def.template.uri_template.clone();
            let compiled = CompiledTemplate::new(def).map_err(|reason| BuildError::Template {
                uri: uri.clone(),
                reason,
            })?;
            if templates
                .iter()
                .any(|t: &CompiledTemplate| t.parsed == compiled.parsed)
            {
                return Err(BuildError::Duplicate {
                    kind: "resource template",
                    name: uri,
                });
            }
            templates.push(compiled);
        }
        let fixed: Vec<&str> = tools
            .iter()
            .flat_map(|t| &t.def.scopes)
            .chain(self.prompts.iter().flat_map(|p| &p.scopes))
            .chain(self.resources.iter().flat_map(|r| &r.scopes))
            .chain(
                templates
                    .iter()
                    .flat_map(|t| &t.def.scopes)
                    .filter(|s| !s.contains('{')),
            )
            .map(String::as_str)
            .collect();
        for t in &templates {
            if let Some((scope, fixed)) = t.collision(fixed.iter().copied()) {
                return Err(BuildError::Template {
                    uri: t.def.template.uri_template.clone(),
                    reason: format!(
                        "scope {scope:?} can expand to {fixed:?}, a fixed scope of this server: \
                         a token granted {fixed:?} would read those resources; give the variable \
                         scope a prefix of its own"
                    ),
                });
            }
        }

        let listed = Some(true);
        let capabilities = ServerCapabilities {
            tools: (!tools.is_empty()).then_some(ListCapability {
                list_changed: listed,
            }),
            prompts: (!self.prompts.is_empty()).then_some(ListCapability {
                list_changed: listed,
            }),
            resources: (!self.resources.is_empty() || !templates.is_empty()).then_some(
                ResourcesCapability {
                    list_changed: listed,
                    subscribe: Some(true),
                },
            ),
            completions: (self.prompts.iter().any(|p| p.complete.is_some())
                || templates.iter().any(|t| t.def.complete.is_some())
                || !self.prompts.is_empty())
            .then(JsonObject::new),
            logging: self.logging.then(JsonObject::new),
            experimental: None,
            extensions: None,
        };
        let fingerprints = Fingerprints {
            tools: fingerprint(
                tools
                    .iter()
                    .map(|t| serde_json::to_string(&t.def.tool).unwrap_or_default()),
            ),
            prompts: fingerprint(
                self.prompts
                    .iter()
                    .map(|p| serde_json::to_string(&p.prompt).unwrap_or_default()),
            ),
            resources: fingerprint(
                self.resources
                    .iter()
                    .map(|r| serde_json::to_string(&r.resource).unwrap_or_default()),
            ),
            templates: fingerprint(
                templates
                    .iter()
                    .map(|t| serde_json::to_string(&t.def.template).unwrap_or_default()),
            ),
        };
        let cursors = CursorCodec::new(self.config.cursor_key.clone(), self.config.cursor_max_age);
        let gate = Gate::new(self.config.limits, tools.iter().any(|t| t.limit.is_some()));
        let lines = Arc::new(crate::serialize::Lines::new(
            self.config.max_store_locks_per_principal,
        ));
        Ok(Server {
            inner: Arc::new(Inner {
                info: ServerInfo::new(self.info),
                instructions: self.instructions,
                capabilities,
                tools,
                tool_index,
                prompts: self.prompts,
                prompt_index,
                resources: self.resources,
                resource_index,
                templates,
                fingerprints,
                cursors,
                config: self.config,
                bus: self
                    .bus
                    .unwrap_or_else(|| Arc::new(InProcessBus::default())),
                store: self.store,
                gate,
                lines,
                middleware: self.middleware,
                shutdown: CancellationToken::new(),
            }),
        })
    }
}

/// A stable digest of a list's definitions: cursors issued for another version of the list
/// are refused as stale. Uses a fixed hasher so every replica computes the same value.
fn fingerprint(items: impl Iterator<Item = String>) -> u64 {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for item in items {
        h.update(item.as_bytes());
        h.update([0]);
    }
    let out = h.finalize();
    let mut word = [0u8; 8];
    word.copy_from_slice(&out[..8]);
    u64::from_be_bytes(word)
}

/// The top-level properties of an input schema that carry the handle marker.
fn handle_params(input: &JsonObject) -> Vec<HandleParam> {
    let Some(props) = input.get("properties").and_then(|p| p.as_object()) else {
        return Vec::new();
    };
    props
        .iter()
        .filter_map(|(name, schema)| {
            let marker = schema.get(SCHEMA_KEYWORD)?;
            let text = |k: &str| marker.get(k).and_then(|v| v.as_str()).unwrap_or_default();
            Some(HandleParam {
                name: name.clone(),
                kind: text("kind").to_owned(),
                created_by: text("createdBy").to_owned(),
            })
        })
        .collect()
}

/// Whether `name` is a required property of `input` whose schema says it is a string.
fn required_string(input: &JsonObject, name: &str) -> bool {
    let required = input
        .get("required")
        .and_then(|r| r.as_array())
        .is_some_and(|r| r.iter().any(|v| v == name));
    let string = input
        .get("properties")
        .and_then(|p| p.get(name))
        .and_then(|p| p.get("type"))
        .is_some_and(|t| t == "string");
    required && string
}
