//! Tools: typed handlers, their schemas, and what a handler may return.

use std::future::Future;
use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use wharf_protocol::{
    CallToolResult, ClientCapabilities, Content, Icon, JsonObject, Tool, ToolAnnotations,
};

use crate::context::{Context, guarded};
use crate::handler::{BoxFuture, HandlerError};
use crate::schema;
use crate::store::{KEY_ARGUMENT, key_schema};

/// What a tool handler may return.
pub trait IntoToolResult: Send + 'static {
    /// The result to send.
    fn into_tool_result(self) -> Result<CallToolResult, HandlerError>;

    /// The `outputSchema` this type implies, if it carries structured content.
    fn output_schema() -> Option<JsonObject> {
        None
    }
}

impl IntoToolResult for CallToolResult {
    fn into_tool_result(self) -> Result<CallToolResult, HandlerError> {
        Ok(self)
    }
}

impl IntoToolResult for String {
    fn into_tool_result(self) -> Result<CallToolResult, HandlerError> {
        Ok(CallToolResult::text(self))
    }
}

impl IntoToolResult for &'static str {
    fn into_tool_result(self) -> Result<CallToolResult, HandlerError> {
        Ok(CallToolResult::text(self))
    }
}

impl IntoToolResult for Content {
    fn into_tool_result(self) -> Result<CallToolResult, HandlerError> {
        Ok(CallToolResult::success(vec![self]))
    }
}

impl IntoToolResult for Vec<Content> {
    fn into_tool_result(self) -> Result<CallToolResult, HandlerError> {
        Ok(CallToolResult::success(self))
    }
}

impl<T: IntoToolResult, E: Into<HandlerError> + Send + 'static> IntoToolResult for Result<T, E> {
    fn into_tool_result(self) -> Result<CallToolResult, HandlerError> {
        self.map_err(Into::into)
            .and_then(IntoToolResult::into_tool_result)
    }

    fn output_schema() -> Option<JsonObject> {
        T::output_schema()
    }
}

/// Structured output: sent as `structuredContent` and, for older clients, as JSON text.
/// The tool's `outputSchema` is derived from `T`.
#[derive(Debug, Clone)]
pub struct Structured<T>(pub T);

impl<T: Serialize + JsonSchema + Send + 'static> IntoToolResult for Structured<T> {
    fn into_tool_result(self) -> Result<CallToolResult, HandlerError> {
        let value = serde_json::to_value(&self.0).map_err(HandlerError::internal)?;
        let text = value.to_string();
        Ok(CallToolResult {
            structured_content: Some(value),
            ..CallToolResult::text(text)
        })
    }

    fn output_schema() -> Option<JsonObject> {
        Some(schema::schema_for::<T>())
    }
}

/// Arguments of a tool that takes none.
#[derive(Debug, Clone, Copy, Default, serde::Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

/// One event of a streaming handler (see [`ToolBuilder::stream_handler`]): progress on the
/// way, then the result.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Step<R> {
    /// Progress, sent as `notifications/progress` when the client asked for it (kept
    /// strictly increasing and coalesced, as [`Context::progress`] does).
    Progress {
        /// How far the work got.
        progress: f64,
        /// Of how much, when known.
        total: Option<f64>,
        /// A message for the user.
        message: Option<String>,
    },
    /// The result; the stream is not polled after it.
    Done(R),
}

impl<R> Step<R> {
    /// Progress `progress` out of `total`.
    pub fn progress(progress: f64, total: Option<f64>) -> Self {
        Step::Progress {
            progress,
            total,
            message: None,
        }
    }

    /// Progress with a message for the user.
    pub fn progress_with(progress: f64, total: Option<f64>, message: impl Into<String>) -> Self {
        Step::Progress {
            progress,
            total,
            message: Some(message.into()),
        }
    }
}

pub(crate) trait ErasedToolHandler: Send + Sync + 'static {
    /// `args` is always a JSON object that passed the input schema.
    fn call(
        &self,
        cx: Context,
        args: serde_json::Value,
    ) -> BoxFuture<Result<CallToolResult, HandlerError>>;
}

