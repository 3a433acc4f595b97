//! Clients of the initialization-based era (2025-11-25, 2025-06-18, 2025-03-26), served on
//! the same endpoint as stateless ones (2026-07-28 basic/versioning, "Backward
//! Compatibility with Initialization-Based Versions").
//!
//! `initialize` opens a [`Session`]: the negotiated version, the client's capabilities, its
//! log level and its resource subscriptions, kept in the server's store so that any replica
//! serves any request of the session (without a store, in this process). A transport hands
//! each message of a session to [`Sessions`]: requests run through the same admission,
//! methods and handlers as stateless ones, with what `_meta` carries in 2026-07-28 taken from
//! the session. What differs is at the edges: results lose the fields only 2026-07-28 has,
//! a handler's input requests go to the client as server requests on the call's stream
//! ([`LegacyCall`]), and the session's own stream ([`SessionStream`]) carries list changes
//! and updates of subscribed resources.

mod call;
mod older;
mod stream;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_json::value::RawValue;
use sha2::{Digest as _, Sha256};
use wharf_protocol::{
    CancelledParams, InitializeParams, InitializeResult, RequestId, ServerCapabilities,
    SetLevelParams, SubscribeParams, methods, version,
};

pub use call::{LegacyCall, Outcome, Rounds};
pub use stream::SessionStream;

use crate::access;
use crate::admission::{self, ErrorReply};
use crate::bus::{BusError, ChangeEvent, SessionSignal};
use crate::dispatch::Core;
use crate::error::{ErrorKind, RpcError};
use crate::meta::TraceContext;
use crate::metrics::Throttled;
use crate::principal::Principal;
use crate::reply::respond;
use crate::request::{self, MAX_SUBSCRIBED_BYTES, MAX_SUBSCRIPTIONS, MAX_URI_LEN};
use crate::runtime::Runtime;
pub use crate::session::Session;
use crate::session::{CACHE_TTL, Delivery, SessionCap, SessionKind, SessionState};
use crate::store::{HandleRecord, Millis, StoreError, TxMode, after, millis, now_millis};

/// Where a session is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Scope {
    /// In the server's session book (the store, shared by every replica): HTTP, where each
    /// request may reach another replica.
    Shared,
    /// By the transport alone, for as long as the process runs: stdio.
    Process,
}

/// Why a session cannot be resumed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// No such session: it never existed, ended, expired or belongs to someone else (all
    /// answered alike, so a session id tells nothing to whoever does not own it).
    #[error("the session is unknown or has ended; initialize a new one")]
    Unknown,
    /// The request speaks another version than the session negotiated.
    #[error("the request's protocol version {sent:?} is not the session's version {session:?}")]
    OtherVersion {
        /// The version the request named.
        sent: String,
        /// The session's version.
        session: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a request of a session gets.
#[derive(Debug)]
#[non_exhaustive]
pub enum Answer {
    /// Its one response message, ready (`ping`, `logging/setLevel`, subscriptions).
    Message(Vec<u8>),
    /// A call admitted to run (see [`LegacyCall`]).
    Call(Box<LegacyCall>),
}

/// The legacy side of a server (see [`Server::sessions`](crate::Server::sessions)).
#[derive(Clone, Copy)]
pub struct Sessions<'a> {
    core: &'a Arc<Core>,
}

impl std::fmt::Debug for Sessions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("enabled", &self.enabled())
            .finish_non_exhaustive()
    }
}

impl<'a> Sessions<'a> {
    pub(crate) fn new(core: &'a Arc<Core>) -> Self {
        Sessions { core }
    }

    /// Whether clients that open with `initialize` are served.
    pub fn enabled(&self) -> bool {
        self.core.runtime.config.legacy.enabled
    }

    /// The most messages one batch may hold ([`LegacyConfig::max_batch`](crate::LegacyConfig)).
    pub fn max_batch(&self) -> usize {
        self.core.runtime.config.legacy.max_batch
    }

    /// Whether a message opens a legacy session: an `initialize` request that does not carry
    /// the `_meta` of 2026-07-28 (which is served statelessly, and there `initialize` does
    /// not exist).
    pub fn opens_session(&self, method: &str, params: Option<&RawValue>) -> bool {
        // Only whether `_meta` names a version: whatever else it holds is the stateless
        // method's to judge.
        #[derive(serde::Deserialize)]
        struct Meta {
            #[serde(rename = "io.modelcontextprotocol/protocolVersion")]
            version: Option<serde::de::IgnoredAny>,
        }
        #[derive(serde::Deserialize)]
        struct Probe {
            #[serde(rename = "_meta", default)]
            meta: Option<Meta>,
        }
        method == methods::INITIALIZE
            && params
                .and_then(|p| serde_json::from_str::<Probe>(p.get()).ok())
                .and_then(|p| p.meta)
                .is_none_or(|m| m.version.is_none())
    }

