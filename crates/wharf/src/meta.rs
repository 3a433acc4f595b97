//! The validated `_meta` of a request.

use wharf_protocol::meta::{CLIENT_CAPABILITIES, PROTOCOL_VERSION};
use wharf_protocol::{
    ClientCapabilities, Implementation, LoggingLevel, ProgressToken, RequestMeta, version,
};

use crate::error::{ErrorKind, RpcError};
use crate::session::Session;

/// What a request says about itself. A stateless request's is built only from a `_meta`
/// that carries both required fields, so a handler never sees one without them; a legacy
/// session's request takes its version and capabilities from the session.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestInfo {
    /// The protocol version the request speaks.
    pub protocol_version: String,
    /// What the client can do for this request (input requests it can answer, …).
    pub client_capabilities: ClientCapabilities,
    /// Who the client says it is.
    pub client_info: Option<Implementation>,
    /// The least severe log level the client wants as `notifications/message`.
    pub log_level: Option<LoggingLevel>,
    /// The token progress notifications carry, when the client asked for progress.
    pub progress_token: Option<ProgressToken>,
    /// W3C trace context: the caller's `traceparent`.
    pub traceparent: Option<String>,
    /// W3C trace context: the caller's `tracestate`.
    pub tracestate: Option<String>,
    /// W3C baggage: the caller's `baggage` (what it propagates beside the trace), for the
    /// application to read.
    pub baggage: Option<String>,
    /// The members of the request's `_meta` the protocol does not define: what the client
    /// or an extension sends under its own prefix (`com.example/tenant`). Each object in it
    /// names every member once. Data the client chose, as the arguments are: check it as
    /// input.
    pub other_meta: serde_json::Map<String, serde_json::Value>,
    /// Which era the request belongs to.
    era: Era,
}

/// W3C trace context a transport carries beside the body (HTTP's `traceparent` and
/// `tracestate` headers), for requests whose `_meta` carries none.
#[derive(Debug, Clone, Copy, Default)]
pub struct TraceContext<'a> {
    /// The `traceparent` header.
    pub traceparent: Option<&'a str>,
    /// The `tracestate` header.
    pub tracestate: Option<&'a str>,
}

