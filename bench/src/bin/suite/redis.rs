//! Redis 7's side of the scoring comparison: Debian's `redis-server` on a free loopback
//! port without persistence (`--save '' --appendonly no`), stopped by PID. Each card is a
//! sorted set scored by event time; a Lua script (EVALSHA) per event adds the event, trims
//! what left the 5-minute window and answers COUNT/SUM/AVG. The pipelined form writes a
//! batch of EVALSHAs before reading their replies. The client speaks RESP2 over a plain
//! TCP stream (a few commands, no connection pool needed).

use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use super::procs::{self, Server};
use super::workload::{Answer, Event, Expected, ScoreRun, Tally, WINDOW_MS};
use super::{progress, Plan};

/// Adds event ARGV[3] (score ARGV[1] in ms, amount ARGV[2] in cents) to card KEYS[1],
/// drops the events at or before ARGV[1] - ARGV[4] and answers {count, sum in cents, avg}.
/// Members are `id:cents`; cents keep the sum exact in Lua's doubles.
const SCRIPT: &str = r#"
local ts = tonumber(ARGV[1])
redis.call('ZADD', KEYS[1], ts, ARGV[3] .. ':' .. ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ts - tonumber(ARGV[4]))
local live = redis.call('ZRANGE', KEYS[1], 0, -1)
local sum = 0
for i = 1, #live do
  local m = live[i]
  sum = sum + tonumber(string.sub(m, string.find(m, ':', 1, true) + 1))
end
return {#live, sum, string.format('%.17g', sum / 100 / #live)}
"#;

/// One RESP2 reply.
#[derive(Debug)]
pub enum Reply {
    Status(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Reply>),
}

/// A RESP2 connection.
pub struct Conn {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
}

impl Conn {
    pub fn connect(port: u16) -> Result<Conn> {
        let stream = TcpStream::connect(("127.0.0.1", port))
            .with_context(|| format!("connecting to redis on port {port}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        Ok(Conn {
            reader: BufReader::new(stream.try_clone()?),
            writer: BufWriter::new(stream),
        })
    }

    /// Buffers one command (flushed by [`Conn::flush`] or [`Conn::call`]).
    pub fn send(&mut self, args: &[&[u8]]) -> Result<()> {
        write!(self.writer, "*{}\r\n", args.len())?;
        for a in args {
            write!(self.writer, "${}\r\n", a.len())?;
            self.writer.write_all(a)?;
            self.writer.write_all(b"\r\n")?;
        }
        Ok(())
    }

    pub fn flush(&mut self) -> Result<()> {
        Ok(self.writer.flush()?)
    }

    /// Sends one command and reads its reply.
    pub fn call(&mut self, args: &[&[u8]]) -> Result<Reply> {
        self.send(args)?;
        self.flush()?;
        self.read()
    }

    fn line(&mut self) -> Result<String> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            bail!("redis closed the connection");
        }
        Ok(line.trim_end_matches(['\r', '\n']).to_string())
    }

    /// Reads one reply; an error reply is an error.
    pub fn read(&mut self) -> Result<Reply> {
        let line = self.line()?;
        let (kind, rest) = line.split_at(line.len().min(1));
        Ok(match kind {
            "+" => Reply::Status(rest.to_string()),
            "-" => bail!("redis: {rest}"),
            ":" => Reply::Int(rest.parse()?),
            "$" => {
                let len: i64 = rest.parse()?;
                if len < 0 {
                    Reply::Bulk(None)
                } else {
                    let mut buf = vec![0; len as usize + 2];
                    self.reader.read_exact(&mut buf)?;
                    buf.truncate(len as usize);
                    Reply::Bulk(Some(buf))
                }
            }
            "*" => {
                let len: i64 = rest.parse()?;
                let mut items = Vec::with_capacity(len.max(0) as usize);
                for _ in 0..len.max(0) {
                    items.push(self.read()?);
                }
                Reply::Array(items)
            }
            _ => bail!("unexpected reply from redis: {line}"),
        })
    }
}

