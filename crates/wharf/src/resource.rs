//! Resources and resource templates.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;

use wharf_protocol::{
    Annotations, CacheHints, Completion, CompletionArgument, CompletionContext, Icon, JsonObject,
    Resource, ResourceContents, ResourceTemplate,
};

use crate::context::{Context, guarded};
use crate::handler::{BoxFuture, HandlerError};
use crate::uri_template::{self, UriTemplate, Vars};

/// What a resource handler is asked for.
#[derive(Debug, Clone)]
pub struct ReadRequest {
    /// The URI being read.
    pub uri: String,
    /// Variables matched from the template (empty for a static resource).
    pub vars: Vars,
}

pub(crate) type ReadHandler = Arc<
    dyn Fn(Context, ReadRequest) -> BoxFuture<Result<Vec<ResourceContents>, HandlerError>>
        + Send
        + Sync,
>;
pub(crate) type CompleteHandler = Arc<
    dyn Fn(
            Context,
            CompletionArgument,
            CompletionContext,
        ) -> BoxFuture<Result<Completion, HandlerError>>
        + Send
        + Sync,
>;

fn erase_read<F, Fut>(f: F) -> ReadHandler
where
    F: Fn(Context, ReadRequest) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<ResourceContents>, HandlerError>> + Send + 'static,
{
    Arc::new(move |cx: Context, req| Box::pin(guarded(cx.cleanup_guard(), f(cx, req))))
}

