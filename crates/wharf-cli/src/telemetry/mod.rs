//! What `wharf serve` tells an operator besides its answers: logs on stderr (text, or JSON
//! lines that carry the trace id), and spans and metrics exported over OTLP/HTTP when the
//! standard `OTEL_*` variables say where to.

mod otlp_metrics;

pub(crate) use otlp_metrics::MetricsPush;

use std::io::Write as _;

use clap::ValueEnum;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use std::time::Duration;

use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_opentelemetry::OtelData;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime as _, SystemTime};
use tracing_subscriber::layer::{Context, SubscriberExt as _};
use tracing_subscriber::registry::{LookupSpan, Registry};
use tracing_subscriber::util::SubscriberInitExt as _;

/// The target of the core's request spans (`wharf::trace`): what a tracing backend wants
/// and a text log does not.
const SPANS: &str = "wharf::trace";

/// What the tracing backend gets: the request spans, and warnings and errors as events of
/// the span they happen in; not an internal error's detail, which stays in the log (it may
/// hold what a request carried: a handler's panic message, say).
fn exported() -> Targets {
    Targets::new()
        .with_default(Level::WARN)
        .with_target(SPANS, Level::INFO)
        .with_target(wharf::DETAIL_TARGET, LevelFilter::OFF)
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// For people: one line per event, fields as `key=value`.
    Text,
    /// For log pipelines: one JSON object per line, with the trace id of the request it
    /// belongs to.
    Json,
}

/// Keeps the exporter running; dropping it sends the spans still buffered.
pub(crate) struct Telemetry {
    tracer: Option<SdkTracerProvider>,
    metrics: Option<MetricsPush>,
}

impl Telemetry {
    /// The metrics push the environment configures, for the server to run once it is built.
    pub(crate) fn metrics_push(&self) -> Option<MetricsPush> {
        self.metrics.clone()
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.tracer.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("wharf: could not send the last spans: {e}");
        }
    }
}

/// Installs logging (filtered by `WHARF_LOG`, `info` by default) and, when configured,
/// span export. Returns an error only for an OTLP configuration it cannot use.
pub(crate) fn init(format: LogFormat) -> Result<Telemetry, String> {
    // `Targets` reads `info,wharf=debug`-style filters without compiling regular expressions
    // at startup (EnvFilter does, and every page of that code stays resident).
    let filter = log_filter(std::env::var("WHARF_LOG").ok().as_deref())?;
    let env = |name: &str| std::env::var(name).ok();
    // One resource for spans and metrics: both name the same process (one instance id).
    let resource = resource();
    let tracer = tracer(env, &resource)?;
    let attributes = ResourceAttributesWithSchema::from(&resource).attributes.0;
    let metrics = MetricsPush::from_env(env, attributes)?;
    // Logs go to stderr: on stdio, stdout carries only MCP messages.
    let layers = layers(format, filter, tracer.as_ref(), std::io::stderr);
    tracing_subscriber::registry()
        .with(layers)
        .try_init()
        .map_err(|e| format!("cannot install logging: {e}"))?;
    Ok(Telemetry { tracer, metrics })
}

/// `WHARF_LOG` read: `info` when unset or empty (an env file's `WHARF_LOG=`), else its
/// directives, refused when one does not read. A mistyped level would otherwise be taken as
/// a target's name (`debg` logs only a target `debg`: nothing at all), so a bare word must be
/// a level.
fn log_filter(value: Option<&str>) -> Result<Targets, String> {
    let value = value.map(str::trim).unwrap_or_default();
    if value.is_empty() {
        return Ok(Targets::new().with_default(Level::INFO));
    }
    let refuse = |why: String| format!("WHARF_LOG={value:?}: {why}");
    // An empty level reads as `error` to tracing: refused with the rest.
    let level = |text: &str| {
        text.parse::<LevelFilter>()
            .ok()
            .filter(|_| !text.is_empty())
            .ok_or_else(|| {
                refuse(format!(
                    "{text:?} is no level: give trace, debug, info, warn, error or off"
                ))
            })
    };
    // Each directive read trimmed, its target and level too: `info, wharf = debug` would
    // otherwise name targets ` wharf ` that never match.
    let mut directives = Vec::new();
    for directive in value.split(',').map(str::trim) {
        match directive.split_once('=') {
            _ if directive.is_empty() => {
                return Err(refuse("an empty directive (a comma too many)".into()));
            }
            Some((target, filter)) if !target.trim().is_empty() => {
                let filter = level(filter.trim())?;
                directives.push(format!("{}={filter}", target.trim()));
            }
            Some(_) => return Err(refuse(format!("{directive:?} names no target"))),
            None => directives.push(level(directive)?.to_string()),
        }
    }
    directives
        .join(",")
        .parse::<Targets>()
        .map_err(|e| refuse(format!("{e}: give LEVEL or TARGET=LEVEL, comma-separated")))
}