struct Typed<F, A> {
    f: F,
    _args: std::marker::PhantomData<fn(A)>,
}

impl<F, A, Fut, R> ErasedToolHandler for Typed<F, A>
where
    F: Fn(Context, A) -> Fut + Send + Sync + 'static,
    A: DeserializeOwned + Send + 'static,
    Fut: Future<Output = R> + Send + 'static,
    R: IntoToolResult,
{
    fn call(
        &self,
        cx: Context,
        args: serde_json::Value,
    ) -> BoxFuture<Result<CallToolResult, HandlerError>> {
        let args = match typed_args::<A>(&cx, args) {
            Ok(a) => a,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        let cleanup = cx.cleanup_guard();
        let fut = (self.f)(cx, args);
        Box::pin(guarded(
            cleanup,
            async move { fut.await.into_tool_result() },
        ))
    }
}

/// The arguments already passed the input schema; what is left is a shape serde rejects,
/// which the model reads as it reads a schema violation.
/// Only the handles the core checked for the call are read as handles.
fn typed_args<A: DeserializeOwned>(
    cx: &Context,
    args: serde_json::Value,
) -> Result<A, HandlerError> {
    crate::store::reading_input(cx.checked_handles(), || schema::read_validated::<A>(args))
        .map_err(|e| HandlerError::Execution(format!("Invalid arguments: {e}")))
}

struct Streaming<F, A> {
    f: F,
    _args: std::marker::PhantomData<fn(A)>,
}

impl<F, A, S, R> ErasedToolHandler for Streaming<F, A>
where
    F: Fn(Context, A) -> S + Send + Sync + 'static,
    A: DeserializeOwned + Send + 'static,
    S: Stream<Item = Step<R>> + Send + 'static,
    R: IntoToolResult,
{
    fn call(
        &self,
        cx: Context,
        args: serde_json::Value,
    ) -> BoxFuture<Result<CallToolResult, HandlerError>> {
        let args = match typed_args::<A>(&cx, args) {
            Ok(a) => a,
            Err(e) => return Box::pin(async move { Err(e) }),
        };
        let progress = cx.progress_stream();
        let cleanup = cx.cleanup_guard();
        let steps = (self.f)(cx, args);
        Box::pin(guarded(cleanup, async move {
            let mut steps = std::pin::pin!(steps);
            while let Some(step) = steps.next().await {
                match step {
                    Step::Progress {
                        progress: value,
                        total,
                        message,
                    } => {
                        if let Some(stream) = &progress {
                            stream.report(value, total, message.as_deref()).await;
                        }
                    }
                    Step::Done(result) => return result.into_tool_result(),
                }
            }
            Err(HandlerError::internal(
                "the tool's step stream ended without a result",
            ))
        }))
    }
}

struct Raw<F>(F);

impl<F, Fut, R> ErasedToolHandler for Raw<F>
where
    F: Fn(Context, JsonObject) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = R> + Send + 'static,
    R: IntoToolResult,
{
    fn call(
        &self,
        cx: Context,
        args: serde_json::Value,
    ) -> BoxFuture<Result<CallToolResult, HandlerError>> {
        let args = match args {
            serde_json::Value::Object(map) => map,
            _ => JsonObject::new(),
        };
        let cleanup = cx.cleanup_guard();
        let fut = (self.0)(cx, args);
        Box::pin(guarded(
            cleanup,
            async move { fut.await.into_tool_result() },
        ))
    }
}

/// A tool being described; [`ToolBuilder::handler`] completes it.
#[must_use = "a tool needs a handler before it can be registered"]
pub struct ToolBuilder {
    tool: Tool,
    requires: Option<ClientCapabilities>,
    idempotent: Option<Idempotence>,
    max_concurrency: Option<usize>,
    timeout: Option<std::time::Duration>,
    mutates: Option<String>,
    scopes: Vec<String>,
    /// An `outputSchema` given with [`ToolBuilder::output_schema`], over the result type's.
    output_schema: Option<JsonObject>,
}

/// How an idempotent tool's writes and its idempotency record reach the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Idempotence {
    /// In the call's one transaction, which holds the claim from the start and commits the
    /// writes with the record: [`ToolBuilder::idempotent`].
    OneTransaction,
    /// In transactions the handler commits as it goes, under a turn on the key; the record
    /// follows once the handler returns: [`ToolBuilder::idempotent_in_steps`].
    InSteps,
}

