//! eddy-bench: benchmark binaries live in src/bin; this library holds shared helpers.
