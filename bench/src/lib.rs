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
