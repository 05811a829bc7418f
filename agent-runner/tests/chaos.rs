//! Chaos (issue 9, acceptance): a host inserting messages at random gaps while the runner is
//! SIGKILLed and restarted at random moments, at least 50 times. Every message is answered
//! exactly once, none is stuck, and the DB passes `integrity_check`. The figures are printed;
//! `NANOCLAW_CHAOS_KILLS=N` runs more kills, `NANOCLAW_CHAOS_SEED=S` replays the random gaps.
//! The bigger run is `cargo bench -p agent-runner --bench chaos`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::chaos_run as chaos;

#[test]
fn sigkills_at_random_moments_lose_and_duplicate_nothing() {
    let (kills, seed) = chaos::settings(50);
    let figures = chaos::run(kills, seed);
    eprintln!("{}", figures.report());
    figures.assert_ok();
}