pub(crate) fn erase_complete<F, Fut>(f: F) -> CompleteHandler
where
    F: Fn(Context, CompletionArgument, CompletionContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Completion, HandlerError>> + Send + 'static,
{
    Arc::new(move |cx: Context, arg, ctx| Box::pin(guarded(cx.cleanup_guard(), f(cx, arg, ctx))))
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

    /// A human-readable name, for a client to show where `name` is an identifier.
    pub fn title(mut self, text: impl Into<String>) -> Self {
        self.resource.title = Some(text.into());
        self
    }

    /// Its size in bytes, as a client may show it or budget its context by it.
    pub fn size(mut self, bytes: u64) -> Self {
        self.resource.size = Some(bytes);
        self
    }

    /// Who it is for, how much it matters (a `priority` outside 0 to 1 is left out when
    /// listed) and when it last changed.
    pub fn annotations(mut self, annotations: Annotations) -> Self {
        self.resource.annotations = Some(annotations);
        self
    }

    /// Icons. A `src` that is not a URI fails [`ServerBuilder::build`](crate::ServerBuilder::build).
    pub fn icons(mut self, icons: Vec<Icon>) -> Self {
        self.resource.icons = Some(icons);
        self
    }

    /// Data for clients and extensions, listed as `_meta`. Keys are an optional prefix
    /// (dot-separated labels and a `/`: `com.example/`) and a name, as the specification
    /// writes them; one that is not fails [`ServerBuilder::build`](crate::ServerBuilder::build).
    pub fn meta(mut self, meta: JsonObject) -> Self {
        self.resource.meta = Some(meta);
        self
    }

    /// Scopes a principal limited by scopes ([`Principal::scopes`](crate::Principal::scopes): an OAuth token's, or an app's given them) needs to read it
    /// (-31003, HTTP 403 with `insufficient_scope`, otherwise).
    pub fn scopes(mut self, scopes: &[&str]) -> Self {
        self.scopes = scopes.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// Caching hints for reads of this resource (the server default otherwise):
    /// [`CacheHints::private`] for what depends on who reads it, [`CacheHints::public`] only
    /// for what holds nothing of any user's. A resource that needs scopes is read with
    /// `cacheScope: private` whatever these say.
    pub fn cache(mut self, hints: CacheHints) -> Self {
        self.cache = Some(hints);
        self
    }

    /// Completes the resource with the handler that reads it.
    pub fn handler<F, Fut>(self, f: F) -> ResourceDef
    where
        F: Fn(Context, ReadRequest) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<ResourceContents>, HandlerError>> + Send + 'static,
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

    /// A human-readable name, for a client to show where `name` is an identifier.
    pub fn title(mut self, text: impl Into<String>) -> Self {
        self.template.title = Some(text.into());
        self
    }

    /// Who its resources are for, how much they matter (a `priority` outside 0 to 1 is left
    /// out when listed) and when they last changed.
    pub fn annotations(mut self, annotations: Annotations) -> Self {
        self.template.annotations = Some(annotations);
        self
    }

    /// Icons. A `src` that is not a URI fails [`ServerBuilder::build`](crate::ServerBuilder::build).
    pub fn icons(mut self, icons: Vec<Icon>) -> Self {
        self.template.icons = Some(icons);
        self
    }

    /// Data for clients and extensions, listed as `_meta`. Keys are an optional prefix
    /// (dot-separated labels and a `/`: `com.example/`) and a name, as the specification
    /// writes them; one that is not fails [`ServerBuilder::build`](crate::ServerBuilder::build).
    pub fn meta(mut self, meta: JsonObject) -> Self {
        self.template.meta = Some(meta);
        self
    }

    /// Scopes a principal limited by scopes ([`Principal::scopes`](crate::Principal::scopes): an OAuth token's, or an app's given them) needs to read a
    /// resource of this template (-31003, HTTP 403 with `insufficient_scope`, otherwise).
    ///
    /// A scope may name a variable of the template in braces, so that each resource needs
    /// its own scope: with `template("files://{owner}/{name}", ..)`, the scope
    /// `files:{owner}` is `files:alice` for a read of `files://alice/notes`. The value is
    /// the variable as matched and decoded, written back the way the template expands it
    /// (every character but `A-Z a-z 0-9 - . _ ~` percent-encoded), so one resource has one
    /// scope however its URI was encoded, and a value can neither add a scope nor break the
    /// challenge. A scope that names a variable the template lacks, or that is not a
    /// `{name}` expression, fails [`ServerBuilder::build`](crate::ServerBuilder::build); so
    /// does one that can expand to a fixed scope of any tool, prompt, resource or template
    /// of the server (`files:{owner}` beside `files:read`: owner `read` would need only
    /// `files:read`). Give per-item scopes a prefix of their own (`files:owner:{owner}`).
    /// Scopes every request needs (`--oauth-required-scope`) are not known here.
    pub fn scopes(mut self, scopes: &[&str]) -> Self {
        self.scopes = scopes.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// Caching hints for reads through this template, chosen as for
    /// [`ResourceBuilder::cache`]. One with scopes is read with `cacheScope: private`
    /// whatever these say.
    pub fn cache(mut self, hints: CacheHints) -> Self {
        self.cache = Some(hints);
        self
    }

    /// Completion of the template's variables (`completion/complete` with `ref/resource`).
    pub fn completer<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(Context, CompletionArgument, CompletionContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Completion, HandlerError>> + Send + 'static,
    {
        self.complete = Some(erase_complete(f));
        self
    }

    /// Completes the template with the handler that reads its resources.
    pub fn handler<F, Fut>(self, f: F) -> TemplateDef
    where
        F: Fn(Context, ReadRequest) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<ResourceContents>, HandlerError>> + Send + 'static,
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
    /// The scopes parsed as templates, when one of them names a variable (empty otherwise:
    /// the scopes are then the same for every resource of the template).
    scope_templates: Vec<UriTemplate>,
}

impl CompiledTemplate {
    /// Compiles `def`; the error says what is wrong with its URI template or its scopes.
    pub(crate) fn new(def: TemplateDef) -> Result<Self, String> {
        let parsed = UriTemplate::parse(&def.template.uri_template).map_err(|e| e.to_string())?;
        // Published as it is, it must at least expand to a URI with a plain value for each
        // variable (a read is checked as a URI before it is matched, whatever the values).
        let sample = parsed
            .variables()
            .map(|v| (v.to_owned(), "x".to_owned()))
            .collect();
        let expanded = parsed.expand(&sample);
        if let Some(problem) = uri_template::uri_problem(&expanded) {
            return Err(format!(
                "it does not expand to a URI with x for each variable ({expanded:?}: {problem})"
            ));
        }
        let mut scope_templates = Vec::with_capacity(def.scopes.len());
        for scope in &def.scopes {
            let t = UriTemplate::parse(scope).map_err(|e| format!("scope {scope:?}: {e}"))?;
            // One scope names one item: a token granted it must not reach another.
            if let Some(between) = t.ambiguous_separator() {
                return Err(format!(
                    "scope {scope:?}: {between:?} between two variables can also be part of a value, so two items could share the scope; separate them with ':' or '/'"
                ));
            }
            if let Some(v) = t.variables().find(|v| !parsed.variables().any(|p| p == *v)) {
                return Err(format!(
                    "scope {scope:?} names {{{v}}}, which is not a variable of the template"
                ));
            }
            scope_templates.push(t);
        }
        if scope_templates
            .iter()
            .all(|t| t.variables().next().is_none())
        {
            scope_templates.clear();
        }
        Ok(CompiledTemplate {
            def,
            parsed,
            scope_templates,
        })
    }

    /// The first scope this template's variable scopes can expand to among `fixed`, with
    /// the variable scope: a token granted that fixed scope for something else would read
    /// the resources whose variable takes that value.
    pub(crate) fn collision<'a>(
        &'a self,
        fixed: impl IntoIterator<Item = &'a str>,
    ) -> Option<(&'a str, &'a str)> {
        let variable = || {
            self.scope_templates
                .iter()
                .zip(&self.def.scopes)
                .filter(|(t, _)| t.variables().next().is_some())
        };
        fixed.into_iter().find_map(|f| {
            variable()
                .find(|(t, _)| t.match_uri(f).is_some())
                .map(|(_, scope)| (scope.as_str(), f))
        })
    }

    /// The scopes a completion of this template's variables needs: the fixed ones, and each
    /// per-item scope whose variables the completion's context binds (a completer that lists
    /// names under a bound owner lists that owner's items).
    pub(crate) fn completion_scopes(&self, bound: &Vars) -> Vec<String> {
        if self.scope_templates.is_empty() {
            return self.def.scopes.clone();
        }
        self.scope_templates
            .iter()
            .filter(|t| t.variables().all(|v| bound.contains_key(v)))
            .map(|t| t.expand(bound))
            .collect()
    }

    /// The scopes a read needs of the resource whose URI matched with `vars`.
    pub(crate) fn scopes_for(&self, vars: &Vars) -> Cow<'_, [String]> {
        if self.scope_templates.is_empty() {
            Cow::Borrowed(&self.def.scopes)
        } else {
            Cow::Owned(
                self.scope_templates
                    .iter()
                    .map(|t| t.expand(vars))
                    .collect(),
            )
        }
    }
}

#[cfg(test)]
mod tests {

    use wharf_protocol::Implementation;

    use super::*;
    use crate::principal::Principal;
    use crate::registry::BuildError;
    use crate::server::Server;
    use crate::testing::{Harness, oauth_user};

    fn files(scopes: &[&str]) -> Result<Server, BuildError> {
        Server::builder(Implementation::new("t", "1"))
            .template(
                template("files://{owner}/{name}", "files")
                    .scopes(scopes)
                    .handler(|_cx, req| async move {
                        Ok(vec![ResourceContents::text(req.uri, "text/plain", "x")])
                    }),
            )
            .build()
    }

    /// What a read of `uri` by `who` needs, if it is refused.
    async fn refused(server: &Server, who: &Principal, uri: &str) -> Option<serde_json::Value> {
        let h = Harness::new(server.clone()).principal(who.clone());
        let e = h
            .call("resources/read", serde_json::json!({ "uri": uri }))
            .await
            .err()?;
        assert_eq!(e.error().kind, crate::ErrorKind::InsufficientScope);
        // The transport's challenge names what the error's data names.
        let data = e.error().data.as_ref().unwrap()["requiredScopes"].clone();
        assert_eq!(data, serde_json::json!(e.required_scopes()));
        Some(data)
    }

    #[test]
    fn a_resource_or_template_that_is_no_uri_fails_the_build() {
        let with_resource = |uri: &str| {
            Server::builder(Implementation::new("t", "1"))
                .resource(resource(uri, "r").handler(|_cx, _req| async { Ok(Vec::new()) }))
                .build()
        };
        let with_template = |uri: &str| {
            Server::builder(Implementation::new("t", "1"))
                .template(template(uri, "t").handler(|_cx, _req| async { Ok(Vec::new()) }))
                .build()
        };
        for bad in ["my notes", "notes://a b", "notes://é"] {
            let e = with_resource(bad).unwrap_err().to_string();
            assert!(e.contains("not a URI"), "{bad}: {e}");
            let e = with_template(&format!("{bad}/{{id}}"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("does not expand to a URI"), "{bad}: {e}");
        }
        assert!(with_resource("notes://a%20b").is_ok());
        assert!(with_template("notes://{id}/x%20y").is_ok());
    }

    #[tokio::test]
    async fn a_template_scope_names_the_matched_resource() {
        let s = files(&["files:read", "files:owner:{owner}"]).unwrap();
        let alice = oauth_user(&["files:read", "files:owner:alice"]);
        assert_eq!(refused(&s, &alice, "files://alice/notes").await, None);
        // The same resource, its variable percent-encoded: the same scope.
        assert_eq!(refused(&s, &alice, "files://%61lice/notes").await, None);
        assert_eq!(
            refused(&s, &alice, "files://bob/notes").await,
            Some(serde_json::json!(["files:read", "files:owner:bob"]))
        );
        // A value cannot add a scope nor pass for another one: it stays encoded. (Written
        // plain, `files://x files:owner:alice/notes` is no URI: no port is `owner:alice`.)
        assert_eq!(
            refused(&s, &alice, "files://x%20files%3aowner%3Aalice/notes").await,
            Some(serde_json::json!([
                "files:read",
                "files:owner:x%20files%3Aowner%3Aalice"
            ]))
        );
        // Principals not limited by scopes are not limited by these either.
        assert_eq!(
            refused(&s, &Principal::anonymous(), "files://bob/n").await,
            None
        );

        // Fixed scopes stay fixed.
        let s = files(&["files:read"]).unwrap();
        assert_eq!(
            refused(&s, &oauth_user(&["files:read"]), "files://bob/n").await,
            None
        );
    }

    #[test]
    fn a_template_scope_must_name_a_variable_of_the_template() {
        let e = files(&["files:{user}"]).err().unwrap().to_string();
        assert!(e.contains("{user}") && e.contains("not a variable"), "{e}");
        let e = files(&["files:{+owner}"]).err().unwrap().to_string();
        assert!(e.contains("scope \"files:{+owner}\""), "{e}");
        assert!(files(&["files:{owner}:{name}"]).is_ok());
    }

    #[test]
    fn a_template_scope_that_can_expand_to_a_fixed_scope_is_refused() {
        // Owner "read" would need only files:read, which every reader holds.
        let e = files(&["files:read", "files:{owner}"])
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("\"files:{owner}\" can expand to \"files:read\""),
            "{e}"
        );
        // So is one that collides with another definition's scope.
        let e = Server::builder(Implementation::new("t", "1"))
            .tool(
                crate::tool::tool("admin")
                    .scopes(&["files:admin"])
                    .handler(|_cx: Context, _: crate::NoArgs| async { "ok" }),
            )
            .template(
                template("files://{owner}/{name}", "files")
                    .scopes(&["files:{owner}"])
                    .handler(|_cx, req| async move {
                        Ok(vec![ResourceContents::text(req.uri, "text/plain", "x")])
                    }),
            )
            .build()
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("\"files:admin\""), "{e}");
    }
}
