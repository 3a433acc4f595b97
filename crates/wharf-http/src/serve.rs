//! Serving a router over HTTP/1.1 with explicit connection limits.
//!
//! `axum::serve` sets no timer, so hyper's header-read timeout is off and a client that
//! trickles header bytes (or sends none) holds its connection for ever; it also takes any
//! number of connections. [`serve`] is the same accept loop with the limits of
//! [`ConnectionLimits`]; graceful shutdown works as in `axum::serve`.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::serve::Listener;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;
use tower::ServiceExt as _;
use wharf::metrics::Throttled;

/// Room for the request line and hyper's own framing beyond the header fields.
const REQUEST_LINE_BYTES: usize = 8 * 1024;

/// Limits on the connections [`serve`] accepts.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConnectionLimits {
    /// Time a connection has to send a complete request head, counted from the moment it is
    /// ready for one: from accept, and again after each response. It therefore also closes a
    /// kept-alive connection idle this long (put a proxy's upstream keep-alive below it).
    /// From a millisecond to a day is used (hyper adds it to the clock, where
    /// `Duration::MAX` would overflow).
    pub header_read_timeout: Duration,
    /// Open connections at most; beyond, a new connection is closed as soon as it is
    /// accepted. A proxy that has not written its request yet tries another replica; one
    /// that has (nginx writes at once) answers 502 and does not resend a POST, so keep a
    /// proxy's own connections to a replica (its keep-alive pool and the requests it sends
    /// at once) below this. Not left waiting in the kernel's backlog: the accept loop must
    /// keep running for a shutdown to hand that backlog over.
    pub max_connections: usize,
    /// Header fields per request at most (431 beyond); no more than `max_header_bytes / 3`
    /// is used (hyper makes room for this many on every request head it parses).
    pub max_headers: usize,
    /// Bytes of request line and header fields at most (431 beyond): hyper checks this as it
    /// parses, so a connection never buffers much more than this of a request head.
    pub max_header_bytes: usize,
    /// Whether each request carries its peer's address as axum's `ConnectInfo`, for
    /// handlers that key on it (the authorization server's rate limits). Off by default: it
    /// costs an allocation per request that the MCP endpoint does not need.
    pub peer_address: bool,
    /// While this server drains, every response (whatever route answers it, CORS
    /// preflights and fallbacks included) closes its connection; see
    /// [`close_while_draining`](crate::close_while_draining()).
    pub close_while_draining: Option<wharf::Server>,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_read_timeout: Duration::from_secs(30),
            max_connections: 10_000,
            max_headers: 100,
            max_header_bytes: 16 * 1024 + REQUEST_LINE_BYTES,
            peer_address: false,
            close_while_draining: None,
        }
    }
}

impl ConnectionLimits {
    /// Limits whose header cap leaves room for `max_header_bytes` of header fields (the
    /// transport's own 431 check, [`HttpConfig::max_header_bytes`](crate::HttpConfig)) plus
    /// a request line.
    pub fn for_headers(max_header_bytes: usize) -> Self {
        ConnectionLimits {
            max_header_bytes: max_header_bytes.saturating_add(REQUEST_LINE_BYTES),
            ..ConnectionLimits::default()
        }
    }
}

/// Serves `router` on `listener` until `shutdown` resolves, then lets every open connection
/// finish its request (idle ones close at once) and returns when all have closed.
pub async fn serve<L>(
    mut listener: L,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()>
where
    L: Listener,
    L::Addr: Clone + Send + Sync + 'static,
{
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(
            limits
                .header_read_timeout
                .clamp(Duration::from_millis(1), Duration::from_secs(86_400)),
        )
        // hyper makes room for this many fields on each parse; a field takes at least three
        // bytes of the head (`a:` and a bare line feed), so more than that many never arrive.
        .max_headers(limits.max_headers.min(limits.max_header_bytes / 3))
        .max_header_size(limits.max_header_bytes);
    let http = Arc::new(http);
    // 0 would accept nothing; past `MAX_PERMITS` tokio's semaphore panics.
    let cap = limits.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let slots = Arc::new(Semaphore::new(cap));
    let peer_address = limits.peer_address;
    let closing = limits.close_while_draining.clone();
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (io, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.as_mut() => break,
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            // A line at most every ten seconds: a flood of connections is no flood of lines.
            static AT_LIMIT: Throttled = Throttled::new(Duration::from_secs(10));
            if let Some(held_back) = AT_LIMIT.ready() {
                tracing::warn!(
                    limit = cap,
                    held_back,
                    "connection limit reached; a new connection was closed"
                );
            }
            drop(io);
            continue;
        };
        // When asked, the peer's address travels with each request as axum's `ConnectInfo`.
        let closing = closing.clone();
        let service = TowerToHyperService::new(
            router
                .clone()
                .map_request(move |req: http::Request<Incoming>| {
                    let mut req = req.map(Body::new);
                    if peer_address {
                        req.extensions_mut()
                            .insert(axum::extract::ConnectInfo(peer.clone()));
                    }
                    req
                })
                .map_response(move |response| match &closing {
                    Some(server) => crate::close_if_draining(server, response),
                    None => response,
                }),
        );
        let conn = graceful.watch(http.serve_connection(TokioIo::new(io), service));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::trace!(error = %e, "connection ended");
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
