//! The physical limit for an MCP tool call over Streamable HTTP.
//!
//! A bare axum handler for `POST /mcp` that does the least work a correct 2026-07-28 server
//! must do for `tools/call` of an `echo` tool: parse the JSON-RPC body with serde into typed,
//! borrowing structs, check that `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` mirror the
//! body, and write the JSON-RPC result straight into the response buffer. No registry, no
//! schema validation, no `_meta.serverInfo`: Wharf's numbers are compared against this one
//! (see `bench/run.sh`).
//!
//! With `--protected`, the same handler runs behind the protections `wharf serve` pays for on
//! every request (see `protected`), to tell Wharf's own cost from theirs.
//!
//! Usage: `wharf-bench-baseline [--listen ADDR] [--protected]` (default `127.0.0.1:8090`).

mod protected;

use std::borrow::Cow;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::sync::Arc;

use axum::Router;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

const PROTOCOL_VERSION: &str = "2026-07-28";

const PARSE_ERROR: i32 = -32700;
const INVALID_REQUEST: i32 = -32600;
const METHOD_NOT_FOUND: i32 = -32601;
const INVALID_PARAMS: i32 = -32602;
const HEADER_MISMATCH: i32 = -32020;
const UNSUPPORTED_PROTOCOL_VERSION: i32 = -32022;
/// Wharf's code for a call stopped at its deadline.
const TIMED_OUT: i32 = -31002;

/// The envelope of a request. Strings borrow from the body unless they hold escapes.
#[derive(Deserialize)]
struct Request<'a> {
    #[serde(borrow)]
    jsonrpc: Cow<'a, str>,
    /// Kept raw: echoed byte for byte in the response.
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    method: Cow<'a, str>,
    /// Kept raw until the method is known, then parsed straight into its type.
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
}

/// `A` is what the arguments are read into: echo's own borrowing struct on the bare path,
/// a JSON value to check against the schema first with `--protected`.
#[derive(Deserialize)]
struct CallToolParams<'a, A> {
    #[serde(rename = "_meta", borrow)]
    meta: RequestMeta<'a>,
    #[serde(borrow)]
    name: Cow<'a, str>,
    arguments: A,
}

#[derive(Deserialize)]
struct RequestMeta<'a> {
    #[serde(rename = "io.modelcontextprotocol/protocolVersion", borrow)]
    protocol_version: Cow<'a, str>,
    /// Required by the revision; its content does not matter to `echo`.
    #[serde(rename = "io.modelcontextprotocol/clientCapabilities")]
    _client_capabilities: IgnoredAny,
}

#[derive(Deserialize)]
struct EchoArgs<'a> {
    #[serde(borrow)]
    text: Cow<'a, str>,
}

#[derive(Serialize)]
struct Success<'a, R> {
    jsonrpc: &'static str,
    id: &'a RawValue,
    result: R,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CallToolResult<'a> {
    result_type: &'static str,
    content: [TextContent<'a>; 1],
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    is_error: bool,
}

#[derive(Serialize)]
struct TextContent<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
}

#[derive(Serialize)]
struct Failure<'a> {
    jsonrpc: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a RawValue>,
    error: ErrorObject<'a>,
}

#[derive(Serialize)]
struct ErrorObject<'a> {
    code: i32,
    message: &'a str,
}

