//! Prompts.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use wharf_protocol::{
    Completion, CompletionArgument, CompletionContext, GetPromptResult, Icon, JsonObject, Prompt,
    PromptArgument,
};

use crate::context::{Context, guarded};
use crate::error::RpcError;
use crate::handler::{BoxFuture, HandlerError};
use crate::resource::{CompleteHandler, erase_complete};

/// The arguments a prompt was called with.
pub type PromptArgs = BTreeMap<String, String>;

pub(crate) type PromptHandler = Arc<
    dyn Fn(Context, PromptArgs) -> BoxFuture<Result<GetPromptResult, HandlerError>> + Send + Sync,
>;

/// A prompt being described.
#[must_use = "a prompt needs a handler before it can be registered"]
pub struct PromptBuilder {
    prompt: Prompt,
    complete: Option<CompleteHandler>,
    scopes: Vec<String>,
}

/// Starts describing the prompt `name`.
pub fn prompt(name: impl Into<String>) -> PromptBuilder {
    PromptBuilder {
        prompt: Prompt {
            name: name.into(),
            title: None,
            description: None,
            arguments: None,
            icons: None,
            meta: None,
        },
        complete: None,
        scopes: Vec::new(),
    }
}

impl PromptBuilder {
    /// What the prompt is for.
    pub fn description(mut self, text: impl Into<String>) -> Self {
        self.prompt.description = Some(text.into());
        self
    }

    /// A human-readable name, for a client to show where `name` is an identifier.
    pub fn title(mut self, text: impl Into<String>) -> Self {
        self.prompt.title = Some(text.into());
        self
    }

    /// Icons. A `src` that is not a URI fails [`ServerBuilder::build`](crate::ServerBuilder::build).
    pub fn icons(mut self, icons: Vec<Icon>) -> Self {
        self.prompt.icons = Some(icons);
        self
    }

    /// Data for clients and extensions, listed as `_meta`. Keys are an optional prefix
    /// (dot-separated labels and a `/`: `com.example/`) and a name, as the specification
    /// writes them; one that is not fails [`ServerBuilder::build`](crate::ServerBuilder::build).
    pub fn meta(mut self, meta: JsonObject) -> Self {
        self.prompt.meta = Some(meta);
        self
    }

    /// Scopes a principal limited by scopes ([`Principal::scopes`](crate::Principal::scopes): an OAuth token's, or an app's given them) needs to get it
    /// (-31003, HTTP 403 with `insufficient_scope`, otherwise).
    pub fn scopes(mut self, scopes: &[&str]) -> Self {
        self.scopes = scopes.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// Declares an argument.
    pub fn argument(
        mut self,
        name: impl Into<String>,
        description: impl Into<String>,
        required: bool,
    ) -> Self {
        self.prompt
            .arguments
            .get_or_insert_with(Vec::new)
            .push(PromptArgument {
                name: name.into(),
                title: None,
                description: Some(description.into()),
                required: Some(required),
            });
        self
    }

    /// Declares an argument given in full: with a `title` to show, or without a
    /// description.
    pub fn argument_with(mut self, argument: PromptArgument) -> Self {
        self.prompt
            .arguments
            .get_or_insert_with(Vec::new)
            .push(argument);
        self
    }

    /// Completion of the prompt's arguments.
    pub fn completer<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(Context, CompletionArgument, CompletionContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Completion, HandlerError>> + Send + 'static,
    {
        self.complete = Some(erase_complete(f));
        self
    }

    /// Completes the prompt. Required arguments are checked before `f` runs.
    pub fn handler<F, Fut>(self, f: F) -> PromptDef
    where
        F: Fn(Context, PromptArgs) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<GetPromptResult, HandlerError>> + Send + 'static,
    {
        PromptDef {
            prompt: self.prompt,
            complete: self.complete,
            scopes: self.scopes,
            get: Arc::new(move |cx: Context, args| {
                Box::pin(guarded(cx.cleanup_guard(), f(cx, args)))
            }),
        }
    }
}

/// A complete prompt.
pub struct PromptDef {
    pub(crate) prompt: Prompt,
    pub(crate) complete: Option<CompleteHandler>,
    pub(crate) scopes: Vec<String>,
    pub(crate) get: PromptHandler,
}

impl PromptDef {
    /// Refuses arguments the prompt does not declare as given and required ones missing.
    pub(crate) fn check_args(&self, args: &PromptArgs) -> Result<(), RpcError> {
        let declared = self.prompt.arguments.as_deref().unwrap_or_default();
        for a in declared {
            if a.required == Some(true) && !args.contains_key(&a.name) {
                return Err(RpcError::invalid_params(format!(
                    "Missing required argument {:?} for prompt {:?}",
                    a.name, self.prompt.name
                )));
            }
        }
        if let Some(unknown) = args
            .keys()
            .find(|k| !declared.iter().any(|a| &a.name == *k))
        {
            return Err(RpcError::invalid_params(format!(
                "Unknown argument {unknown:?} for prompt {:?}",
                self.prompt.name
            )));
        }
        Ok(())
    }
}
