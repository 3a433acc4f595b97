//! What an operator sees of a running `wharf serve`: a real Prometheus scraping its
//! metrics, its spans and metrics received over OTLP/HTTP (the spans under the caller's
//! trace), and JSON log lines that carry the trace id.

use crate::common;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::import::{TOKEN_42, sqlite_url, unique};
use common::{ServerProcess, free_port, request};
use futures_util::StreamExt as _;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, HistogramDataPoint, Metric, metric, number_data_point,
};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use serde_json::{Value, json};

/// A W3C trace context as a client would send it, with a fresh trace id.
fn traceparent() -> (String, String, String) {
    let trace: String = (0..4)
        .map(|_| format!("{:08x}", rand_u32()))
        .collect::<String>();
    let parent = format!("{:08x}{:08x}", rand_u32(), rand_u32());
    (format!("00-{trace}-{parent}-01"), trace, parent)
}

/// A client of `server` (user 42's token) whose every request carries `traceparent` as an
/// HTTP header, as a client instrumented for HTTP sends it.
fn sending_traceparent(server: &ServerProcess, traceparent: &str) -> wharf_client::HttpClient {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("traceparent", traceparent.parse().unwrap());
    let http = reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap();
    server.client().with_bearer(TOKEN_42).with_http(http)
}

fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, RandomState};
    (RandomState::new().hash_one(Instant::now()) as u32) | 1
}

