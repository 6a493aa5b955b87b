//! eddy-bench: benchmark binaries live in src/bin; this library holds shared helpers.

/// A small deterministic generator (xorshift64), so every run sees the same events.
pub struct XorShift(pub u64);

impl XorShift {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The middle of `values` (the mean of the two middle ones for an even count), as the
/// benches compare repeated runs.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// A tokio-postgres client of an in-process server, its connection driven on the runtime.
pub async fn connect(
    server: &eddy_server::serve::Server,
) -> anyhow::Result<tokio_postgres::Client> {
    let (client, conn) = tokio_postgres::connect(
        &format!(
            "host=127.0.0.1 port={} user=eddy dbname=eddy",
            server.addr.port()
        ),
        tokio_postgres::NoTls,
    )
    .await?;
    tokio::spawn(conn);
    Ok(client)
}

/// Bytes of a `ZeroedLog`: written over from the start again when full.
const ZEROED_LOG_BYTES: u64 = 16 << 20;

/// A file of zeros, synced, that `write` fills with records and fdatasyncs, as
/// PostgreSQL's WAL segments and Eddy's journal are written: the file's size never
/// changes, so each fdatasync writes data alone, never the inode. The floors' durable
/// answers (`floor`'s `echo_durable`, `pgfloor --durable`) wait for it. Deleted on drop.
pub struct ZeroedLog {
    file: std::fs::File,
    path: std::path::PathBuf,
    at: u64,
}

impl ZeroedLog {
    /// A new file `NAME-PID-N` in `dir`.
    pub fn create(dir: &std::path::Path, name: &str) -> std::io::Result<ZeroedLog> {
        use std::io::Write;
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = dir.join(format!("{name}-{}-{n}", std::process::id()));
        let mut file = std::fs::OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(&path)?;
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..ZEROED_LOG_BYTES >> 20 {
            file.write_all(&zeros)?;
        }
        file.sync_all()?;
        Ok(ZeroedLog { file, path, at: 0 })
    }

    /// Writes `bytes` after the last write (from the start when full) and fdatasyncs.
    pub fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        if self.at + bytes.len() as u64 > ZEROED_LOG_BYTES {
            self.at = 0;
        }
        self.file.write_all_at(bytes, self.at)?;
        self.at += bytes.len() as u64;
        self.file.sync_data()
    }
}

impl Drop for ZeroedLog {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