    /// Answers `initialize`: negotiates the version, opens a session for `principal` and
    /// returns it with the response message. A server that serves only 2026-07-28 refuses
    /// with the versions it supports.
    pub async fn initialize(
        &self,
        id: RequestId,
        params: Option<&RawValue>,
        principal: &Principal,
        scope: Scope,
    ) -> Result<(Session, Vec<u8>), ErrorReply> {
        let fail = |e: RpcError| ErrorReply::new(Some(id.clone()), e.in_2025());
        if !self.enabled() {
            // Named whatever else is wrong with the params: a legacy client has no other way
            // to learn what this server speaks.
            #[derive(serde::Deserialize)]
            struct Asked {
                #[serde(rename = "protocolVersion")]
                version: String,
            }
            let asked = params.and_then(|p| serde_json::from_str::<Asked>(p.get()).ok());
            let requested = asked.map(|a| a.version).unwrap_or_default();
            return Err(fail(RpcError::unsupported_version(
                &requested,
                version::SUPPORTED,
            )));
        }
        // What a session keeps of them (its client's capabilities and description) is
        // stored, copied by every replica that serves it, and read on every request: a
        // megabyte of made-up capabilities per session must not be.
        if params.is_some_and(|p| p.get().len() > MAX_INITIALIZE_BYTES) {
            return Err(fail(RpcError::invalid_params(format!(
                "Invalid params: initialize's params are at most {} KiB (the capabilities and clientInfo a session keeps)",
                MAX_INITIALIZE_BYTES / 1024
            ))));
        }
        let params: InitializeParams = read(params).map_err(fail)?;
        let runtime = &self.core.runtime;
        let config = &runtime.config.legacy;
        let now = now_millis();
        let mut record = HandleRecord::mint::<SessionKind>(principal, now);
        record.expires_at = after(now, config.session_lifetime);
        record.idle_ms = Some(millis(config.session_idle));
        let negotiated = version::negotiate_legacy(&params.protocol_version);
        let session = Session {
            record: Arc::new(record),
            state: Arc::new(SessionState {
                version: negotiated.to_owned(),
                capabilities: older::capabilities(negotiated, params.capabilities),
                client_info: params.client_info,
                log_level: None,
                subscriptions: Default::default(),
            }),
            booked: scope == Scope::Shared,
        };
        if session.booked {
            let cap = if principal.is_anonymous() {
                SessionCap::Refusing(config.max_anonymous_sessions)
            } else {
                SessionCap::Evicting(config.max_sessions_per_principal)
            };
            let ended = runtime
                .sessions
                .insert(&session, &runtime.mutations, now, cap)
                .await
                .map_err(|e| fail(e.into()))?;
            for id in &ended {
                tracing::info!(
                    session = %id,
                    "a legacy session ended to make room for its principal's newest"
                );
                // Not waited for: the opening client never held these sessions.
                drop(self.announce_end(id));
            }
        }
        let result = InitializeResult {
            protocol_version: negotiated.to_owned(),
            capabilities: legacy_capabilities(&self.core.registry.capabilities),
            server_info: runtime.info.get().clone(),
            instructions: self.core.registry.instructions.clone(),
        };
        let message = respond(&id, &result).map_err(fail)?;
        Ok((session, message))
    }

    /// The session `id`, if `principal` opened it and it is still alive, and `version`, when
    /// the request names one, is the session's. Only a request that may go on keeps the
    /// session alive.
    pub async fn resume(
        &self,
        id: &str,
        principal: &Principal,
        version: Option<&str>,
    ) -> Result<Session, SessionError> {
        let runtime = &self.core.runtime;
        let book = &runtime.sessions;
        if book.is_shared() {
            // Copies of stored sessions are only as good as the signals that drop them.
            runtime.hub.listen(&runtime.bus, book);
        }
        let Some(mut session) = book.session(id, false).await? else {
            return Err(SessionError::Unknown);
        };
        // A copy read before this process heard the session end: its calls would be
        // cancelled as they register, and its changes find nothing to change.
        if runtime.hub.ended_lately(id) {
            return Err(SessionError::Unknown);
        }
        let now = now_millis();
        if session.owner() != principal.id() || session.record.expired(now).is_some() {
            return Err(SessionError::Unknown);
        }
        if let Some(sent) = version.filter(|v| *v != session.version()) {
            return Err(SessionError::OtherVersion {
                sent: sent.to_owned(),
                session: session.version().to_owned(),
            });
        }
        if session.needs_touch(now) {
            // A use not recorded only lets the session idle out a touch interval early: no
            // reason to refuse a request that may go on.
            if let Err(e) = book.touch(&mut session, now).await {
                tracing::warn!(error = %e, "could not record a use of a legacy session");
            }
        }
        Ok(session)
    }

    /// Ends `session` (HTTP DELETE); its stream ends too, on every replica. Returns once
    /// the end is published on the bus, which other replicas drop their copies of the
    /// session on: the client's next request, wherever it lands, is far more likely to
    /// find the session ended than a copy the announcement has not reached. When the end
    /// could not be published, it returns once every replica's copy has run out instead
    /// (each is trusted for two seconds at most).
    pub async fn end(&self, session: &Session) -> Result<(), SessionError> {
        let runtime = &self.core.runtime;
        let ended = tokio::time::Instant::now();
        if !runtime.sessions.remove(session.id()).await? {
            return Err(SessionError::Unknown);
        }
        let announced = self.announce_end(session.id());
        let published = matches!(
            tokio::time::timeout(CACHE_TTL, announced).await,
            Ok(Ok(true))
        );
        if !published && runtime.sessions.is_shared() {
            tokio::time::sleep_until(ended + CACHE_TTL).await;
        }
        Ok(())
    }

