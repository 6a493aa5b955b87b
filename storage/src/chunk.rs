//! Sealed chunks: a run of events as one Arrow record batch, written as an Arrow IPC
//! stream compressed whole as one LZ4 block (liblz4, its uncompressed size first) behind
//! a fixed header.
//!
//! On disk a chunk is `header ‖ payload`. The header holds a magic number, the format
//! version, the schema id the batch was written with, its row count, the keys of its first
//! and last event, its uncompressed size, the payload length and the payload's CRC32.
//! The payload is self-describing (the IPC stream carries its schema), so chunks written
//! before a schema change stay readable.
//!
//! Version 1 compressed each Arrow buffer apart, with Arrow's LZ4 frames inside the IPC
//! stream; those chunks (and checkpointed open events so written) stay readable. One
//! block for the whole stream costs about half the instructions per event to write, the
//! most frequent cost of a sealed event. A payload tells its format by its first bytes:
//! an IPC stream starts with the continuation marker, which is never a block's size. So
//! a payload may also be the IPC stream alone, uncompressed: what `Compressor` writes
//! where LZ4 does not pay, and what every reader of version 1 or 2 reads.

use std::io::Cursor;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use arrow_array::RecordBatch;
use arrow_ipc::reader::StreamReader;
use arrow_ipc::writer::StreamWriter;

/// "EDCK", little-endian.
pub const CHUNK_MAGIC: u32 = 0x4b43_4445;
pub const CHUNK_VERSION: u16 = 2;
/// The oldest version still read.
const OLDEST_VERSION: u16 = 1;
/// The first bytes of every Arrow IPC stream (a version 1 payload).
const IPC_CONTINUATION: [u8; 4] = [0xff; 4];
/// LZ4 never compresses by more than this: a block that says it holds more is damaged.
const LZ4_MAX_RATIO: usize = 255;
pub const HEADER_BYTES: usize = 64;

/// An event's position: (event time in microseconds, arrival sequence).
pub type Key = (i64, u64);

/// What a chunk header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    pub schema_id: u32,
    pub rows: u32,
    pub first: Key,
    pub last: Key,
    /// Bytes of the batch's Arrow buffers before compression.
    pub raw_bytes: u64,
    pub payload_len: u32,
    pub crc: u32,
}

impl ChunkHeader {
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..4].copy_from_slice(&CHUNK_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&CHUNK_VERSION.to_le_bytes());
        b[8..12].copy_from_slice(&self.schema_id.to_le_bytes());
        b[12..16].copy_from_slice(&self.rows.to_le_bytes());
        b[16..24].copy_from_slice(&self.first.0.to_le_bytes());
        b[24..32].copy_from_slice(&self.first.1.to_le_bytes());
        b[32..40].copy_from_slice(&self.last.0.to_le_bytes());
        b[40..48].copy_from_slice(&self.last.1.to_le_bytes());
        b[48..56].copy_from_slice(&self.raw_bytes.to_le_bytes());
        b[56..60].copy_from_slice(&self.payload_len.to_le_bytes());
        b[60..64].copy_from_slice(&self.crc.to_le_bytes());
        b
    }

    /// `None` when the bytes are not a chunk header of a known version.
    pub fn decode(b: &[u8]) -> Option<ChunkHeader> {
        if b.len() < HEADER_BYTES {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let version = u16::from_le_bytes([b[4], b[5]]);
        if u32_at(0) != CHUNK_MAGIC || !(OLDEST_VERSION..=CHUNK_VERSION).contains(&version) {
            return None;
        }
        Some(ChunkHeader {
            schema_id: u32_at(8),
            rows: u32_at(12),
            first: (u64_at(16) as i64, u64_at(24)),
            last: (u64_at(32) as i64, u64_at(40)),
            raw_bytes: u64_at(48),
            payload_len: u32_at(56),
            crc: u32_at(60),
        })
    }
}

/// How a reservoir's chunks are compressed (`eddy serve --reservoir-compression`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Compression {
    /// LZ4 where it pays: where it at least halves a chunk's bytes (`Compressor`).
    #[default]
    Auto,
    /// Every chunk.
    Lz4,
    /// No chunk.
    None,
}

