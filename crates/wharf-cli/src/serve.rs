//! `wharf serve`.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use base64::Engine as _;
use clap::{Args, ValueEnum};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use wharf::store::Store;
use wharf::{CursorKey, Server, ServerConfig};
use wharf_auth::{ApiKeys, Auth, Secret};
use wharf_http::{HostPolicy, HttpConfig, ReadinessCheck};
use wharf_reference::Profile;
use wharf_stdio::StdioConfig;
use wharf_store::StoreOptions;

use crate::signals;
use crate::telemetry::{self, LogFormat, MetricsPush};

/// Options of `wharf serve`; each can also come from the environment.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "WHARF_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Serve over stdin/stdout instead of HTTP.
    #[arg(long)]
    stdio: bool,
    /// Serve Prometheus metrics at `GET /metrics` on this address (keep it off the public
    /// listener). Without it, or an OTLP metrics endpoint to push to, nothing is counted.
    #[arg(long, env = "WHARF_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// How log lines on stderr are written: `text`, or `json` (one object per line, with
    /// the trace id of the request it belongs to).
    #[arg(long, env = "WHARF_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Which tool set to expose.
    #[arg(long, env = "WHARF_PROFILE", value_enum, default_value_t = ProfileArg::Default)]
    profile: ProfileArg,
    /// Path of the MCP endpoint.
    #[arg(long, env = "WHARF_ENDPOINT", default_value = "/mcp", value_parser = endpoint_path)]
    endpoint: String,
    /// An allowed browser Origin (`scheme://host[:port]`, as a browser sends it; a path,
    /// `null`, `file:` or an empty item is refused); repeatable. Localhost is always allowed;
    /// a named origin's pages may also read the answers (CORS), at the endpoint and the
    /// authorization server's API, not its sign-in and account pages.
    #[arg(
        long = "allowed-origin",
        env = "WHARF_ALLOWED_ORIGINS",
        value_delimiter = ',',
        value_parser = browser_origin
    )]
    allowed_origins: Vec<String>,
    /// An allowed Host name besides localhost (a name or an address, no port: any port of
    /// it is allowed); repeatable. `*` accepts any host.
    #[arg(
        long = "allowed-host",
        env = "WHARF_ALLOWED_HOSTS",
        value_delimiter = ',',
        value_parser = host_name
    )]
    allowed_hosts: Vec<String>,
    /// Base64 key that signs list cursors, instead of the keys replicas share (and rotate)
    /// through their store; give every replica the same one.
    #[arg(long, env = "WHARF_CURSOR_KEY", hide_env_values = true)]
    cursor_key: Option<Secret>,
    /// Key that seals multi-round request states, `KID=BASE64` (32 bytes), instead of the
    /// keys replicas share (and rotate) through their store; repeat it to rotate by hand: the
    /// first seals, all open. Give every replica the same keys.
    #[arg(
        long = "state-key",
        env = "WHARF_STATE_KEYS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    state_keys: Vec<Secret>,
    /// Hours between rotations of the keys replicas share through their store.
    #[arg(
        long,
        env = "WHARF_KEY_ROTATION_HOURS",
        default_value_t = 24,
        value_parser = positive::<u64>(),
    )]
    key_rotation_hours: u64,
    /// How long a multi-round request state stays valid, in seconds.
    #[arg(
        long,
        env = "WHARF_STATE_MAX_AGE_SECS",
        default_value_t = 600,
        value_parser = positive::<u64>(),
    )]
    state_max_age_secs: u64,
    /// The most rounds of input one request may take.
    #[arg(
        long,
        env = "WHARF_MAX_INPUT_ROUNDS",
        default_value_t = 8,
        value_parser = positive::<u32>(),
    )]
    max_input_rounds: u32,
    /// Serve only stateless 2026-07-28 clients: `initialize` is refused with the supported
    /// versions, instead of opening a legacy session.
    #[arg(long, env = "WHARF_MODERN_ONLY")]
    modern_only: bool,
    /// Minutes a legacy session lives unused (sessions live in the store, shared by replicas).
    #[arg(
        long,
        env = "WHARF_SESSION_IDLE_MINS",
        default_value_t = 60,
        value_parser = positive::<u64>(),
    )]
    session_idle_mins: u64,
    /// Legacy sessions one authenticated principal may hold open at once; its `initialize`
    /// past that ends its least recently used sessions (their clients get 404 and open new
    /// ones).
    #[arg(
        long,
        env = "WHARF_MAX_SESSIONS_PER_PRINCIPAL",
        default_value_t = 1_000,
        value_parser = positive::<u64>(),
    )]
    max_sessions_per_principal: u64,
    /// Legacy sessions open at once for anonymous callers, all together (they share one
    /// principal); past it their `initialize` answers 503 until sessions end or expire.
    #[arg(
        long,
        env = "WHARF_MAX_ANONYMOUS_SESSIONS",
        default_value_t = 5_000,
        value_parser = positive::<u64>(),
    )]
    max_anonymous_sessions: u64,
    /// Seconds a legacy call waits for the client to answer its server requests (and never
    /// past the expiry of the round's request state, --state-max-age-secs).
    #[arg(
        long,
        env = "WHARF_INPUT_TIMEOUT_SECS",
        default_value_t = 600,
        value_parser = positive::<u64>(),
    )]
    input_timeout_secs: u64,
    /// Largest request body in bytes.
    #[arg(
        long,
        env = "WHARF_MAX_BODY_BYTES",
        default_value_t = 1024 * 1024,
        value_parser = positive::<usize>(),
    )]
    max_body_bytes: usize,
    /// Deepest JSON nesting accepted, up to 127 (the JSON parser's own limit).
    #[arg(
        long,
        env = "WHARF_MAX_JSON_DEPTH",
        default_value_t = 64,
        value_parser = positive::<usize>().range(1..=wharf_protocol::jsonrpc::MAX_DEPTH_LIMIT as u64),
    )]
    max_json_depth: usize,
    /// Largest total size of request headers in bytes.
    #[arg(
        long,
        env = "WHARF_MAX_HEADER_BYTES",
        default_value_t = 16 * 1024,
        value_parser = positive::<usize>(),
    )]
    max_header_bytes: usize,
    /// Header fields per request at most (431 beyond).
    #[arg(
        long,
        env = "WHARF_MAX_HEADERS",
        default_value_t = 100,
        value_parser = positive::<usize>(),
    )]
    max_headers: usize,
    /// Seconds a connection has to send a complete request head, from accept and again after
    /// each response: a client trickling headers is dropped, and so is a kept-alive connection
    /// idle this long (keep a proxy's upstream keep-alive timeout below it).
    #[arg(
        long,
        env = "WHARF_HEADER_READ_SECS",
        default_value_t = 30,
        value_parser = positive::<u64>(),
    )]
    header_read_secs: u64,
    /// Seconds a request has to send its whole body once its headers are in (408 after).
    #[arg(
        long,
        env = "WHARF_BODY_READ_SECS",
        default_value_t = 30,
        value_parser = positive::<u64>(),
    )]
    body_read_secs: u64,
    /// Open connections at most; beyond, a new connection is closed at once (a proxy that
    /// has not sent its request yet tries another replica; one that has answers 502: keep
    /// a proxy's connections to a replica below this).
    #[arg(
        long,
        env = "WHARF_MAX_CONNECTIONS",
        default_value_t = 16_384,
        value_parser = positive::<usize>(),
    )]
    max_connections: usize,
    /// Items per page of a list.
    #[arg(long, env = "WHARF_PAGE_SIZE", default_value_t = 100, value_parser = positive::<usize>())]
    page_size: usize,
    /// Seconds between keep-alive comments on streamed answers.
    #[arg(
        long,
        env = "WHARF_KEEP_ALIVE_SECS",
        default_value_t = 15,
        value_parser = positive::<u64>(),
    )]
    keep_alive_secs: u64,
    /// Seconds the server keeps accepting after SIGTERM/SIGINT while `/readyz` answers 503
    /// (and responses close their connections), so load balancers move traffic away before
    /// it stops accepting. Connections still idle when it ends are closed: keep a proxy's
    /// upstream keep-alive below it. A second signal skips the rest of it.
    #[arg(long, env = "WHARF_DRAIN_GRACE_SECS", default_value_t = 5)]
    drain_grace_secs: u64,
    /// Seconds in-flight requests get to finish once the server stops accepting.
    #[arg(long, env = "WHARF_DRAIN_SECS", default_value_t = 10)]
    drain_secs: u64,
    /// Worker threads (default: the CPUs this process may use).
    #[arg(long, env = "WHARF_WORKERS", value_parser = positive::<usize>())]
    workers: Option<usize>,
    /// Where handles, idempotency records, legacy sessions and data live: sqlite://PATH,
    /// postgres://…, redis://… (default sqlite://./wharf.db). Profiles without state of
    /// their own open a store only when given one; their legacy sessions then live in it
    /// (shared by replicas) instead of in the process. (A URL may hold a password: printed,
    /// it shows only that it is set.)
    #[arg(long, env = "WHARF_STORE", hide_env_values = true)]
    store: Option<Secret>,
    /// An API key, `PRINCIPAL=TOKEN`, sent by clients as `Authorization: Bearer TOKEN`;
    /// repeatable. WHARF_API_KEYS takes a comma-separated list.
    #[arg(
        long = "api-key",
        env = "WHARF_API_KEYS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    api_keys: Vec<Secret>,
    /// A file of `PRINCIPAL=TOKEN` lines (`#` starts a comment).
    #[arg(long, env = "WHARF_API_KEYS_FILE")]
    api_keys_file: Option<std::path::PathBuf>,
    /// Serve without authentication: every request acts for one anonymous principal, and
    /// handles are bearer capabilities.
    #[arg(long, env = "WHARF_ANONYMOUS")]
    anonymous: bool,
    /// Act as an OAuth 2.1 resource server for tokens of this issuer (instead of API keys).
    #[arg(long, env = "WHARF_OAUTH_ISSUER", value_parser = secure_url)]
    oauth_issuer: Option<String>,
    /// Run an OAuth 2.1 authorization server on this origin and accept its tokens: users
    /// sign in with accounts added by `wharf user add`, clients identify with Client ID
    /// Metadata Documents or register (RFC 7591). Every record lives in the store.
    #[arg(long, env = "WHARF_AUTHORIZATION_SERVER")]
    authorization_server: bool,
    /// The origin clients reach this server at (`https://mcp.example.com`, no path): the
    /// issuer of the authorization server. Default: `http://` and the listen address.
    #[arg(long, env = "WHARF_PUBLIC_URL", value_parser = public_origin)]
    public_url: Option<String>,
    /// Another resource server (its canonical URI) the authorization server issues tokens
    /// for, besides this one; repeatable.
    #[arg(
        long = "authz-resource",
        env = "WHARF_AUTHZ_RESOURCES",
        value_delimiter = ','
    )]
    authz_resources: Vec<String>,
    /// A network of proxies in front of the server (`10.0.0.0/8`, `127.0.0.1/32`);
    /// repeatable. The authorization server's rate limits count a request from one against
    /// the client its `X-Forwarded-For` names; without, every client behind a proxy shares
    /// the proxy's budget.
    #[arg(
        long = "trusted-proxy",
        env = "WHARF_TRUSTED_PROXIES",
        value_delimiter = ','
    )]
    trusted_proxies: Vec<ipnet::IpNet>,
    /// Refuse Dynamic Client Registration: clients then identify with Client ID Metadata
    /// Documents only.
    #[arg(long, env = "WHARF_AUTHZ_CLOSED_REGISTRATION")]
    authz_closed_registration: bool,
    /// A PEM root certificate to trust when fetching Client ID Metadata Documents (a
    /// private certificate authority), besides the public ones.
    #[arg(long, env = "WHARF_AUTHZ_DOCUMENT_ROOT_CERT")]
    authz_document_root_cert: Option<std::path::PathBuf>,
    /// An upstream OpenID provider people may sign in with (its issuer), besides the local
    /// accounts; this server is its client, redirecting to `/authorize/upstream/callback`.
    #[arg(
        long,
        env = "WHARF_AUTHZ_UPSTREAM_ISSUER",
        requires = "authz_upstream_client_id",
        value_parser = secure_url
    )]
    authz_upstream_issuer: Option<String>,
    /// This server's client id at the upstream provider.
    #[arg(long, env = "WHARF_AUTHZ_UPSTREAM_CLIENT_ID")]
    authz_upstream_client_id: Option<String>,
    /// This server's client secret at the upstream provider (HTTP Basic), if confidential.
    #[arg(
        long,
        env = "WHARF_AUTHZ_UPSTREAM_CLIENT_SECRET",
        hide_env_values = true
    )]
    authz_upstream_client_secret: Option<Secret>,
    /// The key that seals the authorization server's token-signing keys in the store: 32
    /// bytes in base64 (`openssl rand -base64 32`), the same on every replica. Without it,
    /// anyone who can read the store (or a backup) can sign tokens. Keys stored in plain
    /// before are sealed when the server starts.
    #[arg(long, env = "WHARF_AUTHZ_KEY_ENCRYPTION_KEY", hide_env_values = true)]
    authz_key_encryption_key: Option<Secret>,
    /// A key encryption key being replaced by `--authz-key-encryption-key` (repeatable;
    /// the environment variable takes a comma-separated list): what it sealed still opens,
    /// and is sealed again with the new key when the server starts.
    #[arg(
        long = "authz-retired-key-encryption-key",
        env = "WHARF_AUTHZ_RETIRED_KEY_ENCRYPTION_KEYS",
        value_delimiter = ',',
        hide_env_values = true,
        requires = "authz_key_encryption_key"
    )]
    authz_retired_key_encryption_keys: Vec<Secret>,
    /// The provider's name on the sign-in button, and the prefix of its users' names here.
    #[arg(long, env = "WHARF_AUTHZ_UPSTREAM_NAME", default_value = "OpenID")]
    authz_upstream_name: String,
    /// Seconds after a refresh token is spent during which the same token request, sent
    /// again, gets the same tokens back (a client whose answer was lost retries), as long as
    /// the client has not used the new refresh token; any other second use revokes the
    /// grant. Meanwhile a copy of the spent token, in other hands, gets them too: at most
    /// 300. 0: every second use revokes.
    #[arg(
        long,
        env = "WHARF_AUTHZ_REFRESH_RETRY_SECS",
        default_value_t = 60,
        value_parser = clap::value_parser!(u64).range(0..=300)
    )]
    authz_refresh_retry_secs: u64,
    /// Fetch Client ID Metadata Documents from loopback addresses too. For tests only: it
    /// lets any client make the server call itself.
    #[arg(long, hide = true)]
    authz_allow_loopback_documents: bool,
    /// This server's canonical resource URI (the public URL of its MCP endpoint): the
    /// audience tokens must carry and the `resource` of its metadata. Default: the listen
    /// address and endpoint over http.
    #[arg(long, env = "WHARF_OAUTH_RESOURCE", value_parser = resource_uri)]
    oauth_resource: Option<String>,
    /// An accepted audience (repeatable): the list replaces the default, the resource URI.
    #[arg(
        long = "oauth-audience",
        env = "WHARF_OAUTH_AUDIENCES",
        value_delimiter = ','
    )]
    oauth_audiences: Vec<String>,
    /// Check tokens by introspection (RFC 7662) at this URL instead of as JWTs.
    #[arg(long, env = "WHARF_OAUTH_INTROSPECTION_URL", value_parser = secure_url)]
    oauth_introspection_url: Option<String>,
    /// Client id for introspection.
    #[arg(long, env = "WHARF_OAUTH_CLIENT_ID", default_value = "")]
    oauth_client_id: String,
    /// Client secret for introspection.
    #[arg(
        long,
        env = "WHARF_OAUTH_CLIENT_SECRET",
        default_value = "",
        hide_env_values = true
    )]
    oauth_client_secret: Secret,
    /// Seconds an introspection answer is cached (never past the token's expiry).
    #[arg(
        long,
        env = "WHARF_OAUTH_INTROSPECTION_CACHE_SECS",
        default_value_t = 30
    )]
    oauth_introspection_cache_secs: u64,
    /// Introspection requests in flight at once, at most, for tokens not seen yet (each costs
    /// one); re-checks of tokens accepted before have as many of their own.
    #[arg(
        long,
        env = "WHARF_OAUTH_INTROSPECTION_MAX_IN_FLIGHT",
        default_value_t = 32,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    oauth_introspection_max_in_flight: u32,
    /// Introspection requests started per second, at most, on average, for tokens not seen
    /// yet, and as many for re-checks of tokens accepted before; a check waits up to two
    /// seconds for its turn, then gets 503.
    #[arg(
        long,
        env = "WHARF_OAUTH_INTROSPECTION_PER_SECOND",
        default_value_t = 200,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    oauth_introspection_per_second: u32,
    /// The issuer's JWKS URL, when its metadata does not give one.
    #[arg(long, env = "WHARF_OAUTH_JWKS_URI", value_parser = secure_url)]
    oauth_jwks_uri: Option<String>,
    /// A token with an unknown key id (or without one, that no known key verifies) fetches
    /// the JWKS again at most once per this many seconds
    /// (0: every such token fetches; for tests, since a flood of made-up key ids then reaches
    /// the issuer).
    #[arg(long, env = "WHARF_OAUTH_JWKS_MIN_REFRESH_SECS", default_value_t = 60)]
    oauth_jwks_min_refresh_secs: u64,
    /// Seconds a fetched JWKS is trusted before it is fetched again: a key the issuer
    /// withdrew is refused within this long (while the issuer cannot be reached, its last
    /// keys stand). At least --oauth-jwks-min-refresh-secs.
    #[arg(
        long,
        env = "WHARF_OAUTH_JWKS_MAX_AGE_SECS",
        default_value_t = 3600,
        value_parser = positive::<u64>(),
    )]
    oauth_jwks_max_age_secs: u64,
    /// Clock skew tolerated on exp and nbf, in seconds.
    #[arg(
        long,
        env = "WHARF_OAUTH_LEEWAY_SECS",
        default_value_t = 30,
        value_parser = clap::value_parser!(u64).range(0..=300)
    )]
    oauth_leeway_secs: u64,
    /// Scopes advertised in the protected resource metadata (repeatable).
    #[arg(
        long = "oauth-scope-supported",
        env = "WHARF_OAUTH_SCOPES_SUPPORTED",
        value_delimiter = ','
    )]
    oauth_scopes_supported: Vec<String>,
    /// A scope every request needs (repeatable).
    #[arg(
        long = "oauth-required-scope",
        env = "WHARF_OAUTH_REQUIRED_SCOPES",
        value_delimiter = ','
    )]
    oauth_required_scopes: Vec<String>,
    /// Store-level mutation locks (PostgreSQL sessions, Redis leases) one principal may hold
    /// or wait for at once in this process; keep it below the store's connections.
    #[arg(
        long,
        env = "WHARF_MAX_STORE_LOCKS_PER_PRINCIPAL",
        default_value_t = 8,
        value_parser = positive::<usize>(),
    )]
    max_store_locks_per_principal: usize,
    /// tools/list shows a token only the tools its scopes permit (then `cacheScope: private`).
    #[arg(long, env = "WHARF_LIST_PERMITTED_TOOLS_ONLY")]
    list_permitted_tools_only: bool,
    /// Hours an idempotent write's first result is kept for replays (with a store, longer
    /// than --max-call-secs: a record must outlive the call that writes it).
    #[arg(
        long,
        env = "WHARF_IDEMPOTENCY_RETENTION_HOURS",
        default_value_t = 24,
        value_parser = positive::<u64>(),
    )]
    idempotency_retention_hours: u64,
    /// Seconds a write waits for a duplicate still running before answering "busy, retry".
    #[arg(
        long,
        env = "WHARF_LOCK_WAIT_SECS",
        default_value_t = 10,
        value_parser = positive::<u64>(),
    )]
    lock_wait_secs: u64,
    /// Requests running at once (unlimited if unset); beyond it they queue.
    #[arg(long, env = "WHARF_MAX_IN_FLIGHT", value_parser = positive::<usize>())]
    max_in_flight: Option<usize>,
    /// Requests that may wait for a slot; beyond it, 503 with Retry-After at once.
    #[arg(long, env = "WHARF_MAX_QUEUE", default_value_t = 256)]
    max_queue: usize,
    /// Requests running at once per principal; beyond it, 503 at once (anonymous requests
    /// share one id, so this cap leaves them to --max-in-flight).
    #[arg(long, env = "WHARF_MAX_PER_PRINCIPAL", value_parser = positive::<usize>())]
    max_per_principal: Option<usize>,
    /// `subscriptions/listen` streams one principal may hold open; beyond it, 503 at once
    /// (not applied to anonymous streams: --max-listen-streams bounds them).
    #[arg(
        long,
        env = "WHARF_MAX_LISTEN_PER_PRINCIPAL",
        default_value_t = 32,
        value_parser = positive::<usize>(),
    )]
    max_listen_per_principal: usize,
    /// `subscriptions/listen` streams open at once, server-wide; beyond it, 503 at once.
    #[arg(
        long,
        env = "WHARF_MAX_LISTEN_STREAMS",
        default_value_t = 10_000,
        value_parser = positive::<usize>(),
    )]
    max_listen_streams: usize,
    /// Longest a tool call may run, in seconds; then it is stopped (504, -31002).
    #[arg(
        long,
        env = "WHARF_MAX_CALL_SECS",
        default_value_t = 300,
        value_parser = positive::<u64>(),
    )]
    max_call_secs: u64,
    /// Milliseconds between two progress messages of one request (bursts are coalesced;
    /// the last value is sent unless the client stopped reading).
    #[arg(long, env = "WHARF_PROGRESS_INTERVAL_MS", default_value_t = 20)]
    progress_interval_ms: u64,
    /// Seconds between sweeps of expired handles and records.
    #[arg(long, env = "WHARF_SWEEP_SECS", default_value_t = 60, value_parser = positive::<u64>())]
    sweep_secs: u64,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ProfileArg {
    Default,
    Demo,
    Conformance,
}

