//! End-to-end latency through Kafka, measured as Railgun measures it (seed 002 §5): an
//! injector publishes events at a fixed rate to a stream's task topic, each asking for
//! an answer on the injector's reply topic; Eddy (`eddy serve --kafka`) applies the
//! event, computes COUNT/SUM/AVG per card over a 5-minute sliding window and answers;
//! the injector consumes the answer. Latency runs from the moment the event was due to
//! be sent (not when it was sent), so a stalled pipeline cannot hide its queueing delay
//! (coordinated omission); histograms are HdrHistogram.
//!
//! Before Eddy, each rate runs the bare Kafka round trip: the same events to a topic of
//! its own, answered at once by an echo in this process. Its latency is the floor of
//! Eddy's, and each line gives Eddy's p99.9 as a multiple of that floor's in the same run.
//! With `--rounds N`, each rate runs N times, the bare round trip and Eddy in turn, and a
//! last table gives each rate's ratio by round and their median.
//!
//! Usage (a broker and an `eddy serve --kafka` running; `bench/kafka-latency.sh` starts
//! both):
//!   cargo run --release -p eddy-bench --bin kafka_latency -- \
//!     --kafka 127.0.0.1:9092 --pg 127.0.0.1:5433 --rates 5000,20000,50000 --seconds 20 \
//!     --rounds 3

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

use eddy_bench::{median, XorShift};
use eddy_cluster::log::kafka::{reply_headers, reply_to};
use eddy_cluster::route::partition_for;
use eddy_planner::codec::encode_row;
use eddy_planner::types::Value;

const CARDS: u64 = 10_000;
const PARTITIONS: u32 = 2;

struct Args {
    kafka: String,
    pg: String,
    cluster: String,
    rates: Vec<u64>,
    /// Runs of each rate, the bare round trip and Eddy in turn each time: one run's
    /// p99.9 is a few hundred events, and a stall of the machine moves it.
    rounds: usize,
    seconds: u64,
    warmup_seconds: u64,
    /// Seconds of one unmeasured run at the first rate before the measured ones: a fresh
    /// broker spends its first 20-30 s compiling its hot paths (JIT) on one of the cores.
    prewarm_seconds: u64,
    /// Print p50 and max latency per 250 ms of send time to stderr.
    timeline: bool,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        kafka: "127.0.0.1:9092".into(),
        pg: "127.0.0.1:5433".into(),
        cluster: "eddy".into(),
        rates: vec![5_000, 20_000, 50_000],
        rounds: 1,
        seconds: 20,
        warmup_seconds: 3,
        prewarm_seconds: 0,
        timeline: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--kafka" => a.kafka = value()?,
            "--pg" => a.pg = value()?,
            "--cluster" => a.cluster = value()?,
            "--rates" => {
                a.rates = value()?
                    .split(',')
                    .map(|r| r.trim().parse())
                    .collect::<Result<_, _>>()?
            }
            "--rounds" => a.rounds = value()?.parse::<usize>()?.max(1),
            "--seconds" => a.seconds = value()?.parse()?,
            "--warmup" => a.warmup_seconds = value()?.parse()?,
            "--prewarm" => a.prewarm_seconds = value()?.parse()?,
            "--timeline" => a.timeline = true,
            other => bail!("unknown flag {other}"),
        }
    }
    Ok(a)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let a = args()?;
    let (pg, conn) = tokio_postgres::connect(
        &format!(
            "host={} port={} user=eddy dbname=eddy",
            a.pg.split(':').next().unwrap_or("127.0.0.1"),
            a.pg.rsplit(':').next().unwrap_or("5433")
        ),
        tokio_postgres::NoTls,
    )
    .await
    .context("connecting to eddy")?;
    tokio::spawn(conn);
    if let (Some(&rate), seconds @ 1..) = (a.rates.first(), a.prewarm_seconds) {
        let prewarm = Phase {
            seconds,
            warmup_seconds: seconds,
            timeline: false,
        };
        run(&pg, &a, &prewarm, 0, rate).await?;
    }
    println!(
        "rate_per_s,round,path,events,answered,p50_ms,p99_ms,p99_9_ms,max_ms,errors,p99_9_vs_kafka"
    );
    let measured = Phase {
        seconds: a.seconds,
        warmup_seconds: a.warmup_seconds,
        timeline: a.timeline,
    };
    let mut ratios = Vec::new();
    for (n, &rate) in a.rates.iter().enumerate() {
        let mut each = Vec::new();
        for round in 1..=a.rounds {
            let (kafka, eddy) = run(&pg, &a, &measured, n * a.rounds + round, rate).await?;
            println!("{}", kafka.line(round, "kafka", &kafka));
            println!("{}", eddy.line(round, "eddy", &kafka));
            each.push(eddy.p999_over(&kafka));
        }
        ratios.push((rate, each));
    }
    if a.rounds > 1 {
        // Each round's ratio compares two runs a few seconds apart; their median is the
        // reading least moved by the machine's stalls.
        println!();
        println!("rate_per_s,rounds,p99_9_vs_kafka_median,p99_9_vs_kafka_by_round");
        for (rate, each) in ratios {
            let by_round: Vec<String> = each.iter().map(|r| format!("{r:.2}")).collect();
            println!(
                "{rate},{},{:.2},{}",
                each.len(),
                median(&each),
                by_round.join(" ")
            );
        }
    }
    Ok(())
}

