//! What the engine-level tests share: catalogs from DDL, and storage with tiny chunks.

use std::sync::Arc;

use eddy_cluster::StorageConfig;
use eddy_planner::catalog::Catalog;
use eddy_storage::ReservoirConfig;

/// The catalog `ddl` builds, statement by statement.
pub fn catalog_of(ddl: &[&str]) -> Arc<Catalog> {
    Arc::new(eddy_planner::ddl::catalog_of(ddl).expect("ddl"))
}

/// Storage whose chunks, segments and chunk caches are a few KiB: chunks are sealed,
/// evicted and read back from disk all the time.
pub fn tiny_chunks() -> StorageConfig {
    StorageConfig {
        reservoir: ReservoirConfig {
            chunk_bytes_max: 2048,
            segment_bytes_max: 16 << 10,
            cache_bytes_max: 16 << 10,
            shared_cache_bytes_max: 32 << 10,
            ..ReservoirConfig::default()
        },
        ..Default::default()
    }
}
