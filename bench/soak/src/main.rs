//! Soak load for `bench/soak.sh`: for `SOAK_SECS` seconds, against the import service at
//! `WHARF_URL` (API key `SOAK_TOKEN`), at once:
//! - writers: an import of 500 rows committed into a dataset of their own, the dataset
//!   deleted (a confirmed MRTR round) every tenth time;
//! - readers: every page of those datasets, following cursors;
//! - cutters: `report_generate` with progress over SSE, the stream dropped after its first
//!   event (the client goes away mid-call);
//! - listeners: `subscriptions/listen` on a writer's dataset, held for up to 3 s, dropped.
//!
//! Every 10 s it samples the server process (`SOAK_PID`): resident memory and open file
//! descriptors, and with `SOAK_DB` (a SQLite file) the size of its write-ahead log. At the
//! end it prints the samples and compares the first and last fifths.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};
use wharf_client::HttpClient;

#[derive(Default)]
struct Counts {
    writes: AtomicU64,
    pages: AtomicU64,
    cut: AtomicU64,
    listens: AtomicU64,
    errors: AtomicU64,
}

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

fn unique(prefix: &str) -> String {
    use std::hash::{BuildHasher, RandomState};
    format!("{prefix}-{:x}", RandomState::new().hash_one(Instant::now()))
}

/// A tool call's structured result, or `None` (counted as an error) when it failed.
async fn tool(client: &HttpClient, counts: &Counts, name: &str, args: Value) -> Option<Value> {
    match client.call_tool(name, args).await {
        Ok(r) if r.result().is_some_and(|r| r["isError"] != true) => r.result().cloned(),
        Ok(r) => {
            counts.errors.fetch_add(1, Ordering::Relaxed);
            eprintln!(
                "soak: {name}: {}",
                r.body.chars().take(300).collect::<String>()
            );
            None
        }
        Err(e) => {
            counts.errors.fetch_add(1, Ordering::Relaxed);
            eprintln!("soak: {name}: {e}");
            None
        }
    }
}

fn rows(n: i64) -> Value {
    (0..n)
        .map(|i| json!({ "id": i, "city": format!("city {i}"), "temp": i as f64 / 4.0 }))
        .collect()
}