impl From<ProfileArg> for Profile {
    fn from(p: ProfileArg) -> Self {
        match p {
            ProfileArg::Default => Profile::Default,
            ProfileArg::Demo => Profile::Demo,
            ProfileArg::Conformance => Profile::Conformance,
        }
    }
}

/// Runs `wharf serve`; exits 0 after a graceful shutdown.
pub(crate) fn run(args: ServeArgs) -> ExitCode {
    if let Err(e) = one_way_to_authenticate(&args) {
        eprintln!("wharf: {e}");
        return ExitCode::from(2);
    }
    let telemetry = match telemetry::init(args.log_format) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("wharf: {e}");
            return ExitCode::FAILURE;
        }
    };
    let workers = args
        .workers
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    // With one CPU a work-stealing scheduler is pure overhead: run everything on one thread.
    let built = if workers <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
    };
    let runtime = match built {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("wharf: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let served = runtime.block_on(serve(args, telemetry.metrics_push()));
    // A write to stdout runs on a blocking thread, which a client that stopped reading
    // leaves stuck: the runtime does not wait on it for ever.
    runtime.shutdown_timeout(Duration::from_secs(2));
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wharf: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Options given that the way this server serves does not use. Said on stderr, not
/// refused (a shared environment may set them for other replicas), but said: an option
/// that looks in force and does nothing (`--oauth-required-scope` beside API keys) misleads
/// more than a missing one.
fn unused_options(args: &ServeArgs) -> Vec<&'static str> {
    let keys = !args.api_keys.is_empty() || args.api_keys_file.is_some();
    let (stdio, authz) = (args.stdio, args.authorization_server && !args.stdio);
    let oauth = authz || (args.oauth_issuer.is_some() && !stdio);
    let upstream = authz && args.authz_upstream_issuer.is_some();
    [
        ("--api-key/--api-keys-file", keys && stdio),
        ("--oauth-issuer", args.oauth_issuer.is_some() && stdio),
        ("--authorization-server", args.authorization_server && stdio),
        ("--metrics-listen", args.metrics_listen.is_some() && stdio),
        ("--oauth-resource", args.oauth_resource.is_some() && !oauth),
        (
            "--oauth-audience",
            !args.oauth_audiences.is_empty() && !oauth,
        ),
        (
            "--oauth-introspection-url",
            args.oauth_introspection_url.is_some() && !oauth,
        ),
        // Only introspection authenticates this server at the issuer.
        ("--oauth-client-id/--oauth-client-secret", {
            let given = !args.oauth_client_id.is_empty() || !args.oauth_client_secret.is_empty();
            let introspecting = oauth && args.oauth_introspection_url.is_some();
            given && !introspecting
        }),
        // Only tokens carry scopes to filter by.
        (
            "--list-permitted-tools-only",
            args.list_permitted_tools_only && !oauth,
        ),
        ("--oauth-jwks-uri", args.oauth_jwks_uri.is_some() && !oauth),
        (
            "--oauth-scope-supported",
            !args.oauth_scopes_supported.is_empty() && !oauth,
        ),
        (
            "--oauth-required-scope",
            !args.oauth_required_scopes.is_empty() && !oauth,
        ),
        ("--public-url", args.public_url.is_some() && !authz),
        (
            "--trusted-proxy",
            !args.trusted_proxies.is_empty() && !authz,
        ),
        (
            "--authz-resource",
            !args.authz_resources.is_empty() && !authz,
        ),
        (
            "--authz-closed-registration",
            args.authz_closed_registration && !authz,
        ),
        (
            "--authz-document-root-cert",
            args.authz_document_root_cert.is_some() && !authz,
        ),
        (
            "--authz-upstream-issuer",
            args.authz_upstream_issuer.is_some() && !authz,
        ),
        (
            "--authz-upstream-client-id",
            args.authz_upstream_client_id.is_some() && !upstream,
        ),
        (
            "--authz-upstream-client-secret",
            args.authz_upstream_client_secret.is_some() && !upstream,
        ),
        (
            "--authz-key-encryption-key",
            args.authz_key_encryption_key.is_some() && !authz,
        ),
    ]
    .into_iter()
    .filter_map(|(name, unused)| unused.then_some(name))
    .collect()
}

/// The ways to authenticate exclude each other. Checked on their values, not by clap: clap
/// counts a switch set to `false` in the environment (`WHARF_ANONYMOUS=false`) as given.
fn one_way_to_authenticate(args: &ServeArgs) -> Result<(), String> {
    let keys = !args.api_keys.is_empty() || args.api_keys_file.is_some();
    let chosen: Vec<&str> = [
        ("--anonymous", args.anonymous),
        ("--api-key/--api-keys-file", keys),
        ("--oauth-issuer", args.oauth_issuer.is_some()),
        ("--authorization-server", args.authorization_server),
    ]
    .into_iter()
    .filter_map(|(name, on)| on.then_some(name))
    .collect();
    match chosen.as_slice() {
        [_, _, ..] => Err(format!(
            "{} cannot be used together: choose one way to authenticate",
            chosen.join(" and ")
        )),
        _ => Ok(()),
    }
}

/// How HTTP requests authenticate (an explicit choice, never a silent default); `scopes` are
/// those the server's definitions use, which the protected resource metadata lists unless
/// `--oauth-scope-supported` says otherwise.
fn auth(
    args: &ServeArgs,
    scopes: &[String],
    authz: Option<&wharf_authz::AuthorizationServer>,
    keys: Option<ApiKeys>,
) -> anyhow::Result<Auth> {
    if args.anonymous {
        return Ok(Auth::anonymous());
    }
    let embedded = args.authorization_server.then(|| public_url(args));
    if let Some(issuer) = args.oauth_issuer.as_ref().or(embedded.as_ref()) {
        let resource = args
            .oauth_resource
            .clone()
            .unwrap_or_else(|| match &embedded {
                Some(issuer) => format!("{issuer}{}", args.endpoint),
                None => format!("http://{}{}", args.listen, args.endpoint),
            });
        let validation = match &args.oauth_introspection_url {
            Some(endpoint) => wharf_auth::Validation::Introspection {
                endpoint: endpoint.clone(),
                client_id: args.oauth_client_id.clone(),
                client_secret: args.oauth_client_secret.clone(),
                cache_ttl: Duration::from_secs(args.oauth_introspection_cache_secs),
                limits: wharf_auth::IntrospectionLimits::new(
                    args.oauth_introspection_max_in_flight as usize,
                    args.oauth_introspection_per_second,
                ),
            },
            None => {
                anyhow::ensure!(
                    args.oauth_jwks_max_age_secs >= args.oauth_jwks_min_refresh_secs,
                    "--oauth-jwks-max-age-secs ({}) must be at least --oauth-jwks-min-refresh-secs ({}): the key set cannot be fetched more often than that",
                    args.oauth_jwks_max_age_secs,
                    args.oauth_jwks_min_refresh_secs
                );
                let min_refresh = Duration::from_secs(args.oauth_jwks_min_refresh_secs);
                let max_age = Duration::from_secs(args.oauth_jwks_max_age_secs);
                match (authz, &args.oauth_jwks_uri) {
                    // The embedded server's keys are read in-process: the public URL may not
                    // lead back here (a proxy, TLS in front), nor may the listen address
                    // over plain HTTP.
                    (Some(authz), None) => wharf_auth::Validation::Published {
                        keys: authz.published_keys(),
                        min_refresh,
                        max_age,
                    },
                    (_, jwks_uri) => wharf_auth::Validation::Jwt {
                        jwks_uri: jwks_uri.clone(),
                        min_refresh,
                        max_age,
                    },
                }
            }
        };
        let mut rs = wharf_auth::OAuthConfig::new(resource, issuer.clone(), validation);
        rs.audiences = args.oauth_audiences.clone();
        rs.scopes_supported = offered_scopes(args, scopes);
        rs.required_scopes = args.oauth_required_scopes.clone();
        rs.leeway = Duration::from_secs(args.oauth_leeway_secs);
        let rs = wharf_auth::OAuth::new(rs).with_context(|| match &args.oauth_issuer {
            Some(_) => "--oauth-issuer".to_owned(),
            None => format!(
                "--authorization-server, whose issuer is {issuer} (--public-url, else the listen address)"
            ),
        })?;
        // The embedded authorization server's revoked families stop their access tokens.
        let rs = match authz {
            Some(authz) => rs.with_revocations(authz.revocations()),
            None => rs,
        };
        return Ok(Auth::oauth(rs));
    }
    keys.map(Auth::api_keys)
        .context("no API keys were read for a server that authenticates with them")
}

/// The scopes tokens may carry here: `--oauth-scope-supported` when given, else every scope
/// a token may need, the server-wide required ones first, then those the definitions use.
fn offered_scopes(args: &ServeArgs, scopes: &[String]) -> Vec<String> {
    if !args.oauth_scopes_supported.is_empty() {
        return args.oauth_scopes_supported.clone();
    }
    let mut all = args.oauth_required_scopes.clone();
    for scope in scopes {
        if !all.contains(scope) {
            all.push(scope.clone());
        }
    }
    all
}

/// Introspection authenticates this server at the issuer (RFC 7662 §2.1): without its
/// client id and secret every token would be answered 503. Said before the store opens, as
/// the resource server's setup would say it after.
fn introspection_client(args: &ServeArgs) -> anyhow::Result<()> {
    let oauth = args.oauth_issuer.is_some() || args.authorization_server;
    if args.stdio || args.anonymous || !oauth || args.oauth_introspection_url.is_none() {
        return Ok(());
    }
    anyhow::ensure!(
        !args.oauth_client_id.trim().is_empty()
            && !args.oauth_client_secret.expose().trim().is_empty(),
        "--oauth-introspection-url needs --oauth-client-id and --oauth-client-secret: the issuer's introspection endpoint authenticates this server (RFC 7662 §2.1)"
    );
    Ok(())
}

/// The API keys, when requests authenticate with them: read before the store is opened,
/// so a missing file or no credentials at all is said before anything is touched.
fn api_keys(args: &ServeArgs) -> anyhow::Result<Option<ApiKeys>> {
    if args.stdio || args.anonymous || args.oauth_issuer.is_some() || args.authorization_server {
        return Ok(None);
    }
    let mut keys = ApiKeys::parse(args.api_keys.iter().map(Secret::expose))?;
    if let Some(path) = &args.api_keys_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read --api-keys-file {}", path.display()))?;
        keys = keys.merge(ApiKeys::parse_file(&text)?)?;
    }
    anyhow::ensure!(
        !keys.is_empty(),
        "no credentials configured: give --api-key PRINCIPAL=TOKEN (or --api-keys-file PATH), --oauth-issuer URL, or --anonymous to serve without authentication"
    );
    Ok(Some(keys))
}

