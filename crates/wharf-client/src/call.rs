//! Calling a tool to its end: progress as it comes, input rounds answered (MRTR), and
//! retries that reuse the idempotency key so a write is applied once.

use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use serde_json::{Map, Value, json};
use wharf_protocol::{InputRequest, InputRequests, codes, headers, meta, methods};

use crate::answer::Answerer;
use crate::call_error::CallError;
use crate::{Client, ClientError, retry};

/// The argument a write tool takes its idempotency key in.
pub const IDEMPOTENCY_KEY: &str = "idempotency_key";

/// What happens during a call, for a progress bar or a log.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Event {
    /// The request was sent with this JSON-RPC id (a retry or a new round sends another).
    Sent {
        /// The request id.
        id: Value,
    },
    /// `notifications/progress`.
    Progress {
        /// Progress so far.
        progress: f64,
        /// The total, when known.
        total: Option<f64>,
        /// What is being done.
        message: Option<String>,
    },
    /// Any other notification on the call's stream (`notifications/message` logs, say).
    Notification(Value),
    /// The server asks for input; the answerer is asked next.
    Asked {
        /// The key the server gave the request.
        key: String,
        /// The request.
        request: Box<InputRequest>,
    },
    /// The exchange broke; the call is sent again with the same idempotency key.
    #[non_exhaustive]
    Retrying {
        /// Which attempt comes next (2 for the first retry).
        attempt: u32,
        /// What went wrong.
        error: String,
        /// How long the client waits before sending it: what the server's `Retry-After`
        /// asked for, or a backoff of its own.
        after: Duration,
    },
}

/// A `tools/call` to make: its arguments, and how to make it.
#[derive(Debug, Clone)]
pub struct ToolCall {
    name: String,
    arguments: Value,
    /// `Mcp-Param-*` headers mirroring the arguments the tool marks `x-mcp-header`.
    mirrored: Option<Vec<(String, String)>>,
    progress: bool,
    max_rounds: usize,
    attempts: u32,
    /// Whether the tool takes an idempotency key: false when its definition, known, has no
    /// such argument, and then a key does not make a retry safe (the server may ignore it).
    takes_key: bool,
}

impl ToolCall {
    /// A call of tool `name` with `arguments` (an object; anything else is sent as it is,
    /// for the server to refuse). Arguments the tool mirrors into headers are mirrored when
    /// the client has its definition (see [`ToolCall::for_tool`]).
    pub fn new(name: impl Into<String>, arguments: Value) -> Self {
        ToolCall {
            name: name.into(),
            arguments,
            mirrored: None,
            progress: false,
            max_rounds: 8,
            attempts: 3,
            takes_key: true,
        }
    }

    /// A call of `tool` (a definition from `tools/list`) with `arguments`, its `x-mcp-header`
    /// arguments mirrored into `Mcp-Param-*` headers as the transport requires.
    pub fn for_tool(tool: &Value, arguments: Value) -> Self {
        let mut call = ToolCall::new(tool["name"].as_str().unwrap_or_default(), arguments);
        call.mirror(tool);
        call.takes_key = tool["inputSchema"]["properties"]
            .get(IDEMPOTENCY_KEY)
            .is_some();
        call
    }

    /// Computes the `Mcp-Param-*` headers from `tool`'s input schema.
    fn mirror(&mut self, tool: &Value) {
        let mut mirrored = Vec::new();
        let properties = tool["inputSchema"]["properties"].as_object();
        for (name, property) in properties.into_iter().flatten() {
            let (Some(header), Some(value)) = (
                property[headers::X_MCP_HEADER].as_str(),
                self.arguments.get(name),
            ) else {
                continue;
            };
            if let Some(text) = headers::render_param(value) {
                mirrored.push((
                    format!("{}{header}", headers::PARAM_PREFIX),
                    headers::encode_value(&text),
                ));
            }
        }
        self.mirrored = Some(mirrored);
    }

    /// Asks for `notifications/progress` (a `progressToken` in `_meta`).
    pub fn with_progress(mut self) -> Self {
        self.progress = true;
        self
    }

