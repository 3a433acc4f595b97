//! The spans a request leaves for a tracing backend: `mcp.request` from admission to the
//! answer, and under it the queue wait, the mutation-lock wait, the store's work, the
//! handler and each MRTR round. All have the target [`TARGET`], so a log layer can leave
//! them out and a tracing layer take only them; when no layer wants them they are never
//! built, and a request pays one cached check per span.
//!
//! With the `opentelemetry` feature, a request that carries W3C trace context (in `_meta`,
//! or in a transport's header) becomes a child of the caller's span, so the server's spans
//! join the client's trace.

use sha2::{Digest, Sha256};
use tracing::Span;
use tracing::field::Empty;
use wharf_protocol::RequestId;

use crate::error::RpcError;
use crate::meta::{Era, trace_id_of};
use crate::metrics::Outcome;
use crate::principal::Principal;
use crate::request::ParsedRequest;

/// The target of every span this module makes.
pub(crate) const TARGET: &str = "wharf::trace";

/// The span of one request. The principal appears only as a stable hash of its id: traces
/// are often kept longer and seen by more people than the user table.
pub(crate) fn request<'a>(
    req: &'a ParsedRequest,
    principal: &Principal,
    known: impl FnOnce() -> Option<&'a str>,
) -> Span {
    let method = req.body.method();
    let span = tracing::info_span!(
        target: TARGET,
        "mcp.request",
        otel.name = Empty,
        otel.kind = "server",
        otel.status_code = Empty,
        mcp.method.name = method,
        mcp.target = Empty,
        mcp.era = era(req.info.era()),
        jsonrpc.request.id = Empty,
        enduser.hash = Empty,
        mcp.outcome = Empty,
        rpc.jsonrpc.error_code = Empty,
        trace_id = Empty,
    );
    if span.is_disabled() {
        return span;
    }
    // The span is named `method target` only for a target the server has (`known`): a
    // name a client made up, or a resource URI, would give every request a name of its own.
    match known() {
        Some(target) => span.record("otel.name", format!("{method} {target}")),
        None => span.record("otel.name", method),
    };
    if let Some(target) = req.body.name() {
        span.record("mcp.target", bounded(target));
    }
    // A string attribute, as OpenTelemetry's conventions have it. A number is displayed and a
    // string id recorded as a string, which a text log quotes and escapes: `1` and `"1"` stay
    // apart there, and no client forges a log line.
    match &req.id {
        RequestId::Int(n) => span.record("jsonrpc.request.id", tracing::field::display(n)),
        RequestId::String(s) => span.record("jsonrpc.request.id", bounded(s)),
        RequestId::Number(n) => span.record("jsonrpc.request.id", bounded(n)),
    };
    span.record("enduser.hash", principal_hash(principal.id()));
    if let Some(traceparent) = &req.info.traceparent {
        if let Some(trace_id) = trace_id_of(traceparent) {
            span.record("trace_id", trace_id);
        }
        join(&span, traceparent, req.info.tracestate.as_deref());
    }
    span
}

/// Records how the request ended on its span.
pub(crate) fn finish(span: &Span, outcome: Outcome, error: Option<&RpcError>) {
    span.record("mcp.outcome", outcome.as_str());
    if let Some(e) = error {
        span.record("rpc.jsonrpc.error_code", e.code());
        span.record("otel.status_code", "ERROR");
    }
}

/// The wait for a slot under the load caps, under the request's span.
pub(crate) fn admission(request: &Span) -> Span {
    tracing::info_span!(target: TARGET, parent: request, "mcp.admission")
}

/// The wait for the turn on what a call mutates.
pub(crate) fn mutation_wait() -> Span {
    tracing::info_span!(target: TARGET, "mcp.mutation_wait")
}

/// The wait of a write in steps for a place to hold its claim on (PostgreSQL).
pub(crate) fn claim_wait() -> Span {
    tracing::info_span!(target: TARGET, "mcp.claim_wait")
}