impl FromStr for Compression {
    type Err = String;

    fn from_str(s: &str) -> Result<Compression, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Compression::Auto),
            "lz4" => Ok(Compression::Lz4),
            "none" => Ok(Compression::None),
            _ => Err(format!("\"{s}\" is not a compression: auto, lz4 or none")),
        }
    }
}

/// Under `Compression::Auto`, one chunk in this many is compressed to see what LZ4 saves
/// on a reservoir's events; the chunks until the next sample follow what it saw.
const SAMPLE_EVERY: u64 = 16;

/// LZ4 pays where it divides a chunk's bytes by at least this. Below it, compressing at
/// each seal and decompressing at each read back costs more than the disk it saves: on
/// `bench/memory.sh`'s payments (1.7x), LZ4 took a third of the IO thread's time and
/// cost a 7-day window a tenth of its rate, to save 22 of an event's 54 bytes of disk.
const LZ4_PAYS_AT: usize = 2;

/// Writes a reservoir's payloads, compressed as its `Compression` says. Shared by the
/// reservoir and the writes it queues to the IO thread.
#[derive(Debug)]
pub struct Compressor {
    mode: Compression,
    /// Payloads written under `Auto`: which ones are samples.
    written: AtomicU64,
    /// What the last sample saw.
    pays: AtomicBool,
}

impl Compressor {
    pub fn new(mode: Compression) -> Compressor {
        Compressor {
            mode,
            written: AtomicU64::new(0),
            pays: AtomicBool::new(true),
        }
    }

    /// The payload of `batch`: its IPC stream, as one LZ4 block with its size first or
    /// alone.
    pub fn payload(&self, batch: &RecordBatch) -> Result<Vec<u8>, String> {
        let ipc = ipc_stream(batch)?;
        let sample = match self.mode {
            Compression::None => return Ok(ipc),
            Compression::Lz4 => return lz4_block(&ipc),
            Compression::Auto => self
                .written
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(SAMPLE_EVERY),
        };
        if !sample {
            return if self.pays.load(Ordering::Relaxed) {
                lz4_block(&ipc)
            } else {
                Ok(ipc)
            };
        }
        let block = lz4_block(&ipc)?;
        let pays = block.len() * LZ4_PAYS_AT <= ipc.len();
        self.pays.store(pays, Ordering::Relaxed);
        Ok(if pays { block } else { ipc })
    }
}

fn ipc_stream(batch: &RecordBatch) -> Result<Vec<u8>, String> {
    let mut ipc = Vec::with_capacity(batch.get_array_memory_size() + 1024);
    let mut writer = StreamWriter::try_new(&mut ipc, &batch.schema()).map_err(|e| e.to_string())?;
    writer.write(batch).map_err(|e| e.to_string())?;
    writer.finish().map_err(|e| e.to_string())?;
    drop(writer);
    Ok(ipc)
}

fn lz4_block(ipc: &[u8]) -> Result<Vec<u8>, String> {
    lz4::block::compress(ipc, None, true).map_err(|e| e.to_string())
}

/// The batch of a chunk's payload, once its length and checksum match its header: a
/// damaged payload is refused before Arrow reads it. (A payload whose checksum matches
/// is trusted to be one `Compressor` wrote: Arrow allocates what its IPC messages
/// declare.)
pub fn check_payload(header: &ChunkHeader, payload: &[u8]) -> Result<RecordBatch, String> {
    if payload.len() != header.payload_len as usize {
        return Err(format!(
            "the payload has {} bytes, the header says {}",
            payload.len(),
            header.payload_len
        ));
    }
    if crc32fast::hash(payload) != header.crc {
        return Err("bad checksum".into());
    }
    decode_batch(payload)
}

