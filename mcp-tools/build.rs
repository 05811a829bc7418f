//! Links the `mcp-tools` binary as a position-dependent executable (`-no-pie`).
//!
//! Why (issue 12, RSS ≤ 8 MiB after 1,000 calls): as a PIE, the dynamic loader relocates
//! ~40,000 pointers at every start (vtables, panic locations, static tables) and so turns the
//! binary's 1.1 MiB of `.data.rel.ro` into private, dirty memory in every process, after
//! reading the 0.9 MiB relocation table: ~1.9 MiB of the 10.7 MiB measured, the largest single
//! item. Position-dependent, the linker resolves those pointers once and the pages stay shared
//! and clean. The cost, accepted in docs/decisions/perf.md#D-PERF-03: the executable's own
//! code is at a fixed address (its libraries, heap, stack and mmaps are still randomized). Only
//! this binary: the library and the other crates' binaries are unchanged.

fn main() {
    println!("cargo:rustc-link-arg-bin=mcp-tools=-no-pie");
}