    /// Tells the calls of session `id`, ended in the store, that it ended: this process's
    /// at once, the other replicas' through the bus. Unheard elsewhere, the end still
    /// holds: the session is gone from the store. Told on a task of its own: a client that
    /// goes away once the end is committed must not take the news with it (no retry can
    /// send it: the session is gone), or the session's calls on other replicas would run
    /// on, and wait for input, until their timeouts; the task's handle says whether it was
    /// sent.
    fn announce_end(&self, id: &str) -> tokio::task::JoinHandle<bool> {
        let runtime = &self.core.runtime;
        runtime.hub.route(id, SessionSignal::Ended);
        let bus = Arc::clone(&runtime.bus);
        let event = ChangeEvent::Session {
            session: id.to_owned(),
            signal: SessionSignal::Ended,
        };
        tokio::spawn(async move {
            let published = bus.publish(event).await;
            if let Err(e) = &published {
                tracing::warn!(error = %e, "could not publish a legacy session's end");
            }
            published.is_ok()
        })
    }

    /// Handles a request of `session`: answers the session's own methods at once and admits
    /// everything else as a [`LegacyCall`]. `trace` is the W3C trace context the transport
    /// carried beside the message (HTTP headers), joined when `_meta` carries none.
    pub async fn request(
        &self,
        session: &mut Session,
        id: RequestId,
        method: &str,
        params: Option<&RawValue>,
        principal: Principal,
        trace: TraceContext<'_>,
    ) -> Result<Answer, ErrorReply> {
        let caps = &self.core.registry.capabilities;
        let fail = |e: RpcError| ErrorReply::new(Some(id.clone()), e.in_2025());
        let empty = || respond(&id, &Empty {}).map(Answer::Message).map_err(fail);
        // The methods answered here take the id for as long as they run, as a call does
        // (below): under the id of a running call, the client would get two answers to one
        // id, and its cancellation would name two requests.
        let _id_taken = match method {
            methods::PING
            | methods::LOGGING_SET_LEVEL
            | methods::RESOURCES_SUBSCRIBE
            | methods::RESOURCES_UNSUBSCRIBE => {
                Some(call::register(self.core, session, &id).map_err(fail)?)
            }
            _ => None,
        };
        match method {
            methods::PING => empty(),
            methods::INITIALIZE => Err(fail(RpcError::new(
                ErrorKind::InvalidRequest,
                "Invalid request: this session is initialized already; a new one is opened by an initialize outside it (over HTTP, without Mcp-Session-Id)",
            ))),
            methods::LOGGING_SET_LEVEL => {
                if caps.logging.is_none() {
                    return Err(fail(RpcError::method_not_found(method)));
                }
                let p: SetLevelParams = read(params).map_err(fail)?;
                self.change(session, |s| {
                    let changed = s.log_level != Some(p.level);
                    s.log_level = Some(p.level);
                    changed
                })
                .await
                .map_err(fail)?;
                empty()
            }
            methods::RESOURCES_SUBSCRIBE | methods::RESOURCES_UNSUBSCRIBE => {
                if caps
                    .resources
                    .as_ref()
                    .is_none_or(|r| r.subscribe != Some(true))
                {
                    return Err(fail(RpcError::method_not_found(method)));
                }
                let mut p: SubscribeParams = read(params).map_err(fail)?;
                // As the client wrote it, as a read and a listen stream check it.
                if method == methods::RESOURCES_SUBSCRIBE
                    && let Some(problem) = crate::uri_template::uri_problem(&p.uri)
                {
                    return Err(fail(request::not_a_uri("uri", &p.uri, &problem)));
                }
                // Kept as changes are announced, whichever way the client wrote it.
                p.uri = crate::uri_template::normalized(&p.uri).into_owned();
                if method == methods::RESOURCES_SUBSCRIBE {
                    let registry = &self.core.registry;
                    if registry.resource(&p.uri).is_none() {
                        return Err(fail(RpcError::resource_not_found(&p.uri)));
                    }
                    // A subscription tells when a resource changes: it needs what a read
                    // needs.
                    access::resource(registry, &principal, &p.uri).map_err(|d| {
                        ErrorReply::denied(self.core.runtime.metrics.as_deref(), id.clone(), d)
                    })?;
                    if p.uri.len() > MAX_URI_LEN {
                        return Err(fail(RpcError::invalid_params(format!(
                            "Invalid params: the URI is longer than {MAX_URI_LEN} bytes"
                        ))));
                    }
                    // Bounded by count and by bytes: every change of the session rewrites
                    // its record whole, and every replica reads it again.
                    let fits = |subscriptions: &BTreeSet<String>, uri: &String| {
                        subscriptions.contains(uri)
                            || (subscriptions.len() < MAX_SUBSCRIPTIONS
                                && subscriptions.iter().map(String::len).sum::<usize>() + uri.len()
                                    <= MAX_SUBSCRIBED_BYTES)
                    };
                    if !fits(session.subscriptions(), &p.uri) {
                        return Err(fail(too_many_subscriptions()));
                    }
                    let mut full = false;
                    self.change(session, |s| {
                        // Checked again against the state as stored now: another replica
                        // may have added one since this copy was read. Refused, it writes
                        // nothing.
                        if fits(&s.subscriptions, &p.uri) {
                            s.subscriptions.insert(p.uri)
                        } else {
                            full = true;
                            false
                        }
                    })
                    .await
                    .map_err(fail)?;
                    if full {
                        return Err(fail(too_many_subscriptions()));
                    }
                } else {
                    self.change(session, |s| s.subscriptions.remove(&p.uri))
                        .await
                        .map_err(fail)?;
                }
                empty()
            }
            _ => {
                let req =
                    request::parse_in_session(caps, session, id.clone(), method, params, trace)
                        .map_err(fail)?;
                // Registered before admission: a cancellation that arrives while the request
                // waits in the queue takes it out of the queue.
                let (cancel, running) = call::register(self.core, session, &id).map_err(fail)?;
                let admitted = tokio::select! {
                    biased;
                    () = cancel.cancelled() => return Err(fail(call::cancelled_error())),
                    admitted = admission::admit(self.core, req, principal) => admitted?,
                };
                Ok(Answer::Call(Box::new(LegacyCall::new(
                    admitted,
                    session.clone(),
                    params,
                    (cancel, running),
                ))))
            }
        }
    }

