//! Streamable HTTP.

use std::pin::Pin;

use futures_util::{Stream, StreamExt};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};
use wharf_protocol::headers;

use crate::{ClientError, RequestMetaBuilder, SseParser, retry};

/// A client of one MCP endpoint.
#[derive(Clone)]
pub struct HttpClient {
    pub(crate) http: reqwest::Client,
    url: String,
    /// What every request's `_meta` carries.
    pub meta: RequestMetaBuilder,
    bearer: Option<String>,
    next_id: std::sync::Arc<std::sync::atomic::AtomicI64>,
}

impl std::fmt::Debug for HttpClient {
    // The bearer token is a credential: its presence shows, never its value.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("url", &self.url)
            .field("meta", &self.meta)
            .field("bearer", &self.bearer.as_ref().map(|_| "<set>"))
            .finish_non_exhaustive()
    }
}

/// Everything an HTTP exchange returned.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The HTTP status.
    pub status: u16,
    /// The response headers.
    pub headers: HeaderMap,
    /// The raw body.
    pub body: String,
    /// Every JSON-RPC message in the body, in order (one for JSON, several for SSE).
    pub messages: Vec<Value>,
}

impl Reply {
    /// Whether the body was an SSE stream.
    pub fn is_sse(&self) -> bool {
        self.content_type().starts_with("text/event-stream")
    }

    /// The `Content-Type`.
    pub fn content_type(&self) -> &str {
        self.headers
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// The final response (the last message with an `id` and a result or error).
    pub fn response(&self) -> Option<&Value> {
        self.messages
            .iter()
            .rev()
            .find(|m| m.get("result").is_some() || m.get("error").is_some())
    }

    /// The `result` of the response.
    pub fn result(&self) -> Option<&Value> {
        self.response().and_then(|r| r.get("result"))
    }

    /// The `error` of the response.
    pub fn error(&self) -> Option<&Value> {
        self.response().and_then(|r| r.get("error"))
    }

    /// The error code, if the response is an error.
    pub fn error_code(&self) -> Option<i64> {
        self.error().and_then(|e| e["code"].as_i64())
    }

    /// Notifications sent before the response.
    pub fn notifications(&self) -> impl Iterator<Item = &Value> {
        self.messages
            .iter()
            .filter(|m| m.get("method").is_some() && m.get("id").is_none())
    }
}

impl HttpClient {
    /// A client of the endpoint at `url`.
    pub fn new(url: impl Into<String>) -> Self {
        HttpClient {
            http: reqwest::Client::new(),
            url: url.into(),
            meta: RequestMetaBuilder::default(),
            bearer: None,
            next_id: std::sync::Arc::new(std::sync::atomic::AtomicI64::new(1)),
        }
    }

    /// Whether requests carry a bearer token.
    pub fn has_bearer(&self) -> bool {
        self.bearer.is_some()
    }

    /// Sends `Authorization: Bearer token` on every request. Whitespace around the token (a
    /// token file's newline) is left out: no token holds any.
    pub fn with_bearer(mut self, token: impl Into<String>) -> Self {
        let token: String = token.into();
        self.bearer = Some(token.trim().to_owned());
        self
    }

    /// Sends requests through `http` (timeouts, proxies and roots of its own).
    pub fn with_http(mut self, http: reqwest::Client) -> Self {
        self.http = http;
        self
    }

    /// The `Authorization` header this client sends, if any.
    pub fn authorization(&self) -> Option<HeaderValue> {
        let mut h = HeaderMap::new();
        self.authorize(&mut h);
        h.remove(reqwest::header::AUTHORIZATION)
    }

