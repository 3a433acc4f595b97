//! What a server can be tuned with.

use std::time::Duration;

use wharf_protocol::CacheHints;

use crate::cursor::CursorKey;
use crate::limits::Limits;
use crate::mrtr::StateConfig;

/// Caching hints per kind of result.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct CachePolicy {
    /// For `server/discover`.
    pub discover: CacheHints,
    /// For `tools/list`.
    pub tools_list: CacheHints,
    /// For `prompts/list`.
    pub prompts_list: CacheHints,
    /// For `resources/list`.
    pub resources_list: CacheHints,
    /// For `resources/templates/list`.
    pub templates_list: CacheHints,
    /// Default for `resources/read` when a resource sets none.
    pub resource_read: CacheHints,
}

impl Default for CachePolicy {
    fn default() -> Self {
        let minute = CacheHints::public(Duration::from_secs(60));
        CachePolicy {
            discover: minute,
            tools_list: minute,
            prompts_list: minute,
            resources_list: minute,
            templates_list: minute,
            resource_read: CacheHints::private(Duration::ZERO),
        }
    }
}

/// Tunables of the core. Start from [`ServerConfig::default`] and change what you need.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    /// Items per page of a list.
    pub page_size: usize,
    /// A fixed key to sign cursors with. `None` (the default): the keys every replica on the
    /// store shares and rotates (see [`ServerConfig::key_rotation`]), or a random key of
    /// this process when there is no store.
    pub cursor_key: Option<CursorKey>,
    /// How often the shared keys rotate (cursor and request-state keys, when not fixed); a
    /// retired key still opens what it signed for as long as that lives.
    pub key_rotation: Duration,
    /// How long a cursor stays valid.
    pub cursor_max_age: Duration,
    /// Caching hints.
    pub cache: CachePolicy,
    /// How long an idempotency record (a write's first result) is kept for replays; longer
    /// than `max_call_duration` (a server with a store is not built otherwise: a record must
    /// outlive the call that writes it).
    pub idempotency_retention: Duration,
    /// Caps on requests in flight and the wait queue.
    pub limits: Limits,
    /// The longest a tool call may run; a tool's own limit can only be shorter.
    pub max_call_duration: Duration,
    /// Progress messages of one request go out at most once per this interval (bursts are
    /// coalesced; the last value is sent unless the client stopped reading).
    pub progress_interval: Duration,
    /// Sealing of multi-round request states (MRTR): keys, lifetime, round cap.
    pub request_state: StateConfig,
    /// Whether `tools/list` shows a principal limited by scopes (an OAuth token's, or one
    /// given [`Principal::with_scopes`](crate::Principal::with_scopes)) only the tools they
    /// permit (the list is then `cacheScope: "private"`); otherwise it shows every tool.
    pub list_permitted_tools_only: bool,
    /// Store-level mutation locks (PostgreSQL sessions, Redis leases) one principal may hold
    /// or wait for at once in this process; its other mutating calls wait in turn, so one
    /// principal cannot take every lock session of the store.
    pub max_store_locks_per_principal: usize,
    /// How clients of the initialization-based era are served.
    pub legacy: LegacyConfig,
}

/// How clients that open with `initialize` (2025-11-25, 2025-06-18, 2025-03-26) are served.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LegacyConfig {
    /// Whether they are served at all; when not, `initialize` is refused with an error that
    /// names the supported versions.
    pub enabled: bool,
    /// A session ends after going unused this long.
    pub session_idle: Duration,
    /// A session ends this long after `initialize`, however busy.
    pub session_lifetime: Duration,
    /// How long a call waits for the client to answer one round of its server requests
    /// (the rounds themselves are capped by [`StateConfig::max_rounds`]); never past the
    /// expiry of the round's state ([`StateConfig::max_age`]), less a moment for the next
    /// round to begin.
    pub input_timeout: Duration,
    /// Sessions one authenticated principal may hold open at once. Opening one more ends
    /// its least recently used sessions (their clients hear 404 and open new ones, as the
    /// 2025-11-25 transport has them do), so that sessions clients abandoned without a
    /// DELETE never lock the principal out until they idle out. One opening ends at most
    /// 16, so a cap lowered under what a principal holds is reached over several openings;
    /// 0 is taken as 1.
    pub max_sessions_per_principal: u64,
    /// Sessions open at once for anonymous callers, all of them together: they share one
    /// principal, so the cap each authenticated principal has would hold them all to it,
    /// and no cap would let them fill the store (or the process) and shut everyone else
    /// out. Past it, `initialize` answers "busy, retry" until sessions end or expire.
    pub max_anonymous_sessions: u64,
    /// Messages one JSON-RPC batch may hold (2025-03-26 sessions, the one revision with
    /// batches): the calls of a batch run side by side, so this bounds what one HTTP
    /// request (or stdio line) sets running. A longer batch is refused whole.
    pub max_batch: usize,
}

impl Default for LegacyConfig {
    fn default() -> Self {
        LegacyConfig {
            enabled: true,
            session_idle: Duration::from_secs(3600),
            session_lifetime: Duration::from_secs(24 * 3600),
            input_timeout: Duration::from_secs(600),
            max_sessions_per_principal: 1_000,
            max_anonymous_sessions: 5_000,
            max_batch: 64,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            page_size: 100,
            cursor_key: None,
            key_rotation: Duration::from_secs(24 * 3600),
            cursor_max_age: Duration::from_secs(3600),
            cache: CachePolicy::default(),
            idempotency_retention: Duration::from_secs(24 * 3600),
            limits: Limits::default(),
            max_call_duration: Duration::from_secs(300),
            progress_interval: Duration::from_millis(20),
            request_state: StateConfig::default(),
            list_permitted_tools_only: false,
            max_store_locks_per_principal: 8,
            legacy: LegacyConfig::default(),
        }
    }
}
