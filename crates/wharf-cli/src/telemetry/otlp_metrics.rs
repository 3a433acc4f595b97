//! The server's metrics pushed over OTLP/HTTP (protobuf) to a collector, when the standard
//! `OTEL_*` variables name one. The core's [`Snapshot`] is mapped onto the protocol's
//! messages: counters as cumulative monotonic sums, gauges, and histograms with the core's
//! fixed bounds. Values are cumulative, so a push that fails loses nothing: the next one
//! carries every count.

use std::time::{Duration, SystemTime};

use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint,
    ResourceMetrics, ScopeMetrics, Sum, metric, number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message as _;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use tokio_util::sync::CancellationToken;
use wharf::Server;
use wharf::metrics::{Family, Points, Snapshot};

/// Where and how often to push, read from the environment once at startup.
#[derive(Clone)]
pub(crate) struct MetricsPush {
    endpoint: String,
    headers: HeaderMap,
    timeout: Duration,
    interval: Duration,
    resource: Vec<KeyValue>,
    client: reqwest::Client,
}

impl std::fmt::Debug for MetricsPush {
    // Headers carry the collector's credentials: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsPush")
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

/// The longest the last push at shutdown may take: a collector that does not answer must not
/// hold a stopping replica past its orchestrator's grace period.
const LAST_PUSH: Duration = Duration::from_secs(5);

impl MetricsPush {
    /// The push `env` configures, if any: `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` as it is, or
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` with `/v1/metrics`; off with `OTEL_SDK_DISABLED=true` or
    /// an `OTEL_METRICS_EXPORTER` list without `otlp`. Headers, TLS files, timeout and
    /// interval come from the standard variables, a metrics-only one (`…_METRICS_…`)
    /// replacing the generic one. An error names the variable it cannot use.
    pub(crate) fn from_env(
        env: impl Fn(&str) -> Option<String>,
        resource: Vec<KeyValue>,
    ) -> Result<Option<MetricsPush>, String> {
        let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let setting = |what: &str| signal_setting(&var, "METRICS", what);
        let Some(endpoint) = signal_endpoint(&var, "METRICS", "metrics")? else {
            return Ok(None);
        };
        let name = "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE";
        if let Some(preference) = var(name).filter(|p| !p.eq_ignore_ascii_case("cumulative")) {
            return Err(format!(
                "{name}={preference}: wharf pushes cumulative metrics only"
            ));
        }
        let headers = match setting("HEADERS") {
            Some((name, list)) => parse_headers(&list).map_err(|e| format!("{name}: {e}"))?,
            None => HeaderMap::new(),
        };
        let millis = |name: &str, value: &str| -> Result<Duration, String> {
            match value.trim().parse::<u64>() {
                Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
                _ => Err(format!(
                    "{name}={value}: not a positive number of milliseconds"
                )),
            }
        };
        let mut timeout = match setting("TIMEOUT") {
            Some((name, ms)) => millis(&name, &ms)?,
            None => Duration::from_secs(10),
        };
        // The whole export's bound, when it is the tighter one.
        if let Some(ms) = var("OTEL_METRIC_EXPORT_TIMEOUT") {
            timeout = timeout.min(millis("OTEL_METRIC_EXPORT_TIMEOUT", &ms)?);
        }
        let interval = match var("OTEL_METRIC_EXPORT_INTERVAL") {
            Some(ms) => millis("OTEL_METRIC_EXPORT_INTERVAL", &ms)?,
            None => Duration::from_secs(60),
        };
        let tls = Tls::from_env(&setting)?;
        let mut client = reqwest::Client::builder().timeout(timeout);
        // A collector on this machine is reached directly, whatever the environment's proxy.
        if wharf_auth::is_loopback_url(&endpoint) {
            client = client.no_proxy();
        }
        if let Some(ca) = tls.root {
            client = client.add_root_certificate(ca);
        }
        if let Some(identity) = tls.identity {
            client = client.identity(identity);
        }
        let client = client
            .build()
            .map_err(|e| format!("cannot set up the OTLP metrics client: {e}"))?;
        Ok(Some(MetricsPush {
            endpoint,
            headers,
            timeout,
            interval,
            resource,
            client,
        }))
    }

    /// Pushes `server`'s metrics every interval until `stop`, then once more (for at most
    /// [`LAST_PUSH`]), so the last counts of a stopping replica reach the collector. A push
    /// under way when `stop` comes is dropped for that last one.
    pub(crate) async fn run(self, server: Server, stop: CancellationToken) {
        tracing::info!(
            interval_ms = self.interval.as_millis(),
            "pushing metrics over OTLP"
        );
        let start = tokio::time::Instant::now() + self.interval;
        let mut ticks = tokio::time::interval_at(start, self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = stop.cancelled() => break,
            }
            tokio::select! {
                result = self.push(&server) => failing = self.report(result, failing),
                () = stop.cancelled() => break,
            }
        }
        let last = tokio::time::timeout(LAST_PUSH.min(self.timeout), self.push(&server)).await;
        let last = last.unwrap_or_else(|_| Err("the collector did not answer in time".into()));
        self.report(last, false);
    }

    /// Logs a push that failed after one that worked, and the recovery: one line per change,
    /// not one per interval. Returns whether pushes are failing now.
    fn report(&self, result: Result<(), String>, failing: bool) -> bool {
        match result {
            Ok(()) if failing => {
                tracing::info!("metrics reach the collector again");
                false
            }
            Ok(()) => false,
            Err(e) if !failing => {
                tracing::warn!(error = %e, "could not push metrics; the next push carries every count");
                true
            }
            Err(_) => true,
        }
    }

    /// Sends one snapshot; `Ok` also when the server does not count (nothing to send).
    async fn push(&self, server: &Server) -> Result<(), String> {
        let Some(snapshot) = server.collect_metrics() else {
            return Ok(());
        };
        let body = export_request(&snapshot, self.resource.clone()).encode_to_vec();
        let response = self
            .client
            .post(&self.endpoint)
            .headers(self.headers.clone())
            .header(CONTENT_TYPE, "application/x-protobuf")
            .body(body)
            .send()
            .await
            .map_err(|e| describe(&e.without_url()))?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("the collector answered {status}"));
        }
        let body = response
            .bytes()
            .await
            .map_err(|e| describe(&e.without_url()))?;
        // A collector may accept the request and still drop points: it says so here.
        if let Ok(answer) = ExportMetricsServiceResponse::decode(body)
            && let Some(partial) = answer
                .partial_success
                .filter(|p| p.rejected_data_points > 0)
        {
            return Err(format!(
                "the collector rejected {} data points: {}",
                partial.rejected_data_points, partial.error_message
            ));
        }
        Ok(())
    }
}

/// A transport error with its causes (refused, timed out, a TLS failure), without the URL:
/// it may carry credentials.
fn describe(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// Where `signal` (`TRACES`, `METRICS`; `path` its part of a URL, `traces`) is exported, if
/// anywhere: its own `OTEL_EXPORTER_OTLP_{signal}_ENDPOINT` as it is, or the generic one with
/// `/v1/{path}`; nowhere with `OTEL_SDK_DISABLED=true` or an `OTEL_{signal}_EXPORTER` list
/// without `otlp`. An endpoint that is no http(s) URL, or a protocol other than
/// http/protobuf, is an error naming its variable.
pub(super) fn signal_endpoint(
    var: &impl Fn(&str) -> Option<String>,
    signal: &str,
    path: &str,
) -> Result<Option<String>, String> {
    let setting = |what: &str| signal_setting(var, signal, what);
    let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let otlp = var(&format!("OTEL_{signal}_EXPORTER")).is_none_or(|list| {
        list.split(',')
            .any(|e| e.trim().eq_ignore_ascii_case("otlp"))
    });
    let (name, endpoint) = match setting("ENDPOINT") {
        _ if disabled || !otlp => return Ok(None),
        None => return Ok(None),
        Some((name, endpoint)) if name.contains(&format!("_{signal}_")) => (name, endpoint),
        Some((name, base)) => {
            let endpoint = format!("{}/v1/{path}", base.trim_end_matches('/'));
            (name, endpoint)
        }
    };
    if reqwest::Url::parse(&endpoint).map_or(true, |u| !matches!(u.scheme(), "http" | "https")) {
        return Err(format!("{name}: not an http:// or https:// URL"));
    }
    if let Some((name, protocol)) = setting("PROTOCOL")
        && !protocol.trim().eq_ignore_ascii_case("http/protobuf")
    {
        return Err(format!(
            "{name}={protocol}: wharf exports over http/protobuf only"
        ));
    }
    Ok(Some(endpoint))
}

/// The variable of `signal` (`TRACES`, `METRICS`) for `what` when set, else the generic one:
/// (its name, its value).
pub(super) fn signal_setting(
    var: &impl Fn(&str) -> Option<String>,
    signal: &str,
    what: &str,
) -> Option<(String, String)> {
    let specific = format!("OTEL_EXPORTER_OTLP_{signal}_{what}");
    let generic = format!("OTEL_EXPORTER_OTLP_{what}");
    var(&specific)
        .map(|v| (specific, v))
        .or_else(|| var(&generic).map(|v| (generic, v)))
}

/// What an OTLP client trusts and shows: the collector's CA (`…_CERTIFICATE`) and this
/// process's client certificate (`…_CLIENT_CERTIFICATE` with `…_CLIENT_KEY`), as PEM files.
pub(super) struct Tls {
    pub(super) root: Option<reqwest::Certificate>,
    pub(super) identity: Option<reqwest::Identity>,
}

impl Tls {
    /// Reads the files `setting` names; an error names the variable.
    pub(super) fn from_env(
        setting: &impl Fn(&str) -> Option<(String, String)>,
    ) -> Result<Self, String> {
        let read = |(name, path): (String, String)| {
            std::fs::read(&path)
                .map_err(|e| format!("{name}: cannot read {path}: {e}"))
                .map(|pem| (name, pem))
        };
        let root = match setting("CERTIFICATE").map(read).transpose()? {
            Some((name, pem)) => Some(
                reqwest::Certificate::from_pem(&pem)
                    .map_err(|e| format!("{name}: not a PEM certificate: {e}"))?,
            ),
            None => None,
        };
        let identity = match (
            setting("CLIENT_CERTIFICATE").map(read).transpose()?,
            setting("CLIENT_KEY").map(read).transpose()?,
        ) {
            (Some((name, mut pem)), Some((_, key))) => {
                pem.push(b'\n');
                pem.extend_from_slice(&key);
                Some(
                    reqwest::Identity::from_pem(&pem)
                        .map_err(|e| format!("{name}: not a PEM certificate and key: {e}"))?,
                )
            }
            (None, None) => None,
            (Some((name, _)), None) | (None, Some((name, _))) => {
                return Err(format!(
                    "{name}: a client certificate needs both its certificate and its key"
                ));
            }
        };
        Ok(Tls { root, identity })
    }
}

/// `key=value` pairs separated by commas, values percent-encoded (the W3C baggage form the
/// OpenTelemetry variables use). Errors name an entry by position: it may hold a secret.
fn parse_headers(list: &str) -> Result<HeaderMap, String> {
    let mut headers = HeaderMap::new();
    let pairs = list.split(',').map(str::trim).filter(|p| !p.is_empty());
    for (n, pair) in pairs.enumerate() {
        let n = n + 1;
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("entry {n} is not key=value"))?;
        let value = percent_encoding::percent_decode_str(value.trim())
            .decode_utf8()
            .map_err(|_| format!("the value of entry {n} is not UTF-8"))?;
        let key = HeaderName::try_from(key.trim())
            .map_err(|_| format!("entry {n} does not start with a header name"))?;
        let value = HeaderValue::try_from(value.as_ref())
            .map_err(|_| format!("the value of {key} is not a header value"))?;
        headers.insert(key, value);
    }
    Ok(headers)
}

/// The protocol's request for one snapshot of the counters.
fn export_request(snapshot: &Snapshot, resource: Vec<KeyValue>) -> ExportMetricsServiceRequest {
    let times = Times {
        start: nanos(snapshot.started),
        now: nanos(snapshot.taken),
    };
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(Resource {
                attributes: resource,
                ..Default::default()
            }),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope {
                    name: "wharf".to_owned(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    ..Default::default()
                }),
                metrics: snapshot
                    .families
                    .iter()
                    .filter_map(|f| metric(f, times))
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// The interval every cumulative point covers, in nanoseconds since the epoch.
#[derive(Clone, Copy)]
struct Times {
    start: u64,
    now: u64,
}

/// One family as a metric; `None` for a kind this exporter does not know yet.
fn metric(family: &Family, times: Times) -> Option<Metric> {
    let cumulative = AggregationTemporality::Cumulative as i32;
    let number = |labels: &[(&str, String)], value| NumberDataPoint {
        attributes: attributes(labels),
        start_time_unix_nano: times.start,
        time_unix_nano: times.now,
        value: Some(value),
        ..Default::default()
    };
    let data = match &family.points {
        Points::Counter(points) => metric::Data::Sum(Sum {
            data_points: points
                .iter()
                .map(|p| {
                    let n = i64::try_from(p.value).unwrap_or(i64::MAX);
                    number(&p.labels, number_data_point::Value::AsInt(n))
                })
                .collect(),
            aggregation_temporality: cumulative,
            is_monotonic: true,
        }),
        Points::Gauge(points) => metric::Data::Gauge(Gauge {
            data_points: points
                .iter()
                .map(|p| number(&p.labels, number_data_point::Value::AsInt(p.value)))
                .collect(),
        }),
        Points::Histogram(points) => metric::Data::Histogram(Histogram {
            data_points: points
                .iter()
                .map(|p| HistogramDataPoint {
                    attributes: attributes(&p.labels),
                    start_time_unix_nano: times.start,
                    time_unix_nano: times.now,
                    count: p.value.count(),
                    sum: Some(p.value.sum()),
                    bucket_counts: p.value.counts().to_vec(),
                    explicit_bounds: p.value.bounds().to_vec(),
                    ..Default::default()
                })
                .collect(),
            aggregation_temporality: cumulative,
        }),
        _ => return None,
    };
    Some(Metric {
        name: family.name.to_owned(),
        description: family.help.to_owned(),
        unit: family.unit.to_owned(),
        data: Some(data),
        ..Default::default()
    })
}

fn attributes(labels: &[(&str, String)]) -> Vec<KeyValue> {
    labels
        .iter()
        .map(|(key, value)| KeyValue {
            key: (*key).to_owned(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(value.clone())),
            }),
        })
        .collect()
}

fn nanos(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| vars.get(name).cloned()
    }

    fn push(vars: &[(&str, &str)]) -> Result<Option<MetricsPush>, String> {
        MetricsPush::from_env(env(vars), Vec::new())
    }

    #[test]
    fn the_generic_endpoint_gets_the_metrics_path_and_the_specific_one_is_kept() {
        let p = push(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/")]).unwrap();
        assert_eq!(p.unwrap().endpoint, "http://c:4318/v1/metrics");
        let p = push(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "https://m/custom"),
        ])
        .unwrap();
        assert_eq!(p.unwrap().endpoint, "https://m/custom");
    }

    #[test]
    fn off_without_an_endpoint_or_when_turned_off() {
        assert!(push(&[]).unwrap().is_none());
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
        for off in [
            ("OTEL_SDK_DISABLED", "TRUE"),
            ("OTEL_METRICS_EXPORTER", "none"),
            // Another exporter asked for: Prometheus is served by --metrics-listen.
            ("OTEL_METRICS_EXPORTER", "prometheus"),
        ] {
            assert!(push(&[endpoint, off]).unwrap().is_none(), "{off:?}");
        }
        for on in ["otlp", "OTLP", "console, otlp"] {
            let exporter = ("OTEL_METRICS_EXPORTER", on);
            assert!(push(&[endpoint, exporter]).unwrap().is_some(), "{on}");
        }
        // No endpoint: whatever else is set, nothing is pushed and nothing refused.
        assert!(
            push(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")])
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn what_it_cannot_honour_is_refused_by_name() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
        for (bad, named) in [
            (
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ),
            (
                ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta"),
                "TEMPORALITY",
            ),
            (
                ("OTEL_METRIC_EXPORT_INTERVAL", "1m"),
                "OTEL_METRIC_EXPORT_INTERVAL",
            ),
            (
                ("OTEL_METRIC_EXPORT_INTERVAL", "0"),
                "OTEL_METRIC_EXPORT_INTERVAL",
            ),
            (
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "0"),
                "OTEL_EXPORTER_OTLP_TIMEOUT",
            ),
            (
                ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/no/such.pem"),
                "OTEL_EXPORTER_OTLP_CERTIFICATE",
            ),
            (
                ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/no/such.pem"),
                "OTEL_EXPORTER_OTLP_CLIENT_KEY",
            ),
        ] {
            let e = push(&[endpoint, bad]).unwrap_err();
            assert!(e.contains(named), "{bad:?}: {e}");
        }
        let e = push(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "c:4318")]).unwrap_err();
        assert!(e.contains("not an http"), "{e}");
        // The metrics-only protocol is the one that counts.
        let p = push(&[
            endpoint,
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "HTTP/PROTOBUF"),
        ]);
        assert!(p.unwrap().is_some());
    }

    #[test]
    fn metrics_headers_replace_the_generic_ones_and_are_percent_decoded() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
        let generic = (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "authorization=Basic%20abc, x-team=a",
        );
        let p = push(&[endpoint, generic]).unwrap().unwrap();
        assert_eq!(p.headers["authorization"], "Basic abc");
        assert_eq!(p.headers["x-team"], "a");
        assert!(!format!("{p:?}").contains("abc"), "no credentials in Debug");
        // A collector for metrics only gets its own headers, never the generic one's key.
        let p = push(&[
            endpoint,
            generic,
            ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "x-team=b"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "250"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(p.headers.get("authorization"), None);
        assert_eq!(p.headers["x-team"], "b");
        assert_eq!(p.interval, Duration::from_millis(250));
        // A malformed entry is named by position: its text may be a secret.
        let e = push(&[
            endpoint,
            ("OTEL_EXPORTER_OTLP_HEADERS", "Authorization: Bearer s3cret"),
        ])
        .unwrap_err();
        assert!(e.contains("entry 1") && !e.contains("s3cret"), "{e}");
    }
}