/// How long a run lasts, and how much of its start is not measured.
struct Phase {
    seconds: u64,
    warmup_seconds: u64,
    timeline: bool,
}

/// Run number `run` at `rate` events/s: first the bare Kafka round trip (`bare`), then
/// Eddy on a stream of its own.
async fn run(
    pg: &tokio_postgres::Client,
    a: &Args,
    phase: &Phase,
    run: usize,
    rate: u64,
) -> anyhow::Result<(Latency, Latency)> {
    let kafka = bare(a, phase, run, rate).await?;
    let stream = format!("lat{}_{run}", std::process::id());
    pg.batch_execute(&format!(
        "CREATE STREAM {stream} (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, \
         amount DOUBLE PRECISION) WITH (event_time = 'ts', partition_by = 'card', \
         partitions = {PARTITIONS}, lateness = '1 second', retention = '10 minutes'); \
         CREATE METRIC {stream}_m AS SELECT card, COUNT(*) AS n, SUM(amount) AS s, AVG(amount) AS a \
         FROM {stream} WINDOW SLIDING (SIZE 5 MINUTES) GROUP BY card;"
    ))
    .await
    .context("creating the stream")?;
    let topic = format!("{}.{stream}.card", a.cluster);
    let eddy = measure(a, phase, &topic, &format!("{run}"), rate).await?;
    pg.batch_execute(&format!("DROP STREAM {stream} CASCADE"))
        .await?;
    Ok((kafka, eddy))
}

/// The bare Kafka round trip at `rate`, the floor under Eddy's: the same events, sent
/// the same way to a topic of as many partitions, where an echo (`echo`) consumes each
/// one and answers at once on the reply topic. Two hops through the broker, as Eddy's
/// path has, with no work between them.
async fn bare(a: &Args, phase: &Phase, run: usize, rate: u64) -> anyhow::Result<Latency> {
    let topic = format!("bare-{}-{run}", std::process::id());
    create_topic(a, &topic, PARTITIONS as i32).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let echo = echo(a, &topic, stop.clone())?;
    let latency = measure(a, phase, &topic, &format!("bare-{run}"), rate).await;
    stop.store(true, Ordering::Release);
    let _ = echo.join();
    latency
}