    /// The endpoint URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A fresh request id.
    pub fn next_id(&self) -> i64 {
        self.next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// The standard headers for a request of `method` with `params` (already holding `_meta`).
    pub fn headers_for(&self, method: &str, params: &Value) -> HeaderMap {
        let mut h = self.base_headers();
        let version = params["_meta"][wharf_protocol::meta::PROTOCOL_VERSION]
            .as_str()
            .unwrap_or(&self.meta.protocol_version);
        if let Ok(v) = HeaderValue::from_str(version) {
            h.insert(HeaderName::from_static(headers::PROTOCOL_VERSION), v);
        }
        if let Ok(v) = HeaderValue::from_str(method) {
            h.insert(HeaderName::from_static(headers::METHOD), v);
        }
        let name = match method {
            "tools/call" | "prompts/get" => params["name"].as_str(),
            "resources/read" => params["uri"].as_str(),
            _ => None,
        };
        if let Some(v) = name.and_then(|n| HeaderValue::from_str(&headers::encode_value(n)).ok()) {
            h.insert(HeaderName::from_static(headers::NAME), v);
        }
        h
    }

    /// Sends `method` with `params` (its `_meta` filled in) and reads the whole reply.
    pub async fn request(&self, method: &str, params: Value) -> Result<Reply, ClientError> {
        let params = self.meta.apply(params);
        let body =
            json!({ "jsonrpc": "2.0", "id": self.next_id(), "method": method, "params": params });
        let headers = self.headers_for(method, &params);
        self.send_raw(body.to_string().into_bytes(), headers).await
    }

    /// Calls a tool.
    pub async fn call_tool(&self, name: &str, arguments: Value) -> Result<Reply, ClientError> {
        self.request(
            "tools/call",
            json!({ "name": name, "arguments": arguments }),
        )
        .await
    }

    /// Posts `body` with exactly `headers` and reads the whole reply (for tests of bad input).
    pub async fn send_raw(&self, body: Vec<u8>, headers: HeaderMap) -> Result<Reply, ClientError> {
        let res = self
            .http
            .post(&self.url)
            .headers(headers)
            .body(body)
            .send()
            .await?;
        let status = res.status().as_u16();
        let headers = res.headers().clone();
        let body = res.text().await?;
        let messages = if is_sse(&headers) {
            // Every event must be one JSON-RPC message: anything else is the server's fault.
            SseParser::default()
                .feed(body.as_bytes())
                .iter()
                .map(|d| {
                    serde_json::from_str(d).map_err(|e| {
                        ClientError::Protocol(format!("SSE event is not JSON ({e}): {d}"))
                    })
                })
                .collect::<Result<Vec<Value>, _>>()?
        } else if body.trim().is_empty() {
            Vec::new()
        } else {
            serde_json::from_str::<Value>(&body)
                .map(|v| vec![v])
                .map_err(|e| not_json_rpc(status, retry::retry_after(&headers), &body, &e))?
        };
        Ok(Reply {
            status,
            headers,
            body,
            messages,
        })
    }

    /// Opens a stream (`subscriptions/listen`, or any request answered with SSE) and yields
    /// its messages as they arrive. A reply that is no stream (a refusal, such as a 503 for
    /// too many listen streams, or an answer sent as JSON) yields its one message; a reply
    /// that is no JSON-RPC at all (a proxy's error page) is an error.
    pub async fn open_stream(
        &self,
        method: &str,
        params: Value,
    ) -> Result<impl Stream<Item = Value> + use<>, ClientError> {
        let params = self.meta.apply(params);
        let body =
            json!({ "jsonrpc": "2.0", "id": self.next_id(), "method": method, "params": params });
        let headers = self.headers_for(method, &params);
        stream_of(self.post(&body, headers).await?).await
    }

    /// Posts `message` with `headers` and returns the response as its messages arrive.
    pub async fn post_incoming(
        &self,
        message: &Value,
        headers: HeaderMap,
    ) -> Result<Incoming, ClientError> {
        Ok(Incoming::read(self.post(message, headers).await?))
    }

    async fn post(
        &self,
        message: &Value,
        headers: HeaderMap,
    ) -> Result<reqwest::Response, ClientError> {
        Ok(self
            .http
            .post(&self.url)
            .headers(headers)
            .body(message.to_string())
            .send()
            .await?)
    }

    /// What every POST carries: the content types, and the token when there is one.
    pub(crate) fn base_headers(&self) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            reqwest::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(
            reqwest::header::ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        self.authorize(&mut h);
        h
    }

    /// `Authorization: Bearer …`, when the client has a token.
    fn authorize(&self, headers: &mut HeaderMap) {
        if let Some(v) = self
            .bearer
            .as_ref()
            .and_then(|t| HeaderValue::from_str(&format!("Bearer {t}")).ok())
        {
            headers.insert(reqwest::header::AUTHORIZATION, v);
        }
    }
}

/// A response whose JSON-RPC messages are read as they arrive: one for a JSON body, each
/// event of an SSE stream in turn.
pub struct Incoming {
    /// The HTTP status.
    pub status: u16,
    /// The response headers.
    pub headers: HeaderMap,
    messages: Pin<Box<dyn Stream<Item = Result<Value, ClientError>> + Send>>,
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incoming")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .finish_non_exhaustive()
    }
}

impl Incoming {
    /// Reads `res`: an SSE body event by event, any other body as one JSON value.
    pub(crate) fn read(res: reqwest::Response) -> Self {
        let status = res.status().as_u16();
        let headers = res.headers().clone();
        let messages: Pin<Box<dyn Stream<Item = Result<Value, ClientError>> + Send>> =
            if is_sse(&headers) {
                let mut parser = SseParser::default();
                Box::pin(res.bytes_stream().flat_map(move |chunk| {
                    let events: Vec<Result<Value, ClientError>> = match chunk {
                        Ok(bytes) => parser
                            .feed(&bytes)
                            .into_iter()
                            .map(|d| {
                                serde_json::from_str(&d).map_err(|e| {
                                    ClientError::Protocol(format!(
                                        "SSE event is not JSON ({e}): {d}"
                                    ))
                                })
                            })
                            .collect(),
                        Err(e) => vec![Err(ClientError::Http(e))],
                    };
                    futures_util::stream::iter(events)
                }))
            } else {
                let retry_after = retry::retry_after(&headers);
                Box::pin(futures_util::stream::once(async move {
                    let body = res.text().await?;
                    serde_json::from_str::<Value>(&body)
                        .map_err(|e| not_json_rpc(status, retry_after, &body, &e))
                }))
            };
        Incoming {
            status,
            headers,
            messages,
        }
    }

