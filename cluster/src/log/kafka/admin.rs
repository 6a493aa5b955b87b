//! Topics: creating, deleting and measuring them, through one admin client.

use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::RDKafkaErrorCode;

use eddy_planner::Result;

use super::config::{admin_results, kafka_error, wait_until, watermarks, KafkaConfig};

pub(super) struct Admin {
    config: KafkaConfig,
    client: AdminClient<DefaultClientContext>,
}

impl Admin {
    pub(super) fn new(config: &KafkaConfig) -> Result<Admin> {
        let client = config
            .client()
            .create()
            .map_err(|e| kafka_error("creating the admin client", e))?;
        Ok(Admin {
            config: config.clone(),
            client,
        })
    }

    /// is still being deleted (a stream dropped and created again) is retried.
    pub(super) async fn create_topics(&self, topics: &[(String, u32, bool)]) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let mut todo: Vec<&(String, u32, bool)> = topics.iter().collect();
        while !todo.is_empty() {
            let new: Vec<NewTopic<'_>> = todo
                .iter()
                .map(|(name, partitions, compacted)| {
                    let mut t = NewTopic::new(
                        name,
                        *partitions as i32,
                        TopicReplication::Fixed(self.config.replication),
                    );
                    // With three copies or more, a record is acknowledged (acks=all)
                    // once two hold it, so one broker may be lost at any time.
                    if self.config.replication >= 3 {
                        t = t.set("min.insync.replicas", "2");
                    }
                    if *compacted {
                        // The broker's append times order beats of different nodes on
                        // one clock (`membership::lease`).
                        t.set("cleanup.policy", "compact")
                            .set("message.timestamp.type", "LogAppendTime")
                    } else {
                        t
                    }
                })
                .collect();
            let results = self
                .client
                .create_topics(&new, &opts)
                .await
                .map_err(|e| kafka_error("creating topics", e))?;
            let mut again = Vec::new();
            for (result, topic) in results.into_iter().zip(&todo) {
                match result {
                    Ok(_) => {}
                    Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {
                        if !self.partitions_match(&topic.0, topic.1)? {
                            again.push(*topic);
                        }
                    }
                    Err((name, code)) => {
                        return Err(kafka_error(&format!("creating topic {name}"), code))
                    }
                }
            }
            if !again.is_empty() && Instant::now() > deadline {
                return Err(kafka_error(
                    "creating topics",
                    format!("{} still exists with another partition count", again[0].0),
                ));
            }
            if !again.is_empty() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            todo = again;
        }
        Ok(())
    }

    /// Whether an existing topic has `partitions` partitions.
    fn partitions_match(&self, topic: &str, partitions: u32) -> Result<bool> {
        Ok(self.partition_count(topic)? == Some(partitions as usize))
    }

    /// A topic's partitions, `None` if the broker does not know it.
    pub(super) fn partition_count(&self, topic: &str) -> Result<Option<usize>> {
        let meta = self
            .client
            .inner()
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .map_err(|e| kafka_error("reading topic metadata", e))?;
        Ok(meta
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
            .map(|t| t.partitions().len()))
    }

    pub(super) async fn delete_topics(&self, topics: &[String]) -> Result<()> {
        if topics.is_empty() {
            return Ok(());
        }
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let results = self
            .client
            .delete_topics(&names, &opts)
            .await
            .map_err(|e| kafka_error("deleting topics", e))?;
        admin_results(
            results,
            RDKafkaErrorCode::UnknownTopicOrPartition,
            "deleting topic",
        )?;
        // Gone from the metadata before this returns: a stream created again under the
        // same name must get a new, empty topic, never the old one's records.
        for topic in topics {
            let gone = || Ok(self.partition_count(topic)?.is_none());
            wait_until(30, gone, || {
                kafka_error("deleting topics", format!("{topic} is still there"))
            })
            .await?;
        }
        Ok(())
    }

    /// Creates a topic another client may create first: any partition count will do.
    pub(super) async fn create_topic_if_missing(&self, topic: &str, partitions: u32) -> Result<()> {
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let new = NewTopic::new(
            topic,
            partitions as i32,
            TopicReplication::Fixed(self.config.replication),
        );
        let results = self
            .client
            .create_topics([&new], &opts)
            .await
            .map_err(|e| kafka_error("creating topics", e))?;
        admin_results(
            results,
            RDKafkaErrorCode::TopicAlreadyExists,
            "creating topic",
        )
    }

    /// The end of a topic partition (the offset its next record will get).
    pub(super) fn high_watermark(&self, topic: &str, partition: i32) -> Result<i64> {
        Ok(watermarks(self.client.inner(), topic, partition)?.1)
    }
}