/// The paths the server serves besides its MCP endpoint (health, the authorization
/// server's pages and API): the endpoint may be none of them.
const OTHER_PATHS: [&str; 14] = [
    "/healthz",
    "/readyz",
    "/authorize",
    "/authorize/consent",
    "/authorize/login",
    "/authorize/upstream",
    "/authorize/upstream/callback",
    "/token",
    "/register",
    "/revoke",
    "/jwks",
    "/account",
    "/account/signout",
    "/account/consents/revoke",
];

/// `--endpoint`: a path (`/` first), of plain segments, that the server does not serve
/// for something else; refused when the command line is read (axum would panic at start,
/// the store opened already).
fn endpoint_path(value: &str) -> anyhow::Result<String> {
    wharf_http::check_endpoint(value)?;
    if OTHER_PATHS.contains(&value) {
        anyhow::bail!("{value:?} is a path the server serves something else at: choose another");
    }
    Ok(value.to_owned())
}

/// `--oauth-resource`: a resource URI the resource server can serve its metadata for.
fn resource_uri(value: &str) -> anyhow::Result<String> {
    wharf_auth::check_resource(value)?;
    Ok(value.to_owned())
}

/// A URL this server sends credentials to or takes keys from: https, or http on a loopback
/// host. Refused when the command line is read, not at the first sign-in.
fn secure_url(value: &str) -> anyhow::Result<String> {
    crate::remote::secure_url("the URL", value).map_err(anyhow::Error::msg)?;
    Ok(value.to_owned())
}

