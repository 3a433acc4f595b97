//! The `MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name` and `Mcp-Param-*` headers must
//! mirror the body.

use std::borrow::Cow;

use axum::http::HeaderMap;
use wharf::{ParsedRequest, RequestBody, RpcError, Server};
use wharf_protocol::headers::{
    self, decode_value, is_of_type, param_matches, plain_value, render_param,
};
use wharf_protocol::methods;

use crate::request_headers::{Field, RequestHeaders};

fn required<'a>(field: &Field<'a>, name: &str, display: &str) -> Result<&'a [u8], RpcError> {
    field.single(name)?.ok_or_else(|| {
        RpcError::header_mismatch(format!("the required {display} header is missing"))
    })
}

/// A header read ahead, if it was sent (once); `strict`: it must have been.
fn read_ahead<'a>(
    field: &Field<'a>,
    name: &str,
    display: &str,
    strict: bool,
) -> Result<Option<&'a [u8]>, RpcError> {
    if strict {
        required(field, name, display).map(Some)
    } else {
        field.single(name)
    }
}

/// A header that may appear once (an `Mcp-Param-*` a tool declares, which is not among
/// those read ahead); a repeated one is refused.
fn raw<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a [u8]>, RpcError> {
    let mut field = Field::default();
    for value in headers.get_all(name) {
        field.see(value);
    }
    field.single(name)
}

fn decoded<'a>(value: &'a [u8], display: &str) -> Result<Cow<'a, str>, RpcError> {
    decode_value(value)
        .map_err(|e| RpcError::header_mismatch(format!("the {display} header value {e}")))
}

/// Whether the `MCP-Protocol-Version` header names a revision after the legacy ones (a
/// legacy client sends its session's version, or none): a supported stateless revision, or
/// a later date this server does not know, which the stateless path refuses with the
/// versions it supports rather than as an unknown session. Anything else (empty, not a
/// date) stays with the session, which names the mismatch.
pub(crate) fn is_modern(headers: &RequestHeaders<'_>) -> bool {
    headers.protocol_version.text().is_some_and(|v| {
        let v = v.trim();
        wharf_protocol::version::is_supported(v) || is_later_revision(v)
    })
}

/// A revision name (`YYYY-MM-DD`) later than every legacy revision.
fn is_later_revision(v: &str) -> bool {
    let is_date = v.len() == 10
        && v.bytes().enumerate().all(|(i, b)| match i {
            4 | 7 => b == b'-',
            _ => b.is_ascii_digit(),
        });
    // Dates of one shape compare as text.
    is_date
        && wharf_protocol::version::LEGACY
            .iter()
            .all(|legacy| v > *legacy)
}

/// The headers a request whose params did not read must still mirror, as far as its raw
/// params let them be compared: `MCP-Protocol-Version` against the version its raw `_meta`
/// names as a string, and refused with the versions this server supports if it is not one
/// of them; `Mcp-Method`; `Mcp-Name` against a `name` or `uri` that is a
/// string; `Mcp-Param-*` against the tool's arguments when they are an object. Checked
/// before the method's own refusal, so that a request whose headers disagree with its body
/// is refused as that (HTTP 400) whatever is wrong in its params.
pub(crate) fn validate_unread(
    headers: &RequestHeaders<'_>,
    method: &str,
    params: Option<&serde_json::value::RawValue>,
    server: &Server,
) -> Result<(), RpcError> {
    let sent = protocol_version(headers)?;
    // The refused path only: reading the params as a tree costs nothing that matters here.
    let params = params.and_then(|p| serde_json::from_str::<serde_json::Value>(p.get()).ok());
    let params = params.as_ref();
    // A version this server does not speak is what the client must hear of first, before
    // the headers this revision asks for (a later one may ask for others).
    version_named(sent, params)?;
    spoken(sent, server)?;
    method_mirrored(headers, method, true)?;
    let target = match method {
        methods::TOOLS_CALL | methods::PROMPTS_GET => "name",
        methods::RESOURCES_READ => "uri",
        _ => return Ok(()),
    };
    let Some(params) = params else {
        return Ok(());
    };
    if let Some(target) = params[target].as_str() {
        name_mirrored(headers, target, true)?;
        if method == methods::TOOLS_CALL {
            if let Some(args) = params["arguments"].as_object() {
                params_mirrored(headers, server.tool_header_params(target), args, true)?;
            }
        }
    }
    Ok(())
}

