//! The chaos run of `tests/chaos.rs` at benchmark size (300 SIGKILLs unless
//! `NANOCLAW_CHAOS_KILLS` says otherwise): prints the figures, then checks exactly-once, nothing
//! stuck and `integrity_check`. Run: `cargo bench -p agent-runner --bench chaos`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/support/binary.rs"]
mod binary;
#[path = "../tests/support/chaos.rs"]
mod chaos;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let (kills, seed) = chaos::settings(300);
    let figures = chaos::run(kills, seed);
    println!("{}", figures.report());
    figures.assert_ok();
}