/// `--allowed-host`: a host as a client's `Host` header names it, without its port
/// (requests are matched on the host alone: a port given here would never match), or `*`.
/// Read as a URL's host is, so it is kept as clients send it: lower-cased, an IDN in its
/// `xn--` form, an IPv6 address bracketed and in its canonical text.
fn host_name(value: &str) -> anyhow::Result<String> {
    if value == "*" {
        return Ok(value.to_owned());
    }
    let refuse = || {
        anyhow::anyhow!(
            "{value:?} is not a host name: give the name or address alone (mcp.example.com), without a scheme, a port or a path"
        )
    };
    // An IPv6 address may be given with or without its brackets.
    let host = match value.parse::<std::net::Ipv6Addr>() {
        Ok(v6) => format!("[{v6}]"),
        Err(_) => value.to_owned(),
    };
    // Nothing may follow the host: a port, a path or user info would never match.
    let alone = match host.strip_prefix('[') {
        Some(inner) => inner
            .split_once(']')
            .is_some_and(|(_, tail)| tail.is_empty()),
        None => !host.contains([':', '/', '?', '#', '@', '\\']),
    };
    if !alone {
        return Err(refuse());
    }
    let url = url::Url::parse(&format!("http://{host}/")).map_err(|_| refuse())?;
    url.host_str().map(str::to_owned).ok_or_else(refuse)
}