/// Consumes `topic` and answers each record on the reply topic its headers name, with
/// the settings Eddy's own consumer and reply producer use (`KafkaConfig::consumer`,
/// `KafkaConfig::producer`), until `stop`.
fn echo(
    a: &Args,
    topic: &str,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<std::thread::JoinHandle<()>> {
    let consumer = consumer(a, topic, PARTITIONS as i32)?;
    let producer = producer(a)?;
    Ok(std::thread::spawn(move || {
        while !stop.load(Ordering::Acquire) {
            let Some(Ok(m)) = consumer.poll(Duration::from_millis(50)) else {
                continue;
            };
            let Some(to) = reply_to(&m) else { continue };
            let key = to.request().to_le_bytes();
            send(
                &producer,
                BaseRecord::to(to.topic()).key(&key[..]).payload(&[0u8][..]),
            );
        }
    }))
}

fn client(a: &Args) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &a.kafka);
    c
}

/// A consumer of every partition of `topic` from its start, with the settings of Eddy's
/// (`KafkaConfig::consumer`).
fn consumer(a: &Args, topic: &str, partitions: i32) -> anyhow::Result<BaseConsumer> {
    let consumer: BaseConsumer = client(a)
        .set("group.id", topic)
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "5")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for partition in 0..partitions {
        tpl.add_partition_offset(topic, partition, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    Ok(consumer)
}

/// A producer with the settings of Eddy's reply producer (`KafkaConfig::statement_producer`,
/// reporting failed deliveries only): nothing here reads a successful delivery's report.
fn producer(a: &Args) -> anyhow::Result<ThreadedProducer<DefaultProducerContext>> {
    Ok(client(a)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("linger.ms", "0")
        .set("max.in.flight.requests.per.connection", "1")
        .set("delivery.report.only.error", "true")
        .create()?)
}

/// Sends `record`, waiting while the producer's queue is full.
fn send<K, P>(producer: &ThreadedProducer<DefaultProducerContext>, mut record: BaseRecord<K, P>)
where
    K: rdkafka::message::ToBytes + ?Sized,
    P: rdkafka::message::ToBytes + ?Sized,
{
    loop {
        match producer.send(record) {
            Ok(()) => return,
            Err((_, r)) => {
                record = r;
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }
}

async fn create_topic(a: &Args, topic: &str, partitions: i32) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = client(a).create()?;
    for created in admin
        .create_topics(
            [&NewTopic::new(
                topic,
                partitions,
                TopicReplication::Fixed(1),
            )],
            &AdminOptions::new(),
        )
        .await?
    {
        created.map_err(|(t, e)| anyhow::anyhow!("creating topic {t}: {e}"))?;
    }
    Ok(())
}

/// One run's answers and latencies.
struct Latency {
    rate: u64,
    events: u64,
    answered: u64,
    errors: u64,
    /// p50, p99, p99.9 and max, in ms.
    ms: [f64; 4],
}

impl Latency {
    /// This p99.9 as a multiple of the bare round trip's in `kafka`.
    fn p999_over(&self, kafka: &Latency) -> f64 {
        self.ms[2] / kafka.ms[2]
    }

    /// The CSV line, with `p999_over` the bare round trip's in `kafka`.
    fn line(&self, round: usize, path: &str, kafka: &Latency) -> String {
        let [p50, p99, p999, max] = self.ms;
        format!(
            "{},{round},{path},{},{},{p50:.2},{p99:.2},{p999:.2},{max:.2},{},{:.2}",
            self.rate,
            self.events,
            self.answered,
            self.errors,
            self.p999_over(kafka)
        )
    }
}

/// One run at `rate` events/s into `topic`, answered on a reply topic named after
/// `name`.
async fn measure(
    a: &Args,
    phase: &Phase,
    topic: &str,
    name: &str,
    rate: u64,
) -> anyhow::Result<Latency> {
    let reply_topic = format!("latency-replies-{}-{name}", std::process::id());
    create_topic(a, &reply_topic, 1).await?;
    let producer = producer(a)?;
    let consumer = consumer(a, &reply_topic, 1)?;

    let total = rate * phase.seconds;
    let warmup = rate * phase.warmup_seconds;
    let start = Instant::now() + Duration::from_millis(200);
    let due = move |seq: u64| start + Duration::from_nanos(seq * 1_000_000_000 / rate);
    let histogram = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(
        1,
        600_000_000,
        3,
    )?));
    // Per 250 ms slice of due time: (answers, sum of latencies, max latency) in µs.
    let slices = Arc::new(Mutex::new(vec![
        (0u64, 0u64, 0u64);
        (phase.seconds * 4 + 1) as usize
    ]));
    let answered = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let slices = slices.clone();
        let (histogram, answered, errors, done) = (
            histogram.clone(),
            answered.clone(),
            errors.clone(),
            done.clone(),
        );
        std::thread::spawn(move || {
            while !done.load(Ordering::Acquire) {
                let Some(Ok(m)) = consumer.poll(Duration::from_millis(50)) else {
                    continue;
                };
                let now = Instant::now();
                let Some(seq) = m
                    .key()
                    .and_then(|k| k.try_into().ok())
                    .map(u64::from_le_bytes)
                else {
                    errors.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                if m.payload().and_then(|p| p.first()) != Some(&0) {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
                if seq >= warmup {
                    let micros = now.saturating_duration_since(due(seq)).as_micros() as u64;
                    let _ = histogram.lock().unwrap().record(micros.max(1));
                    let slice = (seq * 4 / rate) as usize;
                    if let Some(s) = slices.lock().unwrap().get_mut(slice) {
                        s.0 += 1;
                        s.1 += micros;
                        s.2 = s.2.max(micros);
                    }
                }
                answered.fetch_add(1, Ordering::Relaxed);
            }
        })
    };

    let mut rng = XorShift(0x2545_f491_4f6c_dd1d ^ rate);
    let mut payload = Vec::with_capacity(64);
    let epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_micros() as i64;
    for seq in 0..total {
        let at = due(seq);
        let now = Instant::now();
        if at > now {
            // Send in ticks of at least a millisecond: a wake-up per event would cost the
            // machine more than Eddy does. Latency still counts from each event's due time.
            std::thread::sleep((at - now).max(Duration::from_millis(1)));
        }
        let card = format!("c{}", rng.next_u64() % CARDS);
        let amount = (rng.next_u64() % 100_000) as f64 / 100.0;
        let ts = epoch + (at - start).as_micros() as i64;
        payload.clear();
        encode_row(
            &[
                Value::Int(seq as i64),
                Value::Timestamp(ts),
                Value::Text(card.as_str().into()),
                Value::Float(amount),
            ],
            &mut payload,
        );
        let partition = partition_for(&Value::Text(card.as_str().into()), PARTITIONS) as i32;
        let record = BaseRecord::to(topic)
            .partition(partition)
            .key(card.as_bytes())
            .payload(&payload)
            .headers(reply_headers(&reply_topic, seq, 0, true));
        send(&producer, record);
    }
    producer.flush(Duration::from_secs(30))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while answered.load(Ordering::Relaxed) < total && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    done.store(true, Ordering::Release);
    let _ = reader.join();
    if phase.timeline {
        for (i, (n, sum, max)) in slices.lock().unwrap().iter().enumerate() {
            if *n > 0 {
                eprintln!(
                    "t={:6.2}s mean={:7.2}ms max={:7.2}ms",
                    i as f64 / 4.0,
                    *sum as f64 / *n as f64 / 1000.0,
                    *max as f64 / 1000.0
                );
            }
        }
    }
    let h = histogram.lock().unwrap();
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    Ok(Latency {
        rate,
        events: total,
        answered: answered.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        ms: [ms(0.5), ms(0.99), ms(0.999), h.max() as f64 / 1000.0],
    })
}