    /// Handles a notification of `session`: a cancellation reaches the call it names on
    /// whichever replica runs it; the others need nothing.
    pub async fn notify(
        &self,
        session: &Session,
        method: &str,
        params: Option<&RawValue>,
    ) -> Result<(), RpcError> {
        if method == methods::NOTIFICATION_CANCELLED {
            // 2025-11-25 cancellation: malformed ones SHOULD be ignored. Refused, one would
            // sink the whole 2025-03-26 batch it came in.
            let Ok(p) = read::<CancelledParams>(params) else {
                tracing::debug!("a malformed cancellation ignored");
                return Ok(());
            };
            let key = call_key(session.id(), &p.request_id);
            let runtime = &self.core.runtime;
            // A call running here is cancelled here at once, and the cancellation still goes
            // to the others (a retry under the same id may run on one). Any other goes out
            // within the session's budget: each wakes every replica. Past it, the client is
            // asked to send it again later, as when the bus does not take it.
            let here = runtime.hub.cancel_here(session.id(), &key);
            let shared = session.booked && runtime.sessions.is_shared();
            if shared && !here && !runtime.hub.may_send_cancel(session.id()) {
                static PAST_BUDGET: Throttled = Throttled::new(Duration::from_secs(10));
                if let Some(held_back) = PAST_BUDGET.ready() {
                    tracing::warn!(
                        held_back,
                        "a legacy session sent more cancellations than the other replicas are woken for: refused busy"
                    );
                }
                return Err(RpcError::new(
                    ErrorKind::RetryLater,
                    "Busy: this session sent more cancellations than are passed to the other replicas at once; send it again later",
                ));
            }
            // The call may run on another replica, which hears of it only through the bus:
            // a cancellation the bus did not take is not acknowledged, so that the client
            // sends it again rather than wait for a call that goes on.
            if self
                .signal(session, SessionSignal::Cancel(key))
                .await
                .is_err()
            {
                return Err(RpcError::new(
                    ErrorKind::RetryLater,
                    "Busy: the cancellation could not be passed to the other replicas; send it again",
                ));
            }
        }
        Ok(())
    }

