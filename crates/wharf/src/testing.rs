//! An in-process harness: call a built [`Server`] with JSON, no socket, through the same
//! parse and admission path a transport takes. For tests of servers written with Wharf.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use serde_json::json;
//! use wharf::testing::Harness;
//! use wharf::{Context, NoArgs, Server, tool};
//! use wharf::protocol::Implementation;
//!
//! let server = Server::builder(Implementation::new("demo", "1.0.0"))
//!     .tool(tool("hello").handler(|_cx: Context, _: NoArgs| async { "hi" }))
//!     .build()?;
//! let result = Harness::new(server)
//!     .call("tools/call", json!({ "name": "hello", "arguments": {} }))
//!     .await?; // a refusal is an `ErrorReply`, which `?` takes into `Box<dyn Error>`
//! assert_eq!(result["content"][0]["text"], "hi");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use wharf_protocol::RequestId;
use wharf_protocol::meta::{CLIENT_CAPABILITIES, PROTOCOL_VERSION};

use crate::admission::ErrorReply;
use crate::error::RpcError;
use crate::principal::{Grant, Principal};
use crate::server::Server;

/// The principal of an OAuth access token that `https://as.example.com` issued to `alice`
/// with `scopes`: who a test of scope checks calls as.
pub fn oauth_user(scopes: &[&str]) -> Principal {
    Principal::oauth(Grant {
        issuer: "https://as.example.com".into(),
        subject: "alice".into(),
        client_id: None,
        scopes: scopes.iter().map(|s| (*s).to_owned()).collect(),
    })
}

/// Calls a server in-process, as one principal.
#[derive(Debug, Clone)]
pub struct Harness {
    server: Server,
    principal: Principal,
}

impl Harness {
    /// A harness calling `server` as the anonymous principal.
    pub fn new(server: Server) -> Self {
        Harness {
            server,
            principal: Principal::anonymous(),
        }
    }

    /// Calls as `principal` from now on.
    pub fn principal(mut self, principal: Principal) -> Self {
        self.principal = principal;
        self
    }

    /// The server under test.
    pub fn server(&self) -> &Server {
        &self.server
    }

    /// Sends `method` with `params` and returns the `result` of its one JSON response. The
    /// params get the `_meta` a 2026-07-28 client sends (its version, no client
    /// capabilities) where they carry none of their own.
    pub async fn call(&self, method: &str, params: Value) -> Result<Value, ErrorReply> {
        let req = self.parse(method, params)?;
        let admitted = self.server.admit(req, self.principal.clone()).await?;
        let body = admitted.respond().await?;
        Ok(result_of(&body))
    }

    /// Sends `method` with `params` as a stream and collects every message it produced, in
    /// order (notifications, then the response), until it ends or `cancel` fires.
    pub async fn stream(
        &self,
        method: &str,
        params: Value,
        cancel: CancellationToken,
    ) -> Result<Vec<Value>, ErrorReply> {
        let mut opened = self.open_stream(method, params, cancel).await?;
        let mut messages = Vec::new();
        while let Some(m) = opened.recv().await {
            messages.push(m);
        }
        Ok(messages)
    }

    /// Sends `method` with `params` as a stream and hands over its messages as they come,
    /// for a test that acts between them (a listen stream's acknowledgment says it is
    /// subscribed). The channel closes when the stream ends or `cancel` fires.
    pub async fn open_stream(
        &self,
        method: &str,
        params: Value,
        cancel: CancellationToken,
    ) -> Result<mpsc::Receiver<Value>, ErrorReply> {
        let req = self.parse(method, params)?;
        let admitted = self.server.admit(req, self.principal.clone()).await?;
        let (raw_tx, mut raw) = mpsc::channel(64);
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(admitted.stream(raw_tx, cancel));
        tokio::spawn(async move {
            while let Some(m) = raw.recv().await {
                let message = serde_json::from_slice(&m).unwrap_or(Value::Null);
                if tx.send(message).await.is_err() {
                    return;
                }
            }
        });
        Ok(rx)
    }

    fn parse(&self, method: &str, mut params: Value) -> Result<crate::ParsedRequest, ErrorReply> {
        let id = RequestId::Int(1);
        if let Value::Object(map) = &mut params {
            map.entry("_meta").or_insert_with(|| {
                let mut meta = serde_json::Map::new();
                meta.insert(PROTOCOL_VERSION.into(), json!("2026-07-28"));
                meta.insert(CLIENT_CAPABILITIES.into(), json!({}));
                Value::Object(meta)
            });
        }
        // As a transport reads it: in one pass, or the long way, which names what is wrong.
        let body = json!({ "jsonrpc": "2.0", "id": &id, "method": method, "params": &params });
        if let Some(req) = self.server.read_request(body.to_string().as_bytes(), 64) {
            return Ok(req);
        }
        let raw = RawValue::from_string(params.to_string())
            .map_err(|e| ErrorReply::new(Some(id.clone()), RpcError::internal(e)))?;
        self.server.parse_request(id, method, Some(&raw))
    }
}

/// The `result` of a response message (the whole message when it has none).
fn result_of(body: &[u8]) -> Value {
    let mut message: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    match message.get_mut("result") {
        Some(result) => result.take(),
        None => message,
    }
}
