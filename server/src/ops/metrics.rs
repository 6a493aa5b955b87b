//! The metric families of `/metrics`, built at each scrape from the node's counters and
//! written in Prometheus' text format by the Prometheus client library (`prometheus`):
//! its encoder escapes labels and lays out histograms, and `Families` refuses a family
//! name twice, so the page always parses with Prometheus' own parser.

use prometheus::core::Collector as _;
use prometheus::proto::{
    Bucket, Counter, Gauge, Histogram as HistogramSample, LabelPair, Metric, MetricFamily,
    MetricType,
};
use prometheus::Encoder as _;

/// A sample's labels, as (name, value); the encoder escapes the values.
pub type Labels = Vec<(&'static str, String)>;

/// One histogram's series: cumulative counts per upper bound (`+Inf` last), and the sum.
pub struct Series {
    pub buckets: Vec<(f64, u64)>,
    pub count: u64,
    pub sum: f64,
}

/// The families of one scrape, in the order they were added.
#[derive(Default)]
pub struct Families {
    families: Vec<MetricFamily>,
}

fn metric(labels: Labels) -> Metric {
    let mut m = Metric::default();
    let pairs = labels
        .into_iter()
        .map(|(name, value)| {
            let mut p = LabelPair::default();
            p.set_name(name.to_string());
            p.set_value(value);
            p
        })
        .collect();
    m.set_label(pairs);
    m
}

impl Families {
    fn family(&mut self, name: &str, help: &str, kind: MetricType, metrics: Vec<Metric>) {
        assert!(
            self.families.iter().all(|f| f.name() != name),
            "the metric family {name} is written twice"
        );
        // A family with no sample (no stream yet) is left out: the format has no empty one.
        if metrics.is_empty() {
            return;
        }
        let mut f = MetricFamily::default();
        f.set_name(name.to_string());
        f.set_help(help.to_string());
        f.set_field_type(kind);
        f.set_metric(metrics);
        self.families.push(f);
    }

    /// A counter family (the name ends in `_total`).
    pub fn counter(&mut self, name: &str, help: &str, samples: Vec<(Labels, f64)>) {
        debug_assert!(name.ends_with("_total"), "{name}");
        self.scalars(name, help, MetricType::COUNTER, samples);
    }

    pub fn gauge(&mut self, name: &str, help: &str, samples: Vec<(Labels, f64)>) {
        debug_assert!(!name.ends_with("_total"), "{name}");
        self.scalars(name, help, MetricType::GAUGE, samples);
    }

    /// A family of one value per sample: a counter's or a gauge's.
    fn scalars(&mut self, name: &str, help: &str, kind: MetricType, samples: Vec<(Labels, f64)>) {
        let metrics = samples
            .into_iter()
            .map(|(labels, v)| {
                let mut m = metric(labels);
                if kind == MetricType::COUNTER {
                    let mut c = Counter::default();
                    c.set_value(v);
                    m.set_counter(c);
                } else {
                    let mut g = Gauge::default();
                    g.set_value(v);
                    m.set_gauge(g);
                }
                m
            })
            .collect();
        self.family(name, help, kind, metrics);
    }

    pub fn histogram(&mut self, name: &str, help: &str, series: Vec<(Labels, Series)>) {
        let metrics = series
            .into_iter()
            .map(|(labels, s)| {
                let mut m = metric(labels);
                let mut h = HistogramSample::default();
                h.set_sample_count(s.count);
                h.set_sample_sum(s.sum);
                let buckets = s
                    .buckets
                    .into_iter()
                    .filter(|(le, _)| le.is_finite())
                    .map(|(le, n)| {
                        let mut b = Bucket::default();
                        b.set_upper_bound(le);
                        b.set_cumulative_count(n);
                        b
                    })
                    .collect();
                h.set_bucket(buckets);
                m.set_histogram(h);
                m
            })
            .collect();
        self.family(name, help, MetricType::HISTOGRAM, metrics);
    }

    /// The process's own: CPU seconds, resident and virtual memory, open and most file
    /// descriptors, start time (`process_*`, as every Prometheus client names them).
    pub fn process(&mut self) {
        self.extend(prometheus::process_collector::ProcessCollector::for_self().collect());
    }

    /// Families gathered elsewhere (the process collector's).
    fn extend(&mut self, families: Vec<MetricFamily>) {
        for f in families {
            let name = f.name().to_string();
            let help = f.help().to_string();
            let kind = f.get_field_type();
            self.family(&name, &help, kind, f.get_metric().to_vec());
        }
    }

    /// The page, in Prometheus' text format.
    pub fn text(&self) -> String {
        let mut out = Vec::new();
        // Only a family without samples fails, and none is kept.
        let _ = prometheus::TextEncoder::new().encode(&self.families, &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

/// Errors sent to clients, by SQLSTATE class; few and rare, so one lock.
static ERRORS: std::sync::Mutex<std::collections::BTreeMap<String, u64>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// Counts an error sent to a client.
pub fn count_error(sqlstate: &str) {
    let class = sqlstate.get(..2).unwrap_or(sqlstate).to_string();
    let mut errors = ERRORS.lock().unwrap_or_else(|e| e.into_inner());
    *errors.entry(class).or_default() += 1;
}

/// `eddy_errors_total`'s samples.
pub fn errors_by_class() -> Vec<(Labels, f64)> {
    let errors = ERRORS.lock().unwrap_or_else(|e| e.into_inner());
    errors
        .iter()
        .map(|(class, n)| (vec![("class", class.clone())], *n as f64))
        .collect()
}
