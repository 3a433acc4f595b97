//! Sessions of the initialization-based era (2025-11-25 basic/lifecycle and transports):
//! `initialize`, then every message carries `Mcp-Session-Id` and `MCP-Protocol-Version`.

use std::sync::Arc;

use futures_util::Stream;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};
use wharf_protocol::{codes, headers, methods};

use crate::http::{messages_of, stream_of};
use crate::{ClientError, HttpClient, Reply, retry};

/// A legacy session with one server, spoken through an [`HttpClient`] (its URL and token).
/// Clones (and [`LegacySession::through`]) speak for the same session, renewed or not.
#[derive(Debug, Clone)]
pub struct LegacySession {
    client: HttpClient,
    /// The session id, which [`LegacySession::renew`] replaces.
    id: Arc<std::sync::Mutex<Option<String>>>,
    /// Held while a renewal runs: requests that found the session gone at once renew it
    /// once.
    renewing: Arc<tokio::sync::Mutex<()>>,
    version: String,
    capabilities: Value,
    /// The `initialize` result.
    pub initialized: Value,
}

impl LegacySession {
    /// Opens a session: `initialize` asking for `version` with `capabilities`, then
    /// `notifications/initialized`.
    pub async fn initialize(
        client: &HttpClient,
        version: &str,
        capabilities: Value,
    ) -> Result<Self, ClientError> {
        let (id, initialized) = Self::open(client, version, &capabilities).await?;
        let version = initialized["protocolVersion"]
            .as_str()
            .unwrap_or(version)
            .to_owned();
        let session = LegacySession {
            client: client.clone(),
            id: Arc::new(std::sync::Mutex::new(id)),
            renewing: Arc::default(),
            version,
            capabilities,
            initialized,
        };
        session
            .notify(methods::NOTIFICATION_INITIALIZED, json!({}))
            .await?;
        Ok(session)
    }

    /// Opens a session on the server (`initialize`, without a session id): its id, if the
    /// server gave one, and the result.
    async fn open(
        client: &HttpClient,
        version: &str,
        capabilities: &Value,
    ) -> Result<(Option<String>, Value), ClientError> {
        let body = json!({
            "jsonrpc": "2.0",
            "id": client.next_id(),
            "method": methods::INITIALIZE,
            "params": {
                "protocolVersion": version,
                "capabilities": capabilities,
                "clientInfo": client.meta.client_info,
            },
        });
        let reply = client
            .send_raw(body.to_string().into_bytes(), client.base_headers())
            .await?;
        // A server may serve the era without sessions (2025-11-25 transports: the session
        // id is the server's choice).
        let id = reply
            .headers
            .get(headers::SESSION_ID)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let initialized = reply
            .result()
            .cloned()
            .ok_or_else(|| ClientError::Protocol(format!("initialize failed: {}", reply.body)))?;
        Ok((id, initialized))
    }

    /// Starts a new session in place of `stale`, the one a server answered 404 for
    /// (2025-11-25 transports: the client MUST then initialize a new one), with the version
    /// and capabilities of the first; a session renewed since is kept. Every clone speaks
    /// for the new one once it is initialized; a server that now negotiates another
    /// version is an error, and the old id is kept.
    pub async fn renew(&self, stale: Option<&str>) -> Result<(), ClientError> {
        let _turn = self.renewing.lock().await;
        if self.id().as_deref() != stale {
            return Ok(());
        }
        let (fresh, initialized) =
            Self::open(&self.client, &self.version, &self.capabilities).await?;
        let body =
            json!({ "jsonrpc": "2.0", "method": methods::NOTIFICATION_INITIALIZED, "params": {} });
        let done = match initialized["protocolVersion"].as_str() {
            Some(v) if v != self.version => Err(ClientError::Protocol(format!(
                "the server's new session speaks {v}, not {}",
                self.version
            ))),
            _ => self
                .client
                .send_raw(
                    body.to_string().into_bytes(),
                    self.headers_for(fresh.as_deref()),
                )
                .await
                .map(drop),
        };
        match done {
            Ok(()) => {
                *self.id.lock().unwrap_or_else(|e| e.into_inner()) = fresh;
                Ok(())
            }
            Err(e) => {
                // Not left open on the server for nobody.
                let _ = self.delete_session(fresh.as_deref()).await;
                Err(e)
            }
        }
    }

