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
}

impl std::fmt::Debug for MetricsPush {
    // Headers carry the collector's credentials: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsPush")
            .field("endpoint", &self.endpoint)
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

impl MetricsPush {
    /// The push `env` configures, if any: `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` as it is, or
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` with `/v1/metrics`; off with `OTEL_SDK_DISABLED=true` or
    /// `OTEL_METRICS_EXPORTER=none`. Headers, timeout and interval come from the standard
    /// variables too. An error names the variable it cannot use.
    pub(crate) fn from_env(
        env: impl Fn(&str) -> Option<String>,
        resource: Vec<KeyValue>,
    ) -> Result<Option<MetricsPush>, String> {
        let var = |name: &str| env(name).filter(|v| !v.is_empty());
        let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        match var("OTEL_METRICS_EXPORTER").as_deref() {
            _ if disabled => return Ok(None),
            Some("none") => return Ok(None),
            None | Some("otlp") => {}
            Some(other) => {
                return Err(format!(
                    "OTEL_METRICS_EXPORTER={other}: wharf pushes metrics over otlp (or none); \
                     for Prometheus, scrape --metrics-listen"
                ));
            }
        }
        let endpoint = match (
            var("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"),
            var("OTEL_EXPORTER_OTLP_ENDPOINT"),
        ) {
            (Some(endpoint), _) => endpoint,
            (None, Some(base)) => format!("{}/v1/metrics", base.trim_end_matches('/')),
            (None, None) => return Ok(None),
        };
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(format!(
                "OTLP metrics endpoint {endpoint:?}: not an http:// or https:// URL"
            ));
        }
        for name in [
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Some(protocol) = var(name).filter(|p| p != "http/protobuf") {
                return Err(format!(
                    "{name}={protocol}: wharf exports over http/protobuf only"
                ));
            }
        }
        let name = "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE";
        if let Some(preference) = var(name).filter(|p| !p.eq_ignore_ascii_case("cumulative")) {
            return Err(format!(
                "{name}={preference}: wharf pushes cumulative metrics only"
            ));
        }
        // The generic headers, then the metrics-only ones over them.
        let mut headers = HeaderMap::new();
        for name in [
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
        ] {
            if let Some(list) = var(name) {
                headers.extend(parse_headers(&list).map_err(|e| format!("{name}: {e}"))?);
            }
        }
        let millis = |names: &[&str], default: u64| -> Result<Duration, String> {
            for name in names {
                if let Some(v) = var(name) {
                    let ms = v
                        .parse::<u64>()
                        .map_err(|_| format!("{name}={v}: not a number of milliseconds"))?;
                    return Ok(Duration::from_millis(ms.max(1)));
                }
            }
            Ok(Duration::from_millis(default))
        };
        Ok(Some(MetricsPush {
            endpoint,
            headers,
            timeout: millis(
                &[
                    "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
                    "OTEL_EXPORTER_OTLP_TIMEOUT",
                ],
                10_000,
            )?,
            interval: millis(&["OTEL_METRIC_EXPORT_INTERVAL"], 60_000)?,
            resource,
        }))
    }

    /// Pushes `server`'s metrics every interval until `stop`, then once more, so the last
    /// counts of a stopping replica reach the collector.
    pub(crate) async fn run(self, server: Server, stop: CancellationToken) {
        let client = match reqwest::Client::builder().timeout(self.timeout).build() {
            Ok(client) => client,
            Err(e) => {
                tracing::error!(error = %e, "cannot push metrics: no HTTP client");
                return;
            }
        };
        let start = tokio::time::Instant::now() + self.interval;
        let mut ticks = tokio::time::interval_at(start, self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let last = tokio::select! {
                _ = ticks.tick() => false,
                () = stop.cancelled() => true,
            };
            if let Some(snapshot) = server.collect_metrics() {
                if let Err(e) = self.push(&client, &snapshot).await {
                    tracing::warn!(endpoint = %self.endpoint, error = %e, "could not push metrics");
                }
            }
            if last {
                return;
            }
        }
    }

    async fn push(&self, client: &reqwest::Client, snapshot: &Snapshot) -> Result<(), String> {
        let body = export_request(snapshot, self.resource.clone()).encode_to_vec();
        let response = client
            .post(&self.endpoint)
            .headers(self.headers.clone())
            .header(CONTENT_TYPE, "application/x-protobuf")
            .body(body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("the collector answered {status}"));
        }
        let body = response.bytes().await.map_err(|e| e.to_string())?;
        // A collector may accept the request and still drop points: it says so here.
        if let Ok(answer) = ExportMetricsServiceResponse::decode(body) {
            if let Some(partial) = answer
                .partial_success
                .filter(|p| p.rejected_data_points > 0)
            {
                return Err(format!(
                    "the collector rejected {} data points: {}",
                    partial.rejected_data_points, partial.error_message
                ));
            }
        }
        Ok(())
    }
}

/// `key=value` pairs separated by commas, values percent-encoded (the W3C baggage form the
/// OpenTelemetry variables use).
fn parse_headers(list: &str) -> Result<HeaderMap, String> {
    let mut headers = HeaderMap::new();
    for pair in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("{pair:?} is not key=value"))?;
        let value = percent_encoding::percent_decode_str(value.trim())
            .decode_utf8()
            .map_err(|_| format!("the value of {:?} is not UTF-8", key.trim()))?;
        let key = HeaderName::try_from(key.trim())
            .map_err(|_| format!("{:?} is not a header name", key.trim()))?;
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
        ] {
            assert!(push(&[endpoint, off]).unwrap().is_none(), "{off:?}");
        }
    }

    #[test]
    fn what_it_cannot_honour_is_refused_by_name() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
        for (bad, named) in [
            (
                ("OTEL_METRICS_EXPORTER", "prometheus"),
                "OTEL_METRICS_EXPORTER",
            ),
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
                ("OTEL_EXPORTER_OTLP_HEADERS", "novalue"),
                "OTEL_EXPORTER_OTLP_HEADERS",
            ),
        ] {
            let e = push(&[endpoint, bad]).unwrap_err();
            assert!(e.contains(named), "{bad:?}: {e}");
        }
        let e = push(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "c:4318")]).unwrap_err();
        assert!(e.contains("not an http"), "{e}");
    }

    #[test]
    fn headers_are_percent_decoded_and_the_metrics_ones_win() {
        let p = push(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=Basic%20abc, x-team=a",
            ),
            ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "x-team=b"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "250"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(p.headers["authorization"], "Basic abc");
        assert_eq!(p.headers["x-team"], "b");
        assert_eq!(p.interval, Duration::from_millis(250));
        assert!(!format!("{p:?}").contains("abc"), "no credentials in Debug");
    }
}