/// Starts describing a tool named `name`.
pub fn tool(name: impl Into<String>) -> ToolBuilder {
    ToolBuilder {
        tool: Tool {
            name: name.into(),
            title: None,
            description: None,
            input_schema: JsonObject::new(),
            output_schema: None,
            annotations: None,
            icons: None,
            meta: None,
        },
        requires: None,
        idempotent: None,
        max_concurrency: None,
        timeout: None,
        mutates: None,
        scopes: Vec::new(),
        output_schema: None,
    }
}

impl ToolBuilder {
    /// What the tool does, for the model.
    pub fn description(mut self, text: impl Into<String>) -> Self {
        self.tool.description = Some(text.into());
        self
    }

    /// A human-readable name.
    pub fn title(mut self, text: impl Into<String>) -> Self {
        self.tool.title = Some(text.into());
        self
    }

    /// Behaviour hints.
    pub fn annotations(mut self, annotations: ToolAnnotations) -> Self {
        self.tool.annotations = Some(annotations);
        self
    }

    /// Icons. A `src` that is not a URI fails [`ServerBuilder::build`](crate::ServerBuilder::build).
    pub fn icons(mut self, icons: Vec<Icon>) -> Self {
        self.tool.icons = Some(icons);
        self
    }

    /// Data for clients and extensions, listed as `_meta`. Keys are an optional prefix
    /// (dot-separated labels and a `/`: `com.example/`) and a name, as the specification
    /// writes them; one that is not fails [`ServerBuilder::build`](crate::ServerBuilder::build).
    pub fn meta(mut self, meta: JsonObject) -> Self {
        self.tool.meta = Some(meta);
        self
    }

    /// The tool's `outputSchema`, for a handler that makes its own results (a
    /// [`raw_handler`](ToolBuilder::raw_handler), or one returning
    /// [`CallToolResult`]); it replaces the one a [`Structured`] result type gives. A result
    /// that is not an error must then carry `structuredContent` the schema accepts, or the
    /// call fails with -32603: nothing of it is sent, nor committed with the call (a write
    /// in steps keeps what its steps committed). A schema that does not compile fails
    /// [`ServerBuilder::build`](crate::ServerBuilder::build).
    pub fn output_schema(mut self, schema: JsonObject) -> Self {
        self.output_schema = Some(schema);
        self
    }

    /// Client capabilities the tool cannot run without; a request that does not declare
    /// them gets `-32021` before the handler runs.
    pub fn requires(mut self, capabilities: ClientCapabilities) -> Self {
        self.requires = Some(capabilities);
        self
    }

    /// Makes the tool an idempotent write: it gains a required `idempotency_key` argument
    /// (the handler never sees it), its writes go through [`Context::tx`], and a retry with
    /// the same key and arguments returns the first result without running again, on any
    /// replica. The record is kept per handle when the tool takes one, otherwise per
    /// principal and tool. Needs a store.
    pub fn idempotent(mut self) -> Self {
        self.idempotent = Some(Idempotence::OneTransaction);
        self
    }