    /// The same session, spoken through `client` (another replica's URL, say). A renewal of
    /// one is not the other's: `client` may speak for another principal.
    pub fn through(&self, client: &HttpClient) -> Self {
        LegacySession {
            client: client.clone(),
            id: Arc::new(std::sync::Mutex::new(self.id())),
            renewing: Arc::default(),
            ..self.clone()
        }
    }

    /// The client the session speaks through.
    pub fn client(&self) -> &HttpClient {
        &self.client
    }

    /// The session id (`Mcp-Session-Id`), if the server gave one.
    pub fn id(&self) -> Option<String> {
        self.id.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The negotiated version.
    pub fn version(&self) -> &str {
        &self.version
    }

    pub(crate) fn headers(&self) -> HeaderMap {
        self.headers_for(self.id().as_deref())
    }

    /// The headers of a message of session `id`.
    fn headers_for(&self, id: Option<&str>) -> HeaderMap {
        let mut h = self.client.base_headers();
        if let Some(v) = id.and_then(|id| HeaderValue::from_str(id).ok()) {
            h.insert(HeaderName::from_static(headers::SESSION_ID), v);
        }
        if let Ok(v) = HeaderValue::from_str(&self.version) {
            h.insert(HeaderName::from_static(headers::PROTOCOL_VERSION), v);
        }
        h
    }

    /// Sends a request and reads its whole reply (JSON, or an SSE stream to its end).
    pub async fn request(&self, method: &str, params: Value) -> Result<Reply, ClientError> {
        self.post(&self.message(method, params)).await
    }

    /// The request message for `method` (with a fresh id).
    pub fn message(&self, method: &str, params: Value) -> Value {
        json!({ "jsonrpc": "2.0", "id": self.client.next_id(), "method": method, "params": params })
    }

    /// Posts `message` as it is and reads the whole reply.
    pub async fn post(&self, message: &Value) -> Result<Reply, ClientError> {
        self.client
            .send_raw(message.to_string().into_bytes(), self.headers())
            .await
    }

    /// Posts a request and yields the messages of its SSE answer as they arrive (server
    /// requests among them, which the caller answers with [`LegacySession::respond`]). A
    /// reply that is no stream (a refusal, an answer sent as JSON) yields its one message;
    /// one that is no JSON-RPC at all is an error.
    pub async fn stream(
        &self,
        message: &Value,
    ) -> Result<impl Stream<Item = Value> + use<>, ClientError> {
        let res = self
            .client
            .http
            .post(self.client.url())
            .headers(self.headers())
            .body(message.to_string())
            .send()
            .await?;
        stream_of(res).await
    }

    /// Sends a notification; the HTTP status (202 when accepted).
    pub async fn notify(&self, method: &str, params: Value) -> Result<u16, ClientError> {
        let body = json!({ "jsonrpc": "2.0", "method": method, "params": params });
        Ok(self.post(&body).await?.status)
    }

    /// Answers server request `id` with `result`; the HTTP status (202 when accepted).
    pub async fn respond(&self, id: &Value, result: Value) -> Result<u16, ClientError> {
        let body = json!({ "jsonrpc": "2.0", "id": id, "result": result });
        Ok(self.post(&body).await?.status)
    }

    /// Refuses server request `id` with JSON-RPC error `code`; the HTTP status.
    pub async fn respond_error(
        &self,
        id: &Value,
        code: i32,
        message: &str,
    ) -> Result<u16, ClientError> {
        let error = json!({ "code": code, "message": message });
        let body = json!({ "jsonrpc": "2.0", "id": id, "error": error });
        Ok(self.post(&body).await?.status)
    }

    /// Opens the session's own stream (GET): list changes and resource updates.
    pub async fn listen(&self) -> Result<(u16, impl Stream<Item = Value> + use<>), ClientError> {
        let mut h = self.headers();
        h.insert(
            reqwest::header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        );
        let res = self
            .client
            .http
            .get(self.client.url())
            .headers(h)
            .send()
            .await?;
        Ok((res.status().as_u16(), messages_of(res)))
    }

    /// Ends the session (DELETE); the HTTP status.
    pub async fn delete(&self) -> Result<u16, ClientError> {
        self.delete_session(self.id().as_deref()).await
    }

    async fn delete_session(&self, id: Option<&str>) -> Result<u16, ClientError> {
        let res = self
            .client
            .http
            .delete(self.client.url())
            .headers(self.headers_for(id))
            .send()
            .await?;
        Ok(res.status().as_u16())
    }
}

/// What [`HttpClient::connect`] found the server to speak.
#[derive(Debug, Clone)]
pub enum Connection {
    /// 2026-07-28: every request carries its `_meta`; use the client as it is.
    Modern(HttpClient),
    /// An initialization-based version: the session `initialize` opened.
    Legacy(LegacySession),
}

/// The errors only a 2026-07-28 server sends (header mismatch, missing capability,
/// unsupported version): they identify a modern server.
const MODERN_ERRORS: [i64; 3] = [-32020, -32021, -32022];

impl HttpClient {
    /// Connects as a dual-era client does (2026-07-28 basic/versioning, "Backward
    /// Compatibility"): a modern `server/discover` first. A result, or an error only a modern
    /// server sends, means the server is modern; any other `4xx`, or -32601, -32602 or -32600
    /// (a 2025-era server's answers to an unknown method) whatever the status, means it is
    /// legacy, and it
    /// gets `initialize` (newest legacy version, `capabilities`). A modern server that
    /// refuses 2026-07-28 but lists a legacy revision among those it supports gets
    /// `initialize` at the newest of them; one that supports no version this client speaks
    /// is an error, not a fallback; so is a 401 or 403, or a 400 with a challenge (a
    /// malformed token) ([`ClientError::Status`] with the challenge). A `server/discover`
    /// answered 429 or 502–504, or whose exchange broke, is sent again, twice at most, after the
    /// `Retry-After` the server gave.
    pub async fn connect(&self, capabilities: Value) -> Result<Connection, ClientError> {
        let reply = retry::read(|| async {
            let reply = self.request("server/discover", json!({})).await?;
            if retry::passing_status(reply.status) {
                // A rate limit, a gateway or a busy server: asked again (see `retry::read`).
                return Err(ClientError::Status {
                    status: reply.status,
                    retry_after: retry::retry_after(&reply.headers),
                    body: reply.body,
                });
            }
            Ok(reply)
        })
        .await?;
        if reply.status == 200 && reply.result().is_some() {
            return Ok(Connection::Modern(self.clone()));
        }
        let challenge = reply
            .headers
            .get(reqwest::header::WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok());
        // Either era refuses a missing or insufficient token the same way, and a malformed
        // one with 400 and a challenge (no legacy server challenges an unknown method).
        if matches!(reply.status, 401 | 403) || (reply.status == 400 && challenge.is_some()) {
            let challenge = challenge.unwrap_or("");
            return Err(ClientError::Status {
                status: reply.status,
                body: format!("WWW-Authenticate: {challenge}"),
                retry_after: None,
            });
        }
        if let Some(code) = reply.error_code().filter(|c| MODERN_ERRORS.contains(c)) {
            // A dual-era server of a later revision lists the legacy ones it also speaks
            // (basic/versioning): the newest of them this client speaks opens a session.
            let listed = reply
                .error()
                .and_then(|e| e["data"]["supported"].as_array());
            let legacy = listed.and_then(|listed| {
                wharf_protocol::version::LEGACY
                    .iter()
                    .find(|v| listed.iter().any(|l| l == **v))
            });
            if let (Some(version), true) = (
                legacy,
                code == i64::from(codes::UNSUPPORTED_PROTOCOL_VERSION),
            ) {
                return LegacySession::initialize(self, version, capabilities)
                    .await
                    .map(Connection::Legacy);
            }
            return Err(ClientError::Protocol(format!(
                "the server speaks 2026-07-28 or later but refused this client ({code}): {}",
                reply.body
            )));
        }
        // A legacy server refuses the unknown method: with a 4xx, or with the error a 2025-era
        // server answers an unknown method with, whatever the status: -32601, or -32602 or
        // -32600 from a stateless one. Any other error (-32603, an application's code) is the
        // server's own answer, reported as it is.
        let refused_as_unknown = matches!(
            reply.error_code(),
            Some(code) if [codes::METHOD_NOT_FOUND, codes::INVALID_PARAMS, codes::INVALID_REQUEST]
                .iter()
                .any(|c| i64::from(*c) == code)
        );
        if (400..500).contains(&reply.status) || refused_as_unknown {
            let newest = wharf_protocol::version::LEGACY[0];
            return LegacySession::initialize(self, newest, capabilities)
                .await
                .map(Connection::Legacy);
        }
        if reply.status >= 500 {
            // A server (or the proxy before it) in trouble: a status, which may pass.
            return Err(ClientError::Status {
                status: reply.status,
                retry_after: retry::retry_after(&reply.headers),
                body: reply.body,
            });
        }
        Err(ClientError::Protocol(format!(
            "server/discover answered HTTP {}: {}",
            reply.status, reply.body
        )))
    }
}