type Boxed = Box<dyn Layer<Registry> + Send + Sync>;

/// The layers that are on, and only those: an absent layer (an `Option` left `None`) would
/// answer "interested" for every callsite, and the request spans would be built for every
/// request with nobody to read them.
fn layers<W>(
    format: LogFormat,
    filter: Targets,
    tracer: Option<&SdkTracerProvider>,
    writer: W,
) -> Vec<Boxed>
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let mut layers: Vec<Boxed> = Vec::new();
    if let Some(provider) = tracer {
        layers.push(
            tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("wharf"))
                .with_filter(exported())
                .boxed(),
        );
    }
    layers.push(match format {
        // A text log shows the request spans (each line prefixed with its request's method
        // and id) only when debug logging is on for them: at the default level, formatting
        // their fields for every request would cost the hot path for lines nobody reads.
        LogFormat::Text => {
            let spans = if filter.would_enable(SPANS, &Level::DEBUG) {
                LevelFilter::INFO
            } else {
                LevelFilter::OFF
            };
            tracing_subscriber::fmt::layer()
                .fmt_fields(text_fields())
                .with_writer(writer)
                .with_filter(filter.with_target(SPANS, spans))
                .boxed()
        }
        // JSON lines keep them: they hold the trace id every line carries.
        LogFormat::Json => JsonLines(writer)
            .with_filter(filter.with_target(SPANS, Level::INFO))
            .boxed(),
    });
    layers
}

/// How a text line writes an event's and a span's fields: as the default format does
/// (`key=value`, the message bare), with every control character escaped. A value written
/// with `%` (an error, a handler's message, what a client named) is otherwise written as it
/// is, and a newline in it would start a line of the client's making.
fn text_fields() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> + 'static {
    use tracing_subscriber::field::MakeExt as _;
    tracing_subscriber::fmt::format::debug_fn(|w, field, value| {
        let text = format!("{value:?}");
        let text = controls_escaped(&text);
        if field.name() == "message" {
            write!(w, "{text}")
        } else {
            write!(w, "{field}={text}")
        }
    })
    .delimited(" ")
}