    /// Takes the client's answer to a server request (a JSON-RPC response with `id`) and
    /// hands it to the call waiting for it, on whichever replica that runs.
    pub async fn answer(
        &self,
        session: &Session,
        id: &RequestId,
        result: Option<&RawValue>,
        error: Option<&RawValue>,
    ) -> Result<(), RpcError> {
        let mut answer = serde_json::Map::new();
        match (result, error) {
            (Some(r), None) => answer.insert("result".into(), parse_raw(r)?),
            (None, Some(e)) => answer.insert("error".into(), parse_raw(e)?),
            _ => {
                return Err(RpcError::new(
                    ErrorKind::InvalidRequest,
                    "Invalid request: a response carries exactly one of \"result\" and \"error\"",
                ));
            }
        };
        let runtime = &self.core.runtime;
        // The keys that tagged the id: loaded by the first request, which this may be.
        runtime.keys.ready().await.map_err(RpcError::from)?;
        if !is_server_request_id(runtime, session.id(), id, now_millis()) {
            return Err(RpcError::new(
                ErrorKind::InvalidRequest,
                format!("Invalid request: {id} is not the id of a request this server sent"),
            ));
        }
        let answer = Value::Object(answer);
        let key = reply_key(session.id(), id);
        match (runtime.sessions.store(), session.booked) {
            (Some(store), true) => {
                // A second answer to the same request changes nothing.
                if store
                    .load_handle(&key)
                    .await
                    .map_err(RpcError::from)?
                    .is_some()
                {
                    return Ok(());
                }
                let now = now_millis();
                let record = HandleRecord {
                    id: key.clone(),
                    kind: REPLY_KIND.to_owned(),
                    owner: session.owner().to_owned(),
                    created_at: now,
                    expires_at: after(now, runtime.config.legacy.input_timeout),
                    idle_ms: None,
                    last_used_at: now,
                    data: Some(answer),
                };
                // An answer waits until its call takes it, or until it expires. Only ids
                // this server sent the session lately get here, one answer each at a time:
                // what waits is bounded by the requests the server sent lately.
                let mut tx = store.begin(TxMode::Write).await?;
                let filed = async {
                    tx.create_handle(&record).await?;
                    tx.commit().await
                };
                if let Err(e) = filed.await {
                    // The same answer sent twice at once, filed by the other copy: done.
                    if !matches!(store.load_handle(&key).await, Ok(Some(_))) {
                        return Err(e.into());
                    }
                }
                // Unheard, the answer is still found: its call looks in the store.
                let _ = self.signal(session, SessionSignal::Reply(key)).await;
            }
            _ => runtime.hub.deliver(&key, Delivery::Local(answer)),
        }
        Ok(())
    }

    /// The session's stream of messages unrelated to any request: list changes and updates
    /// of the resources it subscribed to (HTTP GET; stdio writes them as they come), opened
    /// for `principal`, its owner. It holds slots under the listen caps, as a
    /// `subscriptions/listen` stream does; refused (`RetryLater`) when they are full, or
    /// when the bus did not take its announcement (a session has one stream at a time: the
    /// one opened last, on any replica, and the others end when they hear of it).
    pub async fn stream(
        &self,
        session: &Session,
        principal: &Principal,
    ) -> Result<SessionStream, RpcError> {
        let runtime = &self.core.runtime;
        let capped = (!principal.is_anonymous()).then(|| principal.id());
        match runtime.gate.enter_listen(capped) {
            Ok(permit) => {
                let until = crate::deadline::credentials_end(principal);
                SessionStream::open(self.core, session, until, permit)
                    .await
                    .map_err(|e| {
                        // The caller says so (HTTP answers 503; stdio warns once while it retries).
                        tracing::debug!(error = %e, "a session's stream could not announce itself");
                        RpcError::new(
                            ErrorKind::RetryLater,
                            "Busy: the session's stream could not be announced to the other replicas; open it again",
                        )
                    })
            }
            Err(busy) => {
                if let Some(m) = &runtime.metrics {
                    m.shed(busy.why);
                }
                Err(busy.error)
            }
        }
    }

    /// Changes the session's state where it is kept (or, for a session only its transport
    /// holds, there), then tells its stream, wherever that is. A `change` answering `false`
    /// changed nothing: nothing is written, nobody told.
    async fn change(
        &self,
        session: &mut Session,
        change: impl FnOnce(&mut SessionState) -> bool,
    ) -> Result<(), RpcError> {
        if !session.booked {
            if change(session.state_mut()) {
                let _ = self.signal(session, SessionSignal::Changed).await;
            }
            return Ok(());
        }
        let mut wrote = false;
        let changed = self
            .core
            .runtime
            .sessions
            .update(session, &self.core.runtime.mutations, now_millis(), |s| {
                wrote = change(s);
                wrote
            })
            .await?;
        let Some(changed) = changed else {
            return Err(session_ended());
        };
        *session = changed;
        if wrote {
            // Unheard, other replicas' copies still go stale within two seconds.
            let _ = self.signal(session, SessionSignal::Changed).await;
        }
        Ok(())
    }

    /// Tells every replica. A cancellation or an answer of a session no other process
    /// holds goes straight to this process's hub; a change or an end always goes on the
    /// bus, which the session's streams hear (the in-process bus when nothing is shared).
    /// A cancellation of a shared session goes to this process's hub as well as on the bus,
    /// so that it reaches a call running here even while the bus is down (an answer needs
    /// no such care: its call also looks for it in the store). `Err` when the bus did not
    /// take it: other replicas may not hear it.
    async fn signal(&self, session: &Session, signal: SessionSignal) -> Result<(), BusError> {
        let runtime = &self.core.runtime;
        let shared = session.booked && runtime.sessions.is_shared();
        match signal {
            SessionSignal::Cancel(_) | SessionSignal::Reply(_) if !shared => {
                runtime.hub.route(session.id(), signal);
                return Ok(());
            }
            // This process's calls hear it at once, whether or not its hub hears the bus.
            SessionSignal::Cancel(_) | SessionSignal::Ended => {
                runtime.hub.route(session.id(), signal.clone());
            }
            _ => {}
        }
        let event = ChangeEvent::Session {
            session: session.id().to_owned(),
            signal,
        };
        runtime.bus.publish(event).await.inspect_err(|e| {
            tracing::warn!(error = %e, "could not publish a legacy session's signal");
        })
    }
}

