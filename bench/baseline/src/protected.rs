//! `--protected`: the same handler behind the protections `wharf serve` puts on every
//! request, so that what Wharf's own code costs can be told apart from what the protections
//! cost. Each is the cheapest honest form of one of Wharf's, with Wharf's default limits:
//!
//! - hyper's header-read timeout (slowloris), which needs a timer on the connection, and its
//!   caps on header fields and head bytes;
//! - a cap on open connections (requests in flight are not capped by default, in Wharf
//!   either);
//! - the total size of the header fields, and the Host and Origin check (DNS rebinding);
//! - a declared Content-Length over the body limit refused before reading, then the body
//!   read under the limit and a timeout;
//! - the nesting depth of the body checked before it is parsed;
//! - the call's deadline;
//! - the arguments read as JSON and checked against the tool's input schema before they are
//!   read into the tool's type.
//!
//! It has none of Wharf's framework: no authentication or admission (Wharf's anonymous
//! principal and its scope check), no registry, no handler driver, no `_meta` kept for the
//! handler, no observability. Like Wharf, it takes the request's headers by move (the bare
//! baseline's `HeaderMap` extractor clones them).

use std::borrow::Cow;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use http_body_util::{BodyExt as _, Limited};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use serde::Deserialize as _;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt as _;

use crate::{EchoArgs, INVALID_REQUEST, TIMED_OUT, answer, error};

/// `wharf serve`'s defaults (its flags, `ConnectionLimits`, `HttpConfig`, `ServerConfig`).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
const MAX_CONNECTIONS: usize = 16_384;
const MAX_HEADERS: usize = 100;
const MAX_HEADER_BYTES: usize = 16 * 1024;
/// What hyper may buffer of a request head: the header bytes and a request line.
const MAX_HEAD_BYTES: usize = MAX_HEADER_BYTES + 8 * 1024;
const MAX_BODY_BYTES: usize = 1024 * 1024;
const MAX_JSON_DEPTH: usize = 64;
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
const CALL_DEADLINE: Duration = Duration::from_secs(300);

/// Echo's input schema, as `schemars` derives it for Wharf's `EchoArgs`.
const ECHO_SCHEMA: &str = r#"{
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "EchoArgs",
    "type": "object",
    "properties": {"text": {"description": "The text to send back.", "type": "string"}},
    "required": ["text"]
}"#;

/// What every request is checked against.
pub(crate) struct Protections {
    /// Hosts served, without port: the listen address's and the localhost names.
    hosts: Vec<String>,
    schema: jsonschema::Validator,
}

impl Protections {
    /// The protections for a server listening on `host`.
    pub(crate) fn new(host: &str) -> Self {
        let schema: Value = serde_json::from_str(ECHO_SCHEMA).expect("echo's schema is JSON");
        Protections {
            hosts: vec![
                host.to_owned(),
                "localhost".to_owned(),
                "127.0.0.1".to_owned(),
                "[::1]".to_owned(),
            ],
            schema: jsonschema::draft202012::new(&schema).expect("echo's schema compiles"),
        }
    }

    fn host_allowed(&self, authority: &str) -> bool {
        let host = match authority.rsplit_once(':') {
            Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
            _ => authority,
        };
        self.hosts.iter().any(|h| h.eq_ignore_ascii_case(host))
    }

    /// Refuses header fields too large in all, a Host this server does not serve, an Origin
    /// on another host, and a declared body over the limit.
    fn guard(&self, headers: &HeaderMap) -> Option<Response> {
        let size: usize = headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len())
            .sum();
        if size > MAX_HEADER_BYTES {
            let message = "Request header fields too large";
            return Some(error(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                None,
                INVALID_REQUEST,
                message,
            ));
        }
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
            let message = "The request body is over the limit";
            return Some(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                None,
                INVALID_REQUEST,
                message,
            ));
        }
        let host_ok = headers
            .get(header::HOST)
            .is_none_or(|h| h.to_str().is_ok_and(|h| self.host_allowed(h)));
        let origin_ok = headers.get(header::ORIGIN).is_none_or(|o| {
            o.to_str().is_ok_and(|o| {
                o.split_once("://")
                    .is_some_and(|(_, authority)| self.host_allowed(authority))
            })
        });
        (!host_ok || !origin_ok).then(|| {
            error(
                StatusCode::FORBIDDEN,
                None,
                INVALID_REQUEST,
                "Forbidden: Host or Origin is not served here",
            )
        })
    }
}

/// `POST /mcp` with the protections.
pub(crate) async fn mcp(
    State(protections): State<Arc<Protections>>,
    request: axum::extract::Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let headers = parts.headers;
    if let Some(refused) = protections.guard(&headers) {
        return refused;
    }
    let reading = Limited::new(body, MAX_BODY_BYTES).collect();
    let body = match tokio::time::timeout(BODY_READ_TIMEOUT, reading).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(_)) => {
            let message = "The request body is too large or could not be read";
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                None,
                INVALID_REQUEST,
                message,
            );
        }
        Err(_) => {
            let message = "The request body was not read in time";
            return error(StatusCode::REQUEST_TIMEOUT, None, INVALID_REQUEST, message);
        }
    };
    if too_deep(&body) {
        let message = "The body nests deeper than the limit";
        return error(StatusCode::BAD_REQUEST, None, INVALID_REQUEST, message);
    }
    let schema = &protections.schema;
    let call = async {
        answer::<Value>(&headers, &body, |args| {
            if !schema.is_valid(&args) {
                let first = schema.iter_errors(&args).next();
                return Err(first.map_or_else(|| "invalid".to_owned(), |e| e.to_string()));
            }
            let args = EchoArgs::deserialize(args).map_err(|e| e.to_string())?;
            Ok(Cow::Owned(args.text.into_owned()))
        })
    };
    match tokio::time::timeout(CALL_DEADLINE, call).await {
        Ok(response) => response,
        Err(_) => error(StatusCode::GATEWAY_TIMEOUT, None, TIMED_OUT, "Timed out"),
    }
}

/// Whether `json` nests arrays and objects deeper than [`MAX_JSON_DEPTH`]: openers counted
/// a vector at a time first, the byte walk only when there are that many.
fn too_deep(json: &[u8]) -> bool {
    let openers = memchr::memchr2_iter(b'{', b'[', json)
        .take(MAX_JSON_DEPTH + 1)
        .count();
    if openers <= MAX_JSON_DEPTH {
        return false;
    }
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in json {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > MAX_JSON_DEPTH {
                    return true;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// Serves `app` on `listener` as `wharf serve` does: hyper's HTTP/1 with a timer for the
/// header-read timeout and its head limits, and a cap on open connections. (Wharf also
/// watches each connection for a graceful shutdown; nothing here shuts down.)
pub(crate) async fn serve(listener: TcpListener, app: Router) -> io::Result<()> {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_headers(MAX_HEADERS)
        .max_header_size(MAX_HEAD_BYTES);
    let http = Arc::new(http);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (io, _peer) = listener.accept().await?;
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            drop(io);
            continue;
        };
        let service = TowerToHyperService::new(
            app.clone()
                .map_request(|req: axum::http::Request<hyper::body::Incoming>| req.map(Body::new)),
        );
        let http = Arc::clone(&http);
        tokio::spawn(async move {
            // A connection that ends in error ends only itself.
            let _ = http.serve_connection(TokioIo::new(io), service).await;
            drop(slot);
        });
    }
}