    /// Sets the idempotency key: a broken exchange is then retried with it (up to
    /// [`ToolCall::attempts`]), and the server applies the write once. Not for a call made
    /// [`for_tool`](ToolCall::for_tool) whose definition has no such argument: that one is
    /// sent once, key or not. Arguments that are not an object (which no tool takes) get no
    /// key.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        if let Value::Object(arguments) = &mut self.arguments {
            arguments.insert(IDEMPOTENCY_KEY.to_owned(), Value::String(key.into()));
        }
        self
    }

    /// How many times a call with an idempotency key is sent before its transport error is
    /// returned (3 unless set; at least 1).
    pub fn attempts(mut self, attempts: u32) -> Self {
        self.attempts = attempts.max(1);
        self
    }

    /// How many input rounds to answer before giving up (8 unless set): the call fails
    /// with [`CallError::TooManyRounds`] when the server asks for one more, without the
    /// answerer being asked.
    pub fn max_rounds(mut self, rounds: usize) -> Self {
        self.max_rounds = rounds;
        self
    }

    /// The idempotency key, if the call has one.
    pub fn key(&self) -> Option<&str> {
        self.arguments[IDEMPOTENCY_KEY].as_str()
    }

    fn params(&self, round: Option<&Round>, progress_token: &str) -> Value {
        let mut params = json!({ "name": self.name, "arguments": self.arguments });
        if self.progress {
            params["_meta"] = json!({ meta::PROGRESS_TOKEN: progress_token });
        }
        if let Some(round) = round {
            params["inputResponses"] = Value::Object(round.responses.clone());
            if let Some(state) = &round.state {
                params["requestState"] = json!(state);
            }
        }
        params
    }
}

/// The answers of one input round, sent with the retry.
#[derive(Debug)]
struct Round {
    responses: Map<String, Value>,
    state: Option<String>,
}