/// What a request of a session that ended while it was served gets: what one of an unknown
/// session gets (404 over HTTP), so that its client initializes a new one.
pub(crate) fn session_ended() -> RpcError {
    RpcError::new(ErrorKind::SessionEnded, SessionError::Unknown.to_string())
}

fn too_many_subscriptions() -> RpcError {
    RpcError::invalid_params(format!(
        "Invalid params: a session subscribes to at most {MAX_SUBSCRIPTIONS} resources, their URIs {} KiB together; unsubscribe from some first",
        MAX_SUBSCRIBED_BYTES / 1024
    ))
}
/// The longest params of `initialize`, in bytes: a client's capabilities and description
/// (icons as `data:` URIs included) fit many times over.
const MAX_INITIALIZE_BYTES: usize = 64 * 1024;
/// What every server request's id starts with.
const SERVER_REQUEST_PREFIX: &str = "wharf-";
/// The purpose of the tag a server request's id carries.
const SERVER_REQUEST_TAG: &[u8] = b"legacy server request";

/// Replicas' clocks may disagree this much about when a server request was sent.
const CLOCK_SKEW_MS: Millis = 60_000;

/// The id of server request `n` of a call's round `nonce` in `session`, sent at `now`:
/// tagged with the server's keys, so that an answer is filed only for a request a replica
/// sent that session and no longer than its call waits for it (an answer to a made-up or
/// an old id would wait in the store until it expired, as often as it is sent).
pub(crate) fn server_request_id(
    runtime: &Runtime,
    session: &str,
    nonce: u64,
    n: usize,
    now: Millis,
) -> RequestId {
    let base = format!("{SERVER_REQUEST_PREFIX}{nonce:016x}-{n}-{now:x}");
    let tag = runtime
        .keys
        .get()
        .cursors
        .tag(SERVER_REQUEST_TAG, &tagged_data(session, &base));
    RequestId::String(format!("{base}.{tag}"))
}

/// Whether `id` is one [`server_request_id`] made for `session`, whose call may still
/// wait for its answer at `now`.
fn is_server_request_id(runtime: &Runtime, session: &str, id: &RequestId, now: Millis) -> bool {
    let RequestId::String(id) = id else {
        return false;
    };
    let Some((base, tag)) = id.split_once('.') else {
        return false;
    };
    let sent = base
        .rsplit_once('-')
        .and_then(|(_, at)| Millis::from_str_radix(at, 16).ok());
    let waited = millis(runtime.config.legacy.input_timeout).saturating_add(CLOCK_SKEW_MS);
    base.starts_with(SERVER_REQUEST_PREFIX)
        && sent.is_some_and(|sent| now.saturating_sub(sent) <= waited)
        && runtime
            .keys
            .get()
            .cursors
            .is_tag(SERVER_REQUEST_TAG, &tagged_data(session, base), tag)
}

fn tagged_data(session: &str, base: &str) -> Vec<u8> {
    [session.as_bytes(), &[0], base.as_bytes()].concat()
}

/// The handle kind of a client's answer waiting for its call.
const REPLY_KIND: &str = "mcp-reply";

/// Where the answer to server request `id` of `session` is filed: a digest, so any id the
/// client chose makes a key of fixed shape.
pub(crate) fn reply_key(session: &str, id: &RequestId) -> String {
    digest_key("rpl_", session, id)
}

/// How the bus names request `id` of `session` when the client cancels it: a digest of
/// fixed size, because the client chooses ids, and one too long for the bus's messages
/// would be announced as a gap, which ends every listen stream on every replica.
pub(crate) fn call_key(session: &str, id: &RequestId) -> String {
    digest_key("run_", session, id)
}

fn digest_key(prefix: &str, session: &str, id: &RequestId) -> String {
    use std::fmt::Write as _;
    let mut h = Sha256::new();
    h.update(session.as_bytes());
    h.update([0]);
    h.update(serde_json::to_string(id).unwrap_or_default().as_bytes());
    let digest = h.finalize();
    let mut key = String::with_capacity(prefix.len() + 32);
    key.push_str(prefix);
    for b in &digest[..16] {
        let _ = write!(key, "{b:02x}");
    }
    key
}

/// What a 2025-era client may be told the server offers: the 2026-07-28 capabilities less
/// what that era has no place for.
fn legacy_capabilities(caps: &ServerCapabilities) -> ServerCapabilities {
    let mut legacy = caps.clone();
    legacy.extensions = None;
    legacy
}

#[derive(Serialize)]
struct Empty {}

fn read<T: DeserializeOwned>(params: Option<&RawValue>) -> Result<T, RpcError> {
    let text = params.map_or("{}", RawValue::get);
    serde_json::from_str(text).map_err(|e| RpcError::invalid_params(format!("Invalid params: {e}")))
}

