//! [`Client`]: one server of either era behind one interface, with list caching.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use reqwest::header::{HeaderName, HeaderValue};
use serde_json::{Value, json};
use wharf_protocol::{headers, methods};

use crate::call_error::CallError;
use crate::{ClientError, Connection, HttpClient, Incoming, Reply, retry};

/// A client of one MCP server, whichever era it speaks.
///
/// [`Client::connect`] follows the spec's fallback rules (`server/discover`, then `initialize`
/// for a legacy-only server); every later request is shaped for the era found.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use wharf_client::{Client, HttpClient, Refuse, ToolCall};
///
/// let client = Client::connect(HttpClient::new("http://127.0.0.1:8080/mcp")).await?;
/// for tool in client.list_tools().await? {
///     println!("{}", tool["name"]);
/// }
/// let call = ToolCall::new("echo", serde_json::json!({ "text": "hi" }));
/// let result = client.call_tool(&call, &mut Refuse, &mut |_| {}).await?;
/// println!("{}", result["content"][0]["text"]);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Client {
    connection: Connection,
    lists: Mutex<HashMap<&'static str, Cached>>,
}

/// A list result kept for its `ttlMs`.
#[derive(Debug)]
struct Cached {
    until: Instant,
    items: Vec<Value>,
}

impl Client {
    /// Connects to the server `http` points at, declaring `http.meta.capabilities`.
    pub async fn connect(http: HttpClient) -> Result<Self, ClientError> {
        let capabilities = http.meta.capabilities.clone();
        let connection = http.connect(capabilities).await?;
        Ok(Client::over(connection))
    }

    /// A client over a connection already made.
    pub fn over(connection: Connection) -> Self {
        Client {
            connection,
            lists: Mutex::new(HashMap::new()),
        }
    }

    /// The connection: which era, and the session of a legacy one.
    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    /// The protocol version spoken.
    pub fn version(&self) -> &str {
        match &self.connection {
            Connection::Modern(http) => &http.meta.protocol_version,
            Connection::Legacy(session) => session.version(),
        }
    }

    /// The request message for `method` with `params` (`_meta` filled in for the modern
    /// era), and the headers it goes with.
    pub(crate) fn message(
        &self,
        method: &str,
        params: Value,
    ) -> (Value, reqwest::header::HeaderMap) {
        match &self.connection {
            Connection::Modern(http) => {
                let params = http.meta.apply(params);
                let headers = http.headers_for(method, &params);
                let message = json!({ "jsonrpc": "2.0", "id": http.next_id(), "method": method, "params": params });
                (message, headers)
            }
            Connection::Legacy(session) => (session.message(method, params), session.headers()),
        }
    }

    fn http(&self) -> &HttpClient {
        match &self.connection {
            Connection::Modern(http) => http,
            Connection::Legacy(session) => session.client(),
        }
    }

    /// Sends `method` with `params` and reads the whole reply.
    pub async fn request(&self, method: &str, params: Value) -> Result<Reply, ClientError> {
        let (message, headers) = self.message(method, params);
        let body = message.to_string().into_bytes();
        let first = self.http().send_raw(body.clone(), headers.clone()).await;
        let status = match &first {
            Ok(reply) => reply.status,
            // A 404 whose body is not JSON-RPC (a plain "not found") says the same.
            Err(ClientError::Status { status, .. }) => *status,
            Err(_) => return first,
        };
        match self.renewed(&headers, status).await? {
            Some(headers) => self.http().send_raw(body, headers).await,
            None => first,
        }
    }

    /// After a 404 to a request of a legacy session, which the server no longer knows (it
    /// expired, or the server restarted): the headers to send the request again with, in a
    /// new session (2025-11-25 transports: the client MUST then initialize one). The request
    /// was not taken, so sending it again applies it once.
    async fn renewed(
        &self,
        sent: &reqwest::header::HeaderMap,
        status: u16,
    ) -> Result<Option<reqwest::header::HeaderMap>, ClientError> {
        let Connection::Legacy(session) = &self.connection else {
            return Ok(None);
        };
        let stale = sent.get(headers::SESSION_ID).and_then(|v| v.to_str().ok());
        if status != 404 || stale.is_none() {
            return Ok(None);
        }
        session.renew(stale).await?;
        let mut resent = sent.clone();
        match session.id().and_then(|id| HeaderValue::from_str(&id).ok()) {
            Some(id) => resent.insert(HeaderName::from_static(headers::SESSION_ID), id),
            None => resent.remove(headers::SESSION_ID),
        };
        Ok(Some(resent))
    }

    /// Sends `method` with `params`; returns the request's id and its response as the
    /// messages arrive (progress, logs, then the result; server requests in the legacy era).
    pub async fn open(
        &self,
        method: &str,
        params: Value,
    ) -> Result<(Value, Incoming), ClientError> {
        let (message, headers) = self.message(method, params);
        let incoming = self.post(&message, headers).await?;
        Ok((message["id"].clone(), incoming))
    }