/// `text` with what could pass for a line's end or reorder what a reader sees written as
/// escapes: control characters (line breaks, terminal escapes), Unicode's line and paragraph
/// separators, and its bidirectional embeddings, overrides and isolates.
fn controls_escaped(text: &str) -> std::borrow::Cow<'_, str> {
    let hidden =
        |c: char| c.is_control() || matches!(c, '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    if !text.chars().any(hidden) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if hidden(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The span exporter, when `OTEL_EXPORTER_OTLP_ENDPOINT` (or its traces-only form) names a
/// collector, `OTEL_TRACES_EXPORTER` (when set) lists `otlp` and `OTEL_SDK_DISABLED` is not
/// true. The protocol (http/protobuf only), timeout and TLS files come from the traces-only
/// variables or the generic ones, as for metrics; the rest (headers, sampler, batch delay,
/// service name, resource) from the standard variables, read by the OpenTelemetry SDK
/// itself. An error names the variable it cannot use.
fn tracer(
    env: impl Fn(&str) -> Option<String>,
    resource: &Resource,
) -> Result<Option<SdkTracerProvider>, String> {
    let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    let setting = |what: &str| otlp_metrics::signal_setting(&var, "TRACES", what);
    let Some(endpoint) = otlp_metrics::signal_endpoint(&var, "TRACES", "traces")? else {
        return Ok(None);
    };
    let timeout = match setting("TIMEOUT") {
        Some((name, ms)) => match ms.trim().parse::<u64>() {
            Ok(ms) if ms > 0 => Duration::from_millis(ms),
            _ => {
                return Err(format!(
                    "{name}={ms}: not a positive number of milliseconds"
                ));
            }
        },
        None => Duration::from_secs(10),
    };
    let tls = otlp_metrics::Tls::from_env(&setting)?;
    // The exporter sends from a thread of its own, with a blocking client; built on a
    // thread of its own too, as a blocking client may not be built inside a runtime.
    // A collector on this machine is reached directly, whatever the environment's proxy.
    let direct = wharf_auth::is_loopback_url(&endpoint);
    let client = std::thread::spawn(move || {
        let mut client = reqwest::blocking::Client::builder().timeout(timeout);
        if direct {
            client = client.no_proxy();
        }
        if let Some(ca) = tls.root {
            client = client.add_root_certificate(ca);
        }
        if let Some(identity) = tls.identity {
            client = client.identity(identity);
        }
        client.build()
    })
    .join()
    .map_err(|_| "cannot set up the OTLP span client".to_owned())?
    .map_err(|e| format!("cannot set up the OTLP span client: {e}"))?;
    use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(endpoint.as_str())
        .with_http_client(client)
        .build()
        .map_err(|e| format!("cannot set up the OTLP span exporter: {e}"))?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(Reporting::new(exporter, &endpoint))
        .with_resource(resource.clone())
        .build();
    Ok(Some(provider))
}

/// A span exporter that says in the log when exports start failing and when they work
/// again, one line per change (the SDK's own reports are compiled out).
#[derive(Debug)]
struct Reporting<E> {
    inner: E,
    failing: std::sync::atomic::AtomicBool,
    /// What of the collector's URL may be a credential (user, password, query), longest
    /// first: the exporter's errors quote the URL, and the log gets them without it.
    secrets: Vec<String>,
    /// The collector's URL, as written and as a URL writes it, with what stands for it in
    /// the log (no user, password or query).
    urls: Vec<(String, String)>,
}

impl<E> Reporting<E> {
    /// Reports on `inner`, which exports to `endpoint`.
    fn new(inner: E, endpoint: &str) -> Self {
        Reporting {
            inner,
            failing: std::sync::atomic::AtomicBool::new(false),
            secrets: secrets_of(endpoint),
            urls: shown_for(endpoint),
        }
    }

    /// `text` with every credential the endpoint's URL holds replaced.
    fn redacted(&self, text: &str) -> String {
        // The URL whole first, so that a line reads as it would without credentials.
        let text = self
            .urls
            .iter()
            .fold(text.to_owned(), |text, (url, shown)| {
                text.replace(url, shown)
            });
        self.secrets
            .iter()
            .fold(text, |text, secret| text.replace(secret, "[redacted]"))
    }

    /// Logs `result` if it changes whether exports fail.
    fn report(&self, result: &OTelSdkResult) {
        let was_failing = self
            .failing
            .swap(result.is_err(), std::sync::atomic::Ordering::Relaxed);
        match result {
            // Outside any span: the OpenTelemetry layer exports none of it.
            Err(e) if !was_failing => tracing::warn!(
                error = %self.redacted(&e.to_string()),
                "could not export spans to the collector; they are dropped until it answers"
            ),
            Ok(()) if was_failing => tracing::info!("spans reach the collector again"),
            _ => {}
        }
    }
}

/// `endpoint` as written and as a URL writes it, each with the URL without its user,
/// password, query and fragment (none when it has none of them).
fn shown_for(endpoint: &str) -> Vec<(String, String)> {
    let Ok(url) = reqwest::Url::parse(endpoint) else {
        return Vec::new();
    };
    let mut shown = url.clone();
    // Only a URL that cannot have a user refuses these, and it has none to hide.
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.set_query(None);
    shown.set_fragment(None);
    if shown == url {
        return Vec::new();
    }
    let mut forms = vec![(endpoint.to_owned(), shown.to_string())];
    if url.as_str() != endpoint {
        forms.push((url.to_string(), shown.to_string()));
    }
    forms
}

/// The parts of `endpoint` that may be credentials, as written and as a URL writes them
/// (percent-encoded), longest first so that none is left half replaced.
fn secrets_of(endpoint: &str) -> Vec<String> {
    let mut secrets = Vec::new();
    if let Ok(url) = reqwest::Url::parse(endpoint) {
        secrets.extend([url.username(), url.password().unwrap_or_default()].map(str::to_owned));
        secrets.extend(url.query().map(str::to_owned));
    }
    let after_scheme = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest);
    let authority = after_scheme
        .split(['/', '?', '#'])
        .next()
        .unwrap_or_default();
    if let Some((userinfo, _)) = authority.rsplit_once('@') {
        secrets.extend(userinfo.split(':').map(str::to_owned));
        secrets.push(userinfo.to_owned());
    }
    if let Some((_, query)) = endpoint.split_once('?') {
        secrets.push(query.split('#').next().unwrap_or_default().to_owned());
    }
    secrets.retain(|s| !s.is_empty());
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets.dedup();
    secrets
}