/// `--public-url`: an http(s) origin. The authorization server's metadata, pages and
/// redirects are served at the root, so an issuer with a path would be looked for where
/// nothing answers (RFC 8414 §3 puts its metadata after the path).
fn public_origin(value: &str) -> anyhow::Result<String> {
    browser_origin(value)
        .ok()
        .filter(|o| o.starts_with("https://") || o.starts_with("http://"))
        .ok_or_else(|| {
            anyhow::anyhow!(
                "{value:?} is not an origin: give https://host[:port] with no path, query or fragment (the authorization server is served at the root)"
            )
        })
}

/// `value` as the `Origin` header a browser sends for it (`https://app.example.com`: scheme,
/// host, and a port other than the scheme's own; an extension's `chrome-extension://<id>`):
/// a spelling that no browser sends (a trailing slash, `:443`) would never match, and
/// `null`, which sandboxed frames and `file:` pages of any site send, would admit them all.
fn browser_origin(value: &str) -> anyhow::Result<String> {
    let refuse = || {
        anyhow::anyhow!(
            "{value:?} is not an origin: give scheme://host[:port] with nothing after it, as a \
             browser sends it (not null, file:, data: or blob:)"
        )
    };
    let url = url::Url::parse(value).map_err(|_| refuse())?;
    let bare = matches!(url.path(), "" | "/")
        && url.query().is_none()
        && url.fragment().is_none()
        && url.username().is_empty()
        && url.password().is_none();
    let Some(host) = url.host_str().filter(|_| bare) else {
        return Err(refuse());
    };
    match url.scheme() {
        "http" | "https" => Ok(url.origin().ascii_serialization()),
        // No page of any site can claim these: a browser serializes their origin as null.
        "file" | "data" | "blob" | "javascript" => Err(refuse()),
        // An extension's or an app's own scheme: its origin is what it sends, as written.
        scheme => {
            let host = host.to_ascii_lowercase();
            Ok(match url.port() {
                Some(port) => format!("{scheme}://{host}:{port}"),
                None => format!("{scheme}://{host}"),
            })
        }
    }
}

/// The hosts of the URLs this server is told it is reached at (`--public-url` for the
/// authorization server, `--oauth-resource` for the resource server): served without being
/// named again with `--allowed-host` (clients behind a proxy that passes `Host` on were
/// refused 403).
fn own_hosts(args: &ServeArgs) -> Vec<String> {
    let oauth = args.oauth_issuer.is_some() || args.authorization_server;
    let public = args
        .public_url
        .as_ref()
        .filter(|_| args.authorization_server);
    let resource = args.oauth_resource.as_ref().filter(|_| oauth);
    public
        .into_iter()
        .chain(resource)
        .filter_map(|u| url::Url::parse(u).ok()?.host_str().map(str::to_owned))
        .collect()
}

/// The origin clients reach this server at, without a trailing slash.
fn public_url(args: &ServeArgs) -> String {
    args.public_url
        .clone()
        .unwrap_or_else(|| format!("http://{}", connectable(args.listen)))
        .trim_end_matches('/')
        .to_owned()
}

/// An address this process can connect to itself at: the listen address, with an
/// unspecified IP (`0.0.0.0`, `::`) read as loopback.
fn connectable(listen: SocketAddr) -> SocketAddr {
    let mut addr = listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    addr
}

/// The embedded authorization server, when asked for.
fn authorization_server(
    args: &ServeArgs,
    store: Option<&Arc<dyn Store>>,
    scopes: &[String],
) -> anyhow::Result<Option<wharf_authz::AuthorizationServer>> {
    if !args.authorization_server {
        return Ok(None);
    }
    let store = store.context("--authorization-server keeps its records in a store")?;
    let issuer = public_url(args);
    let resource = args
        .oauth_resource
        .clone()
        .unwrap_or_else(|| format!("{issuer}{}", args.endpoint));
    let mut config = wharf_authz::AuthzConfig::new(issuer, resource);
    config
        .resources
        .extend(args.authz_resources.iter().cloned());
    // What the resource server asks tokens for, the required scopes included: the
    // authorization server refuses to grant a scope it does not offer.
    config.scopes = offered_scopes(args, scopes);
    config.open_registration = !args.authz_closed_registration;
    config.refresh_retry_window = Duration::from_secs(args.authz_refresh_retry_secs);
    config.trusted_proxies = args.trusted_proxies.clone();
    if let (Some(issuer), Some(client_id)) =
        (&args.authz_upstream_issuer, &args.authz_upstream_client_id)
    {
        let mut upstream = wharf_authz::UpstreamConfig::new(issuer, client_id);
        upstream.client_secret = args
            .authz_upstream_client_secret
            .as_ref()
            .map(|s| s.expose().to_owned());
        upstream.name = args.authz_upstream_name.clone();
        config.upstream = Some(upstream);
    }
    if let Some(key) = &args.authz_key_encryption_key {
        let seal = wharf_authz::KeyEncryptionKey::from_base64(key.expose())
            .context("--authz-key-encryption-key")?;
        let retired = args
            .authz_retired_key_encryption_keys
            .iter()
            .map(|key| wharf_authz::KeyEncryptionKey::from_base64(key.expose()))
            .collect::<Result<_, _>>()
            .context("--authz-retired-key-encryption-key")?;
        config.key_encryption = Some(wharf_authz::KeyEncryption::new(seal, retired));
    } else if config.issuer.starts_with("https://") {
        tracing::warn!(
            "the token-signing keys are stored unsealed: anyone who reads the store can sign tokens; give --authz-key-encryption-key"
        );
    }
    let mut fetcher = wharf_authz::cimd::Fetcher::builder();
    if let Some(path) = &args.authz_document_root_cert {
        let pem = std::fs::read(path).with_context(|| {
            format!("cannot read --authz-document-root-cert {}", path.display())
        })?;
        fetcher = fetcher
            .add_root_certificate(&pem)
            .context("--authz-document-root-cert")?;
    }
    if args.authz_allow_loopback_documents {
        tracing::warn!("Client ID Metadata Documents may be fetched from loopback: for tests only");
        fetcher = fetcher.allow_loopback_for_tests();
    }
    let fetcher = fetcher.build().context("the metadata document fetcher")?;
    Ok(Some(wharf_authz::AuthorizationServer::new(
        config,
        Arc::clone(store),
        fetcher,
    )))
}

