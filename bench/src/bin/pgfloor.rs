//! The floor of a PostgreSQL-protocol server on this host: a server that does no work,
//! for pgbench (or any PostgreSQL client) to run against. What pgbench scores against it
//! is what no server can beat with the same client, clients count and machine.
//!
//!   pgfloor --port P [--durable] [--dir D]
//!
//! It speaks just enough of the protocol for pgbench `-M prepared` and for simple queries
//! (psql `-c`): a startup with no password, Parse, Bind, Describe, Execute, Close, Flush,
//! Sync, Query and Terminate. Every statement answers one row of two int8 columns, `0` and
//! `0`, as Eddy's `RETURNING card_5m.n, card_5m.s` does. Answers are buffered until Sync (or
//! Flush, or the end of a Query) and sent in one write, as Eddy sends them.
//!
//! With `--durable`, a Sync (or Query) that follows work first writes the bytes it received
//! into a zero-filled file of its connection and fdatasyncs it (`eddy_bench::ZeroedLog`,
//! files in `--dir`), as a durable server must before it answers. Each connection syncs
//! alone, with no group commit, so the durable floor is a floor for one client only.
//!
//! One blocking thread per connection, as `floor`'s echo. The protocol is written out here
//! rather than with pgwire on purpose: a floor must carry no library's cost, as `floor`'s
//! echo uses bare sockets. It runs until killed (by PID) and binds loopback only.

use std::collections::HashMap;
use std::io::{BufReader, ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;

use anyhow::Result;

use eddy_bench::ZeroedLog;

#[derive(clap::Parser)]
struct Args {
    /// Port on 127.0.0.1 (0: any free one, printed on stdout).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Write and fdatasync what each Sync answers before answering it.
    #[arg(long)]
    durable: bool,
    /// Where `--durable` keeps its files: the disk the servers compared with it use.
    #[arg(long)]
    dir: Option<PathBuf>,
}

const SSL_REQUEST: i32 = 80877103;
const GSSENC_REQUEST: i32 = 80877104;
/// The two columns of every answer: (name, int8).
const COLUMNS: [&str; 2] = ["n", "s"];
const INT8: i32 = 20;

/// Appends one backend message: its type, its length and its body.
fn message(out: &mut Vec<u8>, kind: u8, body: &[u8]) {
    out.push(kind);
    out.extend_from_slice(&(body.len() as i32 + 4).to_be_bytes());
    out.extend_from_slice(body);
}

fn row_description(out: &mut Vec<u8>) {
    let mut b = (COLUMNS.len() as i16).to_be_bytes().to_vec();
    for name in COLUMNS {
        b.extend_from_slice(name.as_bytes());
        b.push(0);
        b.extend_from_slice(&0i32.to_be_bytes()); // table
        b.extend_from_slice(&0i16.to_be_bytes()); // column
        b.extend_from_slice(&INT8.to_be_bytes());
        b.extend_from_slice(&8i16.to_be_bytes()); // size
        b.extend_from_slice(&(-1i32).to_be_bytes()); // modifier
        b.extend_from_slice(&0i16.to_be_bytes()); // text format
    }
    message(out, b'T', &b);
}

fn data_row(out: &mut Vec<u8>) {
    let mut b = (COLUMNS.len() as i16).to_be_bytes().to_vec();
    for _ in COLUMNS {
        b.extend_from_slice(&1i32.to_be_bytes());
        b.push(b'0');
    }
    message(out, b'D', &b);
    message(out, b'C', b"SELECT 1\0");
}

fn ready(out: &mut Vec<u8>) {
    message(out, b'Z', b"I");
}

/// The highest `$n` in a statement's text: its parameters, for ParameterDescription.
fn parameters(sql: &[u8]) -> i16 {
    let mut highest = 0i16;
    let mut i = 0;
    while i < sql.len() {
        if sql[i] == b'$' {
            let digits = sql[i + 1..]
                .iter()
                .take_while(|c| c.is_ascii_digit())
                .count();
            if let Ok(n) = std::str::from_utf8(&sql[i + 1..i + 1 + digits])
                .unwrap_or("")
                .parse::<i16>()
            {
                highest = highest.max(n);
            }
            i += digits;
        }
        i += 1;
    }
    highest
}

/// The text up to the first zero byte, and what follows it.
fn cstr(b: &[u8]) -> (&[u8], &[u8]) {
    match b.iter().position(|&c| c == 0) {
        Some(i) => (&b[..i], &b[i + 1..]),
        None => (b, &[]),
    }
}

fn read_i32(r: &mut impl Read) -> std::io::Result<i32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(i32::from_be_bytes(b))
}

