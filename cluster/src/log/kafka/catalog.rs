//! The catalog topic (`<cluster>-catalog`, compacted): one record per object
//! (`stream/<name>`, `metric/<name>`) holding its creating statement, a tombstone once
//! dropped. Every node reads it at start and publishes what its DDL changes.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::BaseRecord;
use rdkafka::{Offset, TopicPartitionList};

use eddy_planner::catalog::Catalog;
use eddy_planner::Result;

use super::config::{kafka_error, watermarks};
use super::produce::{format_headers, format_of, send};
use super::Kafka;

impl Kafka {
    /// Publishes the objects that differ between two catalogs to the catalog topic.
    pub async fn publish_catalog(&self, current: &Catalog, next: &Catalog) -> Result<()> {
        let mut records: Vec<(String, Option<String>)> = Vec::new();
        for (name, s) in &next.streams {
            if current.stream(name).map(|o| &o.sql) != Some(&s.sql) {
                records.push((format!("stream/{name}"), Some(s.sql.clone())));
            }
        }
        for (name, m) in &next.metrics {
            if current.metric(name).map(|o| &o.sql) != Some(&m.sql) {
                records.push((format!("metric/{name}"), Some(m.sql.clone())));
            }
        }
        for name in current.streams.keys().filter(|n| next.stream(n).is_none()) {
            records.push((format!("stream/{name}"), None));
        }
        for name in current.metrics.keys().filter(|n| next.metric(n).is_none()) {
            records.push((format!("metric/{name}"), None));
        }
        if current.access != next.access {
            let statements = next.access.statements(next);
            records.push((
                ACCESS_KEY.to_string(),
                Some(statements.join(eddy_planner::catalog::STATEMENT_END)),
            ));
        }
        let catalog = self.config.catalog_topic();
        let format = crate::format::writes();
        let mut deliveries = Vec::new();
        for (key, sql) in &records {
            let delivery = send(&self.publisher.producer, |taken| {
                let record = BaseRecord::with_opaque_to(&catalog, taken)
                    .key(key.as_str())
                    .headers(format_headers(format));
                match sql {
                    Some(sql) => record.payload(sql.as_str()),
                    None => record,
                }
            })?;
            deliveries.push(delivery);
        }
        for d in deliveries {
            let offset = d
                .await
                .map_err(|_| kafka_error("publishing the catalog", "the producer went away"))?
                .map_err(|e| kafka_error("publishing the catalog", e))?;
            self.members
                .catalog_published
                .fetch_max(offset + 1, std::sync::atomic::Ordering::AcqRel);
        }
        Ok(())
    }

    /// objects, streams first, each kind in the order it was last written.
    pub fn read_catalog(&self) -> Result<Vec<String>> {
        let consumer: BaseConsumer = self
            .config
            .reader(&format!("eddy-catalog-reader.{}", self.config.node))
            .create()
            .map_err(|e| kafka_error("creating the catalog reader", e))?;
        let catalog = self.config.catalog_topic();
        let (low, high) = watermarks(consumer.client(), &catalog, 0)?;
        let mut latest = Latest::new();
        if high > low {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(&catalog, 0, Offset::Beginning)
                .map_err(|e| kafka_error("reading the catalog topic", e))?;
            consumer
                .assign(&tpl)
                .map_err(|e| kafka_error("reading the catalog topic", e))?;
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut next = low;
            while next < high {
                if Instant::now() > deadline {
                    return Err(kafka_error("reading the catalog topic", "timed out"));
                }
                let Some(m) = consumer.poll(Duration::from_millis(100)) else {
                    continue;
                };
                let m = m.map_err(|e| kafka_error("reading the catalog topic", e))?;
                next = m.offset() + 1;
                crate::format::check(format_of(&m), "the catalog topic")
                    .map_err(|why| kafka_error("reading the catalog topic", why))?;
                let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
                let sql = m.payload().map(|p| String::from_utf8_lossy(p).into_owned());
                latest.insert(key, (m.offset(), sql));
            }
        }
        Ok(live_statements(&latest))
    }
}

/// The catalog topic's last record per key: (offset, statement, or `None` once dropped).
pub(super) type Latest = HashMap<String, (i64, Option<String>)>;

/// The statements of the live objects, streams first, each kind in the order it was last
/// written.
/// The key of the record that holds the catalog's roles, owners and grants.
const ACCESS_KEY: &str = "access";

pub(super) fn live_statements(latest: &Latest) -> Vec<String> {
    // Streams, then metrics, then the access rules, which name both.
    let rank = |key: &str| match key {
        _ if key.starts_with("stream/") => 0,
        ACCESS_KEY => 2,
        _ => 1,
    };
    let mut live: Vec<(u8, i64, &String)> = latest
        .iter()
        .filter_map(|(key, (offset, sql))| Some((rank(key), *offset, sql.as_ref()?)))
        .collect();
    live.sort();
    live.into_iter().map(|(_, _, sql)| sql.clone()).collect()
}
