//! The `MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name` and `Mcp-Param-*` headers must
//! mirror the body.

use std::borrow::Cow;

use axum::http::header::AsHeaderName;
use axum::http::{HeaderMap, HeaderName};
use wharf::{ParsedRequest, RequestBody, RpcError, Server};
use wharf_protocol::headers::{self, decode_value, param_matches};

static PROTOCOL_VERSION: HeaderName = HeaderName::from_static(headers::PROTOCOL_VERSION);
static METHOD: HeaderName = HeaderName::from_static(headers::METHOD);
static NAME: HeaderName = HeaderName::from_static(headers::NAME);

fn raw<K: AsHeaderName + std::fmt::Display + Copy>(
    headers: &HeaderMap,
    name: K,
) -> Result<Option<&[u8]>, RpcError> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(RpcError::header_mismatch(format!(
            "the {name} header appears more than once"
        )));
    }
    // Optional whitespace around a field value is not part of it (RFC 9110 §5.5).
    Ok(first.map(|v| v.as_bytes().trim_ascii()))
}

fn required<'a>(
    headers: &'a HeaderMap,
    name: &HeaderName,
    display: &str,
) -> Result<&'a [u8], RpcError> {
    raw(headers, name)?.ok_or_else(|| {
        RpcError::header_mismatch(format!("the required {display} header is missing"))
    })
}

fn decoded<'a>(value: &'a [u8], display: &str) -> Result<Cow<'a, str>, RpcError> {
    decode_value(value)
        .map_err(|e| RpcError::header_mismatch(format!("the {display} header value {e}")))
}

/// Whether the `MCP-Protocol-Version` header names a stateless revision (a legacy client
/// sends its session's version, or none).
pub(crate) fn is_modern(headers: &HeaderMap) -> bool {
    headers
        .get(&PROTOCOL_VERSION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| wharf_protocol::version::is_supported(v.trim()))
}

/// Checks every mirrored header of `req` against its body.
pub(crate) fn validate(
    headers: &HeaderMap,
    req: &ParsedRequest,
    server: &Server,
) -> Result<(), RpcError> {
    let version = required(headers, &PROTOCOL_VERSION, "MCP-Protocol-Version")?;
    if version != req.info.protocol_version.as_bytes() {
        return Err(RpcError::header_mismatch(format!(
            "MCP-Protocol-Version header value '{}' does not match body value '{}'",
            String::from_utf8_lossy(version),
            req.info.protocol_version
        )));
    }
    mirrored(headers, req, server, true)
}

/// Checks the mirrored headers a request of a legacy session carries: that era requires
/// none, but one that is sent must match the body (a gateway may route on it).
pub(crate) fn validate_present(
    headers: &HeaderMap,
    req: &ParsedRequest,
    server: &Server,
) -> Result<(), RpcError> {
    mirrored(headers, req, server, false)
}

/// `Mcp-Method`, `Mcp-Name` and `Mcp-Param-*` against the body; `strict`: each one the
/// request has a value for must be there.
fn mirrored(
    headers: &HeaderMap,
    req: &ParsedRequest,
    server: &Server,
    strict: bool,
) -> Result<(), RpcError> {
    let header = |name: &HeaderName, display: &str| {
        if strict {
            required(headers, name, display).map(Some)
        } else {
            raw(headers, name)
        }
    };
    if let Some(method) = header(&METHOD, "Mcp-Method")? {
        if method != req.body.method().as_bytes() {
            return Err(RpcError::header_mismatch(format!(
                "Mcp-Method header value '{}' does not match body value '{}'",
                String::from_utf8_lossy(method),
                req.body.method()
            )));
        }
    }
    if let Some(name) = req.body.name() {
        if let Some(value) = header(&NAME, "Mcp-Name")? {
            let value = decoded(value, "Mcp-Name")?;
            if value != name {
                return Err(RpcError::header_mismatch(format!(
                    "Mcp-Name header value '{value}' does not match body value '{name}'"
                )));
            }
        }
    }
    if let RequestBody::CallTool(call) = &req.body {
        let params = server.tool_header_params(&call.name);
        if params.is_empty() {
            return Ok(());
        }
        let empty = wharf_protocol::JsonObject::new();
        let args = call.arguments.as_ref().unwrap_or(&empty);
        for p in params {
            let display = format!("Mcp-Param-{}", p.name);
            let header = raw(headers, p.header.as_str())?;
            match (p.value_in(args), header) {
                (Some(_), None) if strict => {
                    return Err(RpcError::header_mismatch(format!(
                        "the {display} header is missing; it must mirror argument '{}'",
                        p.path.join(".")
                    )));
                }
                (Some(value), Some(h)) => {
                    let h = decoded(h, &display)?;
                    if !param_matches(p.kind, &h, value) {
                        return Err(RpcError::header_mismatch(format!(
                            "{display} header value '{h}' does not match body value {value}"
                        )));
                    }
                }
                // No value in the body: the header is not expected. A stray one is ignored.
                (None, _) | (Some(_), None) => {}
            }
        }
    }
    Ok(())
}