/// For a method this server does not have, a version it does not speak named in
/// `MCP-Protocol-Version` is what the client hears of first (400, -32022): a client of a
/// later revision renegotiates instead of taking the method to be missing (streamable HTTP,
/// "Protocol Version Header"). Otherwise the method's own 404 stands.
/// A body whose `_meta` names another version is refused as that mismatch (-32020) first.
pub(crate) fn version_before_method(
    headers: &RequestHeaders<'_>,
    params: Option<&serde_json::value::RawValue>,
    server: &Server,
) -> Result<(), RpcError> {
    let Ok(Some(sent)) = headers.protocol_version.single(headers::PROTOCOL_VERSION) else {
        return Ok(());
    };
    // An encoded version is refused as on every other method; one that cannot be read
    // leaves the answer to the method.
    let sent = match plain_value(sent) {
        Ok(sent) => sent,
        Err(e @ headers::HeaderValueError::EncodedNotPermitted) => {
            return Err(RpcError::header_mismatch(format!(
                "the MCP-Protocol-Version header value {e}"
            )));
        }
        Err(_) => return Ok(()),
    };
    let params = params.and_then(|p| serde_json::from_str::<serde_json::Value>(p.get()).ok());
    version_named(sent, params.as_ref())?;
    spoken(sent, server)
}

/// The version the raw params' `_meta` names as a string, if any; refused as a mismatch
/// when the header's (`sent`) is another.
fn version_named<'p>(
    sent: &str,
    params: Option<&'p serde_json::Value>,
) -> Result<Option<&'p str>, RpcError> {
    let named = params.and_then(|p| p["_meta"][wharf_protocol::meta::PROTOCOL_VERSION].as_str());
    match named {
        Some(named) if named != sent => Err(RpcError::header_mismatch(format!(
            "MCP-Protocol-Version header value '{sent}' does not match body value '{named}'",
        ))),
        _ => Ok(named),
    }
}

/// Refuses a version this server does not speak statelessly, listing those it does.
fn spoken(version: &str, server: &Server) -> Result<(), RpcError> {
    if wharf_protocol::version::is_supported(version) {
        Ok(())
    } else {
        Err(RpcError::unsupported_version(
            version,
            server.supported_versions(),
        ))
    }
}

/// Checks every mirrored header of `req` against its body.
pub(crate) fn validate(
    headers: &RequestHeaders<'_>,
    req: &ParsedRequest,
    server: &Server,
) -> Result<(), RpcError> {
    let version = protocol_version(headers)?;
    if version != req.info.protocol_version {
        return Err(RpcError::header_mismatch(format!(
            "MCP-Protocol-Version header value '{version}' does not match body value '{}'",
            req.info.protocol_version
        )));
    }
    // A version this server does not speak is refused as that, listing the ones it does,
    // before any header it defines is asked for: a client of a later revision renegotiates
    // on -32022, and the headers it sends may be that revision's.
    spoken(version, server)?;
    mirrored(headers, req, server, true)
}

/// The `MCP-Protocol-Version` header, required, as sent (never Base64-encoded).
fn protocol_version<'a>(headers: &RequestHeaders<'a>) -> Result<&'a str, RpcError> {
    let sent = required(
        &headers.protocol_version,
        headers::PROTOCOL_VERSION,
        "MCP-Protocol-Version",
    )?;
    plain(sent, "MCP-Protocol-Version")
}

/// A header value that must be sent as it is (see [`plain_value`]).
fn plain<'a>(value: &'a [u8], display: &str) -> Result<&'a str, RpcError> {
    plain_value(value)
        .map_err(|e| RpcError::header_mismatch(format!("the {display} header value {e}")))
}

/// Checks the mirrored headers a request of a legacy session carries: that era requires
/// none, but one that is sent must match the body (a gateway may route on it).
pub(crate) fn validate_present(
    headers: &RequestHeaders<'_>,
    req: &ParsedRequest,
    server: &Server,
) -> Result<(), RpcError> {
    mirrored(headers, req, server, false)
}