/// The trace id of a W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`, lowercase), when
/// it is one.
pub(crate) fn trace_id_of(traceparent: &str) -> Option<&str> {
    let mut parts = traceparent.split('-');
    let (version, trace, parent, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, n: usize| {
        s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    let valid = hex(version, 2)
        && version != "ff"
        && hex(trace, 32)
        && trace.bytes().any(|b| b != b'0')
        && hex(parent, 16)
        && parent.bytes().any(|b| b != b'0')
        && hex(flags, 2)
        && (version != "00" || parts.next().is_none());
    valid.then_some(trace)
}

/// The era a request belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Era {
    /// 2026-07-28: every request carries its version and capabilities in `_meta`.
    Stateless,
    /// An initialization-based version: version, capabilities and log level come from the
    /// session `initialize` opened.
    Legacy,
}

impl RequestInfo {
    /// Checks that the required `_meta` fields are present.
    pub fn from_meta(mut meta: Option<RequestMeta>) -> Result<Self, RpcError> {
        Self::take_from(&mut meta, version::SUPPORTED)
    }

    /// [`from_meta`](Self::from_meta) over the params' own `_meta`, taking its fields where
    /// they lie: the whole of it is hundreds of bytes, and every move would copy them.
    /// `supported`: the versions a refusal lists.
    pub(crate) fn take_from(
        meta: &mut Option<RequestMeta>,
        supported: &[&str],
    ) -> Result<Self, RpcError> {
        let meta = meta.as_mut().ok_or_else(no_meta)?;
        let protocol_version = meta
            .protocol_version
            .take()
            .ok_or_else(|| missing(PROTOCOL_VERSION))?;
        let Some(client_capabilities) = meta.client_capabilities.take() else {
            // What `_meta` must carry depends on the version: one this server does not
            // speak is refused as that first.
            if !version::is_supported(&protocol_version) {
                return Err(RpcError::unsupported_version(&protocol_version, supported));
            }
            return Err(missing(CLIENT_CAPABILITIES));
        };
        Ok(RequestInfo {
            protocol_version,
            client_capabilities,
            client_info: meta.client_info.take(),
            log_level: meta.log_level.take(),
            progress_token: meta.progress_token.take(),
            traceparent: meta.traceparent.take(),
            tracestate: meta.tracestate.take(),
            baggage: meta.baggage.take(),
            other_meta: std::mem::take(&mut meta.other),
            era: Era::Stateless,
        })
    }

    /// What a request of a legacy session says about itself: the session's version,
    /// capabilities and log level, and from its own `_meta` only the progress token, the
    /// trace context, the baggage and the members the protocol does not define.
    pub(crate) fn in_session(session: &Session, meta: &mut Option<RequestMeta>) -> Self {
        let (progress_token, traceparent, tracestate, baggage, other_meta) = match meta {
            Some(m) => (
                m.progress_token.take(),
                m.traceparent.take(),
                m.tracestate.take(),
                m.baggage.take(),
                std::mem::take(&mut m.other),
            ),
            None => (None, None, None, None, serde_json::Map::new()),
        };
        RequestInfo {
            protocol_version: session.version().to_owned(),
            client_capabilities: session.client_capabilities().clone(),
            client_info: Some(session.client_info().clone()),
            log_level: session.log_level(),
            progress_token,
            traceparent,
            tracestate,
            baggage,
            other_meta,
            era: Era::Legacy,
        }
    }

    /// Joins the trace the transport carried (`carried`), unless `_meta` carries a valid
    /// `traceparent` of its own: a client (or a proxy) that sets only the HTTP headers still
    /// has its trace joined, and one whose `_meta` value is malformed does not lose it.
    pub fn adopt_trace(&mut self, carried: TraceContext<'_>) {
        if self.traceparent.as_deref().and_then(trace_id_of).is_some() {
            return;
        }
        if let Some(traceparent) = carried.traceparent.filter(|t| trace_id_of(t).is_some()) {
            self.traceparent = Some(traceparent.to_owned());
            self.tracestate = carried.tracestate.map(str::to_owned);
        }
    }

    /// The era the request belongs to.
    pub fn era(&self) -> Era {
        self.era
    }

    /// Refuses versions this server does not speak, listing the ones it does (`supported`).
    pub fn check_version(&self, supported: &[&str]) -> Result<(), RpcError> {
        let known = match self.era {
            Era::Stateless => version::is_supported(&self.protocol_version),
            Era::Legacy => version::is_legacy(&self.protocol_version),
        };
        if known {
            Ok(())
        } else {
            Err(RpcError::unsupported_version(
                &self.protocol_version,
                supported,
            ))
        }
    }

    /// Whether the response must be a stream: the client asked for progress or log messages.
    pub fn wants_stream(&self) -> bool {
        self.progress_token.is_some() || self.log_level.is_some()
    }
}

/// The refusal of a stateless request without `_meta`.
fn no_meta() -> RpcError {
    RpcError::new(
        ErrorKind::MalformedMeta,
        format!(
            "Invalid params: params._meta is required and must carry {PROTOCOL_VERSION:?} and {CLIENT_CAPABILITIES:?}"
        ),
    )
}

/// The refusal of a `_meta` without the required `field`.
fn missing(field: &str) -> RpcError {
    RpcError::new(
        ErrorKind::MalformedMeta,
        format!("Invalid params: missing required _meta field {field:?}"),
    )
}

/// Why a stateless request is refused before its params are looked at, if it is: its
/// `_meta` (in `params`, raw) names a version this server does not speak, or lacks what
/// every request must say about itself. A request is judged on these first, so that one
/// that is also wrong in its params is still told what the transport needs to know (an
/// HTTP 400), and a client of another version learns the versions this server speaks.
/// `None` when `_meta` is in order, or `params` is not an object.
/// `supported`: the versions a refusal lists.
pub(crate) fn refusal_before_params(params: &str, supported: &[&str]) -> Option<RpcError> {
    #[derive(serde::Deserialize)]
    struct Params {
        #[serde(rename = "_meta", default)]
        meta: Option<serde_json::Value>,
    }
    use serde_json::Value;
    let params: Params = serde_json::from_str(params).ok()?;
    // A `_meta` of the wrong type is named by the params' own error, as malformed.
    let meta = match params.meta {
        None | Some(Value::Null) => return Some(no_meta()),
        Some(Value::Object(meta)) => meta,
        Some(_) => return None,
    };
    match meta.get(PROTOCOL_VERSION) {
        None => Some(missing(PROTOCOL_VERSION)),
        Some(Value::String(v)) if !version::is_supported(v) => {
            Some(RpcError::unsupported_version(v, supported))
        }
        Some(_) if !meta.contains_key(CLIENT_CAPABILITIES) => Some(missing(CLIENT_CAPABILITIES)),
        Some(_) => None,
    }
}

/// Whether `declared` covers every capability named in `required`: its top-level keys, and
/// the parts of elicitation (form, url) and sampling (tools, context) it names.
pub(crate) fn capabilities_cover(
    declared: &ClientCapabilities,
    required: &ClientCapabilities,
) -> bool {
    required.sampling.as_ref().is_none_or(|req| {
        declared
            .sampling
            .as_ref()
            .is_some_and(|dec| dec.covers(req))
    }) && (required.roots.is_none() || declared.roots.is_some())
        && match (&required.elicitation, &declared.elicitation) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(req), Some(dec)) => {
                // An empty elicitation object means form mode (the default).
                let dec_form = dec.form.is_some() || (dec.form.is_none() && dec.url.is_none());
                (req.form.is_none() || dec_form) && (req.url.is_none() || dec.url.is_some())
            }
        }
        && required.experimental.as_ref().is_none_or(|req| {
            req.keys().all(|k| {
                declared
                    .experimental
                    .as_ref()
                    .is_some_and(|d| d.contains_key(k))
            })
        })
        && required.extensions.as_ref().is_none_or(|req| {
            req.keys().all(|k| {
                declared
                    .extensions
                    .as_ref()
                    .is_some_and(|d| d.contains_key(k))
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(traceparent: Option<&str>) -> RequestInfo {
        RequestInfo {
            protocol_version: version::LATEST.to_owned(),
            client_capabilities: ClientCapabilities::default(),
            client_info: None,
            log_level: None,
            progress_token: None,
            traceparent: traceparent.map(str::to_owned),
            tracestate: traceparent.map(|_| "meta=1".to_owned()),
            baggage: None,
            other_meta: serde_json::Map::new(),
            era: Era::Stateless,
        }
    }

    const META: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const HEADER: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn the_transports_trace_is_joined_unless_meta_carries_a_valid_one() {
        let carried = TraceContext {
            traceparent: Some(HEADER),
            tracestate: Some("header=1"),
        };
        let mut kept = info(Some(META));
        kept.adopt_trace(carried);
        assert_eq!(kept.traceparent.as_deref(), Some(META));
        assert_eq!(kept.tracestate.as_deref(), Some("meta=1"));

        for meta in [None, Some("00-junk"), Some(&*META.to_uppercase())] {
            let mut joined = info(meta);
            joined.adopt_trace(carried);
            assert_eq!(joined.traceparent.as_deref(), Some(HEADER), "{meta:?}");
            assert_eq!(joined.tracestate.as_deref(), Some("header=1"), "{meta:?}");
        }

        let mut untouched = info(None);
        untouched.adopt_trace(TraceContext {
            traceparent: Some("00-not-a-trace-01"),
            tracestate: Some("header=1"),
        });
        assert_eq!(untouched.traceparent, None);
        assert_eq!(untouched.tracestate, None);
    }

    #[test]
    fn a_trace_id_is_read_only_from_a_valid_traceparent() {
        let id = "4bf92f3577b34da6a3ce929d0e0e4736";
        assert_eq!(
            trace_id_of(&format!("00-{id}-00f067aa0ba902b7-01")),
            Some(id)
        );
        // A later version may add fields; version 00 may not.
        assert_eq!(
            trace_id_of(&format!("01-{id}-00f067aa0ba902b7-01-x")),
            Some(id)
        );
        for bad in [
            format!("00-{id}-00f067aa0ba902b7-01-x"),
            format!("ff-{id}-00f067aa0ba902b7-01"),
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01".to_owned(),
            format!("00-{id}-0000000000000000-01"),
            format!("00-{id}-00f067aa0ba902b7"),
            format!("00-{}-00f067aa0ba902b7-01", &id[1..]),
            "00-4bf92f3577b34da6a3ce929d0e0e473z-00f067aa0ba902b7-01".to_owned(),
            // W3C: lowercase hex only; `FF` is the invalid version too.
            format!("00-{}-00f067aa0ba902b7-01", id.to_uppercase()),
            format!("FF-{id}-00f067aa0ba902b7-01"),
            format!("00-{id}-00F067AA0BA902B7-01"),
        ] {
            assert_eq!(trace_id_of(&bad), None, "{bad}");
        }
    }
}