    /// Makes the tool an idempotent write whose handler commits its own transactions as it
    /// goes ([`Context::transaction`]): a long call that records how far it got. It gains a
    /// required `idempotency_key` like [`ToolBuilder::idempotent`], and the first result is
    /// recorded once the handler returns; a write whose first result is recorded is never
    /// run again. Meanwhile its claim is held (PostgreSQL, Redis: a duplicate waits for it
    /// up to the store's lock wait, then gets a retryable 503), or, on a store with one
    /// writer (SQLite, one host), its attempts take turns in the process. On PostgreSQL a
    /// held claim keeps a connection, so at most
    /// [`Store::step_claims`](crate::store::Store::step_claims) are held at once;
    /// a call (or duplicate) that finds them taken waits for a place within its time limit,
    /// and a retry of a write already made is answered from its record meanwhile.
    ///
    /// Unlike [`ToolBuilder::idempotent`], the handler's commits and the record are not one
    /// transaction: an attempt that ends without a recorded result (cut short: cancelled,
    /// timed out, its replica gone; or failed, or asking the client for input) is run again
    /// by the next retry. Make each step safe to repeat, for example by keying what it
    /// writes with [`Context::effect_key`]. On PostgreSQL and Redis the handler's own
    /// commits are fenced only by the tool's mutation lock ([`ToolBuilder::mutates`]).
    /// Needs a store.
    pub fn idempotent_in_steps(mut self) -> Self {
        self.idempotent = Some(Idempotence::InSteps);
        self
    }

    /// Runs at most `n` calls of this tool at once. A call beyond them waits in the
    /// server's queue while it has room ([`Limits::max_queue`](crate::Limits::max_queue),
    /// 0 by default) and is refused otherwise, at once, with -31000 (HTTP 503 and
    /// `Retry-After`). A cap of 0 fails [`ServerBuilder::build`](crate::ServerBuilder::build).
    pub fn max_concurrency(mut self, n: usize) -> Self {
        self.max_concurrency = Some(n);
        self
    }

    /// Stops calls that run longer than `limit` (never longer than the server's
    /// `max_call_duration`): the handler's future is dropped and its transaction rolled back.
    pub fn timeout(mut self, limit: std::time::Duration) -> Self {
        self.timeout = Some(limit);
        self
    }