/// `redis-server` on a free loopback port, its files under `work`.
pub fn start(work: &Path) -> Result<(Server, Conn, String)> {
    let dir = work.join("redis");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let port = procs::free_port()?;
    let binary =
        procs::which("redis-server").ok_or_else(|| anyhow!("redis-server is not on the PATH"))?;
    let mut cmd = Command::new(binary);
    cmd.args([
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ])
    .args(["--daemonize", "no", "--dir"])
    .arg(&dir);
    let line = procs::command_line(&cmd);
    let mut server = Server::spawn("redis-server", &mut cmd, dir.join("redis.log"), "TERM")?;
    let conn = procs::wait_ready(&mut server, Duration::from_secs(30), || {
        let mut c = Conn::connect(port)?;
        c.call(&[b"PING"])?;
        Ok(c)
    })?;
    Ok((server, conn, line))
}

fn text(reply: &Reply) -> Result<String> {
    match reply {
        Reply::Bulk(Some(b)) => Ok(String::from_utf8_lossy(b).into_owned()),
        Reply::Status(s) => Ok(s.clone()),
        other => bail!("expected a string from redis, got {other:?}"),
    }
}

/// The script's reply `{count, sum in cents, avg}` as an answer.
fn answer(reply: Reply) -> Result<Answer> {
    let Reply::Array(items) = reply else {
        bail!("expected an array from the script, got {reply:?}");
    };
    let [Reply::Int(n), Reply::Int(cents), avg] = items.as_slice() else {
        bail!("unexpected script reply {items:?}");
    };
    Ok(Answer {
        n: *n,
        sum: Some(*cents as f64 / 100.0),
        avg: Some(text(avg)?.parse().context("the script's average")?),
    })
}

/// Buffers the EVALSHA of one event.
fn send_event(conn: &mut Conn, sha: &str, e: &Event) -> Result<()> {
    let key = format!("sc:{}", e.card);
    let (ts, cents, id, window) = (
        e.ts_ms.to_string(),
        e.cents.to_string(),
        e.id.to_string(),
        WINDOW_MS.to_string(),
    );
    conn.send(&[
        b"EVALSHA",
        sha.as_bytes(),
        b"1",
        key.as_bytes(),
        ts.as_bytes(),
        cents.as_bytes(),
        id.as_bytes(),
        window.as_bytes(),
    ])
}

/// Both Redis runs of the plan: one EVALSHA per round trip, and pipelined batches.
pub fn run_all(
    conn: &mut Conn,
    plan: &Plan,
    events: &[Event],
    expected: &[Expected],
) -> Result<Vec<ScoreRun>> {
    let sha = text(&conn.call(&[b"SCRIPT", b"LOAD", SCRIPT.as_bytes()])?)?;
    let mut runs = Vec::new();
    for batch in [1, plan.batch] {
        let wanted = if batch == 1 {
            plan.single_events
        } else {
            plan.batch_events
        };
        let run = run_one(conn, &sha, plan, &events[..wanted], expected, batch)
            .with_context(|| format!("Redis, {batch} events per round trip"))?;
        runs.push(run);
    }
    Ok(runs)
}

fn run_one(
    conn: &mut Conn,
    sha: &str,
    plan: &Plan,
    events: &[Event],
    expected: &[Expected],
    batch: usize,
) -> Result<ScoreRun> {
    conn.call(&[b"FLUSHALL"])?;
    let form = if batch == 1 { "single" } else { "pipeline" };
    let bar = progress::bar(events.len() as u64, &format!("Redis {form}"));
    let mut tally = Tally::new()?;
    for chunk in events.chunks(batch) {
        if tally.elapsed() > plan.step_cap {
            break;
        }
        let t = Instant::now();
        for e in chunk {
            send_event(conn, sha, e)?;
        }
        conn.flush()?;
        let answers: Vec<Answer> = (0..chunk.len())
            .map(|_| conn.read().and_then(answer))
            .collect::<Result<_>>()?;
        tally.record(t.elapsed(), &answers, expected)?;
        bar.inc(chunk.len() as u64);
    }
    bar.finish_and_clear();
    Ok(ScoreRun::new(
        "Redis 7",
        form,
        "no persistence",
        batch,
        &tally,
        events.len(),
    ))
}
