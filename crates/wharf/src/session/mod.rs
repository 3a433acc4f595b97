//! Legacy sessions: what `initialize` settled and what the client changed since
//! ([`Session`]), where sessions live ([`Book`]), and how what a client sends about a running
//! call reaches the replica running it ([`Hub`]).

mod book;
mod hub;

pub(crate) use book::{Book, CACHE_TTL, SessionCap};
pub(crate) use hub::{Delivery, Hub, Running, Waiter};

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use wharf_protocol::{ClientCapabilities, Implementation, LoggingLevel, version};

use crate::store::{HandleKind, HandleRecord, Millis, StoreError};

/// The kind sessions are stored as (handles, so that every backend keeps them with an
/// owner and an expiry, and the sweeper removes them).
pub(crate) struct SessionKind;

impl HandleKind for SessionKind {
    const KIND: &'static str = "mcp-session";
    const PREFIX: &'static str = "mcs";
    const CREATED_BY: &'static str = "initialize";
    // Both replaced from the configuration when a session is minted.
    const TTL: Duration = Duration::from_secs(24 * 3600);
    const IDLE_TTL: Option<Duration> = Some(Duration::from_secs(3600));
    // No `MAX_PER_OWNER`: the book caps sessions as the configuration says (`SessionCap`).
}

/// One client's session of the initialization-based era, as any replica reads it from the
/// shared store (or, on stdio, as the process keeps it). Cheap to clone: every request of
/// the session holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Session {
    pub(crate) record: Arc<HandleRecord>,
    pub(crate) state: Arc<SessionState>,
    /// Whether the session is in the server's book (HTTP), not only held by its transport
    /// (stdio).
    pub(crate) booked: bool,
}

/// What a session carries besides its handle: the version and capabilities `initialize`
/// settled, and what the client set since.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SessionState {
    pub(crate) version: String,
    pub(crate) capabilities: ClientCapabilities,
    pub(crate) client_info: Implementation,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) log_level: Option<LoggingLevel>,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub(crate) subscriptions: BTreeSet<String>,
}

impl Session {
    /// Reads a stored session; `Corrupt` when its record is not one this version wrote.
    /// The record keeps no copy of the state it was read into: every cached session would
    /// hold the client's capabilities twice.
    pub(crate) fn from_record(mut record: HandleRecord) -> Result<Self, StoreError> {
        let state: SessionState = record
            .data
            .take()
            .ok_or_else(|| StoreError::Corrupt(format!("session {} has no state", record.id)))
            .and_then(|d| {
                serde_json::from_value(d)
                    .map_err(|e| StoreError::Corrupt(format!("session {}: {e}", record.id)))
            })?;
        if !version::is_legacy(&state.version) {
            return Err(StoreError::Corrupt(format!(
                "session {} speaks {:?}",
                record.id, state.version
            )));
        }
        Ok(Session {
            record: Arc::new(record),
            state: Arc::new(state),
            booked: true,
        })
    }

    /// The record to store, its data brought up to date.
    pub(crate) fn to_record(&self) -> HandleRecord {
        let mut record = HandleRecord::clone(&self.record);
        record.data = serde_json::to_value(&*self.state).ok();
        record
    }

    /// The session id (`Mcp-Session-Id`).
    pub fn id(&self) -> &str {
        &self.record.id
    }

    /// The id of the principal that opened it.
    pub fn owner(&self) -> &str {
        &self.record.owner
    }

    /// The negotiated protocol version.
    pub fn version(&self) -> &str {
        &self.state.version
    }

    /// What the client said it can do.
    pub fn client_capabilities(&self) -> &ClientCapabilities {
        &self.state.capabilities
    }

    /// Who the client said it is.
    pub fn client_info(&self) -> &Implementation {
        &self.state.client_info
    }

    /// The least severe level the client wants log messages at, once it set one.
    pub fn log_level(&self) -> Option<LoggingLevel> {
        self.state.log_level
    }

    /// The resources the client subscribed to.
    pub fn subscriptions(&self) -> &BTreeSet<String> {
        &self.state.subscriptions
    }

    /// The state, to change (the clone every holder of the session shares is left alone).
    pub(crate) fn state_mut(&mut self) -> &mut SessionState {
        Arc::make_mut(&mut self.state)
    }

    /// Notes a use recorded at `now`.
    pub(crate) fn touched(&mut self, now: Millis) {
        Arc::make_mut(&mut self.record).last_used_at = now;
    }

    /// Whether it was last used long enough ago that a use should be recorded (at most
    /// once per twentieth of the idle lifetime, so a busy session is not a write per
    /// request).
    pub(crate) fn needs_touch(&self, now: Millis) -> bool {
        self.record
            .idle_ms
            .is_some_and(|idle| now.saturating_sub(self.record.last_used_at) >= idle / 20)
    }
}