fn json(status: StatusCode, body: Vec<u8>) -> Response {
    let mut res = Response::new(body.into());
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

fn error(status: StatusCode, id: Option<&RawValue>, code: i32, message: &str) -> Response {
    let mut buf = Vec::with_capacity(128);
    let failure = Failure {
        jsonrpc: "2.0",
        id,
        error: ErrorObject { code, message },
    };
    serde_json::to_writer(&mut buf, &failure).expect("serializing to a Vec cannot fail");
    json(status, buf)
}

/// A refusal, boxed: the refusals are the rare path.
fn refuse(status: StatusCode, id: Option<&RawValue>, code: i32, message: &str) -> Box<Response> {
    Box::new(error(status, id, code, message))
}

/// The value of a header that must appear, without surrounding whitespace (RFC 9110 §5.5).
fn header_bytes<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h [u8]> {
    headers.get(name).map(|v| v.as_bytes().trim_ascii())
}

fn mirrors(headers: &HeaderMap, name: &str, body: &str) -> bool {
    header_bytes(headers, name) == Some(body.as_bytes())
}

/// JSON-RPC ids of this revision are strings or integers; `raw` is already valid JSON.
fn is_string_or_integer(raw: &RawValue) -> bool {
    let text = raw.get().as_bytes();
    match text[0] {
        b'"' => true,
        b'-' | b'0'..=b'9' => !text.iter().any(|b| matches!(b, b'.' | b'e' | b'E')),
        _ => false,
    }
}

async fn mcp(headers: HeaderMap, body: Bytes) -> Response {
    answer::<EchoArgs<'_>>(&headers, &body, |args| Ok(args.text))
}

/// Answers one request whose arguments are read as `A` and turned into echo's text by
/// `text` (which may refuse them with a message, answered as a tool execution error).
fn answer<'b, A: Deserialize<'b>>(
    headers: &HeaderMap,
    body: &'b [u8],
    text: impl FnOnce(A) -> Result<Cow<'b, str>, String>,
) -> Response {
    match respond(headers, body, text) {
        Ok(response) => response,
        Err(refused) => *refused,
    }
}

fn respond<'b, A: Deserialize<'b>>(
    headers: &HeaderMap,
    body: &'b [u8],
    text: impl FnOnce(A) -> Result<Cow<'b, str>, String>,
) -> Result<Response, Box<Response>> {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            ct.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .eq_ignore_ascii_case("application/json")
        });
    if !is_json {
        return Err(refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            None,
            INVALID_REQUEST,
            "Content-Type must be application/json",
        ));
    }

    let req: Request<'_> = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) if e.is_syntax() || e.is_eof() => {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                None,
                PARSE_ERROR,
                &format!("Parse error: {e}"),
            ));
        }
        Err(e) => {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                None,
                INVALID_REQUEST,
                &format!("Invalid request: {e}"),
            ));
        }
    };
    let id = match req.id {
        Some(id) if is_string_or_integer(id) => id,
        Some(_) => {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                None,
                INVALID_REQUEST,
                "Invalid request: id must be a string or an integer",
            ));
        }
        None => return Ok(StatusCode::ACCEPTED.into_response()),
    };
    if req.jsonrpc != "2.0" {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            Some(id),
            INVALID_REQUEST,
            "Invalid request: jsonrpc must be \"2.0\"",
        ));
    }
    if req.method != "tools/call" {
        return Err(refuse(
            StatusCode::NOT_FOUND,
            Some(id),
            METHOD_NOT_FOUND,
            &format!("Method not found: {}", req.method),
        ));
    }
    let params: CallToolParams<'_, A> = match req.params.map(|p| serde_json::from_str(p.get())) {
        Some(Ok(p)) => p,
        Some(Err(e)) => {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                Some(id),
                INVALID_PARAMS,
                &format!("Invalid params: {e}"),
            ));
        }
        None => {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                Some(id),
                INVALID_PARAMS,
                "Invalid params: params are required",
            ));
        }
    };

    if !mirrors(
        headers,
        "mcp-protocol-version",
        &params.meta.protocol_version,
    ) {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            Some(id),
            HEADER_MISMATCH,
            "MCP-Protocol-Version header does not match _meta[\"io.modelcontextprotocol/protocolVersion\"]",
        ));
    }
    if params.meta.protocol_version != PROTOCOL_VERSION {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            Some(id),
            UNSUPPORTED_PROTOCOL_VERSION,
            "Unsupported protocol version",
        ));
    }
    if !mirrors(headers, "mcp-method", &req.method) {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            Some(id),
            HEADER_MISMATCH,
            "Mcp-Method header does not match the method",
        ));
    }
    if !mirrors(headers, "mcp-name", &params.name) {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            Some(id),
            HEADER_MISMATCH,
            "Mcp-Name header does not match params.name",
        ));
    }
    if params.name != "echo" {
        return Err(refuse(
            StatusCode::OK,
            Some(id),
            INVALID_PARAMS,
            &format!("Unknown tool: {}", params.name),
        ));
    }
    // Arguments the schema refuses are a tool execution error the model reads.
    let (text, is_error) = match text(params.arguments) {
        Ok(text) => (text, false),
        Err(message) => (
            format!("Invalid arguments for tool echo: {message}").into(),
            true,
        ),
    };

    let result = CallToolResult {
        result_type: "complete",
        content: [TextContent {
            kind: "text",
            text: &text,
        }],
        is_error,
    };
    let mut buf = Vec::with_capacity(96 + text.len());
    serde_json::to_writer(
        &mut buf,
        &Success {
            jsonrpc: "2.0",
            id,
            result,
        },
    )
    .expect("serializing to a Vec cannot fail");
    Ok(json(StatusCode::OK, buf))
}