/// `Mcp-Method` against the body's `method`; `strict`: it must be there. Checked before
/// the params are read, too, so that a request whose headers disagree with its body is
/// refused as that (HTTP 400) whatever is wrong in its params.
pub(crate) fn method_mirrored(
    headers: &RequestHeaders<'_>,
    method: &str,
    strict: bool,
) -> Result<(), RpcError> {
    let Some(sent) = read_ahead(&headers.method, headers::METHOD, "Mcp-Method", strict)? else {
        return Ok(());
    };
    if sent == method.as_bytes() {
        return Ok(());
    }
    let sent = plain(sent, "Mcp-Method")?;
    Err(RpcError::header_mismatch(format!(
        "Mcp-Method header value '{sent}' does not match body value '{method}'",
    )))
}

/// `Mcp-Method`, `Mcp-Name` and `Mcp-Param-*` against the body; `strict`: each one the
/// request has a value for must be there.
fn mirrored(
    headers: &RequestHeaders<'_>,
    req: &ParsedRequest,
    server: &Server,
    strict: bool,
) -> Result<(), RpcError> {
    method_mirrored(headers, req.body.method(), strict)?;
    if let Some(name) = req.body.name() {
        name_mirrored(headers, name, strict)?;
    }
    if let RequestBody::CallTool(call) = &req.body {
        let params = server.tool_header_params(&call.name);
        if params.is_empty() {
            return Ok(());
        }
        let empty = wharf_protocol::JsonObject::new();
        let args = call.arguments.as_ref().unwrap_or(&empty);
        params_mirrored(headers, params, args, strict)?;
    }
    Ok(())
}

/// `Mcp-Name` against the body's `name` (or `uri`); `strict`: it must be there.
fn name_mirrored(headers: &RequestHeaders<'_>, name: &str, strict: bool) -> Result<(), RpcError> {
    if let Some(value) = read_ahead(&headers.name, headers::NAME, "Mcp-Name", strict)? {
        let value = decoded(value, "Mcp-Name")?;
        if value != name {
            return Err(RpcError::header_mismatch(format!(
                "Mcp-Name header value '{value}' does not match body value '{name}'"
            )));
        }
    }
    Ok(())
}

/// Each `Mcp-Param-*` a tool declares against its argument in `args`; `strict`: one whose
/// argument has a value must be there.
fn params_mirrored(
    headers: &RequestHeaders<'_>,
    params: &[wharf::HeaderParam],
    args: &wharf_protocol::JsonObject,
    strict: bool,
) -> Result<(), RpcError> {
    for p in params {
        let display = format!("Mcp-Param-{}", p.name);
        let header = raw(headers.map, p.header.as_str())?;
        match (p.value_in(args), header) {
            (Some(_), None) if strict => {
                return Err(RpcError::header_mismatch(format!(
                    "the {display} header is missing; it must mirror argument '{}'",
                    p.path.join(".")
                )));
            }
            (Some(value), Some(h)) => {
                let h = decoded(h, &display)?;
                let mirrors = if is_of_type(p.kind, value) {
                    param_matches(p.kind, &h, value)
                } else {
                    // An argument of another type than declared is the argument check's to
                    // refuse (a tool execution error naming it). A header that mirrors it as it is sent
                    // is no mismatch; one that says something else still is.
                    render_param(value).is_none_or(|v| v == h)
                };
                if !mirrors {
                    return Err(RpcError::header_mismatch(format!(
                        "{display} header value '{h}' does not match body value {value}"
                    )));
                }
            }
            // No value in the body: the header is not expected, and a stray one is
            // ignored, unless it holds what no header value may hold.
            (None, Some(h)) => {
                decoded(h, &display)?;
            }
            (None, None) | (Some(_), None) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::is_later_revision;

    #[test]
    fn only_a_later_date_counts_as_a_later_revision() {
        assert!(is_later_revision("2027-01-01"));
        assert!(is_later_revision("2026-07-28"));
        for v in [
            "2025-11-25",
            "2024-11-05",
            "",
            "garbage",
            "2027-1-01",
            "2027-01-0x",
        ] {
            assert!(!is_later_revision(v), "{v:?}");
        }
    }
}
