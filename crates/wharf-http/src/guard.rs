//! Checks that run before the body is read: Host/Origin, header size, content type.

use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use wharf::{ErrorKind, RpcError};

use crate::config::HttpConfig;
use crate::errors::error_with_status;
use crate::request_headers::RequestHeaders;

/// Refuses what the transport must not even read.
pub(crate) fn check_request(
    headers: &RequestHeaders<'_>,
    config: &HttpConfig,
) -> Result<(), Box<Response>> {
    check(headers, config)?;
    check_body(headers, config)
}

/// Refuses headers too large, and a Host or Origin this server does not serve (every
/// method: a session's GET and DELETE too).
pub(crate) fn check_headers(headers: &HeaderMap, config: &HttpConfig) -> Result<(), Box<Response>> {
    check(&RequestHeaders::read(headers), config)
}

fn check(headers: &RequestHeaders<'_>, config: &HttpConfig) -> Result<(), Box<Response>> {
    let size = headers.size;
    if size > config.max_header_bytes {
        return refuse(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            format!(
                "Request headers total {size} bytes; the limit is {}",
                config.max_header_bytes
            ),
        );
    }
    if let Some(host) = headers.host.first() {
        let allowed = host.to_str().is_ok_and(|h| config.hosts.host_allowed(h));
        if !allowed {
            return refuse(
                StatusCode::FORBIDDEN,
                "Forbidden: the Host header names a host this server does not serve".into(),
            );
        }
    }
    if let Some(origin) = headers.origin.first() {
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
fn check_body(headers: &RequestHeaders<'_>, config: &HttpConfig) -> Result<(), Box<Response>> {
    let json = headers.content_type.first().is_some_and(|ct| {
        let ct = ct.as_bytes();
        // What nearly every client sends, compared whole before anything is split off.
        ct == b"application/json" || {
            let essence = ct.split(|&b| b == b';').next().unwrap_or_default();
            essence
                .trim_ascii()
                .eq_ignore_ascii_case(b"application/json")
        }
    });
    if !json {
        return refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type must be application/json".into(),
        );
    }
    if let Some(len) = headers
        .content_length
        .text()
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

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, HeaderValue, StatusCode, header};

    use super::*;

    fn content_type(value: &'static str) -> Result<(), StatusCode> {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(value));
        check_body(&RequestHeaders::read(&headers), &HttpConfig::default()).map_err(|r| r.status())
    }

    #[test]
    fn json_is_recognised_with_parameters_case_and_whitespace() {
        for ok in [
            "application/json",
            "Application/JSON ; charset=utf-8",
            "application/json\t",
            " application/json;charset=UTF-8",
        ] {
            assert_eq!(content_type(ok), Ok(()), "{ok:?}");
        }
    }

    #[test]
    fn anything_else_is_an_unsupported_media_type() {
        for refused in ["application/jsonx", "text/json", "application/json-seq", ""] {
            assert_eq!(
                content_type(refused),
                Err(StatusCode::UNSUPPORTED_MEDIA_TYPE),
                "{refused:?}"
            );
        }
        let none = check_body(
            &RequestHeaders::read(&HeaderMap::new()),
            &HttpConfig::default(),
        );
        assert_eq!(
            none.map_err(|r| r.status()),
            Err(StatusCode::UNSUPPORTED_MEDIA_TYPE)
        );
    }
}
