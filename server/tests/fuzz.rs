//! Fuzzing within `make test`, for a fixed budget: every decoder a stranger's bytes (or
//! a damaged disk's) reach is fed inputs mutated from valid seeds, and must answer with
//! an error, never a panic or an allocation beyond `ALLOCATION_MAX`. The targets:
//! - the wire: pgwire's decoder in every connection state, and the server's own
//!   connection loop over TCP, after which the server must still answer;
//! - the SQL parser and binder (DDL against a catalog, INSERT binding);
//! - COPY parsing, fed in random pieces;
//! - the log: segment files (`TaskLog::open`, `read_from`) and row records;
//! - the reservoir's chunks: header and Arrow payload.
//!
//! Runs are seeded (`EDDY_FUZZ_SEED`, printed) so a failure repeats; `EDDY_FUZZ_SCALE`
//! multiplies the budget. A failing input is written to `tests/fuzz-regressions/
//! <target>/`; every input kept there is replayed first, on every run.

mod common;

use common::{frontend_message as message, startup_message as startup};

use std::alloc::{GlobalAlloc, Layout, System};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The largest single allocation any input may cause.
const ALLOCATION_MAX: usize = 256 << 20;

/// The system allocator, remembering the largest request since it was last asked.
struct Watching;

thread_local! {
    /// The largest request of this thread (tests fuzz on threads of their own).
    static LARGEST: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

// SAFETY: every call goes to the system allocator unchanged, or fails with null as the
// trait allows; only the sizes are looked at.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Watching {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        if layout.size() > 4 * ALLOCATION_MAX {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        if new_size > 4 * ALLOCATION_MAX {
            return std::ptr::null_mut();
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Watching = Watching;

/// xorshift64*: small, seeded, and the same everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn seed() -> u64 {
    std::env::var("EDDY_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
        | 1
}

fn cases(n: usize) -> usize {
    let scale: f64 = std::env::var("EDDY_FUZZ_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    ((n as f64) * scale).max(1.0) as usize
}

const INTERESTING: [&[u8]; 14] = [
    b"\0",
    b"\xff",
    b"\x7f",
    b"\x80",
    b"\xff\xff\xff\xff",
    b"\x7f\xff\xff\xff",
    b"\x00\x00\x00\x00",
    b"'",
    b"\"",
    b"(",
    b")",
    b";",
    b"$1",
    b"\\",
];

/// One input made from the seeds by a few random edits.
fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut out = seeds[rng.below(seeds.len())].clone();
    for _ in 0..1 + rng.below(6) {
        let at = rng.below(out.len() + 1);
        match rng.below(8) {
            0 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] ^= 1 << rng.below(8);
            }
            1 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] = rng.next() as u8;
            }
            2 => {
                let bytes = INTERESTING[rng.below(INTERESTING.len())];
                out.splice(at..at, bytes.iter().copied());
            }
            3 if !out.is_empty() => {
                let end = (at + 1 + rng.below(16)).min(out.len());
                out.drain(at.min(end)..end);
            }
            4 => out.truncate(at),
            5 => {
                let other = &seeds[rng.below(seeds.len())];
                let from = rng.below(other.len() + 1);
                out.splice(at..at, other[from..].iter().copied());
            }
            6 => {
                let n = rng.below(32);
                out.splice(at..at, (0..n).map(|_| rng.next() as u8));
            }
            _ if !out.is_empty() => {
                let from = rng.below(out.len());
                let piece: Vec<u8> = out[from..(from + rng.below(32)).min(out.len())].to_vec();
                out.splice(at..at, piece);
            }
            _ => {}
        }
    }
    out
}

fn regressions(target: &str) -> PathBuf {
    common::repo()
        .join("server/tests/fuzz-regressions")
        .join(target)
}