/// The URL of the store this server opens, if it opens one: the one given, or the default
/// when the profile keeps state (or the authorization server runs).
fn store_url(args: &ServeArgs) -> Option<&str> {
    // Over stdio there is no authorization server (its options are named unused).
    let needs_store =
        Profile::from(args.profile).needs_store() || (args.authorization_server && !args.stdio);
    match (&args.store, needs_store) {
        (Some(url), _) => Some(url.expose()),
        (None, true) => Some(wharf_store::DEFAULT_URL),
        (None, false) => None,
    }
}

/// The store, opened and migrated, when the profile keeps state or one was given.
async fn open_store(args: &ServeArgs) -> anyhow::Result<Option<Arc<dyn Store>>> {
    let Some(url) = store_url(args) else {
        return Ok(None);
    };
    let mut options = StoreOptions::default();
    options.lock_wait = Duration::from_secs(args.lock_wait_secs);
    // The import service's own tables, created beside the store's.
    options.app_migrations = Some(Arc::new(wharf_reference::data::migrations()));
    let store = wharf_store::open(url, &options)
        .await
        .context("cannot open the store")?;
    tracing::info!(backend = store.backend(), "store ready");
    Ok(Some(store))
}

/// Holds a lock beside a SQLite store's file while this process serves it: a second
/// `wharf serve` on the file would break what only one process can keep (calls in steps
/// taking turns, change notifications), so it is refused at start. Short commands (`wharf
/// user`) do not take it. `None` for another store, or SQLite in memory.
fn hold_sqlite_file(url: &str) -> anyhow::Result<Option<std::fs::File>> {
    // SQLite reads a `file:` URI itself: its file is not known here to be locked.
    anyhow::ensure!(
        !url.starts_with("sqlite:file:"),
        "--store {url}: give a SQLite store as sqlite://PATH (a file: URI names a file this server cannot lock to one process)"
    );
    let Some(file) = wharf_store::sqlite_file(url) else {
        return Ok(None);
    };
    let mut lock = file.clone().into_os_string();
    lock.push(".serve-lock");
    let lock = std::path::PathBuf::from(lock);
    let opened = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock)
        .with_context(|| {
            format!(
                "cannot open {}, the lock of the SQLite store",
                lock.display()
            )
        })?;
    match opened.try_lock() {
        Ok(()) => Ok(Some(opened)),
        Err(std::fs::TryLockError::WouldBlock) => anyhow::bail!(
            "another wharf serve is serving the SQLite store {}: one process per SQLite file (give each process its own --store; replicas share PostgreSQL or Redis)",
            file.display()
        ),
        Err(std::fs::TryLockError::Error(e)) => Err(e).with_context(|| {
            format!(
                "cannot lock {}, the lock of the SQLite store",
                lock.display()
            )
        }),
    }
}

/// `/readyz` reports whether the store answers.
struct StoreReady(Arc<dyn Store>);

impl ReadinessCheck for StoreReady {
    fn name(&self) -> &str {
        "store"
    }
    fn check(&self) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>> {
        Box::pin(async move { self.0.ping().await.map_err(|e| e.to_string()) })
    }
}

/// The core's settings, checked before anything is opened.
fn server_config(args: &ServeArgs) -> anyhow::Result<ServerConfig> {
    let cursor_key = match &args.cursor_key {
        Some(k) => {
            let key = base64::engine::general_purpose::STANDARD
                .decode(k.expose().trim())
                .context("--cursor-key must be base64")?;
            let key = CursorKey::new(key).map_err(|short| {
                anyhow::anyhow!(
                    "--cursor-key must decode to at least {} bytes (it decodes to {}); generate one with `openssl rand -base64 32`",
                    CursorKey::MIN_LEN,
                    short.0
                )
            })?;
            Some(key)
        }
        None => None,
    };
    let mut request_state = wharf::StateConfig::default();
    if !args.state_keys.is_empty() {
        let specs: Vec<&str> = args.state_keys.iter().map(Secret::expose).collect();
        request_state.keys = Some(wharf::StateKeys::parse(&specs).context("--state-key")?);
    }
    request_state.max_age = Duration::from_secs(args.state_max_age_secs);
    request_state.max_rounds = args.max_input_rounds;
    let mut config = ServerConfig::default();
    config.request_state = request_state;
    config.list_permitted_tools_only = args.list_permitted_tools_only;
    config.max_store_locks_per_principal = args.max_store_locks_per_principal;
    config.page_size = args.page_size;
    config.cursor_key = cursor_key;
    config.key_rotation = Duration::from_secs(args.key_rotation_hours.saturating_mul(3600));
    config.max_call_duration = Duration::from_secs(args.max_call_secs);
    config.progress_interval = Duration::from_millis(args.progress_interval_ms);
    config.limits.max_in_flight = args.max_in_flight;
    config.limits.max_queue = args.max_queue;
    config.limits.per_principal = args.max_per_principal;
    config.limits.listen_per_principal = Some(args.max_listen_per_principal);
    config.limits.max_listen_streams = Some(args.max_listen_streams);
    config.idempotency_retention =
        Duration::from_secs(args.idempotency_retention_hours.saturating_mul(3600));
    // As the server checks it (only a store keeps records), first, naming the flags.
    if store_url(args).is_some() && config.idempotency_retention <= config.max_call_duration {
        anyhow::bail!(
            "--idempotency-retention-hours {} must be longer than --max-call-secs {}: a write's record must outlive the call that writes it",
            args.idempotency_retention_hours,
            args.max_call_secs
        );
    }
    config.legacy.enabled = !args.modern_only;
    config.legacy.session_idle = Duration::from_secs(args.session_idle_mins.saturating_mul(60));
    config.legacy.input_timeout = Duration::from_secs(args.input_timeout_secs);
    config.legacy.max_sessions_per_principal = args.max_sessions_per_principal;
    config.legacy.max_anonymous_sessions = args.max_anonymous_sessions;
    Ok(config)
}

fn build_server(
    config: ServerConfig,
    args: &ServeArgs,
    store: Option<Arc<dyn Store>>,
    count: bool,
) -> anyhow::Result<Server> {
    let mut builder = Server::builder(wharf_reference::implementation())
        .config(config)
        .metrics(count);
    if let Some(store) = store {
        builder = builder.store(store);
    }
    Ok(Profile::from(args.profile).register(builder).build()?)
}

async fn serve(args: ServeArgs, push: Option<MetricsPush>) -> anyhow::Result<()> {
    // The core's settings first: a mistake in them is reported before any file or server is
    // touched. Authentication follows the server, whose definitions name its scopes.
    let config = server_config(&args)?;
    let keys = api_keys(&args)?;
    introspection_client(&args)?;
    let _serving = store_url(&args).map(hold_sqlite_file).transpose()?;
    let store = open_store(&args).await?;
    let count = args.metrics_listen.is_some() || push.is_some();
    let server =
        build_server(config, &args, store.clone(), count).context("invalid server definition")?;
    // Metrics are pushed until the server has stopped, then once more with the last counts.
    let stop_pushing = tokio_util::sync::CancellationToken::new();
    let pushing = push.map(|push| tokio::spawn(push.run(server.clone(), stop_pushing.clone())));
    let served = serve_with(args, server, store, keys).await;
    if let Some(pushing) = pushing {
        if served.is_ok() {
            stop_pushing.cancel();
            let _ = pushing.await;
        } else {
            // A server that could not start has nothing to report, and its error should not
            // wait on a collector.
            pushing.abort();
        }
    }
    served
}