/// Waits until `check` gives a value, polling: a generous deadline turns a hang into a
/// failure; nothing is decided by it.
async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(found) = check().await {
            return found;
        }
        if Instant::now() > deadline {
            panic!("never: {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The three echo calls the metrics tests make, as the Prometheus text counts them.
const ECHO_OK_THREE: &str =
    "wharf_requests_total{method=\"tools/call\",tool=\"echo\",outcome=\"ok\"} 3\n";

/// The text `GET /metrics` serves at `address`.
async fn scrape(address: &str) -> String {
    let response = reqwest::get(format!("http://{address}/metrics")).await;
    response.unwrap().text().await.unwrap()
}

/// Debian's Prometheus, scraping `target` every second, with its data in a temporary
/// directory; killed when dropped.
struct Prometheus {
    child: Child,
    port: u16,
}

impl Prometheus {
    fn start(target: &str) -> Prometheus {
        let binary = "/usr/bin/prometheus";
        assert!(
            std::path::Path::new(binary).exists(),
            "{binary} is missing: scripts/test.sh installs Debian's prometheus package"
        );
        let dir = common::scratch(unique("wharf-prometheus"));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: wharf\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let port = free_port();
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus");
        Prometheus { child, port }
    }

    /// The value of the one series `query` selects, if Prometheus has it.
    async fn value(&self, query: &str) -> Option<f64> {
        let url = format!("http://127.0.0.1:{}/api/v1/query", self.port);
        let answer: Value = reqwest::Client::new()
            .get(url)
            .query(&[("query", query)])
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        let series = answer["data"]["result"].as_array()?;
        series.first()?["value"][1].as_str()?.parse().ok()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_real_prometheus_scrapes_the_request_counter_of_a_tool() {
    let metrics_port = free_port();
    let metrics = format!("127.0.0.1:{metrics_port}");
    let key = "observability-token-0001";
    let server = ServerProcess::start(&[
        "--metrics-listen",
        &metrics,
        "--api-key",
        &format!("ops={key}"),
    ]);
    let client = server.client().with_bearer(key);
    call_echo(&client, 3).await;
    // A call of a tool the server does not have is counted apart, as an error.
    let r = request(
        &client,
        "tools/call",
        json!({ "name": "nope", "arguments": {} }),
    )
    .await;
    assert!(r.error().is_some(), "{}", r.body);

    // Refused before they run: no credentials, and credentials the server does not know.
    for client in [
        server.client(),
        server.client().with_bearer("not-a-key-of-this-server"),
    ] {
        let r = client.request("tools/list", json!({})).await.unwrap();
        assert_eq!(r.status, 401, "{}", r.body);
    }

    // Refused before it reaches a method: counted by its HTTP status only.
    let headers = client.headers_for("tools/list", &json!({}));
    let r = client
        .send_raw(b"{\"jsonrpc\": \"2.0\", ".to_vec(), headers)
        .await
        .unwrap();
    assert_eq!(r.status, 400, "{}", r.body);

    let text = scrape(&metrics).await;
    assert!(text.contains(ECHO_OK_THREE), "{text}");
    for (status, n) in [(200, 4), (400, 1), (401, 2)] {
        let series = format!("wharf_http_responses_total{{status=\"{status}\"}} {n}\n");
        assert!(text.contains(&series), "{series}: {text}");
    }
    assert!(
        text.contains(
            "wharf_requests_total{method=\"tools/call\",tool=\"\",outcome=\"error\"} 1\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "wharf_request_duration_seconds_count{method=\"tools/call\",tool=\"echo\"} 3\n"
        ),
        "{text}"
    );

    for reason in ["missing", "invalid"] {
        let series = format!("wharf_auth_refusals_total{{reason=\"{reason}\"}} 1\n");
        assert!(text.contains(&series), "{series}: {text}");
    }

    let prometheus = Prometheus::start(&metrics);
    let query = r#"sum(wharf_requests_total{tool="echo",outcome="ok"})"#;
    let seen = eventually("Prometheus has scraped the echo calls", async || {
        prometheus.value(query).await.filter(|&n| n >= 3.0)
    })
    .await;
    assert_eq!(seen, 3.0);
    // Calls made while it scrapes give the rates and quantiles dashboards show.
    for _ in 0..20 {
        let r = request(
            &client,
            "tools/call",
            json!({ "name": "echo", "arguments": { "text": "more" } }),
        )
        .await;
        assert!(r.result().is_some(), "{}", r.body);
    }
    let p99 = r#"histogram_quantile(0.99, sum by (le) (rate(wharf_request_duration_seconds_bucket{tool="echo"}[1m])))"#;
    let latency = eventually(
        "Prometheus computes the echo latency quantile",
        async || prometheus.value(p99).await.filter(|v| v.is_finite()),
    )
    .await;
    assert!(latency > 0.0, "{latency}");
}

/// A metrics push as the receiver got it.
#[derive(Clone)]
struct Push {
    headers: axum::http::HeaderMap,
    request: ExportMetricsServiceRequest,
}

/// An OTLP/HTTP receiver: keeps every span and every metrics push it is sent.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Span>>>,
    pushes: Arc<Mutex<Vec<Push>>>,
}

impl Receiver {
    async fn start(&self) -> u16 {
        let spans = self.spans.clone();
        let pushes = self.pushes.clone();
        let app = axum::Router::new()
            .route(
                "/v1/traces",
                axum::routing::post(move |body: axum::body::Bytes| {
                    let spans = spans.clone();
                    async move {
                        let request = ExportTraceServiceRequest::decode(body)
                            .expect("the exporter sends protobuf");
                        let mut kept = spans.lock().unwrap();
                        for resource in request.resource_spans {
                            for scope in resource.scope_spans {
                                kept.extend(scope.spans);
                            }
                        }
                        axum::http::StatusCode::OK
                    }
                }),
            )
            .route(
                "/v1/metrics",
                axum::routing::post(
                    move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                        let pushes = pushes.clone();
                        async move {
                            let request = ExportMetricsServiceRequest::decode(body)
                                .expect("the exporter sends protobuf");
                            pushes.lock().unwrap().push(Push { headers, request });
                            axum::http::StatusCode::OK
                        }
                    },
                ),
            );
        let listener = common::tokio_listener();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        port
    }

    /// The spans of trace `trace` (hex) received so far.
    fn of_trace(&self, trace: &str) -> Vec<Span> {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| hex(&s.trace_id) == trace)
            .cloned()
            .collect()
    }

    /// The metrics pushes received so far.
    fn pushes(&self) -> Vec<Push> {
        self.pushes.lock().unwrap().clone()
    }
}

impl Push {
    /// The metric named `name` in this push.
    fn metric(&self, name: &str) -> Option<&Metric> {
        let resources = self.request.resource_metrics.iter();
        let scopes = resources.flat_map(|r| &r.scope_metrics);
        scopes.flat_map(|s| &s.metrics).find(|m| m.name == name)
    }

    /// The value of the counter `name` at the point with exactly `labels`.
    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> Option<i64> {
        let Some(metric::Data::Sum(sum)) = self.metric(name)?.data.as_ref() else {
            panic!("{name} is a sum");
        };
        assert!(sum.is_monotonic, "{name} only grows");
        assert_eq!(
            sum.aggregation_temporality,
            AggregationTemporality::Cumulative as i32
        );
        let point = sum
            .data_points
            .iter()
            .find(|p| has(&p.attributes, labels))?;
        match point.value {
            Some(number_data_point::Value::AsInt(n)) => Some(n),
            ref other => panic!("{name}: an integer, not {other:?}"),
        }
    }

    /// The histogram `name`'s point with exactly `labels`.
    fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Option<&HistogramDataPoint> {
        let Some(metric::Data::Histogram(h)) = self.metric(name)?.data.as_ref() else {
            panic!("{name} is a histogram");
        };
        h.data_points.iter().find(|p| has(&p.attributes, labels))
    }

    /// The string attribute `key` of the resource that pushed.
    fn resource(&self, key: &str) -> Option<String> {
        let resource = self.request.resource_metrics.first()?.resource.as_ref()?;
        string(&resource.attributes, key)
    }
}

fn string(attributes: &[KeyValue], key: &str) -> Option<String> {
    let value = attributes.iter().find(|a| a.key == key)?.value.as_ref()?;
    match &value.value {
        Some(any_value::Value::StringValue(s)) => Some(s.clone()),
        _ => None,
    }
}

/// Whether `attributes` are exactly `labels`.
fn has(attributes: &[KeyValue], labels: &[(&str, &str)]) -> bool {
    attributes.len() == labels.len()
        && labels
            .iter()
            .all(|(k, v)| string(attributes, k).as_deref() == Some(*v))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `span` is under `ancestor` in `spans`.
fn is_under(spans: &HashMap<Vec<u8>, &Span>, span: &Span, ancestor: &Span) -> bool {
    let mut parent = span.parent_span_id.clone();
    while let Some(up) = spans.get(&parent) {
        if up.span_id == ancestor.span_id {
            return true;
        }
        parent = up.parent_span_id.clone();
    }
    false
}

#[tokio::test]
async fn spans_exported_over_otlp_join_the_callers_trace() {
    let receiver = Receiver::default();
    let otlp = format!("http://127.0.0.1:{}", receiver.start().await);
    let store = sqlite_url("otlp");
    let args = common::import::replica_args(&store);
    let server = ServerProcess::start_with_env(
        free_port(),
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        &[
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.as_str()),
                ("OTEL_BSP_SCHEDULE_DELAY", "100"),
                ("OTEL_SERVICE_NAME", "wharf-under-test"),
            ][..],
            &common::proxy_env(&unanswered_proxy()),
        ]
        .concat(),
    );
    let client = server.client().with_bearer(TOKEN_42);
    let (tp, trace, parent) = traceparent();
    let dataset = unique("traced");
    let r = request(
        &client,
        "tools/call",
        json!({
            "name": "import_begin",
            "arguments": {
                "dataset": dataset,
                "columns": common::import::columns(),
                "idempotency_key": unique("begin"),
            },
            "_meta": { "traceparent": tp },
        }),
    )
    .await;
    assert_ne!(r.result().unwrap()["isError"], true, "{}", r.body);

    // The request span is named for what it called, as OpenTelemetry's conventions ask.
    let request_name = "tools/call import_begin";
    let spans = eventually("the call's spans reach the receiver", async || {
        let spans = receiver.of_trace(&trace);
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
        let all = [request_name, "mcp.handler", "mcp.store"]
            .iter()
            .all(|n| names.contains(n));
        all.then_some(spans)
    })
    .await;
    let by_id: HashMap<Vec<u8>, &Span> = spans.iter().map(|s| (s.span_id.clone(), s)).collect();
    let named = |name: &'static str| spans.iter().filter(move |s| s.name == name);
    let request_span = named(request_name).next().unwrap();
    assert_eq!(
        hex(&request_span.parent_span_id),
        parent,
        "the request span is a child of the client's span"
    );
    let attribute = |span: &Span, key: &str| {
        span.attributes
            .iter()
            .find(|a| a.key == key)
            .and_then(|a| a.value.as_ref())
            .map(|v| format!("{:?}", v.value))
    };
    assert!(
        attribute(request_span, "mcp.target").is_some_and(|v| v.contains("import_begin")),
        "{request_span:?}"
    );
    assert!(
        attribute(request_span, "mcp.outcome").is_some_and(|v| v.contains("\"ok\"")),
        "{request_span:?}"
    );
    assert!(
        attribute(request_span, "enduser.hash").is_some_and(|v| !v.contains("user-42")),
        "the principal appears only as a hash: {request_span:?}"
    );
    // Every stage, the commit on its own task included, is under the request span.
    for span in named("mcp.handler").chain(named("mcp.store")) {
        assert!(
            is_under(&by_id, span, request_span),
            "{} is under the request span: {spans:?}",
            span.name
        );
    }
    // The `tools/list` span of trace `trace` arrives, a child of span `parent`.
    let listed_under = async |trace: &str, parent: &str| {
        let listed = eventually("the list's span reaches the receiver", async || {
            receiver
                .of_trace(trace)
                .into_iter()
                .find(|s| s.name == "tools/list")
        })
        .await;
        assert_eq!(hex(&listed.parent_span_id), parent);
    };
    // A client that sends its trace context only in the HTTP headers is joined too.
    let (tp, trace, parent) = traceparent();
    let by_header = sending_traceparent(&server, &tp);
    let r = request(&by_header, "tools/list", json!({})).await;
    assert!(r.result().is_some(), "{}", r.body);
    listed_under(&trace, &parent).await;
    // So is a legacy session's request: that era has no trace context in `_meta`.
    let (tp, trace, parent) = traceparent();
    let legacy_client = sending_traceparent(&server, &tp);
    let session = wharf_client::LegacySession::initialize(&legacy_client, "2025-11-25", json!({}))
        .await
        .unwrap();
    let r = session.request("tools/list", json!({})).await.unwrap();
    assert!(r.result().is_some(), "{}", r.body);
    listed_under(&trace, &parent).await;

    // The store spans name their operation; the call's transaction began and committed.
    let operations: Vec<String> = named("mcp.store")
        .filter_map(|s| attribute(s, "db.operation.name"))
        .collect();
    assert!(
        operations.iter().any(|o| o.contains("begin"))
            && operations.iter().any(|o| o.contains("commit")),
        "{operations:?}"
    );
}

#[tokio::test]
async fn json_log_lines_parse_and_carry_the_trace_id() {
    let server = ServerProcess::start(&[
        "--log-format",
        "json",
        "--max-in-flight",
        "1",
        "--max-queue",
        "4",
    ]);
    let client = server.client();
    // The first call holds the one slot; the second waits in the queue, and the line that
    // says so belongs to its trace.
    let (first_tp, _, _) = traceparent();
    let mut first = Box::pin(
        client
            .open_stream(
                "tools/call",
                json!({ "name": "slow_count", "arguments": { "steps": 3, "interval_ms": 300 },
                        "_meta": { "progressToken": "first", "traceparent": first_tp } }),
            )
            .await
            .unwrap(),
    );
    first.next().await.expect("the first call runs");
    let (second_tp, second_trace, _) = traceparent();
    let second = request(
        &client,
        "tools/call",
        json!({ "name": "echo", "arguments": { "text": "queued" },
                "_meta": { "traceparent": second_tp } }),
    );
    let (second, _) = tokio::join!(second, async { while first.next().await.is_some() {} });
    assert!(second.result().is_some(), "{}", second.body);

    let lines = server.log.lines();
    assert!(!lines.is_empty());
    let parsed: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    for line in &parsed {
        for key in ["timestamp", "level", "target"] {
            assert!(line[key].is_string(), "{key} missing: {line}");
        }
    }
    let queued: Vec<&Value> = parsed
        .iter()
        .filter(|l| l["message"] == "request queued for a slot")
        .collect();
    assert!(
        queued
            .iter()
            .any(|l| l["trace_id"] == second_trace.as_str()),
        "the queue line carries the queued request's trace id: {queued:?}"
    );
}

/// A proxy nobody answers on, for the environment of a server whose collector is on
/// loopback: it must reach it directly.
fn unanswered_proxy() -> String {
    format!("http://127.0.0.1:{}", free_port())
}

/// The tools/call echo point's labels.
const ECHO_OK: [(&str, &str); 3] = [
    ("method", "tools/call"),
    ("tool", "echo"),
    ("outcome", "ok"),
];

async fn call_echo(client: &wharf_client::HttpClient, times: usize) {
    for _ in 0..times {
        let r = request(
            client,
            "tools/call",
            json!({ "name": "echo", "arguments": { "text": "counted" } }),
        )
        .await;
        assert!(r.result().is_some(), "{}", r.body);
    }
}

#[tokio::test]
async fn metrics_pushed_over_otlp_count_what_the_prometheus_text_counts() {
    let receiver = Receiver::default();
    let otlp = format!("http://127.0.0.1:{}", receiver.start().await);
    let metrics = format!("127.0.0.1:{}", free_port());
    let server = ServerProcess::start_with_env(
        free_port(),
        &[
            "--profile",
            "demo",
            "--anonymous",
            "--metrics-listen",
            &metrics,
        ],
        &[
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.as_str()),
                ("OTEL_TRACES_EXPORTER", "none"),
                ("OTEL_METRIC_EXPORT_INTERVAL", "200"),
                (
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    "authorization=Bearer%20collector-secret",
                ),
            ][..],
            &common::proxy_env(&unanswered_proxy()),
        ]
        .concat(),
    );
    call_echo(&server.client(), 3).await;
    let push = eventually("a push counts the three echo calls", async || {
        let pushes = receiver.pushes();
        let last = pushes.last()?;
        (last.counter("wharf_requests", &ECHO_OK) == Some(3)).then(|| last.clone())
    })
    .await;
    assert_eq!(push.headers["content-type"], "application/x-protobuf");
    assert_eq!(
        push.headers["authorization"], "Bearer collector-secret",
        "OTEL_EXPORTER_OTLP_HEADERS reach the collector"
    );
    assert_eq!(push.resource("service.name").as_deref(), Some("wharf"));
    assert!(
        push.resource("service.instance.id")
            .is_some_and(|id| id.len() == 32),
        "each replica pushes as an instance of its own"
    );
    // A gauge: once the calls are answered, nothing is in flight.
    eventually("a push shows no request in flight", async || {
        let pushes = receiver.pushes();
        let Some(metric::Data::Gauge(in_flight)) = pushes
            .last()?
            .metric("wharf_requests_in_flight")
            .and_then(|m| m.data.as_ref())
        else {
            panic!("wharf_requests_in_flight is a gauge");
        };
        let zero = Some(number_data_point::Value::AsInt(0));
        (in_flight.data_points[0].value == zero).then_some(())
    })
    .await;

    // The latency histogram: the core's bounds, one count more than bounds, three calls.
    let echo = [("method", "tools/call"), ("tool", "echo")];
    let latency = push
        .histogram("wharf_request_duration_seconds", &echo)
        .expect("the echo calls are timed");
    assert_eq!(latency.count, 3);
    assert_eq!(
        latency.bucket_counts.len(),
        latency.explicit_bounds.len() + 1
    );
    assert_eq!(latency.bucket_counts.iter().sum::<u64>(), 3);
    assert!(latency.sum.is_some_and(|s| s > 0.0), "{latency:?}");
    assert!(latency.start_time_unix_nano < latency.time_unix_nano);
    let Some(metric::Data::Histogram(h)) = push
        .metric("wharf_request_duration_seconds")
        .unwrap()
        .data
        .as_ref()
    else {
        unreachable!("checked by histogram()")
    };
    assert_eq!(
        h.aggregation_temporality,
        AggregationTemporality::Cumulative as i32
    );
    assert_eq!(
        push.metric("wharf_request_duration_seconds").unwrap().unit,
        "s"
    );

    // The same numbers as the Prometheus text, from the same counters.
    let text = scrape(&metrics).await;
    assert!(text.contains(ECHO_OK_THREE), "{text}");

    // Cumulative: later pushes keep the start of counting and carry new calls on top.
    call_echo(&server.client(), 2).await;
    let later = eventually("a later push counts five", async || {
        let pushes = receiver.pushes();
        let last = pushes.last()?;
        (last.counter("wharf_requests", &ECHO_OK) == Some(5)).then(|| last.clone())
    })
    .await;
    let first_point = |p: &Push| {
        let Some(metric::Data::Sum(sum)) = p.metric("wharf_requests").unwrap().data.as_ref() else {
            unreachable!("checked by counter()")
        };
        sum.data_points[0].start_time_unix_nano
    };
    assert_eq!(first_point(&push), first_point(&later));
}

// Two workers: the receiver answers while the test thread waits for the process to exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_server_pushes_its_last_counts() {
    let receiver = Receiver::default();
    let otlp = format!("http://127.0.0.1:{}", receiver.start().await);
    let mut server = ServerProcess::start_with_env(
        free_port(),
        &[
            "--profile",
            "demo",
            "--anonymous",
            "--drain-grace-secs",
            "0",
        ],
        &[
            (
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                &format!("{otlp}/v1/metrics"),
            ),
            // An hour: the only push in this test is the one made at shutdown.
            ("OTEL_METRIC_EXPORT_INTERVAL", "3600000"),
            ("OTEL_SERVICE_NAME", "wharf-stopping"),
        ],
    );
    call_echo(&server.client(), 2).await;
    assert!(
        receiver.pushes().is_empty(),
        "nothing pushed before the hour"
    );
    server.terminate();
    assert!(server.wait_exit(Duration::from_secs(30)).success());
    let pushes = receiver.pushes();
    assert_eq!(pushes.len(), 1, "one push, at shutdown");
    assert_eq!(pushes[0].counter("wharf_requests", &ECHO_OK), Some(2));
    assert_eq!(
        pushes[0].resource("service.name").as_deref(),
        Some("wharf-stopping")
    );
}