/// A random idempotency key: 128 bits, hex.
pub fn new_idempotency_key() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Client {
    /// Calls a tool to its end: reports progress and notifications to `on_event`, answers
    /// the server's input requests with `answerer` (MRTR rounds, or server requests on a
    /// legacy stream), and retries a broken exchange when the call has an idempotency key.
    /// Returns the `CallToolResult` (which may have `isError`).
    ///
    /// Dropping the future closes the response stream, which cancels the call on a
    /// 2026-07-28 server; see [`Client::cancel`] for a legacy one.
    pub async fn call_tool<A: Answerer>(
        &self,
        call: &ToolCall,
        answerer: &mut A,
        on_event: &mut (dyn FnMut(Event) + Send),
    ) -> Result<Value, CallError> {
        let mut call = std::borrow::Cow::Borrowed(call);
        if call.mirrored.is_none() {
            // A tool listed earlier says which arguments travel in headers too.
            if let Some(tool) = self.listed_tool(&call.name) {
                call.to_mut().mirror(&tool);
            }
        }
        // Unique among this client's requests, so progress is never taken for another's.
        let token = format!("wharf-{}", new_idempotency_key());
        let mut round = None;
        for answered in 0..=call.max_rounds {
            let result = self
                .attempts(&call, round.as_ref(), &token, answerer, on_event)
                .await?;
            if result["resultType"] != "input_required" {
                return Ok(result);
            }
            // Answering a round that will not be sent would waste the answerer's work (a
            // person filling in a form, a paid sampling call).
            if answered == call.max_rounds {
                break;
            }
            if result.get("inputRequests").is_none() && result.get("requestState").is_none() {
                return Err(ClientError::Protocol(
                    "an input_required result with neither inputRequests nor requestState"
                        .to_owned(),
                )
                .into());
            }
            let requests: InputRequests = serde_json::from_value(
                result
                    .get("inputRequests")
                    .cloned()
                    .unwrap_or_else(|| json!({})),
            )
            .map_err(|e| ClientError::Protocol(format!("unreadable inputRequests: {e}")))?;
            let mut responses = Map::new();
            for (key, request) in requests {
                on_event(Event::Asked {
                    key: key.clone(),
                    request: Box::new(request.clone()),
                });
                let answer = answerer.answer(&key, &request).await?;
                responses.insert(key, answer);
            }
            round = Some(Round {
                responses,
                state: result["requestState"].as_str().map(str::to_owned),
            });
        }
        Err(CallError::TooManyRounds(call.max_rounds))
    }

    /// One round, sent again after a transient failure when the call has a key.
    async fn attempts<A: Answerer>(
        &self,
        call: &ToolCall,
        round: Option<&Round>,
        token: &str,
        answerer: &mut A,
        on_event: &mut (dyn FnMut(Event) + Send),
    ) -> Result<Value, CallError> {
        let attempts = if call.key().is_some() && call.takes_key {
            call.attempts
        } else {
            1
        };
        let mut attempt = 1;
        loop {
            let outcome = self.exchange(call, round, token, answerer, on_event).await;
            let Err(e) = &outcome else { return outcome };
            let Some(wait) = retry::next_wait(attempt, attempts, e) else {
                return outcome;
            };
            attempt += 1;
            on_event(Event::Retrying {
                attempt,
                error: e.to_string(),
                after: wait,
            });
            tokio::time::sleep(wait).await;
        }
    }

    /// Sends the call once and reads its stream to the response.
    async fn exchange<A: Answerer>(
        &self,
        call: &ToolCall,
        round: Option<&Round>,
        token: &str,
        answerer: &mut A,
        on_event: &mut (dyn FnMut(Event) + Send),
    ) -> Result<Value, CallError> {
        let (message, mut headers) = self.message(methods::TOOLS_CALL, call.params(round, token));
        for (name, value) in call.mirrored.iter().flatten() {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                headers.insert(name, value);
            }
        }
        let id = message["id"].clone();
        // Known before the answer starts, so that a cancellation can name it.
        on_event(Event::Sent { id: id.clone() });
        let mut incoming = self.post(&message, headers).await?;
        while let Some(message) = incoming.next().await {
            let message = message?;
            let method = message["method"].as_str();
            match (method, message.get("id")) {
                (None, Some(mid)) if *mid == id => {
                    return CallError::from_response(incoming.status, &incoming.headers, &message);
                }
                (Some(method), Some(server_id)) => {
                    self.server_request(method, server_id, &message, answerer, on_event)
                        .await?;
                }
                (Some(methods::NOTIFICATION_PROGRESS), None)
                    if message["params"][meta::PROGRESS_TOKEN] == token =>
                {
                    let p = &message["params"];
                    on_event(Event::Progress {
                        progress: p["progress"].as_f64().unwrap_or(0.0),
                        total: p["total"].as_f64(),
                        message: p["message"].as_str().map(str::to_owned),
                    });
                }
                _ => on_event(Event::Notification(message)),
            }
        }
        Err(ClientError::Incomplete(incoming.status).into())
    }

    /// A request the server sent on the call's stream. Only a legacy server may: its input
    /// requests go to `answerer` and their answers (or a refusal) back to the server, which
    /// would otherwise wait for them; `ping` is answered; anything else is refused.
    async fn server_request<A: Answerer>(
        &self,
        method: &str,
        id: &Value,
        message: &Value,
        answerer: &mut A,
        on_event: &mut (dyn FnMut(Event) + Send),
    ) -> Result<(), CallError> {
        if matches!(self.connection(), crate::Connection::Modern(_)) {
            return Err(ClientError::Protocol(format!(
                "the server sent a {method} request on the call's stream, which 2026-07-28 does not allow (MRTR asks through input_required results)"
            ))
            .into());
        }
        if method == "ping" {
            self.respond(id, json!({})).await?;
            return Ok(());
        }
        let request = serde_json::from_value::<InputRequest>(json!({
            "method": method,
            "params": message.get("params"),
        }));
        let request = match request {
            Ok(r) => r,
            Err(e) => {
                let code = if matches!(
                    method,
                    methods::ELICITATION_CREATE
                        | methods::SAMPLING_CREATE_MESSAGE
                        | methods::ROOTS_LIST
                ) {
                    codes::INVALID_PARAMS
                } else {
                    codes::METHOD_NOT_FOUND
                };
                self.respond_error(id, code, &format!("{method}: {e}"))
                    .await?;
                return Ok(());
            }
        };
        on_event(Event::Asked {
            key: method.to_owned(),
            request: Box::new(request.clone()),
        });
        match answerer.answer(method, &request).await {
            Ok(answer) => Ok(self.respond(id, answer).await?),
            Err(unanswered) => {
                // The server waits for an answer: tell it there is none, then stop.
                self.respond_error(id, codes::INTERNAL_ERROR, &unanswered.to_string())
                    .await?;
                Err(unanswered.into())
            }
        }
    }
}
