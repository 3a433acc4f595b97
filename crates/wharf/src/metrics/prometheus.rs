//! The Prometheus text exposition format (version 0.0.4) of a [`Snapshot`].

use std::borrow::Cow;
use std::fmt::Write as _;

use super::family::{Buckets, Points, Snapshot};

/// Renders every family: counters with the `_total` suffix, histograms as cumulative
/// `_bucket` series ending at `+Inf` with `_sum` and `_count`.
pub(super) fn encode(snapshot: &Snapshot) -> String {
    let mut out = String::with_capacity(16 * 1024);
    for family in &snapshot.families {
        let name = family.name;
        match &family.points {
            Points::Counter(points) => {
                let name = format!("{name}_total");
                header(&mut out, &name, "counter", family.help);
                for p in points {
                    sample(&mut out, &name, &p.labels, None, p.value);
                }
            }
            Points::Gauge(points) => {
                header(&mut out, name, "gauge", family.help);
                for p in points {
                    sample(&mut out, name, &p.labels, None, p.value);
                }
            }
            Points::Histogram(points) => {
                header(&mut out, name, "histogram", family.help);
                for p in points {
                    histogram(&mut out, name, &p.labels, &p.value);
                }
            }
        }
    }
    out
}

fn histogram(out: &mut String, name: &str, labels: &[(&'static str, String)], buckets: &Buckets) {
    let bucket = format!("{name}_bucket");
    let mut cumulative = 0;
    let bounds = buckets.bounds().iter().map(|b| Cow::Owned(b.to_string()));
    let bounds = bounds.chain(std::iter::once(Cow::Borrowed("+Inf")));
    for (le, n) in bounds.zip(buckets.counts()) {
        cumulative += n;
        sample(out, &bucket, labels, Some(&le), cumulative);
    }
    sample(out, &format!("{name}_sum"), labels, None, buckets.sum());
    sample(out, &format!("{name}_count"), labels, None, cumulative);
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// One line: `name{labels,le="…"} value`.
fn sample(
    out: &mut String,
    name: &str,
    labels: &[(&'static str, String)],
    le: Option<&str>,
    value: impl std::fmt::Display,
) {
    out.push_str(name);
    let le = le.map(|le| ("le", Cow::Borrowed(le)));
    let mut all = labels
        .iter()
        .map(|(k, v)| (*k, escape(v)))
        .chain(le)
        .peekable();
    if all.peek().is_some() {
        out.push('{');
        for (i, (key, value)) in all.enumerate() {
            let sep = if i == 0 { "" } else { "," };
            let _ = write!(out, "{sep}{key}=\"{value}\"");
        }
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

/// A label value as the text format writes it: backslash, quote and newline escaped.
fn escape(value: &str) -> Cow<'_, str> {
    if value.contains(['\\', '"', '\n']) {
        let escaped = value
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n");
        Cow::Owned(escaped)
    } else {
        Cow::Borrowed(value)
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::super::family::{Family, Point};
    use super::*;

    fn render(family: Family) -> String {
        encode(&Snapshot {
            started: SystemTime::UNIX_EPOCH,
            taken: SystemTime::UNIX_EPOCH,
            families: vec![family],
        })
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_end_at_inf() {
        let buckets = Buckets::new(&[0.001, 0.01], vec![1, 0, 2], 20.5);
        let out = render(Family::seconds(
            "x",
            "help",
            vec![Point::unlabelled(buckets)],
        ));
        assert!(out.contains("# TYPE x histogram\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"0.001\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"0.01\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("x_sum 20.5\n"), "{out}");
        assert!(out.contains("x_count 3\n"), "{out}");
    }

    #[test]
    fn counters_end_in_total_and_label_values_are_escaped() {
        let point = Point::new(vec![("tool", "a\"b\\c\nd".to_owned())], 7);
        let out = render(Family::counter("x", "help", vec![point]));
        assert!(out.contains("# TYPE x_total counter\n"), "{out}");
        assert!(
            out.contains("x_total{tool=\"a\\\"b\\\\c\\nd\"} 7\n"),
            "{out}"
        );
    }
}
