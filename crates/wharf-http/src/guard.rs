//! Checks that run before the body is read: Host/Origin, header size, content type.

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use wharf::{ErrorKind, RpcError};

use crate::config::HttpConfig;
use crate::errors::error_with_status;

/// Refuses what the transport must not even read.
pub(crate) fn check_request(headers: &HeaderMap, config: &HttpConfig) -> Result<(), Box<Response>> {
    check_headers(headers, config)?;
    check_body(headers, config)
}

/// Refuses headers too large, and a Host or Origin this server does not serve (every
/// method: a session's GET and DELETE too).
pub(crate) fn check_headers(headers: &HeaderMap, config: &HttpConfig) -> Result<(), Box<Response>> {
    let size: usize = headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum();
    if size > config.max_header_bytes {
        return refuse(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            format!(
                "Request headers total {size} bytes; the limit is {}",
                config.max_header_bytes
            ),
        );
    }
    if let Some(host) = headers.get(header::HOST) {
        let allowed = host.to_str().is_ok_and(|h| config.hosts.host_allowed(h));
        if !allowed {
            return refuse(
                StatusCode::FORBIDDEN,
                "Forbidden: the Host header names a host this server does not serve".into(),
            );
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let allowed = origin
            .to_str()
            .is_ok_and(|o| config.hosts.origin_allowed(o));
        if !allowed {
            return refuse(
                StatusCode::FORBIDDEN,
                "Forbidden: the Origin is not allowed".into(),
            );
        }
    }
    Ok(())
}

fn refuse(status: StatusCode, message: String) -> Result<(), Box<Response>> {
    Err(Box::new(error_with_status(
        status,
        None,
        &RpcError::new(ErrorKind::InvalidRequest, message),
    )))
}

/// Refuses a body that is not JSON, or announces more bytes than the limit.
fn check_body(headers: &HeaderMap, config: &HttpConfig) -> Result<(), Box<Response>> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            let essence = ct.split(';').next().unwrap_or("").trim();
            essence.eq_ignore_ascii_case("application/json")
        });
    if !json {
        return refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type must be application/json".into(),
        );
    }
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        if len > config.max_body_bytes as u64 {
            return refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "The body is {len} bytes; the limit is {}",
                    config.max_body_bytes
                ),
            );
        }
    }
    Ok(())
}
