//! Cancellation latency over real loopback TCP: a client starts a tool call, waits until the
//! handler runs, closes its connection, and measures how long until the handler's work is
//! cancelled (its future dropped, which is where a handler's drop guards and `cancelled()`
//! observe it).
//!
//! Two paths, `TRIALS` times each (default 1000):
//! - `sse`: the call asks for progress, so its answer is an SSE stream; the client closes
//!   after the first progress event;
//! - `json`: a plain call, answered with one JSON body; the client closes once the handler
//!   reports it started.
//!
//! The server runs on its own one-thread runtime; the client on another thread. Each path
//! is measured idle, then with `LOAD` (default 16) other clients calling a tool in a loop on
//! the same server, so the cancellation competes with real work for the server's thread.
//! Prints p50, p90, p99 and max per path.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use wharf::{Context, NoArgs, Server, tool};
use wharf_client::{HttpClient, RequestMetaBuilder};
use wharf_protocol::Implementation;

/// Reports when the handler starts and when its work is cancelled.
struct Observer {
    cancelled: mpsc::UnboundedSender<Instant>,
}

impl Drop for Observer {
    fn drop(&mut self) {
        let _ = self.cancelled.send(Instant::now());
    }
}

fn server(started: mpsc::UnboundedSender<()>, cancelled: mpsc::UnboundedSender<Instant>) -> Server {
    Server::builder(Implementation::new("cancel-bench", "0"))
        .tool(tool("hold").description("Runs until cancelled.").handler(
            move |cx: Context, _: NoArgs| {
                let (started, cancelled) = (started.clone(), cancelled.clone());
                async move {
                    let _observer = Observer { cancelled };
                    cx.progress(1.0, None, Some("started")).await;
                    let _ = started.send(());
                    std::future::pending::<()>().await;
                    "never"
                }
            },
        ))
        .tool(
            tool("tick")
                .description("Answers at once.")
                .handler(|_cx: Context, _: NoArgs| async move { "tick" }),
        )
        .build()
        .expect("valid server")
}

/// Keeps `clients` callers of `tick` busy on their own thread until the process ends.
fn load(port: u16, clients: usize) {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("load runtime");
        rt.block_on(async move {
            let mut tasks = Vec::new();
            for _ in 0..clients {
                let client = HttpClient::new(format!("http://127.0.0.1:{port}/mcp"));
                tasks.push(tokio::spawn(async move {
                    loop {
                        let _ = client.call_tool("tick", json!({})).await;
                    }
                }));
            }
            for t in tasks {
                let _ = t.await;
            }
        });
    });
}

/// The raw bytes of a `tools/call` of `hold`, with or without a progress token.
fn request(port: u16, progress: bool) -> Vec<u8> {
    let mut params = json!({ "name": "hold", "arguments": {} });
    if progress {
        params["_meta"] = json!({ "progressToken": 1 });
    }
    let params = RequestMetaBuilder::default().apply(params);
    let headers = HttpClient::new("").headers_for("tools/call", &params);
    let body =
        json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params }).to_string();
    let mut out = format!(
        "POST /mcp HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (name, value) in &headers {
        out.push_str(&format!(
            "{name}: {}\r\n",
            value.to_str().unwrap_or_default()
        ));
    }
    out.push_str("\r\n");
    out.push_str(&body);
    out.into_bytes()
}

async fn trial(
    port: u16,
    raw: &[u8],
    sse: bool,
    started: &mut mpsc::UnboundedReceiver<()>,
    cancelled: &mut mpsc::UnboundedReceiver<Instant>,
) -> Duration {
    let mut socket = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    socket.set_nodelay(true).expect("nodelay");
    socket.write_all(raw).await.expect("send");
    started.recv().await.expect("the handler starts");
    if sse {
        // Wait for the first progress event on the wire.
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while !seen.windows(14).any(|w| w == b"notifications/") {
            let n = socket.read(&mut buf).await.expect("read");
            assert!(n > 0, "the stream ended early");
            seen.extend_from_slice(&buf[..n]);
        }
    }
    let closed = Instant::now();
    drop(socket);
    let seen = cancelled.recv().await.expect("the work is cancelled");
    seen.saturating_duration_since(closed)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

fn main() {
    let trials: usize = std::env::var("TRIALS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(1000);
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let (cancelled_tx, mut cancelled) = mpsc::unbounded_channel();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    listener.set_nonblocking(true).expect("nonblocking");
    let server = server(started_tx, cancelled_tx);
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("server runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            let app = wharf_http::router(server, wharf_http::HttpConfig::default());
            axum::serve(listener, app).await.expect("serve");
        });
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    let load_clients: usize = std::env::var("LOAD")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(16);
    rt.block_on(async move {
        println!("| path | other load | trials | p50 ms | p90 ms | p99 ms | max ms |");
        println!("|---|---|---|---|---|---|---|");
        let paths = [
            ("sse (progress stream closed)", true, 0),
            ("json (connection closed)", false, 0),
            ("sse (progress stream closed)", true, load_clients),
            ("json (connection closed)", false, load_clients),
        ];
        let mut loaded = false;
        for (name, sse, others) in paths {
            if others > 0 && !loaded {
                load(port, others);
                loaded = true;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            let raw = request(port, sse);
            // Warm-up.
            for _ in 0..20 {
                trial(port, &raw, sse, &mut started, &mut cancelled).await;
            }
            let mut samples = Vec::with_capacity(trials);
            for _ in 0..trials {
                samples.push(trial(port, &raw, sse, &mut started, &mut cancelled).await);
            }
            samples.sort_unstable();
            let row: Vec<String> = [0.5, 0.9, 0.99, 1.0]
                .into_iter()
                .map(|p| ms(percentile(&samples, p)))
                .collect();
            let others = if others == 0 {
                "idle".to_owned()
            } else {
                format!("{others} clients")
            };
            println!("| {name} | {others} | {trials} | {} |", row.join(" | "));
        }
    });
}
