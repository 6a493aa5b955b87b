//! The machine's floor: what no server on this host can beat, whatever its code does.
//! Prints one JSON object, so a front-door or engine figure can be read against it.
//!
//! - `clock`: one thread that does nothing but read the monotonic clock for `--seconds`.
//!   Its longest gap between two reads is time the host took the core away; no program's
//!   maximum latency per event, measured over as long a run, can be lower.
//! - `echo_blocking` / `echo_polling`: one client and one echo thread over loopback TCP
//!   (`TCP_NODELAY`), one message of `--size` bytes in flight, for `--seconds`: the round
//!   trips a second and their percentiles when the server does no work at all. Blocking:
//!   both sides sleep in `read`, as a blocking driver (psycopg, JDBC) and a server woken by
//!   its socket do. Polling: both spin on non-blocking reads, each holding a core.
//! - `echo_durable`: the blocking echo, but before each answer the echo thread writes the
//!   message into a file and `fdatasync`s it: one durable single-client statement with
//!   nothing else to do. The file is written full of zeros and synced first, and the
//!   messages then go over the zeros, as PostgreSQL's WAL and Eddy's journal do, so each
//!   fdatasync writes data alone, never the inode. A durable server answering one client
//!   on this host can at best reach this rate (`--dir`: on the servers' disk).

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use serde_json::json;

use eddy_bench::ZeroedLog;

#[derive(clap::Parser)]
struct Args {
    /// Seconds each probe runs.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Bytes of each message of the echo probes: about a prepared single-row
    /// `INSERT … RETURNING`'s Bind, Execute and Sync.
    #[arg(long, default_value_t = 96)]
    size: usize,
    /// Where `echo_durable` writes its file (deleted at the end): the directory the
    /// servers compared with it keep their logs on. Default: the system's temporary one.
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
}

/// The clock probe: the longest gap between two reads, and how many gaps passed 1 ms.
fn clock(seconds: f64) -> serde_json::Value {
    let started = Instant::now();
    let (mut last, mut longest, mut over_1ms, mut reads) = (started, Duration::ZERO, 0u64, 0u64);
    while last.duration_since(started).as_secs_f64() < seconds {
        let now = Instant::now();
        let gap = now - last;
        longest = longest.max(gap);
        over_1ms += u64::from(gap > Duration::from_millis(1));
        reads += 1;
        last = now;
    }
    json!({
        "probe": "clock",
        "seconds": seconds,
        "reads": reads,
        "longest_gap_ms": (longest.as_secs_f64() * 1e5).round() / 100.0,
        "gaps_over_1ms": over_1ms,
        "gaps_over_1ms_per_sec": (over_1ms as f64 / seconds * 10.0).round() / 10.0,
    })
}

/// Reads exactly `buf.len()` bytes, spinning on a non-blocking socket when `polling`.
fn read_all(s: &mut TcpStream, buf: &mut [u8], polling: bool) -> std::io::Result<()> {
    if !polling {
        return s.read_exact(buf);
    }
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// How the echo thread answers.
#[derive(Clone, Copy, PartialEq)]
enum Echo {
    Blocking,
    Polling,
    /// Blocking, with the message made durable first.
    Durable,
}

/// One echo probe: a client and an echo thread on loopback, one message in flight.
fn echo(seconds: f64, size: usize, how: Echo, dir: &std::path::Path) -> Result<serde_json::Value> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let polling = how == Echo::Polling;
    let mut log = match how {
        Echo::Durable => {
            Some(ZeroedLog::create(dir, "floor-echo-durable").context("echo_durable's file")?)
        }
        _ => None,
    };
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        s.set_nonblocking(polling)?;
        let mut buf = vec![0u8; size];
        loop {
            match read_all(&mut s, &mut buf, polling) {
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(()),
                r => r?,
            }
            if let Some(log) = &mut log {
                log.write(&buf)?;
            }
            s.write_all(&buf)?;
        }
    });
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    s.set_nonblocking(polling)?;
    let mut buf = vec![7u8; size];
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let started = Instant::now();
    let mut trips = 0u64;
    while started.elapsed().as_secs_f64() < seconds {
        let t = Instant::now();
        s.write_all(&buf)?;
        read_all(&mut s, &mut buf, polling)?;
        h.record((t.elapsed().as_nanos() as u64 / 1000).max(1))?;
        trips += 1;
    }
    let elapsed = started.elapsed().as_secs_f64();
    drop(s);
    echo.join()
        .map_err(|_| anyhow::anyhow!("the echo thread panicked"))?
        .context("echo thread")?;
    let ms = |us: u64| us as f64 / 1000.0;
    Ok(json!({
        "probe": match how {
            Echo::Blocking => "echo_blocking",
            Echo::Polling => "echo_polling",
            Echo::Durable => "echo_durable",
        },
        "message_bytes": size,
        "seconds": (elapsed * 100.0).round() / 100.0,
        "round_trips": trips,
        "round_trips_per_sec": (trips as f64 / elapsed).round(),
        "p50_ms": ms(h.value_at_quantile(0.5)),
        "p99_ms": ms(h.value_at_quantile(0.99)),
        "p999_ms": ms(h.value_at_quantile(0.999)),
        "max_ms": ms(h.max()),
    }))
}

fn main() -> Result<()> {
    let a = <Args as clap::Parser>::parse();
    let dir = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    let probes = vec![
        clock(a.seconds),
        echo(a.seconds, a.size, Echo::Blocking, &dir)?,
        echo(a.seconds, a.size, Echo::Polling, &dir)?,
        echo(a.seconds, a.size, Echo::Durable, &dir)?,
    ];
    println!(
        "{}",
        serde_json::to_string_pretty(&json!({
            "nproc": std::thread::available_parallelism().map_or(1, |n| n.get()),
            "floor": probes,
        }))?
    );
    Ok(())
}
