//! What this process asks of glibc's malloc to stay small (issue 12: RSS ≤ 8 MiB after 1,000
//! calls, sequential or pipelined). Elsewhere (musl, other systems) both calls do nothing.

/// Requests in flight at once from which the end of a burst gives memory back (see
/// [`release_free_heap`]); below it, a call's few KiB are reused by the next call anyway.
pub const BURST_REQUESTS: usize = 8;

/// One malloc arena for every thread. glibc gives each thread that allocates an arena of its
/// own (up to 8 per core), each keeping 100-300 KiB resident after a burst; this server's few
/// threads take turns on short DB calls and never contend enough for more arenas to pay.
/// Call it first in `main`, before any thread exists. A refusal only costs memory: ignored.
pub fn single_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: sets one malloc parameter; called before any other thread runs.
    let _ = unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
}

/// Returns the heap's free pages to the system. After a burst of pipelined calls the heap has
/// grown by the burst's tasks and buffers, freed now but kept by malloc (only a free top of the
/// heap is given back on its own): without this, the server stays ~1 MiB larger for the rest
/// of its life. It walks the heap once (well under a millisecond here), so it runs at the end
/// of a burst, not after every call.
pub fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes malloc's own locks; it is safe to call from any thread.
    let _ = unsafe { libc::malloc_trim(0) };
}