/// The handler's run; `round` is the MRTR round the request answers, if any.
pub(crate) fn handler(round: Option<u32>) -> Span {
    tracing::info_span!(target: TARGET, "mcp.handler", mcp.mrtr.round = round)
}

/// A span for one operation of the store.
pub(crate) fn store(operation: &'static str, backend: &'static str) -> Span {
    tracing::info_span!(
        target: TARGET,
        "mcp.store",
        otel.name = Empty,
        db.operation.name = operation,
        db.system.name = system_name(backend),
    )
}

/// OpenTelemetry's well-known `db.system.name` for a store backend's name.
fn system_name(backend: &'static str) -> &'static str {
    match backend {
        "postgres" => "postgresql",
        other => other,
    }
}

/// A span for round `round` of a multi-round request (legacy calls that asked their
/// client, and MRTR retries that answer a server's input request).
pub(crate) fn round(request: &Span, round: u32) -> Span {
    tracing::info_span!(
        target: TARGET,
        parent: request,
        "mcp.mrtr.round",
        mcp.mrtr.round = round,
        mcp.outcome = Empty,
        rpc.jsonrpc.error_code = Empty,
        otel.status_code = Empty,
    )
}

fn era(era: Era) -> &'static str {
    match era {
        Era::Stateless => "2026-07-28",
        _ => "legacy",
    }
}

/// The longest text a span takes from a request (an id, a tool name, a resource URI): a
/// client's string may be as long as the body, and every span is kept in the exporter's
/// queue until it is sent.
const MAX_ATTRIBUTE_LEN: usize = 256;

/// `text`, cut to at most [`MAX_ATTRIBUTE_LEN`] bytes on a character boundary.
fn bounded(text: &str) -> &str {
    if text.len() <= MAX_ATTRIBUTE_LEN {
        return text;
    }
    let mut end = MAX_ATTRIBUTE_LEN;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The first 16 hex digits of the SHA-256 of `id`: stable across replicas and restarts,
/// so a trace search finds one principal's requests, and no id is written out.
fn principal_hash(id: &str) -> String {
    let digest = Sha256::digest(id.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(feature = "opentelemetry")]
fn join(span: &Span, traceparent: &str, tracestate: Option<&str>) {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
    };
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;

    let Some(trace) = trace_id_of(traceparent) else {
        return;
    };
    let mut parts = traceparent.split('-').skip(2);
    let (Some(parent), Some(flags)) = (parts.next(), parts.next()) else {
        return;
    };
    let (Ok(trace), Ok(parent), Ok(flags)) = (
        TraceId::from_hex(trace),
        SpanId::from_hex(parent),
        u8::from_str_radix(flags, 16),
    ) else {
        return;
    };
    // W3C trace context: at most 32 members, and a value over 512 characters may be
    // dropped. The state is copied into every span under this one.
    let state = tracestate
        .filter(|s| s.len() <= 512 && s.split(',').count() <= 32)
        .and_then(|s| s.parse::<TraceState>().ok())
        .unwrap_or_default();
    let remote = SpanContext::new(trace, parent, TraceFlags::new(flags), true, state);
    let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
}

#[cfg(not(feature = "opentelemetry"))]
fn join(_span: &Span, _traceparent: &str, _tracestate: Option<&str>) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_from_a_request_is_bounded_on_a_character_boundary() {
        assert_eq!(bounded("tools/call"), "tools/call");
        let long = "é".repeat(MAX_ATTRIBUTE_LEN);
        let cut = bounded(&long);
        assert!(cut.len() <= MAX_ATTRIBUTE_LEN && cut.len() >= MAX_ATTRIBUTE_LEN - 1);
        assert!(cut.chars().all(|c| c == 'é'));
    }

    #[test]
    fn the_principal_hash_is_stable_and_hides_the_id() {
        let a = principal_hash("alice@example.com");
        assert_eq!(a, principal_hash("alice@example.com"));
        assert_ne!(a, principal_hash("bob@example.com"));
        assert_eq!(a.len(), 16);
        assert!(!a.contains("alice"));
    }
}