fn parse_raw(raw: &RawValue) -> Result<Value, RpcError> {
    serde_json::from_str(raw.get())
        .map_err(|e| RpcError::invalid_params(format!("Invalid response: {e}")))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::value::RawValue;
    use wharf_protocol::{Implementation, RequestId};

    use super::{Scope, SessionError};
    use crate::config::ServerConfig;
    use crate::principal::Principal;
    use crate::server::Server;

    /// A server request's id holds for its session, while its call may wait for the
    /// answer (the input timeout, and a minute for replicas' clocks), and under the keys
    /// that tagged it; nothing else passes for one.
    #[test]
    fn a_server_request_id_holds_for_its_session_while_its_call_waits() {
        use super::{is_server_request_id, server_request_id};
        let mut config = ServerConfig::default();
        config.legacy.input_timeout = Duration::from_secs(600);
        let server = Server::builder(Implementation::new("t", "1"))
            .config(config)
            .build()
            .unwrap();
        let runtime = &server.core.runtime;
        let sent = 1_000_000_000;
        let id = server_request_id(runtime, "s1", 7, 0, sent);
        let holds =
            |session: &str, id: &RequestId, now| is_server_request_id(runtime, session, id, now);
        assert!(holds("s1", &id, sent));
        assert!(
            holds("s1", &id, sent + 660_000),
            "within the wait and the skew"
        );
        assert!(!holds("s1", &id, sent + 660_001), "too old");
        assert!(!holds("s2", &id, sent), "another session's");
        let RequestId::String(text) = &id else {
            panic!("{id:?}")
        };
        // The time moved: the tag no longer holds.
        let (base, tag) = text.split_once('.').unwrap();
        let (head, _) = base.rsplit_once('-').unwrap();
        let moved = RequestId::String(format!("{head}-{:x}.{tag}", sent + 1_000));
        assert!(!holds("s1", &moved, sent + 1_000));
        let other = Server::builder(Implementation::new("t", "1"))
            .build()
            .unwrap();
        assert!(!is_server_request_id(&other.core.runtime, "s1", &id, sent));
        for made_up in ["wharf-0000000000000007-0-3b9aca00", "x.y", ""] {
            assert!(!holds("s1", &RequestId::String(made_up.into()), sent));
        }
        assert!(!holds("s1", &RequestId::Int(7), sent));
    }

    /// A DELETE is answered once the session's end is on the bus: a client's next request,
    /// on whichever replica, finds the end announced rather than racing it.
    #[tokio::test]
    async fn an_end_is_answered_once_it_is_announced() {
        use std::pin::Pin;
        use std::sync::{Arc, Mutex};

        use crate::bus::{BusError, ChangeEvent, InProcessBus, NotificationBus, SessionSignal};

        /// The in-process bus, with what was published kept in order.
        #[derive(Default)]
        struct Recording {
            bus: InProcessBus,
            published: Mutex<Vec<ChangeEvent>>,
        }
        impl NotificationBus for Recording {
            fn publish(
                &self,
                event: ChangeEvent,
            ) -> Pin<Box<dyn Future<Output = Result<(), BusError>> + Send + '_>> {
                Box::pin(async move {
                    // As a store's bus does, it answers after a round trip.
                    tokio::task::yield_now().await;
                    self.published.lock().unwrap().push(event.clone());
                    self.bus.publish(event).await
                })
            }
            fn subscribe(&self) -> tokio::sync::broadcast::Receiver<ChangeEvent> {
                self.bus.subscribe()
            }
        }

        let bus = Arc::new(Recording::default());
        let server = Server::builder(Implementation::new("t", "1"))
            .bus(bus.clone())
            .build()
            .unwrap();
        let init = init_params();
        let alice = Principal::new("alice").unwrap();
        let (session, _) = server
            .sessions()
            .initialize(RequestId::Int(1), Some(&init), &alice, Scope::Shared)
            .await
            .unwrap();
        server.sessions().end(&session).await.unwrap();
        let ended = ChangeEvent::Session {
            session: session.id().to_owned(),
            signal: SessionSignal::Ended,
        };
        assert!(
            bus.published.lock().unwrap().contains(&ended),
            "answered before the end was announced"
        );
    }

    /// What a 2025-11-25 client's `initialize` says.
    fn init_params() -> Box<RawValue> {
        RawValue::from_string(
            r#"{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"c","version":"1"}}"#.into(),
        )
        .unwrap()
    }

    /// A 2025-11-25 session alice opened on `server`, and alice.
    async fn alices_session(server: &Server) -> (crate::session::Session, Principal) {
        let alice = Principal::new("alice").unwrap();
        let (session, _) = server
            .sessions()
            .initialize(
                RequestId::Int(1),
                Some(&init_params()),
                &alice,
                Scope::Shared,
            )
            .await
            .unwrap();
        (session, alice)
    }

    /// A change of a session that ended meanwhile (the request read its session before the
    /// end) is answered as a request of an ended session: 404 over HTTP, so that its client
    /// initializes again. It was an error over 200, on which clients go on with the session.
    #[tokio::test]
    async fn a_change_of_a_session_ended_meanwhile_is_answered_as_ended() {
        let server = Server::builder(Implementation::new("t", "1"))
            .build()
            .unwrap();
        let sessions = server.sessions();
        let (mut session, alice) = alices_session(&server).await;
        sessions.end(&session).await.unwrap();
        let level = RawValue::from_string(r#"{"level":"debug"}"#.into()).unwrap();
        let Err(refused) = sessions
            .request(
                &mut session,
                RequestId::Int(2),
                "logging/setLevel",
                Some(&level),
                alice,
                crate::meta::TraceContext::default(),
            )
            .await
        else {
            panic!("an ended session's level was set");
        };
        assert_eq!(refused.error().kind, crate::ErrorKind::SessionEnded);
    }

    /// A session this process heard end is unknown from then on, though a copy read just
    /// before the end may still be at hand (here the book itself still holds it).
    #[tokio::test]
    async fn a_session_heard_to_end_is_not_resumed_from_a_copy() {
        let server = Server::builder(Implementation::new("t", "1"))
            .build()
            .unwrap();
        let sessions = server.sessions();
        let (session, alice) = alices_session(&server).await;
        server
            .core
            .runtime
            .hub
            .route(session.id(), crate::bus::SessionSignal::Ended);
        let resumed = sessions.resume(session.id(), &alice, None).await;
        assert!(matches!(resumed, Err(SessionError::Unknown)), "{resumed:?}");
    }

    /// A subscription needs what a read needs: refused without the resource's scopes, and
    /// counted as such a refusal, as a read is.
    #[tokio::test]
    async fn a_subscribe_without_the_resources_scopes_is_a_counted_refusal() {
        use crate::resource::resource;
        let server = Server::builder(Implementation::new("t", "1"))
            .resource(
                resource("notes://secret", "secret")
                    .scopes(&["notes:read"])
                    .handler(|_cx, _req| async { Ok(Vec::new()) }),
            )
            .metrics(true)
            .build()
            .unwrap();
        let sessions = server.sessions();
        let bob = crate::testing::oauth_user(&["other"]);
        let init = init_params();
        let (mut session, _) = sessions
            .initialize(RequestId::Int(1), Some(&init), &bob, Scope::Shared)
            .await
            .unwrap();
        let subscribe = async |session: &mut crate::session::Session, uri: &str| {
            let uri = RawValue::from_string(format!(r#"{{"uri":"{uri}"}}"#)).unwrap();
            sessions
                .request(
                    session,
                    RequestId::Int(2),
                    "resources/subscribe",
                    Some(&uri),
                    bob.clone(),
                    crate::meta::TraceContext::default(),
                )
                .await
        };
        // A URI is judged as the client wrote it: this one is no URI (its scheme would be
        // `notes` once its `%6E` were decoded).
        let Err(refused) = subscribe(&mut session, "%6Eotes://secret").await else {
            panic!("subscribed to no URI");
        };
        assert_eq!(refused.error().kind, crate::ErrorKind::InvalidParams);
        assert!(
            refused.error().message.contains("is not a URI"),
            "{:?}",
            refused.error()
        );
        let Err(refused) = subscribe(&mut session, "notes://secret").await else {
            panic!("subscribed without the scope");
        };
        assert_eq!(refused.error().kind, crate::ErrorKind::InsufficientScope);
        let text = server.encode_metrics().unwrap();
        assert!(
            text.contains("wharf_auth_refusals_total{reason=\"forbidden\"} 1\n"),
            "{text}"
        );
    }

    /// A session is kept alive by the requests that may go on, not by those refused for
    /// speaking another version.
    #[tokio::test]
    async fn a_request_refused_for_its_version_does_not_keep_the_session_alive() {
        let mut config = ServerConfig::default();
        // A touch is due once a twentieth of the idle time has passed: 50 ms here.
        config.legacy.session_idle = Duration::from_secs(1);
        let server = Server::builder(Implementation::new("t", "1"))
            .config(config)
            .build()
            .unwrap();
        let sessions = server.sessions();
        let principal = Principal::new("alice").unwrap();
        let params = init_params();
        let (session, _) = sessions
            .initialize(RequestId::Int(1), Some(&params), &principal, Scope::Shared)
            .await
            .unwrap();
        let opened_at = session.record.last_used_at;
        // Past the point where a use would be recorded.
        tokio::time::sleep(Duration::from_millis(80)).await;

        let refused = sessions
            .resume(session.id(), &principal, Some("2025-06-18"))
            .await
            .unwrap_err();
        assert!(
            matches!(&refused, SessionError::OtherVersion { sent, session }
                if sent == "2025-06-18" && session == "2025-11-25"),
            "{refused:?}"
        );
        let stored = server
            .core
            .runtime
            .sessions
            .session(session.id(), false)
            .await;
        let stored = stored.unwrap().unwrap();
        assert_eq!(
            stored.record.last_used_at, opened_at,
            "the refusal kept it alive"
        );

        let resumed = sessions
            .resume(session.id(), &principal, Some("2025-11-25"))
            .await
            .unwrap();
        assert!(
            resumed.record.last_used_at > opened_at,
            "a use keeps it alive"
        );
    }
}