/// The command line: where to listen, and whether with the protections.
fn parse_args() -> Result<(SocketAddr, bool), String> {
    let mut listen = "127.0.0.1:8090".to_owned();
    let mut protect = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--listen" => listen = args.next().ok_or("--listen needs an address")?,
            "--protected" => protect = true,
            "-h" | "--help" => {
                println!(
                    "usage: wharf-bench-baseline [--listen ADDR] [--protected]   (default 127.0.0.1:8090)"
                );
                std::process::exit(0);
            }
            other => match other.strip_prefix("--listen=") {
                Some(addr) => listen = addr.to_owned(),
                None => return Err(format!("unknown argument {other:?}")),
            },
        }
    }
    let addr = listen
        .parse()
        .map_err(|e| format!("bad --listen address {listen:?}: {e}"))?;
    Ok((addr, protect))
}

/// The physical limit for an idle listen stream (bench/replicas.sh): an SSE response that
/// sends one event and then only keep-alive comments, served by the same axum and hyper.
async fn listen() -> axum::response::Response {
    use axum::response::IntoResponse as _;
    use axum::response::sse::{Event, KeepAlive, Sse};
    use futures_util::StreamExt as _;
    let ack = futures_util::stream::once(async {
        Ok::<_, std::convert::Infallible>(Event::default().data(
            r#"{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":{}}"#,
        ))
    });
    let idle = ack.chain(futures_util::stream::pending());
    Sse::new(idle)
        .keep_alive(
            KeepAlive::new()
                .interval(std::time::Duration::from_secs(15))
                .text(""),
        )
        .into_response()
}

fn main() {
    let (addr, protect) = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("wharf-bench-baseline: {e}");
            std::process::exit(2);
        }
    };
    // One worker per CPU this process may run on (affinity mask, cgroup quota), and a
    // single-threaded runtime when that is one: the same rule as `wharf serve`.
    let workers = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
    let runtime = if workers == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
    }
    .expect("building the tokio runtime");
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("wharf-bench-baseline: cannot listen on {addr}: {e}");
                std::process::exit(1);
            }
        };
        let mode = if protect { " (protected)" } else { "" };
        eprintln!(
            "wharf-bench-baseline: listening on http://{addr}/mcp with {workers} worker(s){mode}"
        );
        let served = if protect {
            let protections = Arc::new(protected::Protections::new(&addr.ip().to_string()));
            let app = Router::new()
                .route("/mcp", post(protected::mcp))
                .with_state(protections);
            protected::serve(listener, app).await
        } else {
            // Plain `axum::serve` with default options, as a bare axum server runs. `wharf
            // serve` has its own accept loop (`wharf_http::serve`); BENCHMARKS.md measures
            // what that difference does to each side.
            let app = Router::new()
                .route("/mcp", post(mcp))
                .route("/listen", post(listen));
            axum::serve(listener, app).await
        };
        if let Err(e) = served {
            eprintln!("wharf-bench-baseline: {e}");
            std::process::exit(1);
        }
    });
}