async fn serve_with(
    args: ServeArgs,
    server: Server,
    store: Option<Arc<dyn Store>>,
    keys: Option<ApiKeys>,
) -> anyhow::Result<()> {
    let authz = if args.stdio {
        None
    } else {
        authorization_server(&args, store.as_ref(), server.scopes())?
    };
    // The resource server's settings are checked before the signing keys are written.
    let auth = if args.stdio {
        Auth::anonymous()
    } else {
        auth(&args, server.scopes(), authz.as_ref(), keys)?
    };
    if let Some(authz) = &authz {
        authz
            .prepare()
            .await
            .context("the authorization server's signing keys")?;
    }
    server
        .prepare(Duration::from_secs(10))
        .await
        .context("cannot load the shared keys from the store")?;
    let stop_sweeping = tokio_util::sync::CancellationToken::new();
    let _stop_sweeping = stop_sweeping.clone().drop_guard();
    if let Some(store) = &store {
        wharf_store::spawn_sweeper(
            Arc::clone(store),
            Duration::from_secs(args.sweep_secs),
            500,
            stop_sweeping,
        );
    }
    let unused = unused_options(&args);
    if args.stdio {
        if !unused.is_empty() {
            tracing::warn!(
                unused = %unused.join(", "),
                "over stdio every request acts for one anonymous principal and nothing listens on the network: these options are not used"
            );
        }
        let mut config = StdioConfig::default();
        config.drain = Duration::from_secs(args.drain_secs);
        // A line is stdio's request body.
        config.max_line_bytes = args.max_body_bytes;
        config.max_json_depth = args.max_json_depth;
        wharf_stdio::serve_with(server, tokio::io::stdin(), tokio::io::stdout(), config).await?;
        return Ok(());
    }
    if !unused.is_empty() {
        tracing::warn!(
            unused = %unused.join(", "),
            "these options are not used by the way this server authenticates (the --oauth-* options need --oauth-issuer or --authorization-server, its client id and secret --oauth-introspection-url too; --list-permitted-tools-only needs tokens; --public-url, --trusted-proxy and the --authz-* options need --authorization-server)"
        );
    }
    // Read as browsers send them when the command line was parsed (`browser_origin`).
    let origins = args.allowed_origins.iter().cloned();
    let hosts = if args.allowed_hosts.iter().any(|h| h == "*") {
        HostPolicy::any_host(origins)
    } else {
        let mut p = HostPolicy::localhost();
        for h in args.allowed_hosts.iter().cloned().chain(own_hosts(&args)) {
            p = p.allow_host(h);
        }
        for o in origins {
            p = p.allow_origin(o);
        }
        p
    };
    let mut config = HttpConfig::default();
    config.endpoint = args.endpoint.clone();
    config.hosts = hosts;
    config.max_body_bytes = args.max_body_bytes;
    config.max_json_depth = args.max_json_depth;
    config.max_header_bytes = args.max_header_bytes;
    config.body_read_timeout = Duration::from_secs(args.body_read_secs);
    config.keep_alive = Duration::from_secs(args.keep_alive_secs);
    config.readiness = store
        .map(|s| Arc::new(StoreReady(s)) as Arc<dyn ReadinessCheck>)
        .into_iter()
        .collect();
    config.auth = Arc::new(auth);
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    if let Some(address) = args.metrics_listen {
        serve_metrics(address, server.clone()).await?;
    }
    let local = listener.local_addr()?;
    let (listener, closer) = wharf_http::DrainingListener::new(listener)?;
    // Every stop signal from now on (before the line that says the server serves, which a
    // supervisor may act on), counted: the first starts the drain, the next skips the
    // grace, and one after the grace ends the drain at once (an operator who signals again
    // does not want to wait for the deadline).
    let signals = signals::StopSignals::listen().counted();
    tracing::info!(address = %local, endpoint = %args.endpoint, "wharf serving MCP 2026-07-28");
    let mut limits = wharf_http::ConnectionLimits::for_headers(args.max_header_bytes);
    limits.header_read_timeout = Duration::from_secs(args.header_read_secs);
    limits.max_connections = args.max_connections;
    limits.max_headers = args.max_headers;
    // The authorization server's rate limits key on the peer's address.
    limits.peer_address = args.authorization_server;
    limits.close_while_draining = Some(server.clone());
    let cors = wharf_http::cors(&config.hosts);
    let mut app = wharf_http::router(server.clone(), config);
    if let Some(authz) = &authz {
        tracing::info!(issuer = %public_url(&args), "authorization server on this origin");
        // A browser-based client of a named origin signs in through the endpoints a program
        // calls too (metadata, registration, token, revocation, keys); the pages a person's
        // browser navigates get no CORS.
        let api = authz.api_router();
        app = app
            .merge(match cors {
                Some(cors) => api.layer(cors),
                None => api,
            })
            .merge(authz.page_router());
    }

    // Once the server stops accepting: how many signals had come by then.
    let (drain_began, draining) = tokio::sync::watch::channel(None::<u32>);
    let drain_server = server.clone();
    let grace = Duration::from_secs(args.drain_grace_secs);
    let mut heard = signals.clone();
    let shutdown = async move {
        if heard.wait_for(|n| *n >= 1).await.is_err() {
            // Nothing counts signals any more: nothing will ask for a stop.
            std::future::pending::<()>().await;
        }
        drain_server.drain();
        if !grace.is_zero() {
            tracing::info!(
                seconds = grace.as_secs(),
                "draining: /readyz answers 503; still accepting until load balancers move away"
            );
            tokio::select! {
                () = tokio::time::sleep(grace) => {}
                Ok(_) = heard.wait_for(|n| *n >= 2) => {}
            }
        }
        tracing::info!("shutting down: draining in-flight requests; no longer accepting");
        drain_server.shutdown();
        // The drain deadline runs from here, whatever the listener's close takes.
        let _ = drain_began.send(Some(*heard.borrow()));
        closer.close(Duration::from_millis(500)).await;
    };
    let serve = wharf_http::serve(listener, app, limits, shutdown);
    let deadline = Duration::from_secs(args.drain_secs);
    let began = |mut draining: tokio::sync::watch::Receiver<Option<u32>>| async move {
        match draining.wait_for(Option::is_some).await {
            Ok(seen) => seen.unwrap_or_default(),
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        result = serve => result.context("server error")?,
        () = async { began(draining.clone()).await; tokio::time::sleep(deadline).await } => {
            tracing::warn!(seconds = args.drain_secs, "drain deadline passed; closing the remaining connections");
        }
        _ = async {
            let seen = began(draining.clone()).await;
            let mut again = signals;
            if again.wait_for(|n| *n > seen).await.is_err() {
                std::future::pending::<()>().await;
            }
        } => {
            tracing::warn!("signalled again while draining; closing the remaining connections");
        }
    }
    tracing::info!("stopped");
    Ok(())
}

/// Serves `GET /metrics` on `address` until the process exits.
async fn serve_metrics(address: SocketAddr, server: Server) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("cannot listen for metrics on {address}"))?;
    tracing::info!(address = %listener.local_addr()?, "metrics at /metrics");
    let app = wharf_http::metrics_router(server);
    tokio::spawn(async move {
        // With the endpoint's head read timeout and caps: a slow client must not hold the
        // scraper's port either.
        let limits = wharf_http::ConnectionLimits::default();
        let forever = std::future::pending();
        if let Err(e) = wharf_http::serve(listener, app, limits, forever).await {
            tracing::error!(error = %e, "the metrics listener stopped");
        }
    });
    Ok(())
}

