//! The Prometheus endpoint's text (`--metrics-addr`, `GET /metrics`):
//! the numbers `INFO` shows, named by Prometheus' rules — counters typed
//! `counter` and ending in `_total`, durations in seconds, sizes in bytes,
//! latency as a histogram — and encoded by the `prometheus` crate's text
//! encoder (the 0.0.4 text format that `promtool check metrics` reads).
//!
//! The numbers live in the engine and the server's own counters; each
//! scrape reads them once and builds the metric families from them, so
//! nothing is counted twice.

use prometheus::proto::{Bucket, Counter, Gauge, Histogram, Metric, MetricFamily, MetricType};
use prometheus::{Encoder, TextEncoder};

use crate::context::Context;
use crate::info::{self, Kind};

/// The content type of [`exposition`]'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Every metric in Prometheus' text format.
pub fn exposition(ctx: &Context) -> Result<String, String> {
    let mut families = Vec::new();
    for m in info::metrics(ctx) {
        let mut metric = Metric::default();
        let kind = match m.kind {
            Kind::InfoOnly => continue,
            Kind::Counter => {
                let mut c = Counter::default();
                c.set_value(m.value);
                metric.set_counter(c);
                MetricType::COUNTER
            }
            Kind::Gauge => {
                let mut g = Gauge::default();
                g.set_value(m.value);
                metric.set_gauge(g);
                MetricType::GAUGE
            }
        };
        families.push(family(m.prometheus, m.help, kind, metric));
    }
    let wal = ctx.engine().metrics().wal;
    families.push(histogram(
        &wal.sync_micros,
        "fencelog_fsync_duration_seconds",
        "Write + fdatasync latency of group commits.",
    ));
    families.push(histogram(
        &wal.commit_micros,
        "fencelog_commit_duration_seconds",
        "Commit latency of each durable entry: from the first submission of its group \
         commit until that commit's sync returned.",
    ));
    let mut out = Vec::new();
    TextEncoder::new()
        .encode(&families, &mut out)
        .map_err(|e| format!("cannot encode the metrics: {e}"))?;
    String::from_utf8(out).map_err(|e| format!("the metrics are not UTF-8: {e}"))
}

fn family(name: &str, help: &str, kind: MetricType, metric: Metric) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.to_string());
    f.set_help(help.to_string());
    f.set_field_type(kind);
    f.set_metric(vec![metric]);
    f
}

/// A latency in seconds, from the engine's log-scale histogram of
/// microseconds (its buckets' upper bounds become `le`).
fn histogram(h: &fencelog_wal::HistogramSnapshot, name: &str, help: &str) -> MetricFamily {
    let mut hist = Histogram::default();
    hist.set_sample_count(h.count);
    hist.set_sample_sum(h.sum as f64 / 1e6);
    let mut buckets = Vec::new();
    for (upper_us, count) in h.cumulative() {
        if upper_us == 0 {
            continue;
        }
        let mut b = Bucket::default();
        b.set_upper_bound(upper_us as f64 / 1e6);
        b.set_cumulative_count(count);
        buckets.push(b);
        if count == h.count {
            break;
        }
    }
    hist.set_bucket(buckets);
    let mut metric = Metric::default();
    metric.set_histogram(hist);
    family(name, help, MetricType::HISTOGRAM, metric)
}
