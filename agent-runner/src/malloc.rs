//! glibc's malloc tuned for a long-lived process that does the same work per message (issue 12):
//! one arena for the whole runner (RSS flat over a long session), and a heap top that is kept
//! instead of handed back and faulted in again for every message.
//!
//! **One arena.** glibc gives each thread that allocates while the arenas are busy an arena of
//! its own, up to eight per core, and an arena keeps the high-water mark of what was ever
//! allocated in it. The runner's work moves between the runtime thread, the blocking pool (DB
//! calls that waited for a lock, archive files), SQLite's pool and checkpoint threads, so a
//! SQLite page cache or a turn's JSON lands in whichever arena the thread had: measured with
//! Codex, five thread arenas grew to ~1.2 MiB each and the runner's RSS rose 5-10 MiB over 1,000
//! messages while the memory in use stayed at ~1 MiB. With one arena, freed memory is reused
//! wherever it was freed: the same run grew 2 MiB in its first 400 messages and 80 KiB in the 600
//! after. The runner's threads seldom allocate at the same moment (one runtime thread does nearly
//! everything), so one arena costs no measurable waiting.

/// Limits glibc's malloc to one arena for every thread started from now on; call it before any
/// thread starts. Returns whether it took effect (`false` with another C library, where
/// nothing changes).
pub fn single_arena() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` only sets a tunable of glibc's allocator; M_ARENA_MAX takes any
        // positive count.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Free memory at the top of the heap that malloc keeps instead of returning it to the kernel.
pub const KEPT_HEAP_TOP: usize = 1024 * 1024;

/// Allocations from this size up get a mapping of their own, returned when freed.
pub const OWN_MAPPING_FROM: usize = 512 * 1024;

/// Lets glibc's malloc keep up to [`KEPT_HEAP_TOP`] free at the top of the heap (default: 128
/// KiB). Each message's work takes the heap ~160 KiB up and frees it again (the floor's, which
/// is little more than SQLite, does the same: most likely SQLite's page cache, dropped after
/// another connection's commit and refilled by the next read): with the default, every message
/// shrank the heap (`brk`) and grew it back, 3.4 `brk` calls and ~1 more page fault per message
/// (measured: 1.4 page faults per message, 0.5 with this). Setting the threshold ends glibc's
/// own adjustment of both thresholds, so allocations below [`OWN_MAPPING_FROM`] stay on the
/// heap, where they are reused (the adjustment raises the mapping threshold to the largest
/// block freed, up to 32 MiB). Returns whether it took effect (`false` with another C library).
pub fn keep_heap_top() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` only sets tunables of glibc's allocator; both take any size that
        // fits an int, which these constants do.
        unsafe {
            libc::mallopt(libc::M_TRIM_THRESHOLD, KEPT_HEAP_TOP as libc::c_int) == 1
                && libc::mallopt(libc::M_MMAP_THRESHOLD, OWN_MAPPING_FROM as libc::c_int) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}