impl<E: SpanExporter> SpanExporter for Reporting<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let result = self.inner.export(batch).await;
        self.report(&result);
        result
    }

    fn shutdown_with_timeout(&mut self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&mut self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// What spans and metrics say about this process: `OTEL_RESOURCE_ATTRIBUTES` and
/// `OTEL_SERVICE_NAME`, read by the SDK; by default `wharf` as the service name and a
/// random `service.instance.id`, so a collector tells the replicas' cumulative counts apart.
fn resource() -> Resource {
    let var = |name| std::env::var(name).unwrap_or_default();
    let attributes = var("OTEL_RESOURCE_ATTRIBUTES");
    let given = |key: &str| {
        attributes
            .split(',')
            .any(|pair| pair.split_once('=').is_some_and(|(k, _)| k.trim() == key))
    };
    let mut resource = Resource::builder();
    if var("OTEL_SERVICE_NAME").is_empty() && !given("service.name") {
        resource = resource.with_service_name("wharf");
    }
    if !given("service.instance.id") {
        let id: [u8; 16] = rand::random();
        let id: String = id.iter().map(|b| format!("{b:02x}")).collect();
        resource = resource.with_attribute(opentelemetry::KeyValue::new("service.instance.id", id));
    }
    resource.build()
}

/// The trace id a span's `trace_id` field named (the caller's, from its W3C trace context),
/// kept for the log lines of events inside it when no OpenTelemetry layer tracks the trace.
struct CallerTrace(String);

/// Writes each event as one JSON object on a line of its writer: `timestamp`, `level`,
/// `target`, `message`, the event's fields, `span` (the innermost one) and `trace_id`.
/// Every value goes through a JSON encoder, so nothing a client sent can break a line or
/// forge a field.
struct JsonLines<W>(W);

impl<S, W> Layer<S> for JsonLines<W>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'a> MakeWriter<'a> + 'static,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut found = TraceField(None);
        attrs.record(&mut found);
        if let (Some(trace), Some(span)) = (found.0, ctx.span(id)) {
            span.extensions_mut().insert(CallerTrace(trace));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let mut found = TraceField(None);
        values.record(&mut found);
        if let (Some(trace), Some(span)) = (found.0, ctx.span(id)) {
            span.extensions_mut().replace(CallerTrace(trace));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let meta = event.metadata();
        let mut line = Map::new();
        let mut time = String::new();
        if SystemTime.format_time(&mut Writer::new(&mut time)).is_ok() {
            line.insert("timestamp".into(), Value::String(time));
        }
        line.insert("level".into(), Value::String(meta.level().to_string()));
        line.insert("target".into(), Value::String(meta.target().to_owned()));
        let mut fields = JsonFields(Map::new());
        event.record(&mut fields);
        line.extend(fields.0);
        if let Some(scope) = ctx.event_scope(event) {
            let mut innermost = None;
            for span in scope {
                innermost.get_or_insert_with(|| span.name());
                let ext = span.extensions();
                let trace = ext
                    .get::<OtelData>()
                    .and_then(OtelData::trace_id)
                    .map(|t| t.to_string())
                    .or_else(|| ext.get::<CallerTrace>().map(|t| t.0.clone()));
                if let Some(trace) = trace {
                    line.insert("trace_id".into(), Value::String(trace));
                    break;
                }
            }
            if let Some(name) = innermost {
                line.insert("span".into(), Value::String(name.to_owned()));
            }
        }
        let Ok(mut text) = serde_json::to_vec(&Value::Object(line)) else {
            return;
        };
        text.push(b'\n');
        // One write per line (stderr writes it under its lock): lines of concurrent
        // requests never mix.
        let _ = self.0.make_writer_for(meta).write_all(&text);
    }
}

/// Finds a span's `trace_id` field.
struct TraceField(Option<String>);

impl Visit for TraceField {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "trace_id" {
            self.0 = Some(value.to_owned());
        }
    }

    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}

