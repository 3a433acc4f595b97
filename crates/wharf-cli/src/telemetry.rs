//! What `wharf serve` tells an operator besides its answers: logs on stderr (text, or JSON
//! lines that carry the trace id), and spans exported over OTLP/HTTP when the standard
//! `OTEL_*` variables say where to.

use std::io::Write as _;

use clap::ValueEnum;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_opentelemetry::OtelData;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime as _, SystemTime};
use tracing_subscriber::layer::{Context, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The target of the core's request spans (`wharf::trace`): what a tracing backend wants
/// and a text log does not.
const SPANS: &str = "wharf::trace";

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
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.tracer.take() {
            if let Err(e) = provider.shutdown() {
                eprintln!("wharf: could not send the last spans: {e}");
            }
        }
    }
}

/// Installs logging (filtered by `WHARF_LOG`, `info` by default) and, when configured,
/// span export. Returns an error only for an OTLP configuration it cannot use.
pub(crate) fn init(format: LogFormat) -> Result<Telemetry, String> {
    // `Targets` reads `info,wharf=debug`-style filters without compiling regular expressions
    // at startup (EnvFilter does, and every page of that code stays resident).
    let filter = std::env::var("WHARF_LOG")
        .ok()
        .and_then(|f| f.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(Level::INFO));
    let tracer = tracer()?;
    let otel = tracer.as_ref().map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("wharf"))
            .with_filter(
                Targets::new()
                    .with_default(Level::WARN)
                    .with_target(SPANS, Level::INFO),
            )
    });
    // Logs go to stderr: on stdio, stdout carries only MCP messages.
    let (text, json) = match format {
        // A text log leaves the request spans out: formatting their fields for every request
        // would cost the hot path, and its lines do not show them.
        LogFormat::Text => (
            Some(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_filter(filter.with_target(SPANS, LevelFilter::OFF)),
            ),
            None,
        ),
        // JSON lines keep them: they hold the trace id every line carries.
        LogFormat::Json => (
            None,
            Some(JsonLines.with_filter(filter.with_target(SPANS, Level::INFO))),
        ),
    };
    tracing_subscriber::registry()
        .with(otel)
        .with(text)
        .with(json)
        .try_init()
        .map_err(|e| format!("cannot install logging: {e}"))?;
    Ok(Telemetry { tracer })
}

/// The span exporter, when `OTEL_EXPORTER_OTLP_ENDPOINT` (or its traces-only form) names a
/// collector and neither `OTEL_SDK_DISABLED` nor `OTEL_TRACES_EXPORTER=none` turns it off.
/// Everything else (headers, timeout, sampler, batch delay, service name, resource) comes
/// from the other standard variables, read by the OpenTelemetry SDK itself.
fn tracer() -> Result<Option<SdkTracerProvider>, String> {
    let var = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
    let configured = var("OTEL_EXPORTER_OTLP_ENDPOINT")
        .or_else(|| var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
        .is_some();
    let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v == "none");
    if !configured || disabled {
        return Ok(None);
    }
    if let Some(protocol) = var("OTEL_EXPORTER_OTLP_PROTOCOL") {
        if protocol != "http/protobuf" {
            return Err(format!(
                "OTEL_EXPORTER_OTLP_PROTOCOL={protocol}: wharf exports over http/protobuf only"
            ));
        }
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| format!("cannot set up the OTLP span exporter: {e}"))?;
    let mut resource = Resource::builder();
    if var("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("wharf");
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    Ok(Some(provider))
}

/// The trace id a span's `trace_id` field named (the caller's, from its W3C trace context),
/// kept for the log lines of events inside it when no OpenTelemetry layer tracks the trace.
struct CallerTrace(String);

/// Writes each event as one JSON object on a line of stderr: `timestamp`, `level`,
/// `target`, `message`, the event's fields, `span` (the innermost one) and `trace_id`.
/// Every value goes through a JSON encoder, so nothing a client sent can break a line or
/// forge a field.
struct JsonLines;

impl<S> Layer<S> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
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
        // One write per line, under stderr's lock: lines of concurrent requests never mix.
        let _ = std::io::stderr().lock().write_all(&text);
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