/// Runs `check` on every kept regression input of `target`, then on `n` mutated
/// inputs; fails on the first panic or oversized allocation, keeping its input.
fn fuzz(target: &str, seeds: &[Vec<u8>], n: usize, check: impl Fn(&[u8])) {
    let seed = seed();
    let mut kept: Vec<Vec<u8>> = std::fs::read_dir(regressions(target))
        .map(|d| {
            d.filter_map(|e| std::fs::read(e.ok()?.path()).ok())
                .collect()
        })
        .unwrap_or_default();
    kept.extend(seeds.iter().cloned());
    let mut rng = Rng(seed);
    let n = cases(n);
    let inputs = kept
        .into_iter()
        .chain((0..n).map(|_| mutate(&mut rng, seeds)));
    let started = std::time::Instant::now();
    let mut ran = 0;
    for input in inputs {
        LARGEST.with(|l| l.set(0));
        let outcome = catch_unwind(AssertUnwindSafe(|| check(&input)));
        let largest = LARGEST.with(|l| l.get());
        ran += 1;
        let failure = match outcome {
            Err(_) => Some("panicked".to_string()),
            Ok(()) if largest > ALLOCATION_MAX => {
                Some(format!("allocated {largest} bytes at once"))
            }
            Ok(()) => None,
        };
        if let Some(failure) = failure {
            let dir = regressions(target);
            std::fs::create_dir_all(&dir).unwrap();
            let name = format!("{:016x}", {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                input.hash(&mut h);
                h.finish()
            });
            std::fs::write(dir.join(&name), &input).unwrap();
            panic!(
                "fuzz target {target} {failure} on input {name} (seed {seed}), kept in {}:\n{:?}",
                dir.display(),
                String::from_utf8_lossy(&input)
            );
        }
    }
    println!(
        "fuzz {target}: {ran} inputs in {:?}, seed {seed}",
        started.elapsed()
    );
}

// ---- the wire ----

/// Frontend messages of every kind a session sends after logging in.
fn wire_seeds() -> Vec<Vec<u8>> {
    let bind = {
        let mut b = b"\0s1\0".to_vec();
        b.extend_from_slice(&[0, 1, 0, 0, 0, 2, 0, 0, 0, 2, b'4', b'2', 0, 0, 0, 0, 0, 0]);
        b
    };
    vec![
        message(b'Q', b"SELECT 1\0"),
        message(
            b'Q',
            b"INSERT INTO pay VALUES ('c1', 5, '2026-01-01 00:00:00')\0",
        ),
        [
            message(b'P', b"s1\0SELECT $1::bigint + 1\0\0\x01\0\0\0\x14"),
            message(b'B', &bind),
            message(b'D', b"P\0"),
            message(b'E', b"\0\0\0\0\0"),
            message(b'S', b""),
        ]
        .concat(),
        [
            message(b'Q', b"COPY pay FROM STDIN WITH (FORMAT csv)\0"),
            message(b'd', b"c1,5,2026-01-01 00:00:00\n"),
            message(b'c', b""),
        ]
        .concat(),
        message(b'f', b"no\0"),
        message(b'C', b"S\0"),
        message(b'H', b""),
        message(b'X', b""),
    ]
}

#[test]
fn the_wire_decodes_anything_without_panicking() {
    let startup = startup("eddy");
    let seeds: Vec<Vec<u8>> = wire_seeds()
        .into_iter()
        .map(|m| [startup.clone(), m].concat())
        .collect();
    fuzz("wire", &seeds, 20_000, |input| {
        eddy_server::wire::decode_as_served(input);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_loop_survives_any_bytes_after_login() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = common::temp_dir("fuzz-wire");
    let server = common::start(&dir).await;
    let admin = common::connect(&server).await;
    admin
        .batch_execute(
            "CREATE STREAM pay (card TEXT, amount BIGINT, ts TIMESTAMP) WITH (event_time = 'ts')",
        )
        .await
        .unwrap();
    let port = server.addr.port();
    // A panic anywhere in the server (a session's task dies with it) fails the test.
    let panics = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = panics.clone();
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with("eddy-"))
        {
            seen.lock().unwrap().push(info.to_string());
        }
        default_hook(info);
    }));
    let seeds = wire_seeds();
    let inputs: Vec<Vec<u8>> = {
        let mut rng = Rng(seed());
        (0..cases(2000)).map(|_| mutate(&mut rng, &seeds)).collect()
    };
    for input in inputs {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        s.write_all(&startup("fuzz")).await.unwrap();
        let _ = s.write_all(&input).await;
        let _ = s.write_all(&message(b'S', b"")).await;
        let _ = s.shutdown().await;
        // Whatever it answers, the server answers and closes within moments.
        let mut sink = Vec::new();
        let read =
            tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut sink))
                .await;
        assert!(
            read.is_ok(),
            "the server neither answered nor closed: {:?}",
            String::from_utf8_lossy(&input)
        );
    }
    assert_eq!(
        common::simple_rows(&admin, "SELECT 1").await,
        [[Some("1".to_string())]]
    );
    let _ = std::panic::take_hook();
    assert!(
        panics.lock().unwrap().is_empty(),
        "the server panicked: {:?}",
        panics.lock().unwrap()
    );
    server.stop().await;
}

