//! The server: everything registered, built once and shared behind an `Arc`.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;
use wharf_protocol::{Implementation, JsonObject, RequestId, ServerCapabilities, ServerInfo};

use crate::admission::{self, Admitted, ErrorReply};
use crate::bus::{ChangeEvent, InProcessBus, NotificationBus};
use crate::config::ServerConfig;
use crate::dispatch::Core;
use crate::fair_share::FairShare;
use crate::keys::KeyRing;
use crate::legacy::Sessions;
use crate::limits::Gate;
use crate::metrics::{Gauges, Metrics, Snapshot};
use crate::middleware::Middleware;
use crate::mutation::MutationQueue;
use crate::principal::Principal;
use crate::prompt::PromptDef;
use crate::registry::{BuildError, Definitions, Registry, check_cap, icons_are_uris};
use crate::request::{self, ParsedRequest};
use crate::resource::{ResourceDef, TemplateDef};
use crate::runtime::Runtime;
use crate::schema::HeaderParam;
use crate::session::Book;
use crate::store::{Store, StoreError};
use crate::tool::ToolDef;

/// A built MCP server. Cheap to clone; every clone is the same server.
#[derive(Clone)]
pub struct Server {
    pub(crate) core: Arc<Core>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("name", &self.core.runtime.info.name)
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
            metrics: false,
            middleware: Vec::new(),
            extensions: BTreeMap::new(),
        }
    }

    /// Who this server is.
    pub fn info(&self) -> &ServerInfo {
        &self.core.runtime.info
    }

    /// What this server offers.
    pub fn capabilities(&self) -> &ServerCapabilities {
        &self.core.registry.capabilities
    }

    /// Every scope a tool, prompt, resource or template of this server declares, sorted,
    /// each once: what protected resource metadata lists as `scopes_supported`. Per-item
    /// scopes of templates (`{variable}` in them) name no scope until a URI fills them in,
    /// and are left out.
    pub fn scopes(&self) -> &[String] {
        &self.core.registry.scopes
    }

    /// The `x-mcp-header` arguments of tool `name` (empty for unknown tools).
    pub fn tool_header_params(&self, name: &str) -> &[HeaderParam] {
        self.core
            .registry
            .tool(name)
            .map(|t| t.header_params.as_slice())
            .unwrap_or_default()
    }

    /// Announces a change to every listen stream that opted into it.
    pub async fn announce(&self, event: ChangeEvent) {
        self.core.runtime.announce(event).await;
    }

    /// Reads a request: the method must exist (and its capability be offered), the params
    /// must have their type, and `_meta` its required fields. The version is checked in
    /// admission, so a transport can first compare the headers that mirror the body.
    pub fn parse_request(
        &self,
        id: RequestId,
        method: &str,
        params: Option<&RawValue>,
    ) -> Result<ParsedRequest, ErrorReply> {
        let registry = &self.core.registry;
        request::parse(
            &registry.capabilities,
            registry.versions,
            id,
            method,
            params,
        )
        .map_err(|(e, id)| ErrorReply::new(Some(id), e))
    }

    /// Reads a well-formed request from `body` in one pass: the same request
    /// [`Envelope::parse`](wharf_protocol::Envelope::parse) and
    /// [`parse_request`](Self::parse_request) would read, without parsing the params twice.
    /// `None` means only "read it the long way": the body may be malformed or nest deeper
    /// than `max_depth`, be a notification or a response, name an unknown method or carry
    /// invalid params or `_meta`, but it may also be a valid request this pass does not take
    /// (params before the method, or none); those two read it and say what is wrong, if
    /// anything is.
    pub fn read_request(&self, body: &[u8], max_depth: usize) -> Option<ParsedRequest> {
        let registry = &self.core.registry;
        request::read(&registry.capabilities, registry.versions, body, max_depth)
    }

    /// Decides whether `req` may run for `principal` (see [`Admitted`]): the
    /// version, scopes, client capabilities and a slot under the load caps. Waits in the
    /// queue when the caps are reached and there is room; dropping the future takes the
    /// request out of the queue.
    pub async fn admit(
        &self,
        req: ParsedRequest,
        principal: Principal,
    ) -> Result<Admitted, ErrorReply> {
        admission::admit(&self.core, req, principal).await
    }

    /// Gets the server ready before it accepts anything: loads the keys replicas share and
    /// waits, at most `within`, until the bus listens, so that no listen stream opens before
    /// the changes announced elsewhere can reach it. Without this, the keys load on the first
    /// request, and streams opened before the bus listens are told, once it does, that they
    /// may have missed changes (they announce every change they subscribe to). `Err` when the store cannot give the keys.
    pub async fn prepare(&self, within: std::time::Duration) -> Result<(), StoreError> {
        self.core.runtime.keys.ready().await?;
        let bus = &self.core.runtime.bus;
        let deadline = crate::deadline::later(tokio::time::Instant::now(), within);
        while !bus.is_connected() {
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!("the change bus is not listening yet; /readyz says so until it is");
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// The revisions this server speaks, newest first: 2026-07-28, and the legacy ones when
    /// it opens sessions for clients of the `initialize` era. What a `-32022` refusal and
    /// `server/discover` list.
    pub fn supported_versions(&self) -> &'static [&'static str] {
        self.core.registry.versions
    }

    /// The store, if one was configured.
    pub fn store(&self) -> Option<&Arc<dyn Store>> {
        self.core.runtime.store.as_ref()
    }

    /// Starts draining: the server still serves everything, but tells load balancers it
    /// is going away (`/readyz` answers 503, HTTP responses close their connections), so
    /// they stop sending it work before it stops accepting. Listen streams and legacy
    /// session streams opened before now end at once (clients listen again, elsewhere);
    /// those opened from now on end at [`Server::shutdown`].
    pub fn drain(&self) {
        self.core.runtime.draining.cancel();
    }

    /// The legacy sessions of clients that open with `initialize`: what a transport calls
    /// for a request that belongs to one (see [`Sessions`]).
    pub fn sessions(&self) -> Sessions<'_> {
        Sessions::new(&self.core)
    }

    /// Whether [`Server::drain`] (or [`Server::shutdown`]) was called.
    pub fn is_draining(&self) -> bool {
        self.core.runtime.draining.is_cancelled()
    }

    /// Starts a graceful shutdown: every open listen stream sends its final response and
    /// ends, and every legacy session stream ends.
    pub fn shutdown(&self) {
        self.core.runtime.draining.cancel();
        self.core.runtime.shutdown.cancel();
    }

    /// The bus change notifications travel on.
    pub fn bus(&self) -> &Arc<dyn NotificationBus> {
        &self.core.runtime.bus
    }

    /// The server's counters, when it was built to count them
    /// ([`ServerBuilder::metrics`]): transports count their own refusals there.
    pub fn metrics(&self) -> Option<&Metrics> {
        self.core.runtime.metrics.as_deref()
    }

    /// Every counter, gauge and histogram now, for an exporter, when the server counts.
    pub fn collect_metrics(&self) -> Option<Snapshot> {
        let metrics = self.core.runtime.metrics.as_ref()?;
        Some(metrics.snapshot(self.gauges()))
    }

    /// Every counter in the Prometheus text exposition format, when the server counts.
    pub fn encode_metrics(&self) -> Option<String> {
        let metrics = self.core.runtime.metrics.as_ref()?;
        Some(metrics.encode(self.gauges()))
    }

    /// The levels kept outside the counters: the admission queue and the bus.
    fn gauges(&self) -> Gauges {
        let runtime = &self.core.runtime;
        Gauges {
            queued: runtime.gate.queued(),
            bus_reconnects: runtime.bus.reconnects(),
            bus_connected: runtime.bus.is_connected(),
        }
    }

    /// Cancelled once [`Server::shutdown`] is called.
    pub fn shutdown_token(&self) -> &CancellationToken {
        &self.core.runtime.shutdown
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
    metrics: bool,
    middleware: Vec<Arc<dyn Middleware>>,
    extensions: BTreeMap<String, JsonObject>,
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

    /// Uses `bus` for change notifications (otherwise the store's, when it has one, or the
    /// in-process bus).
    pub fn bus(mut self, bus: Arc<dyn NotificationBus>) -> Self {
        self.bus = Some(bus);
        self
    }

    /// Uses `store` for handles, idempotency records and app data.
    pub fn store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// Adds a layer around request handling (see [`Middleware`]), run after admission; the
    /// first added is the outermost.
    pub fn middleware(self, layer: impl Middleware) -> Self {
        self.middleware_arc(Arc::new(layer))
    }

    /// Adds a shared layer.
    pub fn middleware_arc(mut self, layer: Arc<dyn Middleware>) -> Self {
        self.middleware.push(layer);
        self
    }

    /// Whether to count requests, waits and refusals for [`Server::metrics`] (off by
    /// default: counting costs a few atomic increments per request).
    pub fn metrics(mut self, enabled: bool) -> Self {
        self.metrics = enabled;
        self
    }

    /// Declares extension `name` (`com.example/feature`, a prefix required) with its
    /// `settings` (an empty object for none) in the server's capabilities, as the
    /// 2026-07-28 revision has servers declare the extensions they support. Clients of the
    /// `initialize` era, which know no extensions, are not told. A name not written as the
    /// specification says fails [`ServerBuilder::build`].
    pub fn extension(mut self, name: impl Into<String>, settings: JsonObject) -> Self {
        self.extensions.insert(name.into(), settings);
        self
    }

    /// Whether to declare the `logging` capability (on by default). Without it the server
    /// sends no `notifications/message`, and a request's `logLevel` asks nothing of it (its
    /// response is not made a stream for it).
    pub fn logging(mut self, enabled: bool) -> Self {
        self.logging = enabled;
        self
    }

    /// Checks every definition and compiles every schema, once.
    pub fn build(self) -> Result<Server, BuildError> {
        if self.config.page_size == 0 {
            return Err(BuildError::PageSize);
        }
        let limits = &self.config.limits;
        let caps = [
            ("limits.max_in_flight", limits.max_in_flight),
            ("limits.per_principal", limits.per_principal),
            ("limits.max_listen_streams", limits.max_listen_streams),
            ("limits.listen_per_principal", limits.listen_per_principal),
            (
                "max_store_locks_per_principal",
                Some(self.config.max_store_locks_per_principal),
            ),
        ];
        for (what, cap) in caps {
            if let Some(n) = cap {
                check_cap(n, || what.to_owned())?;
            }
        }
        // Every result carries who the server is, links and all.
        let info = &self.info;
        if let Some(url) = info.website_url.as_ref().filter(|u| !crate::is_uri(u)) {
            return Err(BuildError::NotAUri {
                what: "the server's websiteUrl".to_owned(),
                uri: url.clone(),
            });
        }
        icons_are_uris(&info.icons, || "the server".to_owned())?;
        // Only a store keeps records (and only with one can a tool be idempotent).
        if self.store.is_some()
            && self.config.idempotency_retention <= self.config.max_call_duration
        {
            return Err(BuildError::Retention {
                retention: self.config.idempotency_retention,
                call: self.config.max_call_duration,
            });
        }
        let registry = Registry::build(Definitions {
            instructions: self.instructions,
            tools: self.tools,
            prompts: self.prompts,
            resources: self.resources,
            templates: self.templates,
            has_store: self.store.is_some(),
            step_claims: self.store.as_ref().and_then(|s| s.step_claims()),
            logging: self.logging,
            legacy: self.config.legacy.enabled,
            extensions: self.extensions,
        })?;
        let config = self.config;
        let store_bus = self.store.as_ref().and_then(|s| s.bus());
        let runtime = Runtime {
            info: ServerInfo::new(self.info),
            keys: Arc::new(KeyRing::new(&config, self.store.as_ref())),
            gate: Gate::new(
                config.limits,
                registry.tools.iter().any(|t| t.limit.is_some()),
            ),
            mutations: Arc::new(MutationQueue::new(config.max_store_locks_per_principal)),
            step_claims: self
                .store
                .as_ref()
                .and_then(|s| s.step_claims())
                .map(|n| Arc::new(FairShare::new(n))),
            bus_in_store: self.bus.is_none() && store_bus.is_some(),
            bus: self
                .bus
                .or(store_bus)
                .unwrap_or_else(|| Arc::new(InProcessBus::default())),
            sessions: Arc::new(Book::new(self.store.as_ref())),
            hub: Arc::default(),
            metrics: self.metrics.then(|| {
                let names = registry.tools.iter().map(|t| t.def.tool.name.clone());
                Arc::new(Metrics::new(names.collect()))
            }),
            store: self.store,
            shutdown: CancellationToken::new(),
            draining: CancellationToken::new(),
            config,
        };
        Ok(Server {
            core: Arc::new(Core {
                registry,
                runtime: Arc::new(runtime),
                middleware: self.middleware,
            }),
        })
    }
}