/// A count or a duration for which 0 would make a server that refuses everything (or
/// forgets at once what it must keep): refused by name when the server starts, rather than
/// taken silently as 1.
fn positive<T>() -> clap::builder::RangedU64ValueParser<T>
where
    T: TryFrom<u64> + Clone + Send + Sync + 'static,
    <T as TryFrom<u64>>::Error: std::error::Error + Send + Sync + 'static,
{
    clap::builder::RangedU64ValueParser::new().range(1..)
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    /// An allowed origin is kept as a browser sends it; what no browser sends for one page
    /// (a path, user info, `null`, `file:`) is refused when the command line is read.
    #[test]
    fn allowed_origins_are_origins_as_browsers_send_them() {
        for (given, kept) in [
            ("https://App.Example.com", "https://app.example.com"),
            ("https://app.example.com/", "https://app.example.com"),
            ("https://app.example.com:443", "https://app.example.com"),
            ("http://127.0.0.1:6274", "http://127.0.0.1:6274"),
            ("http://[::1]:8080", "http://[::1]:8080"),
            (
                "chrome-extension://Abcdefghijklmnop",
                "chrome-extension://abcdefghijklmnop",
            ),
            ("tauri://localhost", "tauri://localhost"),
        ] {
            assert_eq!(super::browser_origin(given).unwrap(), kept, "{given}");
        }
        for refused in [
            "null",
            "*",
            "app.example.com",
            "https://app.example.com/path",
            "https://app.example.com?x=1",
            "https://user@app.example.com",
            "file:///etc",
            "",
            "chrome-extension://id/page.html",
        ] {
            let e = super::browser_origin(refused).unwrap_err().to_string();
            assert!(e.contains("is not an origin"), "{refused}: {e}");
        }
    }

    /// The public URL is an origin, the URLs credentials and keys travel to are https (but
    /// on loopback), a resource URI one whose metadata can be served, and introspection has
    /// this server's credentials: each refused before anything is opened.
    #[test]
    fn public_and_provider_urls_are_checked_when_read() {
        for (given, kept) in [
            ("https://MCP.example.com/", "https://mcp.example.com"),
            ("https://mcp.example.com:443", "https://mcp.example.com"),
            ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
        ] {
            assert_eq!(super::public_origin(given).unwrap(), kept, "{given}");
        }
        for refused in [
            "https://mcp.example.com/wharf",
            "https://mcp.example.com/?a",
            "mcp.example.com",
            "ftp://mcp.example.com",
            "https://user@mcp.example.com",
        ] {
            let e = super::public_origin(refused).unwrap_err().to_string();
            assert!(e.contains("is not an origin"), "{refused}: {e}");
        }
        for fine in ["https://id.example.com", "http://localhost:9000/realms/x"] {
            assert!(super::secure_url(fine).is_ok(), "{fine}");
        }
        let e = super::secure_url("http://id.example.com")
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not https"), "{e}");
        assert!(super::secure_url("id.example.com").is_err());
        // Past the JSON parser's own nesting limit, a depth would fail as a parse error.
        let depth = |n: &str| {
            crate::Cli::try_parse_from(["wharf", "serve", "--max-json-depth", n]).map(|_| ())
        };
        assert!(depth("127").is_ok());
        assert!(depth("128").is_err());
        // A resource whose metadata could not be served at its path, refused as it is read.
        let resource = |r: &str| {
            crate::Cli::try_parse_from(["wharf", "serve", "--oauth-resource", r]).map(|_| ())
        };
        assert!(resource("https://mcp.example.com/mcp").is_ok());
        let e = resource("https://mcp.example.com/:tenant/mcp").unwrap_err();
        assert!(
            e.to_string().contains("cannot have its metadata served"),
            "{e}"
        );
        // Introspection without this server's credentials, before anything is opened.
        let introspecting = |more: &[&str]| {
            let base = [
                "wharf",
                "serve",
                "--oauth-issuer",
                "https://id.example.com",
                "--oauth-introspection-url",
                "https://id.example.com/introspect",
            ];
            let cli = crate::Cli::try_parse_from([&base[..], more].concat()).unwrap();
            let crate::Command::Serve(args) = cli.command else {
                unreachable!("a serve command")
            };
            super::introspection_client(&args).map_err(|e| e.to_string())
        };
        let e = introspecting(&["--oauth-client-id", "rs"]).unwrap_err();
        assert!(
            e.contains("needs --oauth-client-id and --oauth-client-secret"),
            "{e}"
        );
        assert!(introspecting(&["--oauth-client-id", "rs", "--oauth-client-secret", "s"]).is_ok());
    }

    /// The endpoint is a plain path the server serves nothing else at, and an allowed host
    /// a name or address as requests are matched (no port, an IPv6 address bracketed):
    /// anything else is refused when the command line is read. (`--endpoint mcp` made axum
    /// panic at start; `--allowed-host h:443` started a server that refused every request.)
    #[test]
    fn endpoints_and_allowed_hosts_are_checked_when_read() {
        assert_eq!(super::endpoint_path("/mcp").unwrap(), "/mcp");
        assert_eq!(super::endpoint_path("/api/v1/mcp").unwrap(), "/api/v1/mcp");
        for refused in ["mcp", "", "/x/{id}", "/x/:id", "/a b", "/mcp?x", "/files/*"] {
            let e = super::endpoint_path(refused).unwrap_err().to_string();
            assert!(e.contains("is not a path"), "{refused}: {e}");
        }
        for taken in [
            "/healthz",
            "/readyz",
            "/token",
            "/authorize/consent",
            "/.well-known/oauth-protected-resource",
        ] {
            let e = super::endpoint_path(taken).unwrap_err().to_string();
            assert!(e.contains("serves something else"), "{taken}: {e}");
        }
        for (given, kept) in [
            ("MCP.Example.com", "mcp.example.com"),
            ("mcp_server", "mcp_server"),
            ("bücher.example", "xn--bcher-kva.example"),
            ("10.0.0.7", "10.0.0.7"),
            ("::1", "[::1]"),
            ("[2001:DB8::1]", "[2001:db8::1]"),
            ("[::ffff:a00:7]", "[::ffff:a00:7]"),
            ("::ffff:10.0.0.7", "[::ffff:a00:7]"),
            ("*", "*"),
        ] {
            assert_eq!(super::host_name(given).unwrap(), kept, "{given}");
        }
        for refused in [
            "mcp.example.com:443",
            "https://mcp.example.com",
            "mcp.example.com/mcp",
            "10.0.0.7:80",
            "[::1]:8080",
            "",
        ] {
            let e = super::host_name(refused).unwrap_err().to_string();
            assert!(e.contains("is not a host name"), "{refused}: {e}");
        }
    }

    /// What `wharf serve` was given, as `Debug` prints it (a log line, a panic message):
    /// every key and secret shows only that it is set.
    #[test]
    fn debug_output_holds_no_secret() {
        let secrets = [
            "c3VwZXItc2VjcmV0LWN1cnNvci1rZXktMzItYnl0ZXMhIQ==",
            "k1=AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
            "alice=token-of-alice-1234567890",
            "introspection-client-secret",
        ];
        let cli = crate::Cli::try_parse_from([
            "wharf",
            "serve",
            "--cursor-key",
            secrets[0],
            "--state-key",
            secrets[1],
            "--api-key",
            secrets[2],
            "--oauth-client-secret",
            secrets[3],
            "--store",
            "postgres://wharf:hunter2-db-password@db.internal/wharf",
        ])
        .unwrap();
        let printed = format!("{cli:?}");
        let hidden = [
            secrets[0],
            "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8",
            "token-of-alice-1234567890",
            secrets[3],
            "hunter2-db-password",
        ];
        for value in hidden {
            assert!(!printed.contains(value), "{printed}");
        }
        assert!(printed.contains("Secret(redacted)"), "{printed}");
    }

    /// A zero where it would make the server useless is refused, naming the option.
    #[test]
    fn zero_is_refused_where_it_means_nothing_would_work() {
        for option in [
            "--max-body-bytes",
            "--max-connections",
            "--keep-alive-secs",
            "--idempotency-retention-hours",
            "--oauth-jwks-max-age-secs",
            "--workers",
            "--max-in-flight",
            "--max-listen-streams",
            "--max-listen-per-principal",
            "--max-input-rounds",
        ] {
            let err = crate::Cli::try_parse_from(["wharf", "serve", option, "0"]).unwrap_err();
            let said = err.to_string();
            assert!(
                said.contains(option) && said.contains("not in 1.."),
                "{said}"
            );
            crate::Cli::try_parse_from(["wharf", "serve", option, "1"]).unwrap();
        }
        // Where 0 means something (no drain, no cache), it stays allowed.
        crate::Cli::try_parse_from(["wharf", "serve", "--drain-secs", "0"]).unwrap();
        crate::Cli::try_parse_from(["wharf", "serve", "--oauth-introspection-cache-secs", "0"])
            .unwrap();
    }
}
