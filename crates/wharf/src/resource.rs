//! Resources and resource templates.

use std::future::Future;
use std::sync::Arc;

use wharf_protocol::{
    CacheHints, Completion, CompletionArgument, CompletionContext, Resource, ResourceContents,
    ResourceTemplate,
};

use crate::context::Context;
use crate::error::RpcError;
use crate::tool::BoxFuture;
use crate::uri_template::{UriTemplate, Vars};

/// What a resource handler is asked for.
#[derive(Debug, Clone)]
pub struct ReadRequest {
    /// The URI being read.
    pub uri: String,
    /// Variables matched from the template (empty for a static resource).
    pub vars: Vars,
}

pub(crate) type ReadHandler = Arc<
    dyn Fn(Context, ReadRequest) -> BoxFuture<Result<Vec<ResourceContents>, RpcError>>
        + Send
        + Sync,
>;
pub(crate) type CompleteHandler = Arc<
    dyn Fn(
            Context,
            CompletionArgument,
            CompletionContext,
        ) -> BoxFuture<Result<Completion, RpcError>>
        + Send
        + Sync,
>;

fn erase_read<F, Fut>(f: F) -> ReadHandler
where
    F: Fn(Context, ReadRequest) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<ResourceContents>, RpcError>> + Send + 'static,
{
    Arc::new(move |cx, req| Box::pin(f(cx, req)))
}

pub(crate) fn erase_complete<F, Fut>(f: F) -> CompleteHandler
where
    F: Fn(Context, CompletionArgument, CompletionContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Completion, RpcError>> + Send + 'static,
{
    Arc::new(move |cx, arg, ctx| Box::pin(f(cx, arg, ctx)))
}

/// A static resource being described.
#[must_use = "a resource needs a handler before it can be registered"]
pub struct ResourceBuilder {
    resource: Resource,
    cache: Option<CacheHints>,
    scopes: Vec<String>,
}

/// Starts describing the resource at `uri`.
pub fn resource(uri: impl Into<String>, name: impl Into<String>) -> ResourceBuilder {
    ResourceBuilder {
        resource: Resource {
            uri: uri.into(),
            name: name.into(),
            title: None,
            description: None,
            mime_type: None,
            size: None,
            annotations: None,
            icons: None,
            meta: None,
        },
        cache: None,
        scopes: Vec::new(),
    }
}

impl ResourceBuilder {
    /// What the resource holds.
    pub fn description(mut self, text: impl Into<String>) -> Self {
        self.resource.description = Some(text.into());
        self
    }

    /// Its MIME type.
    pub fn mime_type(mut self, mime: impl Into<String>) -> Self {
        self.resource.mime_type = Some(mime.into());
        self
    }

    /// Caching hints for reads of this resource (the server default otherwise).
    /// OAuth scopes a token needs to read it (HTTP 403 with `insufficient_scope` otherwise).
    pub fn scopes(mut self, scopes: &[&str]) -> Self {
        self.scopes = scopes.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    pub fn cache(mut self, hints: CacheHints) -> Self {
        self.cache = Some(hints);
        self
    }

    /// Completes the resource with the handler that reads it.
    pub fn handler<F, Fut>(self, f: F) -> ResourceDef
    where
        F: Fn(Context, ReadRequest) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<ResourceContents>, RpcError>> + Send + 'static,
    {
        ResourceDef {
            resource: self.resource,
            cache: self.cache,
            scopes: self.scopes,
            read: erase_read(f),
        }
    }
}

/// A complete static resource.
pub struct ResourceDef {
    pub(crate) resource: Resource,
    pub(crate) cache: Option<CacheHints>,
    pub(crate) scopes: Vec<String>,
    pub(crate) read: ReadHandler,
}

/// A resource template being described.
#[must_use = "a template needs a handler before it can be registered"]
pub struct TemplateBuilder {
    template: ResourceTemplate,
    cache: Option<CacheHints>,
    scopes: Vec<String>,
    complete: Option<CompleteHandler>,
}

/// Starts describing the resource template `uri_template` (RFC 6570 `{var}` expansion).
pub fn template(uri_template: impl Into<String>, name: impl Into<String>) -> TemplateBuilder {
    TemplateBuilder {
        template: ResourceTemplate {
            uri_template: uri_template.into(),
            name: name.into(),
            title: None,
            description: None,
            mime_type: None,
            annotations: None,
            icons: None,
            meta: None,
        },
        cache: None,
        scopes: Vec::new(),
        complete: None,
    }
}

impl TemplateBuilder {
    /// What the resources of this template hold.
    pub fn description(mut self, text: impl Into<String>) -> Self {
        self.template.description = Some(text.into());
        self
    }

    /// Their MIME type.
    pub fn mime_type(mut self, mime: impl Into<String>) -> Self {
        self.template.mime_type = Some(mime.into());
        self
    }

    /// Caching hints for reads through this template.
    /// OAuth scopes a token needs to read it (HTTP 403 with `insufficient_scope` otherwise).
    pub fn scopes(mut self, scopes: &[&str]) -> Self {
        self.scopes = scopes.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    pub fn cache(mut self, hints: CacheHints) -> Self {
        self.cache = Some(hints);
        self
    }

    /// Completion of the template's variables (`completion/complete` with `ref/resource`).
    pub fn completer<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(Context, CompletionArgument, CompletionContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Completion, RpcError>> + Send + 'static,
    {
        self.complete = Some(erase_complete(f));
        self
    }

    /// Completes the template with the handler that reads its resources.
    pub fn handler<F, Fut>(self, f: F) -> TemplateDef
    where
        F: Fn(Context, ReadRequest) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<ResourceContents>, RpcError>> + Send + 'static,
    {
        TemplateDef {
            template: self.template,
            cache: self.cache,
            scopes: self.scopes,
            complete: self.complete,
            read: erase_read(f),
        }
    }
}

/// A complete resource template.
pub struct TemplateDef {
    pub(crate) template: ResourceTemplate,
    pub(crate) cache: Option<CacheHints>,
    pub(crate) scopes: Vec<String>,
    pub(crate) complete: Option<CompleteHandler>,
    pub(crate) read: ReadHandler,
}

pub(crate) struct CompiledTemplate {
    pub(crate) def: TemplateDef,
    pub(crate) parsed: UriTemplate,
}
