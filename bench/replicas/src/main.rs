//! Benchmarks of what replicas share, against real `wharf serve` processes:
//!
//! - `fanout`: three replicas on one store; a listen stream on the third is subscribed to a
//!   dataset, the dataset is committed through the second (imports begun on the first), and
//!   each sample is the time from sending `import_commit` to the `resources/updated` on the
//!   stream. The baseline, in the same run, is the store's own channel: a bare `pg_notify`
//!   heard by a bare `LISTEN` (PostgreSQL) or a `PUBLISH` heard by a `SUBSCRIBE` (Redis).
//! - `streams`: one replica holds `STREAMS` idle listen streams; the growth of its resident
//!   memory divided by the streams is the cost of one. The baseline, in the same run, is a
//!   bare axum SSE endpoint (`wharf-bench-baseline`'s `/listen`) holding as many. While the
//!   streams are open, `tools/list` round trips are timed against the same with none open.
//!
//! Usage: `wharf-bench-replicas fanout|streams`, configured by the environment (see
//! bench/replicas.sh, which builds and runs both).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use wharf_client::HttpClient;

const TOKEN: &str = "bench-token-0123456789abcdef";

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A child process killed when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether an HTTP server answers on `port`.
fn answers(port: u16) -> bool {
    let up = std::net::TcpStream::connect(("127.0.0.1", port)).and_then(|mut s| {
        use std::io::{Read, Write};
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")?;
        let mut head = [0u8; 8];
        s.read_exact(&mut head)?;
        Ok(head.starts_with(b"HTTP/1."))
    });
    up.unwrap_or(false)
}

fn wait_http(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !answers(port) {
        assert!(Instant::now() < deadline, "nothing answers on port {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts `wharf serve` on `port` over `store`, pinned to `cpu` when given, with `extra`
/// arguments after the common ones.
fn replica(store: &str, port: u16, cpu: Option<&str>, extra: &[&str]) -> Process {
    let bin = env_or("WHARF_BIN", "target/release/wharf");
    let mut cmd = match cpu {
        Some(cpu) => {
            let mut c = Command::new("taskset");
            c.args(["-c", cpu, &bin]);
            c
        }
        None => Command::new(&bin),
    };
    // What answered would be someone else, not this replica.
    assert!(!answers(port), "something already answers on port {port}");
    let child = cmd
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--store",
            store,
        ])
        .args(["--api-key", &format!("bench={TOKEN}")])
        .args(extra)
        .env("WHARF_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
    // Owned before the wait, so that a replica that never answers is killed too.
    let process = Process(child);
    wait_http(port);
    process
}

fn client(port: u16) -> HttpClient {
    HttpClient::new(format!("http://127.0.0.1:{port}/mcp")).with_bearer(TOKEN)
}

async fn call(client: &HttpClient, name: &str, args: Value) -> Value {
    let reply = client.call_tool(name, args).await.expect("a reply");
    let result = reply.result().unwrap_or_else(|| panic!("{}", reply.body));
    assert_ne!(result["isError"], true, "{}", reply.body);
    result.clone()
}

/// p50, p90, p99 and max of `samples`, in milliseconds.
fn summary(samples: &mut [Duration]) -> String {
    samples.sort_unstable();
    let at = |q: f64| {
        let i = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
        samples[i].as_secs_f64() * 1000.0
    };
    format!(
        "p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms (n={})",
        at(0.5),
        at(0.9),
        at(0.99),
        at(1.0),
        samples.len()
    )
}

async fn fanout() {
    let store = env_or("STORE", "postgres://postgres@127.0.0.1:5432/test");
    let samples: usize = env_or("SAMPLES", "300").parse().unwrap();
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let _replicas: Vec<Process> = ports
        .iter()
        .map(|&p| replica(&store, p, None, &[]))
        .collect();
    let (a, b, c) = (client(ports[0]), client(ports[1]), client(ports[2]));
    let dataset = format!("fanout_{}", std::process::id());
    let uri = format!("dataset://{dataset}");
    let mut stream = Box::pin(
        c.open_stream(
            "subscriptions/listen",
            json!({ "notifications": { "resourceSubscriptions": [uri] } }),
        )
        .await
        .unwrap(),
    );
    let ack = stream.next().await.unwrap();
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    let columns = json!([{ "name": "id", "type": "integer" }]);
    let mut fan = Vec::with_capacity(samples);
    let mut commit_rtt = Vec::with_capacity(samples);
    for i in 0..samples {
        let begun = call(
            &a,
            "import_begin",
            json!({ "dataset": dataset, "columns": columns, "idempotency_key": format!("begin-{dataset}-{i}") }),
        )
        .await;
        let import = begun["structuredContent"]["import"].clone();
        call(
            &a,
            "import_append_rows",
            json!({ "import": import, "rows": [{ "id": i }], "idempotency_key": format!("k{i}") }),
        )
        .await;
        let sent = Instant::now();
        let heard = async {
            loop {
                let m = stream.next().await.expect("the stream stays open");
                if m["method"] == "notifications/resources/updated" {
                    return Instant::now();
                }
            }
        };
        let commit = async {
            call(
                &b,
                "import_commit",
                json!({ "import": import, "idempotency_key": "commit" }),
            )
            .await;
            Instant::now()
        };
        let (heard, committed) = tokio::join!(heard, commit);
        fan.push(heard - sent);
        commit_rtt.push(committed - sent);
    }
    let baseline = if store.starts_with("redis") {
        redis_baseline(&store, samples).await
    } else {
        postgres_baseline(&store, samples).await
    };
    println!("fanout store={store} replicas=3 samples={samples}");
    println!(
        "  wharf: commit sent on replica 2 -> resources/updated on replica 3: {}",
        summary(&mut fan)
    );
    println!(
        "  wharf: import_commit round trip: {}",
        summary(&mut commit_rtt)
    );
    println!(
        "  baseline: the store's bare channel, publish -> heard: {}",
        summary(&mut baseline.clone())
    );
}

async fn postgres_baseline(url: &str, samples: usize) -> Vec<Duration> {
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    let mut listener = sqlx::postgres::PgListener::connect_with(&pool)
        .await
        .unwrap();
    listener.listen("wharf_bench").await.unwrap();
    let mut out = Vec::with_capacity(samples);
    for i in 0..samples {
        let sent = Instant::now();
        sqlx::query("SELECT pg_notify('wharf_bench', $1)")
            .bind(i.to_string())
            .execute(&pool)
            .await
            .unwrap();
        listener.recv().await.unwrap();
        out.push(sent.elapsed());
    }
    out
}

async fn redis_baseline(url: &str, samples: usize) -> Vec<Duration> {
    let client = redis::Client::open(url).unwrap();
    let mut publisher = client.get_multiplexed_async_connection().await.unwrap();
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    pubsub.subscribe("wharf_bench").await.unwrap();
    let mut messages = pubsub.into_on_message();
    let mut out = Vec::with_capacity(samples);
    for i in 0..samples {
        let sent = Instant::now();
        let _: i64 = redis::cmd("PUBLISH")
            .arg("wharf_bench")
            .arg(i)
            .query_async(&mut publisher)
            .await
            .unwrap();
        messages.next().await.unwrap();
        out.push(sent.elapsed());
    }
    out
}

/// Resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Opens one idle stream at `path` and reads until its first event has arrived.
async fn open_idle(port: u16, path: &str, body: &str) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: subscriptions/listen\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 2048];
    while !String::from_utf8_lossy(&seen).contains("acknowledged") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "stream closed: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    s
}

