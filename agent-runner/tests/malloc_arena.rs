//! `malloc::single_arena`: threads started after it allocate in the one arena there is, instead
//! of one arena each that keeps its high-water mark (see `agent-runner/src/malloc.rs`). A test
//! binary of its own, so no other test's threads make arenas meanwhile.
#![cfg(all(target_os = "linux", target_env = "gnu"))]
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Barrier};

/// The arenas glibc's malloc has now: the `<heap nr=…>` entries of `malloc_info`.
fn arenas() -> usize {
    let file = tempfile::tempfile().unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    // SAFETY: a FILE over a duplicate of a descriptor this test owns, written by malloc_info
    // and closed (with the duplicate) before the descriptor is read.
    unsafe {
        let stream = libc::fdopen(libc::dup(fd), c"w".as_ptr());
        assert!(!stream.is_null());
        assert_eq!(libc::malloc_info(0, stream), 0);
        libc::fclose(stream);
    }
    let text = std::fs::read_to_string(format!("/proc/self/fd/{fd}")).unwrap();
    text.matches("<heap nr=").count()
}

/// Starts `n` threads that each allocate while all of them are alive (so none can take an arena
/// another just let go of) and waits for them.
fn allocate_on_threads(n: usize) {
    let barrier = Arc::new(Barrier::new(n));
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                let held = vec![vec![1u8; 4096]; 64];
                barrier.wait();
                held.len()
            })
        })
        .collect();
    for thread in threads {
        assert_eq!(thread.join().unwrap(), 64);
    }
}

#[test]
fn threads_started_after_single_arena_share_the_one_arena() {
    assert!(agent_runner::malloc::single_arena());
    let before = arenas();
    allocate_on_threads(4);
    assert_eq!(arenas(), before, "no arena was added for the new threads");
}
