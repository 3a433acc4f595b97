//! `wharf serve`.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use base64::Engine as _;
use clap::{Args, ValueEnum};
use wharf::{CursorKey, Server, ServerConfig};
use wharf_http::{HostPolicy, HttpConfig};
use wharf_reference::Profile;

/// Options of `wharf serve`; each can also come from the environment.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "WHARF_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Serve over stdin/stdout instead of HTTP.
    #[arg(long)]
    stdio: bool,
    /// Which tool set to expose.
    #[arg(long, env = "WHARF_PROFILE", value_enum, default_value_t = ProfileArg::Default)]
    profile: ProfileArg,
    /// Path of the MCP endpoint.
    #[arg(long, env = "WHARF_ENDPOINT", default_value = "/mcp")]
    endpoint: String,
    /// An allowed browser Origin (`scheme://host[:port]`); repeatable. Localhost is always allowed.
    #[arg(
        long = "allowed-origin",
        env = "WHARF_ALLOWED_ORIGINS",
        value_delimiter = ','
    )]
    allowed_origins: Vec<String>,
    /// An allowed Host name besides localhost; repeatable. `*` accepts any host.
    #[arg(
        long = "allowed-host",
        env = "WHARF_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    allowed_hosts: Vec<String>,
    /// Base64 key that signs list cursors; give every replica the same one. Random if unset.
    #[arg(long, env = "WHARF_CURSOR_KEY", hide_env_values = true)]
    cursor_key: Option<String>,
    /// Largest request body in bytes.
    #[arg(long, env = "WHARF_MAX_BODY_BYTES", default_value_t = 1024 * 1024)]
    max_body_bytes: usize,
    /// Deepest JSON nesting accepted.
    #[arg(long, env = "WHARF_MAX_JSON_DEPTH", default_value_t = 64)]
    max_json_depth: usize,
    /// Largest total size of request headers in bytes.
    #[arg(long, env = "WHARF_MAX_HEADER_BYTES", default_value_t = 16 * 1024)]
    max_header_bytes: usize,
    /// Items per page of a list.
    #[arg(long, env = "WHARF_PAGE_SIZE", default_value_t = 100)]
    page_size: usize,
    /// Seconds between keep-alive comments on listen streams.
    #[arg(long, env = "WHARF_KEEP_ALIVE_SECS", default_value_t = 15)]
    keep_alive_secs: u64,
    /// Seconds in-flight requests get to finish after SIGTERM/SIGINT.
    #[arg(long, env = "WHARF_DRAIN_SECS", default_value_t = 10)]
    drain_secs: u64,
    /// Worker threads (default: the CPUs this process may use).
    #[arg(long, env = "WHARF_WORKERS")]
    workers: Option<usize>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ProfileArg {
    Default,
    Conformance,
}

/// Runs `wharf serve`; exits 0 after a graceful shutdown.
pub fn run(args: ServeArgs) -> ExitCode {
    // Logs go to stderr: on stdio, stdout carries only MCP messages.
    // `Targets` reads `info,wharf=debug`-style filters without compiling regular expressions
    // at startup (EnvFilter does, and every page of that code stays resident).
    let filter = std::env::var("WHARF_LOG")
        .ok()
        .and_then(|f| f.parse::<tracing_subscriber::filter::Targets>().ok())
        .unwrap_or_else(|| {
            tracing_subscriber::filter::Targets::new().with_default(tracing::Level::INFO)
        });
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .with(filter)
        .init();
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
    match runtime.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wharf: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn build_server(args: &ServeArgs) -> anyhow::Result<Server> {
    let cursor_key = match &args.cursor_key {
        Some(k) => {
            let key = base64::engine::general_purpose::STANDARD
                .decode(k.trim())
                .context("--cursor-key must be base64")?;
            anyhow::ensure!(
                key.len() >= 32,
                "--cursor-key must decode to at least 32 bytes (it decodes to {}); generate one with `openssl rand -base64 32`",
                key.len()
            );
            CursorKey::new(key)
        }
        None => CursorKey::random(),
    };
    let config = ServerConfig {
        page_size: args.page_size,
        cursor_key,
        ..ServerConfig::default()
    };
    let profile = match args.profile {
        ProfileArg::Default => Profile::Default,
        ProfileArg::Conformance => Profile::Conformance,
    };
    let server = profile
        .register(Server::builder(wharf_reference::implementation()).config(config))
        .build()?;
    Ok(server)
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let server = build_server(&args).context("invalid server definition")?;
    if args.stdio {
        let drain = Duration::from_secs(args.drain_secs);
        wharf_stdio::serve_with_drain(server, tokio::io::stdin(), tokio::io::stdout(), drain)
            .await?;
        return Ok(());
    }
    let hosts = if args.allowed_hosts.iter().any(|h| h == "*") {
        HostPolicy::any_host(args.allowed_origins.iter().cloned())
    } else {
        let mut p = HostPolicy::localhost();
        for h in &args.allowed_hosts {
            p = p.allow_host(h.clone());
        }
        for o in &args.allowed_origins {
            p = p.allow_origin(o.clone());
        }
        p
    };
    let config = HttpConfig {
        endpoint: args.endpoint.clone(),
        hosts,
        max_body_bytes: args.max_body_bytes,
        max_json_depth: args.max_json_depth,
        max_header_bytes: args.max_header_bytes,
        keep_alive: Duration::from_secs(args.keep_alive_secs.max(1)),
        readiness: Vec::new(),
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let local = listener.local_addr()?;
    tracing::info!(address = %local, endpoint = %args.endpoint, "wharf serving MCP 2026-07-28");
    let app = wharf_http::router(server.clone(), config);

    let stopping = tokio_util::sync::CancellationToken::new();
    let signal_seen = stopping.clone();
    let drain_server = server.clone();
    let shutdown = async move {
        wait_for_signal().await;
        tracing::info!("shutting down: draining in-flight requests");
        drain_server.shutdown();
        signal_seen.cancel();
    };
    let serve = axum::serve(listener, app).with_graceful_shutdown(shutdown);
    let deadline = Duration::from_secs(args.drain_secs);
    tokio::select! {
        result = serve => result.context("server error")?,
        () = async { stopping.cancelled().await; tokio::time::sleep(deadline).await } => {
            tracing::warn!(seconds = args.drain_secs, "drain deadline passed; closing the remaining connections");
        }
    }
    tracing::info!("stopped");
    Ok(())
}

async fn wait_for_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