// ---- SQL ----

fn sql_seeds() -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    let mut stack = vec![common::repo().join("sqllogic-tests/slt")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "slt") {
                let text = std::fs::read_to_string(&path).unwrap();
                for block in text.split("\n\n") {
                    let statement: Vec<&str> = block
                        .lines()
                        .skip_while(|l| !l.starts_with("statement") && !l.starts_with("query"))
                        .skip(1)
                        .take_while(|l| *l != "----")
                        .collect();
                    if !statement.is_empty() {
                        out.push(statement.join("\n").into_bytes());
                    }
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[test]
fn the_parser_and_binder_refuse_without_panicking() {
    use eddy_planner::sql::{parse_statement, split_statements, Statement};
    let base = [
        "CREATE STREAM pay (id BIGINT, card TEXT NOT NULL, amount DOUBLE PRECISION, ts TIMESTAMP) WITH (event_time = 'ts', event_id = 'id')",
        "CREATE METRIC spend AS SELECT card, SUM(amount), COUNT(*) FROM pay WINDOW SLIDING (SIZE 5 MINUTES) GROUP BY card",
        "CREATE ROLE ana LOGIN",
    ];
    let mut catalog = eddy_planner::catalog::Catalog::default();
    for sql in base {
        catalog = eddy_planner::ddl::apply(&catalog, &parse_statement(sql).unwrap())
            .unwrap()
            .0;
    }
    let seeds = sql_seeds();
    assert!(seeds.len() > 100, "the slt files give seeds");
    fuzz("sql", &seeds, 20_000, |input| {
        let text = String::from_utf8_lossy(input);
        let Ok(statements) = split_statements(&text) else {
            return;
        };
        for sql in statements {
            match parse_statement(&sql) {
                Ok(Statement::Insert(insert)) => {
                    let _ = eddy_planner::bind::bind_insert(&catalog, &insert);
                }
                Ok(stmt) => {
                    let _ = eddy_planner::ddl::apply(&catalog, &stmt);
                }
                Err(_) => {}
            }
        }
    });
}

// ---- COPY ----

#[test]
fn copy_parsing_refuses_without_panicking() {
    use eddy_planner::sql::{parse_statement, Statement};
    let catalog = eddy_planner::ddl::apply(
        &Default::default(),
        &parse_statement("CREATE STREAM pay (id BIGINT NOT NULL, card TEXT, amount DOUBLE PRECISION, ok BOOLEAN, ts TIMESTAMP) WITH (event_time = 'ts')").unwrap(),
    )
    .unwrap()
    .0;
    let statements: Vec<Statement> = [
        "COPY pay FROM STDIN",
        "COPY pay FROM STDIN WITH (FORMAT csv, HEADER true)",
        "COPY pay (ts, id) FROM STDIN WITH (FORMAT csv, DELIMITER ';', NULL 'x')",
    ]
    .iter()
    .map(|s| parse_statement(s).unwrap())
    .collect();
    let seeds: Vec<Vec<u8>> = [
        "1\tc1\t2.5\ttrue\t2026-01-01 00:00:00\n2\t\\N\t-1e3\tf\t2026-01-01 00:00:01\n\\.\n",
        "id,card,amount,ok,ts\n1,\"c,1\",2.5,true,2026-01-01 00:00:00\n2,\"say \"\"hi\"\"\",,false,2026-01-01\n",
        "2026-01-01 00:00:00;1\nx;2\n",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    fuzz("copy", &seeds, 5_000, |input| {
        let Some(first) = input.first() else { return };
        let Statement::Copy(copy) = &statements[*first as usize % statements.len()] else {
            unreachable!()
        };
        let mut copy = eddy_server::session::copy::CopyIn::bind(&catalog, copy).unwrap();
        let mut at = 0;
        let mut piece = 1 + *first as usize % 7;
        while at < input.len() {
            let end = (at + piece).min(input.len());
            let _ = copy.push(&input[at..end]);
            at = end;
            piece = piece * 3 % 97 + 1;
        }
        let _ = runtime.block_on(copy.finish());
    });
}

// ---- the log and the reservoir ----

#[test]
fn log_segments_and_records_refuse_without_panicking() {
    use eddy_planner::codec::{decode_row, encode_row};
    use eddy_planner::types::Value;
    let rows: Vec<Vec<Value>> = vec![
        vec![
            Value::Int(1),
            Value::Text("card".into()),
            Value::Float(2.5),
            Value::Null,
        ],
        vec![
            Value::Bool(true),
            Value::Timestamp(1_700_000_000_000_000),
            Value::Text("".into()),
        ],
    ];
    let records: Vec<Vec<u8>> = rows
        .iter()
        .map(|r| {
            let mut b = Vec::new();
            encode_row(r, &mut b);
            b
        })
        .collect();
    fuzz("log-record", &records, 20_000, |input| {
        let _ = decode_row(input);
    });

    let dir = common::temp_dir("fuzz-log");
    let seed_dir = dir.join("seed");
    let mut log = eddy_storage::TaskLog::open(&seed_dir, 1 << 20).unwrap();
    let framed: eddy_storage::Records = records.iter().collect();
    log.append(&framed).unwrap();
    log.append(&framed).unwrap();
    log.sync().unwrap();
    drop(log);
    let segment = std::fs::read(seed_dir.join("00000000000000000000.log")).unwrap();
    let case = std::sync::atomic::AtomicUsize::new(0);
    fuzz("log-segment", &[segment], 1_000, |input| {
        let n = case.fetch_add(1, Ordering::Relaxed);
        let dir = dir.join(format!("case{n}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("00000000000000000000.log"), input).unwrap();
        if let Ok(log) = eddy_storage::TaskLog::open(&dir, 1 << 20) {
            let _ = log.read_from(0, &mut |_, record| {
                let _ = decode_row(&record);
            });
        }
        let _ = std::fs::remove_dir_all(&dir);
    });
}

#[test]
fn chunks_refuse_without_panicking() {
    use datafusion::arrow::array::{Int64Array, StringArray, TimestampMicrosecondArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    use datafusion::arrow::record_batch::RecordBatch;
    use eddy_storage::chunk::{
        check_payload, encode_chunk, ChunkHeader, Compression, Compressor, HEADER_BYTES,
    };
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("card", DataType::Utf8, true),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            false,
        ),
    ]));
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(vec![1, 2, 3])),
            Arc::new(StringArray::from(vec![Some("a"), None, Some("ccc")])),
            Arc::new(TimestampMicrosecondArray::from(vec![10, 20, 30])),
        ],
    )
    .unwrap();
    // Both payloads a reservoir writes: an LZ4 block, and the IPC stream alone.
    let chunk = |mode| {
        let compressor = Compressor::new(mode);
        encode_chunk(&batch, &compressor, 7, (10, 1), (30, 3))
            .unwrap()
            .1
    };
    let chunks = [chunk(Compression::Lz4), chunk(Compression::None)];
    fuzz("chunk", &chunks, 5_000, |input| {
        // As the reservoir reads a chunk: its header, then its payload, checked.
        if let Some(header) = ChunkHeader::decode(input) {
            let _ = check_payload(&header, &input[HEADER_BYTES..]);
        }
    });
}