/// One connection, until the client leaves.
fn serve(stream: TcpStream, mut log: Option<ZeroedLog>) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut out_stream = stream.try_clone()?;
    let mut r = BufReader::with_capacity(64 << 10, stream);
    // The startup, after any SSL or GSS encryption request (refused: plaintext).
    loop {
        let len = read_i32(&mut r)?;
        let mut body = vec![0u8; (len.max(8) - 4) as usize];
        r.read_exact(&mut body)?;
        let code = i32::from_be_bytes(body[..4].try_into().expect("4 bytes"));
        if code == SSL_REQUEST || code == GSSENC_REQUEST {
            out_stream.write_all(b"N")?;
            continue;
        }
        break;
    }
    let mut out = Vec::with_capacity(64 << 10);
    message(&mut out, b'R', &0i32.to_be_bytes());
    for (name, value) in [
        ("server_version", "15.0"),
        ("server_encoding", "UTF8"),
        ("client_encoding", "UTF8"),
        ("DateStyle", "ISO, MDY"),
        ("TimeZone", "UTC"),
        ("integer_datetimes", "on"),
        ("standard_conforming_strings", "on"),
    ] {
        message(&mut out, b'S', format!("{name}\0{value}\0").as_bytes());
    }
    let mut key = std::process::id().to_be_bytes().to_vec();
    key.extend_from_slice(&7i32.to_be_bytes());
    message(&mut out, b'K', &key);
    ready(&mut out);
    out_stream.write_all(&out)?;
    out.clear();

    let mut statements: HashMap<Vec<u8>, i16> = HashMap::new();
    // With a log, the bytes received since the last Sync: what a durable Sync writes.
    let mut received = Vec::with_capacity(64 << 10);
    let mut worked = false;
    loop {
        let mut kind = [0u8; 1];
        match r.read_exact(&mut kind) {
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(()),
            other => other?,
        }
        let len = read_i32(&mut r)?;
        let mut body = vec![0u8; (len.max(4) - 4) as usize];
        r.read_exact(&mut body)?;
        if log.is_some() {
            received.push(kind[0]);
            received.extend_from_slice(&body);
        }
        match kind[0] {
            b'P' => {
                let (name, rest) = cstr(&body);
                let (sql, _) = cstr(rest);
                statements.insert(name.to_vec(), parameters(sql));
                message(&mut out, b'1', &[]);
            }
            b'B' => message(&mut out, b'2', &[]),
            b'D' => {
                if body.first() == Some(&b'S') {
                    let (name, _) = cstr(&body[1..]);
                    let n = statements.get(name).copied().unwrap_or(0);
                    let mut b = n.to_be_bytes().to_vec();
                    for _ in 0..n {
                        b.extend_from_slice(&0i32.to_be_bytes());
                    }
                    message(&mut out, b't', &b);
                }
                row_description(&mut out);
            }
            b'E' => {
                data_row(&mut out);
                worked = true;
            }
            b'C' => message(&mut out, b'3', &[]),
            b'H' => {
                out_stream.write_all(&out)?;
                out.clear();
            }
            b'S' => {}
            b'Q' => {
                row_description(&mut out);
                data_row(&mut out);
                worked = true;
            }
            b'X' => return Ok(()),
            _ => {}
        }
        // Sync, or the end of a simple query: durable first, then ready, in one write.
        if matches!(kind[0], b'S' | b'Q') {
            if let (Some(log), true) = (log.as_mut(), worked) {
                log.write(&received)?;
            }
            ready(&mut out);
            out_stream.write_all(&out)?;
            out.clear();
            received.clear();
            worked = false;
        }
    }
}

fn main() -> Result<()> {
    let a = <Args as clap::Parser>::parse();
    let dir = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    let listener = TcpListener::bind(("127.0.0.1", a.port))?;
    println!("{}", listener.local_addr()?.port());
    std::io::stdout().flush()?;
    for stream in listener.incoming() {
        let stream = stream?;
        let log = if a.durable {
            Some(ZeroedLog::create(&dir, "pgfloor")?)
        } else {
            None
        };
        std::thread::spawn(move || {
            if let Err(e) = serve(stream, log) {
                if e.kind() != ErrorKind::UnexpectedEof && e.kind() != ErrorKind::ConnectionReset {
                    eprintln!("pgfloor: {e}");
                }
            }
        });
    }
    Ok(())
}