    /// Scopes a principal limited by scopes ([`Principal::scopes`](crate::Principal::scopes): an OAuth token's, or an app's given them) needs to call the
    /// tool (-31003, HTTP 403 with `insufficient_scope`, otherwise; see also
    /// `ServerConfig::list_permitted_tools_only`).
    pub fn scopes(mut self, scopes: &[&str]) -> Self {
        self.scopes = scopes.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// Declares that the tool mutates what its required string argument `argument` names
    /// (typically a handle): calls with the same value, by the same principal, run one at a
    /// time in arrival order, across every replica on a shared store (PostgreSQL advisory
    /// locks, Redis leases, each with a fencing token the call's commits check). Calls that
    /// wait count against the
    /// tool's timeout, and a call cancelled while it waits leaves the line without running.
    /// Reads are not held up (declare only writers), and different values run in parallel.
    pub fn mutates(mut self, argument: impl Into<String>) -> Self {
        self.mutates = Some(argument.into());
        self
    }

    fn finish(mut self, handler: Arc<dyn ErasedToolHandler>) -> ToolDef {
        if self.idempotent.is_some() {
            add_key_argument(&mut self.tool.input_schema);
        }
        if let Some(schema) = self.output_schema {
            self.tool.output_schema = Some(schema);
        }
        ToolDef {
            tool: self.tool,
            requires: self.requires,
            idempotent: self.idempotent,
            max_concurrency: self.max_concurrency,
            timeout: self.timeout,
            mutates: self.mutates,
            scopes: self.scopes,
            handler,
        }
    }

    /// Completes the tool with a typed handler. The `inputSchema` comes from `A`, the
    /// `outputSchema` from the return type when it is [`Structured`].
    pub fn handler<A, F, Fut, R>(mut self, f: F) -> ToolDef
    where
        A: DeserializeOwned + JsonSchema + Send + 'static,
        F: Fn(Context, A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = R> + Send + 'static,
        R: IntoToolResult,
    {
        self.tool.input_schema = schema::schema_for::<A>();
        self.tool.output_schema = R::output_schema();
        self.finish(Arc::new(Typed {
            f,
            _args: std::marker::PhantomData,
        }))
    }

    /// Completes the tool with a streaming handler: a stream of [`Step`]s, progress events
    /// ending with the result (the shape of a generator). Progress goes out only when the
    /// client asked for it; dropping the stream cancels the call's work.
    pub fn stream_handler<A, F, S, R>(mut self, f: F) -> ToolDef
    where
        A: DeserializeOwned + JsonSchema + Send + 'static,
        F: Fn(Context, A) -> S + Send + Sync + 'static,
        S: Stream<Item = Step<R>> + Send + 'static,
        R: IntoToolResult,
    {
        self.tool.input_schema = schema::schema_for::<A>();
        self.tool.output_schema = R::output_schema();
        self.finish(Arc::new(Streaming {
            f,
            _args: std::marker::PhantomData,
        }))
    }

    /// Completes the tool with a handler over raw JSON arguments, validated against the
    /// given `inputSchema` (for schemas no Rust type describes).
    pub fn raw_handler<F, Fut, R>(mut self, input_schema: JsonObject, f: F) -> ToolDef
    where
        F: Fn(Context, JsonObject) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = R> + Send + 'static,
        R: IntoToolResult,
    {
        self.tool.input_schema = input_schema;
        self.tool.output_schema = R::output_schema();
        self.finish(Arc::new(Raw(f)))
    }
}

/// A complete tool, ready to register.
pub struct ToolDef {
    pub(crate) tool: Tool,
    pub(crate) requires: Option<ClientCapabilities>,
    pub(crate) idempotent: Option<Idempotence>,
    pub(crate) max_concurrency: Option<usize>,
    pub(crate) timeout: Option<std::time::Duration>,
    pub(crate) mutates: Option<String>,
    pub(crate) scopes: Vec<String>,
    pub(crate) handler: Arc<dyn ErasedToolHandler>,
}

impl ToolDef {
    /// The definition as listed.
    pub fn definition(&self) -> &Tool {
        &self.tool
    }
}

/// Adds the required `idempotency_key` property to an object schema.
fn add_key_argument(schema: &mut JsonObject) {
    let properties = schema
        .entry("properties")
        .or_insert_with(|| serde_json::Value::Object(JsonObject::new()));
    if let Some(map) = properties.as_object_mut() {
        map.insert(KEY_ARGUMENT.to_owned(), key_schema());
    }
    let required = schema
        .entry("required")
        .or_insert_with(|| serde_json::Value::Array(Vec::new()));
    if let Some(list) = required.as_array_mut() {
        if !list.iter().any(|v| v == KEY_ARGUMENT) {
            list.push(KEY_ARGUMENT.into());
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use wharf_protocol::Implementation;

    use super::*;
    use crate::server::Server;
    use crate::testing::Harness;

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct Sum {
        a: i64,
        b: Vec<i64>,
        scale: f64,
    }

    /// `2.0` is an integer to the input schema, so the handler's integer field takes it;
    /// a fraction is refused by the schema, and a float field still reads what it is sent.
    #[tokio::test]
    async fn a_whole_number_with_a_fraction_reads_as_an_integer() {
        let server = Server::builder(Implementation::new("t", "1"))
            .tool(tool("sum").handler(|_cx: Context, s: Sum| async move {
                let total = s.a + s.b.iter().sum::<i64>();
                format!("{}", total as f64 * s.scale)
            }))
            .build()
            .unwrap();
        let h = Harness::new(server);
        let call = |arguments| {
            h.call(
                "tools/call",
                json!({ "name": "sum", "arguments": arguments }),
            )
        };
        let r = call(json!({ "a": 1.0, "b": [2, 3.0, -4.0], "scale": 2 }))
            .await
            .unwrap();
        assert_eq!(r["content"][0]["text"], "4", "{r}");
        assert_eq!(r.get("isError"), None, "{r}");
        let r = call(json!({ "a": 1, "b": [], "scale": 0.5 }))
            .await
            .unwrap();
        assert_eq!(r["content"][0]["text"], "0.5", "{r}");
        let r = call(json!({ "a": 1.5, "b": [], "scale": 1 }))
            .await
            .unwrap();
        assert_eq!(r["isError"], true, "{r}");
        let text = r["content"][0]["text"].as_str().unwrap();
        assert!(text.contains("integer") && text.contains("/a"), "{text}");
    }
}