/// An event's fields as JSON values.
struct JsonFields(Map<String, Value>);

impl JsonFields {
    fn put(&mut self, field: &Field, value: Value) {
        self.0.insert(field.name().to_owned(), value);
    }
}

impl Visit for JsonFields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::String(value.to_owned()));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::Bool(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::from(value));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::String(value.to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, Value::String(format!("{value:?}")));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn the_log_filter_is_read_or_refused_by_name() {
        for unset in [None, Some(""), Some("  ")] {
            let filter = log_filter(unset).unwrap();
            assert!(filter.would_enable("wharf", &Level::INFO));
            assert!(!filter.would_enable("wharf", &Level::DEBUG));
        }
        let filter = log_filter(Some("warn, wharf_http = debug")).unwrap();
        assert!(filter.would_enable("wharf_http::endpoint", &Level::DEBUG));
        assert!(filter.would_enable("wharf_store", &Level::WARN));
        assert!(!filter.would_enable("wharf_store", &Level::INFO));
        assert!(log_filter(Some("DEBUG")).is_ok());
        for (bad, why) in [
            ("debg", "\"debg\" is no level"),
            ("wharf=", "\"\" is no level"),
            ("=debug", "names no target"),
            ("info,,wharf=debug", "an empty directive"),
            ("info,", "a comma too many"),
            ("wharf=loud", "WHARF_LOG=\"wharf=loud\""),
        ] {
            let e = log_filter(Some(bad)).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn an_internal_errors_detail_is_not_exported_to_traces() {
        let exported = exported();
        assert!(!exported.would_enable(wharf::DETAIL_TARGET, &Level::ERROR));
        assert!(exported.would_enable(SPANS, &Level::INFO));
        assert!(exported.would_enable("wharf_store::sql", &Level::WARN));
        assert!(!exported.would_enable("wharf_store::sql", &Level::INFO));
    }

    /// Whether the span exporter `vars` configure is on; or the error naming a variable.
    fn traces(vars: &[(&str, &str)]) -> Result<bool, String> {
        let env = |name: &str| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        };
        let provider = tracer(env, &Resource::builder_empty().build())?;
        let on = provider.is_some();
        if let Some(provider) = provider {
            // Nothing was exported: its last batch is empty.
            let _ = provider.shutdown();
        }
        Ok(on)
    }

