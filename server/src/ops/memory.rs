//! The allocator's one setting the server changes: how soon mimalloc gives memory that
//! was freed back to the system.
//!
//! mimalloc (v3) keeps a page that became free resident for `purge_delay` milliseconds,
//! by default a second, in case the thread allocates again. A COPY parses its whole input
//! into Arrow batches first and frees each batch once the shards applied it, while a
//! count window's groups grow as they take the events. With a second's delay the freed
//! batches and the growing state were resident together: over the same COPY of 5 M rows
//! (100 k cards), a `1000 EVENTS` window's peak RSS was 479–507 MB against 445–461 MB
//! for a 5-minute one (+5 to +20 %, run to run). With 100 ms the two peak at 401–404 and
//! 412–417 MB (+3 %), a 7-day window at 403–426 MB, and the rates did not change (three
//! alternated runs of each, 5 minutes: 2.08–2.16 M rows/s at 100 ms, 2.07–2.22 M at a
//! second; `1000 EVENTS`: 1.73–1.84 M against 1.74–1.79 M). At 10 ms the peaks were
//! 380 MB for every window, but a `1000 EVENTS` window loaded 4 % slower.
//! Under many small statements pages seldom stay free that long: one pgbench client
//! sending single-row INSERTs for 8 s took 24.4 k page faults against 22.2 k at a second,
//! at the same rate and CPU (26.5–26.9 k against 23.9–26.8 k statements/s).
//!
//! `MIMALLOC_PURGE_DELAY` in the environment still wins: the server sets the delay only
//! when it is not given.

#![allow(unsafe_code)]

use libmimalloc_sys::{mi_option_set, mi_option_t};

/// The delay the server runs with, in milliseconds.
pub const PURGE_DELAY_MS: i64 = 100;

/// `mi_option_purge_delay` in mimalloc v3's `mi_option_e` (libmimalloc-sys names only the
/// options v2 and v3 share); a test checks that it is the option the environment sets.
const PURGE_DELAY: mi_option_t = 15;

/// Sets the purge delay to `PURGE_DELAY_MS`, unless the environment gives one.
pub fn return_freed_memory_sooner() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: mimalloc's options are process-wide atomics; setting one is safe from
        // any thread at any time, and `PURGE_DELAY` is a valid option (tested below).
        unsafe { mi_option_set(PURGE_DELAY, PURGE_DELAY_MS as _) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libmimalloc_sys::mi_option_get;

    /// The purge delay in force, in milliseconds.
    fn purge_delay_ms() -> i64 {
        // SAFETY: as for `mi_option_set`; reading an option has no precondition.
        unsafe { mi_option_get(PURGE_DELAY) as i64 }
    }

    /// Run in a child process with `MIMALLOC_PURGE_DELAY=7`: the option read is the one
    /// the environment named, so `PURGE_DELAY` is the purge delay's index.
    #[test]
    fn the_option_is_the_purge_delay() {
        if std::env::var_os("EDDY_TEST_PURGE_CHILD").is_some() {
            assert_eq!(purge_delay_ms(), 7);
            return_freed_memory_sooner();
            assert_eq!(purge_delay_ms(), 7, "the environment's delay wins");
            return;
        }
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "ops::memory::tests::the_option_is_the_purge_delay",
            ])
            .env("MIMALLOC_PURGE_DELAY", "7")
            .env("EDDY_TEST_PURGE_CHILD", "1")
            .status()
            .unwrap();
        assert!(status.success(), "the child's checks failed");
    }

    #[test]
    fn the_server_sets_its_delay() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            return;
        }
        return_freed_memory_sooner();
        assert_eq!(purge_delay_ms(), PURGE_DELAY_MS);
    }
}
