//! `malloc::keep_heap_top`: memory freed at the top of the heap stays there for the next
//! message instead of going back to the kernel (see `agent-runner/src/malloc.rs`). Its own test
//! binary without the test harness: the allocations must come from the main thread's heap (the
//! one `brk` moves), and no other test may allocate meanwhile.
#![allow(clippy::unwrap_used, clippy::print_stdout)]

/// Blocks of a size that comes from the heap, not a mapping of its own.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const BLOCK: usize = 4096;

/// The program break now.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn program_break() -> usize {
    // SAFETY: `sbrk(0)` only reads the current break.
    unsafe { libc::sbrk(0) as usize }
}

/// Allocates `bytes` in blocks, frees them newest first; the break at the peak and after.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn break_at_peak_and_after_free(bytes: usize) -> (usize, usize) {
    let held: Vec<Vec<u8>> = (0..bytes / BLOCK).map(|i| vec![i as u8; BLOCK]).collect();
    let peak = program_break();
    std::hint::black_box(&held);
    let mut held = held;
    while held.pop().is_some() {}
    drop(held);
    (peak, program_break())
}

/// The one test of this binary, by the name test runners list it under.
const TEST: &str = "freed_heap_top_is_kept_up_to_the_limit";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // What libtest answers to a listing (cargo-nextest lists every test binary first); there is
    // no ignored test here.
    if args.iter().any(|arg| arg == "--list") {
        if !args.iter().any(|arg| arg == "--ignored") {
            println!("{TEST}: test");
        }
        return;
    }
    freed_heap_top_is_kept_up_to_the_limit();
    println!("test {TEST} ... ok");
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn freed_heap_top_is_kept_up_to_the_limit() {
    let bytes = 640 * 1024;
    // glibc's default first: the heap shrinks again once more than 128 KiB is free at its top,
    // as it did after every message.
    let (peak, after) = break_at_peak_and_after_free(bytes);
    assert!(
        peak - after >= bytes / 2,
        "by default the freed top goes back to the kernel (break {peak:#x} → {after:#x})"
    );
    assert!(agent_runner::malloc::keep_heap_top());
    let (peak, after) = break_at_peak_and_after_free(bytes);
    assert_eq!(
        after, peak,
        "{bytes} bytes freed at the top of the heap are kept (the break moved {peak:#x} → {after:#x})"
    );
    // Beyond the limit, the heap still shrinks: what is kept is bounded.
    let (peak, after) = break_at_peak_and_after_free(4 * agent_runner::malloc::KEPT_HEAP_TOP);
    assert!(
        peak - after >= 2 * agent_runner::malloc::KEPT_HEAP_TOP,
        "more than KEPT_HEAP_TOP free at the top goes back (break {peak:#x} → {after:#x})"
    );
}

/// Another C library's malloc has nothing to tune (`keep_heap_top` returns false there).
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn freed_heap_top_is_kept_up_to_the_limit() {
    assert!(!agent_runner::malloc::keep_heap_top());
}