    /// The next message; `None` once the body ended.
    pub async fn next(&mut self) -> Option<Result<Value, ClientError>> {
        self.messages.next().await
    }
}

/// Whether a reply's body is an SSE stream.
fn is_sse(headers: &HeaderMap) -> bool {
    headers
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("text/event-stream"))
}

/// The messages of a reply as they arrive: an SSE body's events; any other body's one
/// JSON-RPC message. A body that is neither is an error naming the reply's status.
pub(crate) async fn stream_of(
    res: reqwest::Response,
) -> Result<impl Stream<Item = Value> + use<>, ClientError> {
    if is_sse(res.headers()) {
        return Ok(futures_util::future::Either::Left(messages_of(res)));
    }
    // Any other body is one message, read as `Incoming` reads it.
    let message = Incoming::read(res)
        .next()
        .await
        .ok_or_else(|| ClientError::Protocol("a reply without a body".into()))??;
    Ok(futures_util::future::Either::Right(
        futures_util::stream::once(async move { message }),
    ))
}

/// The JSON-RPC messages of an SSE response, as they arrive.
pub(crate) fn messages_of(res: reqwest::Response) -> impl Stream<Item = Value> + use<> {
    let mut parser = SseParser::default();
    res.bytes_stream().flat_map(move |chunk| {
        let events = match chunk {
            Ok(bytes) => parser.feed(&bytes),
            Err(_) => Vec::new(),
        };
        futures_util::stream::iter(
            events
                .into_iter()
                .filter_map(|d| serde_json::from_str::<Value>(&d).ok()),
        )
    })
}

/// A reply whose body is no JSON-RPC: an error status (a proxy's page) is that status, which
/// the caller may retry; anything else is the server's fault.
fn not_json_rpc(
    status: u16,
    retry_after: Option<std::time::Duration>,
    body: &str,
    e: &serde_json::Error,
) -> ClientError {
    let shown: String = body.chars().take(200).collect();
    if status >= 400 {
        ClientError::Status {
            status,
            body: shown,
            retry_after,
        }
    } else {
        ClientError::Protocol(format!("HTTP {status}, not JSON-RPC ({e}): {shown}"))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_token_never_shows_in_debug_output() {
        let client = super::HttpClient::new("http://127.0.0.1:1/mcp").with_bearer("s3cret-value");
        let shown = format!("{client:?}");
        assert!(
            !shown.contains("s3cret") && shown.contains("<set>"),
            "{shown}"
        );
    }

    #[test]
    fn a_token_read_from_a_file_is_sent_without_its_newline() {
        let client = super::HttpClient::new("http://127.0.0.1:1/mcp").with_bearer(" tok-1\n");
        assert_eq!(client.authorization().unwrap(), "Bearer tok-1");
    }
}
