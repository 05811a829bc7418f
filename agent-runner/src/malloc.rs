//! One malloc arena for the whole runner (issue 12: RSS flat over a long session).
//!
//! glibc gives each thread that allocates while the arenas are busy an arena of its own, up to
//! eight per core, and an arena keeps the high-water mark of what was ever allocated in it. The
//! runner's work moves between the runtime thread, the blocking pool (DB calls that waited for a
//! lock, archive files), SQLite's pool and checkpoint threads, so a SQLite page cache or a turn's
//! JSON lands in whichever arena the thread had: measured with Codex, five thread arenas grew to
//! ~1.2 MiB each and the runner's RSS rose 5-10 MiB over 1,000 messages while the memory in use
//! stayed at ~1 MiB. With one arena, freed memory is reused wherever it was freed: the same run
//! grew 2 MiB in its first 400 messages and 80 KiB in the 600 after. The runner's threads seldom
//! allocate at the same moment (one runtime thread does nearly everything), so one arena costs
//! no measurable waiting.

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