    /// Posts a message [`Client::message`] built.
    pub(crate) async fn post(
        &self,
        message: &Value,
        headers: reqwest::header::HeaderMap,
    ) -> Result<Incoming, ClientError> {
        let incoming = self.http().post_incoming(message, headers.clone()).await?;
        match self.renewed(&headers, incoming.status).await? {
            Some(headers) => self.http().post_incoming(message, headers).await,
            None => Ok(incoming),
        }
    }

    /// Tells the server a request is abandoned. In 2026-07-28 closing the response stream
    /// already says so and this does nothing; a legacy server gets `notifications/cancelled`.
    pub async fn cancel(&self, id: &Value, reason: &str) -> Result<(), ClientError> {
        if let Connection::Legacy(session) = &self.connection {
            session
                .notify(
                    methods::NOTIFICATION_CANCELLED,
                    json!({ "requestId": id, "reason": reason }),
                )
                .await?;
        }
        Ok(())
    }

    /// Ends what the connection holds on the server: a legacy session is deleted, so that
    /// its server need not keep it until it idles out (2025-11-25 transports: a client
    /// SHOULD end a session it no longer needs). A 2026-07-28 connection holds nothing.
    pub async fn close(&self) -> Result<(), ClientError> {
        if let Connection::Legacy(session) = &self.connection {
            session.delete().await?;
        }
        Ok(())
    }

    /// Answers a legacy server's request `id` (elicitation, sampling, roots) with `result`.
    pub(crate) async fn respond(&self, id: &Value, result: Value) -> Result<(), ClientError> {
        if let Connection::Legacy(session) = &self.connection {
            session.respond(id, result).await?;
        }
        Ok(())
    }

    /// Refuses a legacy server's request `id` with JSON-RPC error `code`.
    pub(crate) async fn respond_error(
        &self,
        id: &Value,
        code: i32,
        message: &str,
    ) -> Result<(), ClientError> {
        if let Connection::Legacy(session) = &self.connection {
            session.respond_error(id, code, message).await?;
        }
        Ok(())
    }

    /// The definition of tool `name`, if a list still cached holds it.
    pub(crate) fn listed_tool(&self, name: &str) -> Option<Value> {
        self.cached(methods::TOOLS_LIST)?
            .into_iter()
            .find(|t| t["name"] == name)
    }

    /// Every tool, page after page; kept for the `ttlMs` the server gave.
    pub async fn list_tools(&self) -> Result<Vec<Value>, CallError> {
        self.list(methods::TOOLS_LIST, "tools").await
    }

    /// Every item of list method `method` (its array is `field`), page after page. A list
    /// whose pages all carry `ttlMs` is reused until the shortest of them passed. A page
    /// answered by a rate limit (429), a gateway or a busy server (502–504), or whose
    /// exchange broke, is asked
    /// for again, twice at most, after the `Retry-After` the server gave.
    pub async fn list(&self, method: &'static str, field: &str) -> Result<Vec<Value>, CallError> {
        if let Some(cached) = self.cached(method) {
            return Ok(cached);
        }
        let started = Instant::now();
        let mut items = Vec::new();
        let mut cursor: Option<String> = None;
        let mut seen = std::collections::HashSet::new();
        let mut ttl = Some(u64::MAX);
        loop {
            let params = match &cursor {
                Some(c) => json!({ "cursor": c }),
                None => json!({}),
            };
            let result = retry::read(|| async {
                CallError::result_of(self.request(method, params.clone()).await?)
            })
            .await?;
            ttl = ttl.zip(result["ttlMs"].as_u64()).map(|(a, b)| a.min(b));
            if let Some(page) = result[field].as_array() {
                items.extend(page.iter().cloned());
            }
            match result["nextCursor"].as_str() {
                Some(next) if seen.insert(next.to_owned()) => cursor = Some(next.to_owned()),
                Some(next) => {
                    return Err(ClientError::Protocol(format!(
                        "{method} handed out cursor {next:?} twice: its pages go round in a circle"
                    ))
                    .into());
                }
                None => break,
            }
        }
        if let Some(ms) = ttl.filter(|ms| *ms > 0) {
            self.lock().insert(
                method,
                Cached {
                    until: started + Duration::from_millis(ms),
                    items: items.clone(),
                },
            );
        }
        Ok(items)
    }

    /// Forgets cached lists (after a `list_changed` notification, say).
    pub fn forget_lists(&self) {
        self.lock().clear();
    }

    fn cached(&self, method: &str) -> Option<Vec<Value>> {
        let mut lists = self.lock();
        match lists.get(method) {
            Some(c) if c.until > Instant::now() => Some(c.items.clone()),
            Some(_) => {
                lists.remove(method);
                None
            }
            None => None,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<&'static str, Cached>> {
        // The map holds only copies of answers: a panic elsewhere cannot leave it torn.
        self.lists.lock().unwrap_or_else(|e| e.into_inner())
    }
}
