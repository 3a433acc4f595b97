//! The counters at one moment, as an exporter reads them: named families of labelled
//! points. The Prometheus text encoder and an OTLP exporter both render these, so the two
//! outputs name and slice everything the same way.

use std::time::SystemTime;

/// One metric with every labelled point it has now.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Family {
    /// The name, without the `_total` the Prometheus text format gives a counter:
    /// `wharf_requests`, `wharf_request_duration_seconds`.
    pub name: &'static str,
    /// What it counts, in a sentence.
    pub help: &'static str,
    /// The unit in UCUM (`s`), empty for a plain count.
    pub unit: &'static str,
    /// The points, typed by the kind of metric they make.
    pub points: Points,
}

impl Family {
    pub(crate) fn counter(name: &'static str, help: &'static str, points: Vec<Point<u64>>) -> Self {
        Family {
            name,
            help,
            unit: "",
            points: Points::Counter(points),
        }
    }

    pub(crate) fn gauge(name: &'static str, help: &'static str, points: Vec<Point<i64>>) -> Self {
        Family {
            name,
            help,
            unit: "",
            points: Points::Gauge(points),
        }
    }

    /// A histogram of durations, in seconds.
    pub(crate) fn seconds(
        name: &'static str,
        help: &'static str,
        points: Vec<Point<Buckets>>,
    ) -> Self {
        Family {
            name,
            help,
            unit: "s",
            points: Points::Histogram(points),
        }
    }
}

/// A family's points; the variant is the kind of metric.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Points {
    /// Monotonic counts since counting began ([`Snapshot::started`]).
    Counter(Vec<Point<u64>>),
    /// Levels that go up and down, read now.
    Gauge(Vec<Point<i64>>),
    /// Observations in fixed buckets, since counting began.
    Histogram(Vec<Point<Buckets>>),
}

/// One labelled value of a family.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Point<T> {
    /// Label names and values, in a fixed order per family. Values may hold any text
    /// (tool names are the server's); an encoder escapes them.
    pub labels: Vec<(&'static str, String)>,
    /// The value.
    pub value: T,
}

impl<T> Point<T> {
    pub(crate) fn new(labels: Vec<(&'static str, String)>, value: T) -> Self {
        Point { labels, value }
    }

    pub(crate) fn unlabelled(value: T) -> Self {
        Point::new(Vec::new(), value)
    }
}

/// A histogram's observations: a count per bucket (not cumulative), and their sum.
#[derive(Debug, Clone, PartialEq)]
pub struct Buckets {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
}

impl Buckets {
    /// `counts` has one count more than `bounds`: the observations past the last bound.
    pub(crate) fn new(bounds: &'static [f64], counts: Vec<u64>, sum: f64) -> Self {
        debug_assert_eq!(counts.len(), bounds.len() + 1);
        Buckets {
            bounds,
            counts,
            sum,
        }
    }

    /// The buckets' upper bounds (inclusive), ascending.
    pub fn bounds(&self) -> &'static [f64] {
        self.bounds
    }

    /// The observations in each bucket: `counts()[i]` those above `bounds()[i - 1]` and at
    /// most `bounds()[i]`; the last, those above every bound. One longer than
    /// [`Buckets::bounds`].
    pub fn counts(&self) -> &[u64] {
        &self.counts
    }

    /// The sum of the observations, in the family's unit.
    pub fn sum(&self) -> f64 {
        self.sum
    }

    /// The number of observations.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// Every family at one moment, with the interval the counts cover.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Snapshot {
    /// When counting began: the start of every counter and histogram.
    pub started: SystemTime,
    /// When the values were read.
    pub taken: SystemTime,
    /// The families, in a fixed order.
    pub families: Vec<Family>,
}