    #[test]
    fn the_span_exporter_reads_the_traces_variables_as_the_metrics_push_does() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1");
        assert_eq!(traces(&[]), Ok(false));
        assert_eq!(traces(&[endpoint]), Ok(true));
        assert_eq!(
            traces(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:1/t")]),
            Ok(true)
        );
        // An exporter list without otlp turns it off; one with it, in any case, keeps it.
        assert_eq!(
            traces(&[endpoint, ("OTEL_TRACES_EXPORTER", "console")]),
            Ok(false)
        );
        assert_eq!(
            traces(&[endpoint, ("OTEL_TRACES_EXPORTER", "console, OTLP")]),
            Ok(true)
        );
        assert_eq!(
            traces(&[endpoint, ("OTEL_SDK_DISABLED", "TRUE")]),
            Ok(false)
        );
        // The traces-only protocol is the one that counts, in any case.
        assert_eq!(
            traces(&[
                endpoint,
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "HTTP/PROTOBUF"),
            ]),
            Ok(true)
        );
        for (bad, named) in [
            (
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            ),
            (
                ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "/no/such.pem"),
                "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
            ),
            (
                ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/no/such.pem"),
                "OTEL_EXPORTER_OTLP_CLIENT_KEY",
            ),
            (
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "0"),
                "OTEL_EXPORTER_OTLP_TIMEOUT",
            ),
            (
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "c:4318"),
                "OTEL_EXPORTER_OTLP_ENDPOINT",
            ),
        ] {
            // The bad one first: it is the one read.
            let e = traces(&[bad, endpoint]).unwrap_err();
            assert!(e.contains(named), "{bad:?}: {e}");
        }
    }

    /// Exports that fail one after another are logged once, and so is the recovery.
    #[test]
    fn failing_span_exports_are_logged_once_and_the_recovery_too() {
        use opentelemetry_sdk::error::OTelSdkError;

        #[derive(Debug)]
        struct Flaky(Mutex<Vec<bool>>);
        impl SpanExporter for Flaky {
            fn export(&self, _: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
                let ok = self.0.lock().unwrap().remove(0);
                async move {
                    if ok {
                        Ok(())
                    } else {
                        Err(OTelSdkError::InternalFailure(
                            "the collector answered 404".into(),
                        ))
                    }
                }
            }
        }

        let _one = one_subscriber();
        let out = Buffer::default();
        let exporter = Reporting::new(
            Flaky(Mutex::new(vec![true, false, false, true, true])),
            "http://127.0.0.1:4318/v1/traces",
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        tracing::subscriber::with_default(subscriber(LogFormat::Text, &out), || {
            for _ in 0..5 {
                let _ = runtime.block_on(exporter.export(Vec::new()));
            }
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.matches("could not export spans").count(), 1, "{text}");
        assert!(text.contains("the collector answered 404"), "{text}");
        assert_eq!(
            text.matches("spans reach the collector again").count(),
            1,
            "{text}"
        );
    }

    /// The exporter's errors quote the collector's URL; what of it may be a credential
    /// never reaches the log. Exported for real, to a port nothing listens on.
    #[test]
    fn a_failed_exports_log_line_holds_no_credential_of_the_collectors_url() {
        let endpoint = "http://trace-user:pa%24%24word@127.0.0.1:1/v1/traces?api-key=t0ken-1";
        let client = std::thread::spawn(|| reqwest::blocking::Client::builder().build())
            .join()
            .unwrap()
            .unwrap();
        use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(endpoint)
            .with_http_client(client)
            .build()
            .unwrap();
        let exporter = Reporting::new(exporter, endpoint);
        let _one = one_subscriber();
        let out = Buffer::default();
        // The blocking client may not run inside a runtime: polled on a thread of its own.
        let result = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    tracing::subscriber::with_default(subscriber(LogFormat::Text, &out), || {
                        futures_executor::block_on(exporter.export(Vec::new()))
                    })
                })
                .join()
                .unwrap()
        });
        let raw = result.unwrap_err().to_string();
        assert!(
            raw.contains("t0ken-1"),
            "the exporter quotes the URL: {raw}"
        );
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert!(text.contains("could not export spans"), "{text}");
        assert!(
            text.contains("http://127.0.0.1:1/v1/traces"),
            "where it failed to: {text}"
        );
        for secret in [
            "trace-user",
            "pa%24%24word",
            "pa$$word",
            "api-key",
            "t0ken-1",
        ] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
    }

    #[test]
    fn the_credentials_of_a_url_are_what_it_holds_before_the_host_and_after_the_path() {
        assert_eq!(secrets_of("http://127.0.0.1:4318"), Vec::<String>::new());
        assert_eq!(
            secrets_of("https://u:p%40ss@c.example/v1/traces?k=v&x=y#f"),
            ["u:p%40ss", "k=v&x=y", "p%40ss", "u"]
        );
        assert_eq!(secrets_of("https://token@c.example/"), ["token"]);
    }

    /// Collects what a layer writes.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buffer {
        type Writer = Buffer;

        fn make_writer(&'a self) -> Buffer {
            self.clone()
        }
    }

    /// Held by each test that installs a subscriber. Whether a callsite is enabled is cached
    /// once, from every subscriber alive at that moment, on any thread; tests running side by
    /// side would decide for each other whether a span is built.
    static ONE_SUBSCRIBER: Mutex<()> = Mutex::new(());

    fn one_subscriber() -> std::sync::MutexGuard<'static, ()> {
        ONE_SUBSCRIBER.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn subscriber(format: LogFormat, out: &Buffer) -> impl Subscriber + Send + Sync {
        with_filter(format, "info", out)
    }

    fn with_filter(format: LogFormat, filter: &str, out: &Buffer) -> impl Subscriber + Send + Sync {
        let filter = filter.parse::<Targets>().unwrap();
        tracing_subscriber::registry().with(layers(format, filter, None, out.clone()))
    }

    #[test]
    fn text_logs_leave_the_request_spans_unbuilt() {
        let _one = one_subscriber();
        let out = Buffer::default();
        tracing::subscriber::with_default(subscriber(LogFormat::Text, &out), || {
            let span = tracing::info_span!(target: "wharf::trace", "mcp.request");
            assert!(span.is_disabled(), "built for nobody on every request");
            tracing::info!("still logged");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert!(text.contains("still logged"), "{text}");
    }

    #[test]
    fn debug_text_logs_name_the_request_of_each_line_escaped() {
        let _one = one_subscriber();
        let out = Buffer::default();
        let hostile = "w\nINJECTED \u{1b}[31m";
        tracing::subscriber::with_default(
            with_filter(LogFormat::Text, "info,wharf=debug", &out),
            || {
                let span = tracing::info_span!(
                    target: "wharf::trace",
                    "mcp.request",
                    jsonrpc.request.id = hostile
                );
                span.in_scope(|| tracing::debug!(target: "wharf::mutation", "waits for its turn"));
            },
        );
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let line = text.lines().find(|l| l.contains("waits for its turn"));
        let line = line.unwrap_or_else(|| panic!("no event line in {text:?}"));
        assert!(
            line.contains(r#"jsonrpc.request.id="w\nINJECTED \u{1b}[31m""#),
            "{line}"
        );
        assert!(!text.contains('\u{1b}'), "no raw escape: {text:?}");
        assert_eq!(text.lines().count(), 1, "no forged line: {text:?}");
    }

    #[test]
    fn text_lines_escape_what_a_value_written_as_it_is_holds() {
        let _one = one_subscriber();
        let out = Buffer::default();
        let hostile = "bad input\n2026-12-07T00:00:00Z ERROR forged=1 \u{1b}[31m\u{2028}\u{202e}";
        tracing::subscriber::with_default(subscriber(LogFormat::Text, &out), || {
            tracing::error!(detail = %hostile, name = hostile, "internal error: {hostile}");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "no forged line: {text:?}");
        for raw in ['\u{1b}', '\u{2028}', '\u{202e}'] {
            assert!(!text.contains(raw), "no raw {raw:?}: {text:?}");
        }
        assert!(
            text.contains(
                r"detail=bad input\n2026-12-07T00:00:00Z ERROR forged=1 \u{1b}[31m\u{2028}\u{202e}"
            ),
            "{text}"
        );
        assert!(text.contains(r"internal error: bad input\n"), "{text}");
        assert!(text.contains(r#"name="bad input\n"#), "{text}");
    }

    #[test]
    fn json_lines_escape_client_text_and_carry_the_callers_trace_id() {
        let _one = one_subscriber();
        let out = Buffer::default();
        let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
        let hostile = "x\"}\n{\"level\":\"ERROR\",\"trace_id\":\"forged\"";
        tracing::subscriber::with_default(subscriber(LogFormat::Json, &out), || {
            let span = tracing::info_span!(target: "wharf::trace", "mcp.request", trace_id = trace);
            assert!(
                !span.is_disabled(),
                "JSON lines need the span for the trace id"
            );
            span.in_scope(|| tracing::warn!(name = hostile, "refused"));
            tracing::info!("outside any request");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[0]["name"], hostile);
        assert_eq!(lines[0]["trace_id"], trace);
        assert_eq!(lines[0]["level"], "WARN");
        assert_eq!(lines[0]["span"], "mcp.request");
        assert_eq!(lines[0]["message"], "refused");
        assert!(lines[1].get("trace_id").is_none(), "{}", lines[1]);
    }
}