/// The batch of a payload `Compressor` wrote, of any version.
pub fn decode_batch(payload: &[u8]) -> Result<RecordBatch, String> {
    if payload.starts_with(&IPC_CONTINUATION) {
        return read_ipc(payload);
    }
    let size = payload
        .get(..4)
        .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")))
        .ok_or("the payload is too short for an LZ4 block")?;
    if size < 0 || size as usize > (payload.len() - 4).saturating_mul(LZ4_MAX_RATIO) + 16 {
        return Err(format!(
            "an LZ4 block of {} bytes cannot hold the {size} it declares",
            payload.len() - 4
        ));
    }
    let ipc = lz4::block::decompress(payload, None).map_err(|e| format!("bad LZ4 block: {e}"))?;
    read_ipc(&ipc)
}

fn read_ipc(ipc: &[u8]) -> Result<RecordBatch, String> {
    let mut reader = StreamReader::try_new(Cursor::new(ipc), None).map_err(|e| e.to_string())?;
    match reader.next() {
        Some(batch) => batch.map_err(|e| e.to_string()),
        None => Err("the chunk holds no record batch".into()),
    }
}

/// A whole chunk (header and payload) for `batch` of events spanning `first..=last`.
pub fn encode_chunk(
    batch: &RecordBatch,
    compressor: &Compressor,
    schema_id: u32,
    first: Key,
    last: Key,
) -> Result<(ChunkHeader, Vec<u8>), String> {
    let payload = compressor.payload(batch)?;
    let header = ChunkHeader {
        schema_id,
        rows: batch.num_rows() as u32,
        first,
        last,
        raw_bytes: batch.get_array_memory_size() as u64,
        payload_len: payload.len() as u32,
        crc: crc32fast::hash(&payload),
    };
    let mut bytes = Vec::with_capacity(HEADER_BYTES + payload.len());
    bytes.extend_from_slice(&header.encode());
    bytes.extend_from_slice(&payload);
    Ok((header, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int64Array, StringArray};
    use std::sync::Arc;

    #[test]
    fn round_trips_and_compresses() {
        let n = 10_000;
        let batch = RecordBatch::try_from_iter(vec![
            (
                "card",
                Arc::new(StringArray::from_iter_values(
                    (0..n).map(|i| format!("card-{}", i % 100)),
                )) as _,
            ),
            (
                "amount",
                Arc::new(Int64Array::from_iter_values((0..n).map(|i| i % 1000))) as _,
            ),
        ])
        .unwrap();
        let (header, bytes) = encode_chunk(&batch, &lz4(), 3, (1, 1), (9, 9)).unwrap();
        assert_eq!(ChunkHeader::decode(&bytes), Some(header));
        assert!((header.payload_len as u64) < header.raw_bytes / 2);
        let back = decode_batch(&bytes[HEADER_BYTES..]).unwrap();
        assert_eq!(back, batch);
        assert_eq!(ChunkHeader::decode(&bytes[1..]), None);
    }

    fn lz4() -> Compressor {
        Compressor::new(Compression::Lz4)
    }

    /// Doubles from a xorshift: bytes LZ4 can do nothing with.
    fn noise(n: usize) -> RecordBatch {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let values = (0..n).map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            f64::from_bits(x >> 2)
        });
        RecordBatch::try_from_iter(vec![(
            "amount",
            Arc::new(arrow_array::Float64Array::from_iter_values(values)) as _,
        )])
        .unwrap()
    }

    fn compressed(payload: &[u8]) -> bool {
        !payload.starts_with(&IPC_CONTINUATION)
    }

    /// `Auto` compresses what LZ4 at least halves, writes the rest as the IPC stream
    /// alone, and follows its last sample between samples: a reservoir whose events stop
    /// compressing stops paying for LZ4 at its next sample, and takes it up again the
    /// same way. Every payload reads back whole, whichever it is.
    #[test]
    fn auto_compresses_where_lz4_pays() {
        // A card of ten, its amount: a batch LZ4 divides by more than two.
        let good = RecordBatch::try_from_iter(vec![(
            "card",
            Arc::new(StringArray::from_iter_values(
                (0..5000).map(|i| format!("card-{}", i % 10)),
            )) as _,
        )])
        .unwrap();
        let bad = noise(5000);
        let auto = Compressor::new(Compression::Auto);
        let write = |batch: &RecordBatch| {
            let payload = auto.payload(batch).unwrap();
            assert_eq!(&decode_batch(&payload).unwrap(), batch);
            compressed(&payload)
        };
        // Sample 0 compresses well; until sample 1, everything is compressed, noise too.
        assert!(write(&good));
        assert!((1..SAMPLE_EVERY).all(|_| write(&bad)));
        // Sample 1 is noise: until sample 2, nothing is compressed, not even what would pay.
        assert!(!write(&bad));
        assert!((1..SAMPLE_EVERY).all(|_| !write(&good)));
        assert!(write(&good));
        // The fixed modes never sample.
        let none = Compressor::new(Compression::None);
        assert!(!compressed(&none.payload(&good).unwrap()));
        assert!(compressed(&lz4().payload(&bad).unwrap()));
        assert_eq!("LZ4".parse(), Ok(Compression::Lz4));
        assert!("zstd"
            .parse::<Compression>()
            .unwrap_err()
            .contains("auto, lz4 or none"));
    }

    fn sample() -> RecordBatch {
        RecordBatch::try_from_iter(vec![
            (
                "card",
                Arc::new(StringArray::from_iter_values(
                    (0..5000).map(|i| format!("c{}", i * 7919 % 1000)),
                )) as _,
            ),
            (
                "amount",
                Arc::new(Int64Array::from_iter_values(0..5000)) as _,
            ),
        ])
        .unwrap()
    }

    /// A chunk of version 1, as the last release wrote it: Arrow's own LZ4 frames per
    /// buffer, inside the IPC stream.
    fn version_1_chunk(batch: &RecordBatch) -> Vec<u8> {
        use arrow_ipc::writer::IpcWriteOptions;
        use arrow_ipc::CompressionType;
        let options = IpcWriteOptions::default()
            .try_with_compression(Some(CompressionType::LZ4_FRAME))
            .unwrap();
        let mut payload = Vec::new();
        let mut writer =
            StreamWriter::try_new_with_options(&mut payload, &batch.schema(), options).unwrap();
        writer.write(batch).unwrap();
        writer.finish().unwrap();
        drop(writer);
        let mut header = ChunkHeader {
            schema_id: 1,
            rows: batch.num_rows() as u32,
            first: (1, 1),
            last: (2, 2),
            raw_bytes: batch.get_array_memory_size() as u64,
            payload_len: payload.len() as u32,
            crc: crc32fast::hash(&payload),
        }
        .encode();
        header[4..6].copy_from_slice(&1u16.to_le_bytes());
        [&header[..], &payload].concat()
    }

    #[test]
    fn reads_chunks_of_version_1() {
        let batch = sample();
        let old = version_1_chunk(&batch);
        let header = ChunkHeader::decode(&old).expect("a version 1 header");
        assert_eq!(check_payload(&header, &old[HEADER_BYTES..]).unwrap(), batch);
        // The payload is an IPC stream, not a block: the version is told by its bytes.
        assert!(old[HEADER_BYTES..].starts_with(&IPC_CONTINUATION));
        let (_, new) = encode_chunk(&batch, &lz4(), 1, (1, 1), (2, 2)).unwrap();
        assert!(!new[HEADER_BYTES..].starts_with(&IPC_CONTINUATION));
        assert_eq!(decode_batch(&new[HEADER_BYTES..]).unwrap(), batch);
        let mut future = new.clone();
        future[4..6].copy_from_slice(&(CHUNK_VERSION + 1).to_le_bytes());
        assert_eq!(ChunkHeader::decode(&future), None);
    }

    #[test]
    fn refuses_a_block_that_claims_more_than_lz4_can_hold() {
        let payload = lz4().payload(&sample()).unwrap();
        let mut lying = payload.clone();
        lying[..4].copy_from_slice(&i32::MAX.to_le_bytes());
        let e = decode_batch(&lying).unwrap_err();
        assert!(e.contains("cannot hold"), "{e}");
        lying[..4].copy_from_slice(&(-1i32).to_le_bytes());
        assert!(decode_batch(&lying).is_err());
        assert!(decode_batch(&payload[..3]).is_err());
        // A truncated block is an error, not a panic.
        assert!(decode_batch(&payload[..payload.len() / 2]).is_err());
    }
}