async fn writer(client: HttpClient, counts: Arc<Counts>, dataset: String, until: Instant) {
    let columns = json!([
        { "name": "id", "type": "integer" },
        { "name": "city", "type": "string" },
        { "name": "temp", "type": "number" }
    ]);
    let mut round = 0u64;
    while Instant::now() < until {
        round += 1;
        let begun = tool(
            &client,
            &counts,
            "import_begin",
            json!({ "dataset": dataset, "columns": columns, "idempotency_key": unique("b") }),
        )
        .await;
        let Some(import) =
            begun.and_then(|r| r["structuredContent"]["import"].as_str().map(str::to_owned))
        else {
            continue;
        };
        tool(
            &client,
            &counts,
            "import_append_rows",
            json!({ "import": import, "rows": rows(500), "idempotency_key": unique("a") }),
        )
        .await;
        if tool(
            &client,
            &counts,
            "import_commit",
            json!({ "import": import, "idempotency_key": unique("c") }),
        )
        .await
        .is_some()
        {
            counts.writes.fetch_add(1, Ordering::Relaxed);
        }
        if round.is_multiple_of(10) {
            let key = unique("d");
            let mut params = json!({
                "name": "dataset_delete",
                "arguments": { "dataset": dataset, "idempotency_key": key },
                "_meta": { "io.modelcontextprotocol/clientCapabilities": { "elicitation": {} } }
            });
            let asked = client.request("tools/call", params.clone()).await;
            let state = asked.ok().and_then(|r| {
                r.result()
                    .and_then(|r| r["requestState"].as_str().map(str::to_owned))
            });
            match state {
                Some(state) => {
                    params["requestState"] = json!(state);
                    params["inputResponses"] = json!({ "confirm_delete": { "action": "accept", "content": { "delete": true } } });
                    if client.request("tools/call", params).await.is_err() {
                        counts.errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                None => {
                    counts.errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

async fn reader(client: HttpClient, counts: Arc<Counts>, datasets: Vec<String>, until: Instant) {
    let mut i = 0;
    while Instant::now() < until {
        let dataset = &datasets[i % datasets.len()];
        i += 1;
        let mut cursor = Value::Null;
        loop {
            let mut args = json!({ "dataset": dataset, "limit": 200 });
            if !cursor.is_null() {
                args["cursor"] = cursor.clone();
            }
            // A dataset just deleted (or not yet created) is an isError: not the server's fault.
            let Ok(reply) = client.call_tool("dataset_query", args).await else {
                counts.errors.fetch_add(1, Ordering::Relaxed);
                break;
            };
            counts.pages.fetch_add(1, Ordering::Relaxed);
            let Some(result) = reply.result() else { break };
            cursor = result["structuredContent"]["nextCursor"].clone();
            if cursor.is_null() {
                break;
            }
        }
    }
}

async fn cutter(client: HttpClient, counts: Arc<Counts>, datasets: Vec<String>, until: Instant) {
    let mut i = 0;
    while Instant::now() < until {
        let dataset = &datasets[i % datasets.len()];
        i += 1;
        let params = json!({
            "name": "report_generate",
            "arguments": { "dataset": dataset, "chunk_rows": 100, "pause_ms": 50, "idempotency_key": unique("r") },
            "_meta": { "progressToken": i }
        });
        match client.open_stream("tools/call", params).await {
            Ok(stream) => {
                let mut stream = Box::pin(stream);
                let _ = tokio::time::timeout(Duration::from_secs(5), stream.next()).await;
                counts.cut.fetch_add(1, Ordering::Relaxed);
                // Dropped here: the connection closes mid-call.
            }
            Err(_) => {
                counts.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

async fn listener(client: HttpClient, counts: Arc<Counts>, datasets: Vec<String>, until: Instant) {
    let mut i = 0u64;
    while Instant::now() < until {
        let dataset = &datasets[i as usize % datasets.len()];
        i += 1;
        let params = json!({ "notifications": { "resourceSubscriptions": [format!("dataset://{dataset}")] } });
        match client.open_stream("subscriptions/listen", params).await {
            Ok(stream) => {
                let mut stream = Box::pin(stream);
                let hold = Duration::from_millis(500 + (i * 397) % 2500);
                let _ =
                    tokio::time::timeout(hold, async { while stream.next().await.is_some() {} })
                        .await;
                counts.listens.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                counts.errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Resident memory (KiB) and open descriptors of process `pid`.
fn sample(pid: &str) -> Option<(u64, usize)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .ok()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
    Some((rss, fds))
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

#[tokio::main]
async fn main() {
    let url = env("WHARF_URL", "http://127.0.0.1:18097/mcp");
    let token = env("SOAK_TOKEN", "soak-token-0123456789");
    let pid = env("SOAK_PID", "");
    let wal = std::env::var("SOAK_DB").ok().map(|db| format!("{db}-wal"));
    let secs: u64 = env("SOAK_SECS", "1800")
        .parse()
        .expect("SOAK_SECS is a number");
    let started = Instant::now();
    let until = started + Duration::from_secs(secs);
    let client = HttpClient::new(url).with_bearer(token);
    let counts = Arc::new(Counts::default());
    let datasets: Vec<String> = (0..4).map(|i| format!("soak_w{i}")).collect();
    let mut tasks = Vec::new();
    for d in &datasets {
        tasks.push(tokio::spawn(writer(
            client.clone(),
            Arc::clone(&counts),
            d.clone(),
            until,
        )));
    }
    for _ in 0..4 {
        tasks.push(tokio::spawn(reader(
            client.clone(),
            Arc::clone(&counts),
            datasets.clone(),
            until,
        )));
    }
    for _ in 0..2 {
        tasks.push(tokio::spawn(cutter(
            client.clone(),
            Arc::clone(&counts),
            datasets.clone(),
            until,
        )));
    }
    for _ in 0..4 {
        tasks.push(tokio::spawn(listener(
            client.clone(),
            Arc::clone(&counts),
            datasets.clone(),
            until,
        )));
    }
    let mut samples = Vec::new();
    while Instant::now() < until {
        if let Some((rss, fds)) = sample(&pid) {
            let at = started.elapsed().as_secs();
            let wal_kib = wal
                .as_ref()
                .and_then(|w| std::fs::metadata(w).ok())
                .map_or(0, |m| m.len() / 1024);
            println!(
                "t={at:>5}s rss={rss:>7} KiB fds={fds:>4} wal={wal_kib:>7} KiB writes={} pages={} cut={} listens={} errors={}",
                counts.writes.load(Ordering::Relaxed),
                counts.pages.load(Ordering::Relaxed),
                counts.cut.load(Ordering::Relaxed),
                counts.listens.load(Ordering::Relaxed),
                counts.errors.load(Ordering::Relaxed),
            );
            samples.push((rss, fds as u64));
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    for t in tasks {
        let _ = t.await;
    }
    // Settled: the last streams closed.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = sample(&pid);
    let fifth = (samples.len() / 5).max(1);
    let first: Vec<_> = samples.iter().take(fifth).copied().collect();
    let last: Vec<_> = samples.iter().rev().take(fifth).copied().collect();
    let (rss0, rss1) = (
        median(first.iter().map(|s| s.0).collect()),
        median(last.iter().map(|s| s.0).collect()),
    );
    let (fd0, fd1) = (
        median(first.iter().map(|s| s.1).collect()),
        median(last.iter().map(|s| s.1).collect()),
    );
    println!("\n{secs} s of mixed load; medians of the first and last fifth of the samples:");
    println!(
        "  resident memory: {rss0} KiB -> {rss1} KiB ({:+.1} %)",
        (rss1 as f64 / rss0.max(1) as f64 - 1.0) * 100.0
    );
    println!("  open descriptors: {fd0} -> {fd1}");
    if let Some((rss, fds)) = after {
        println!("  after the load stopped: {rss} KiB, {fds} descriptors");
    }
    println!(
        "  done: {} commits, {} pages, {} calls cut off mid-stream, {} listen streams; {} errors",
        counts.writes.load(Ordering::Relaxed),
        counts.pages.load(Ordering::Relaxed),
        counts.cut.load(Ordering::Relaxed),
        counts.listens.load(Ordering::Relaxed),
        counts.errors.load(Ordering::Relaxed),
    );
}