/// Opens `n` idle streams, 200 at a time, and returns them with the server's RSS growth per
/// stream in bytes.
async fn hold(port: u16, pid: u32, path: &str, body: &str, n: usize) -> (Vec<TcpStream>, f64) {
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_kib(pid);
    let mut held = Vec::with_capacity(n);
    while held.len() < n {
        let batch = (n - held.len()).min(200);
        let opened =
            futures_util::future::join_all((0..batch).map(|_| open_idle(port, path, body))).await;
        held.extend(opened);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_kib(pid);
    (
        held,
        (after.saturating_sub(before) * 1024) as f64 / n as f64,
    )
}

async fn list_times(client: &HttpClient, n: usize) -> Vec<Duration> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = client.request("tools/list", json!({})).await.unwrap();
        assert!(r.result().is_some(), "{}", r.body);
        out.push(t.elapsed());
    }
    out
}

async fn streams() {
    let n: usize = env_or("STREAMS", "10000").parse().unwrap();
    let store = env_or("STORE", "postgres://postgres@127.0.0.1:5432/test");
    let cpu = env_or("SERVER_CPU", "0");
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "subscriptions/listen", "params": {
        "_meta": { "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                   "io.modelcontextprotocol/clientCapabilities": {} },
        "notifications": { "toolsListChanged": true } } })
    .to_string();

    // The baseline first: the bare SSE endpoint.
    let bport = free_port();
    let bbin = env_or("BASELINE_BIN", "target/release/wharf-bench-baseline");
    let baseline = Process(
        Command::new("taskset")
            .args(["-c", &cpu, &bbin])
            .args(["--listen", &format!("127.0.0.1:{bport}")])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {bbin}: {e}")),
    );
    wait_for_port(bport).await;
    let (held, base_per) = hold(bport, baseline.0.id(), "/listen", &body, n).await;
    drop(held);
    drop(baseline);

    let port = free_port();
    // Every stream is the one principal's: the per-principal and server-wide caps (32 and
    // 10,000 by default) are raised to what is measured.
    let cap = n.to_string();
    let server = replica(
        &store,
        port,
        Some(&cpu),
        &[
            "--max-listen-per-principal",
            &cap,
            "--max-listen-streams",
            &cap,
        ],
    );
    let c = client(port);
    let mut idle = list_times(&c, 200).await;
    let (held, per) = hold(port, server.0.id(), "/mcp", &body, n).await;
    let mut busy = list_times(&c, 200).await;
    println!("streams store={store} streams={n}");
    println!(
        "  wharf: {:.0} bytes per idle listen stream ({:.1} KiB)",
        per,
        per / 1024.0
    );
    println!(
        "  baseline (bare axum SSE): {:.0} bytes per idle stream ({:.1} KiB)",
        base_per,
        base_per / 1024.0
    );
    println!("  wharf/baseline memory per stream: {:.2}", per / base_per);
    println!("  tools/list with no stream open: {}", summary(&mut idle));
    println!("  tools/list with {n} streams open: {}", summary(&mut busy));
    drop(held);
}

async fn wait_for_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    match std::env::args().nth(1).as_deref() {
        Some("fanout") => runtime.block_on(fanout()),
        Some("streams") => runtime.block_on(streams()),
        _ => {
            eprintln!("usage: wharf-bench-replicas fanout|streams (see bench/replicas.sh)");
            std::process::exit(2);
        }
    }
}
