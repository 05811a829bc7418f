//! The chaos run shared by `tests/chaos.rs` (CI size) and `benches/chaos.rs` (bigger): a host
//! thread inserts messages at random gaps while the real runner (mock provider) is SIGKILLed and
//! restarted at random moments. Afterwards every message must have exactly one reply, none may
//! be left unfinished, and `PRAGMA integrity_check` must say ok.
//!
//! One message per prompt (`maxMessagesPerPrompt=1`), so every message gets its own reply with
//! `in_reply_to` = its id. Exactly once holds because a reply and the completion of the row it
//! answers are one transaction (`SessionDb::complete_at`): a kill before the commit leaves the row
//! `processing` (reset at the next start, answered again), a kill after it leaves nothing to do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::Path;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use schema::{NewMessageIn, SessionDb};
use serde_json::json;

use crate::binary;

/// xorshift64*: a seeded PRNG, enough to spread gaps and kill moments (no `rand` needed).
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator from `seed` (0 is replaced, xorshift would stay at 0).
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    /// The next 64 random bits.
    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform-ish in `0..n`.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// What a run did and found.
#[derive(Debug)]
pub(crate) struct Figures {
    /// Seed of the run's PRNGs.
    pub seed: u64,
    /// Runner processes SIGKILLed.
    pub kills: usize,
    /// Kills that landed while a row was claimed (`processing`): mid-turn.
    pub kills_mid_turn: usize,
    /// Messages the host inserted.
    pub messages: usize,
    /// `messages_out` rows.
    pub replies: usize,
    /// Replies beyond the first for a message.
    pub duplicates: usize,
    /// Messages without a reply.
    pub unanswered: usize,
    /// Messages not `completed`.
    pub unfinished: usize,
    /// Replies to no message the host sent.
    pub stray: usize,
    /// Highest `tries` of a message (claims, one per run that took it).
    pub max_tries: i64,
    /// Runner starts that reset rows a killed runner left `processing`.
    pub recoveries: usize,
    /// `PRAGMA integrity_check`.
    pub integrity: String,
    /// Whole run.
    pub elapsed: Duration,
    /// Time the last runner took to drain the queue after the kills.
    pub drain: Duration,
}

impl Figures {
    /// The invariants: exactly once, none stuck, DB intact.
    pub(crate) fn assert_ok(&self) {
        assert_eq!(self.duplicates, 0, "messages answered twice: {self:#?}");
        assert_eq!(self.unanswered, 0, "messages never answered: {self:#?}");
        assert_eq!(self.unfinished, 0, "messages stuck: {self:#?}");
        assert_eq!(self.stray, 0, "replies to nothing: {self:#?}");
        assert_eq!(self.replies, self.messages, "{self:#?}");
        assert_eq!(self.integrity, "ok", "{self:#?}");
    }

    /// One line per figure, for the test's and the bench's output.
    pub(crate) fn report(&self) -> String {
        format!(
            "chaos: seed {seed}, {kills} SIGKILLs ({mid} mid-turn, {rec} recoveries), {messages} \
             messages, {replies} replies, {dup} duplicates, {unans} unanswered, {unfin} unfinished, \
             {stray} stray, max tries {tries}, integrity_check {integrity}; {secs:.1} s total, \
             final drain {drain:.2} s",
            seed = self.seed,
            kills = self.kills,
            mid = self.kills_mid_turn,
            rec = self.recoveries,
            messages = self.messages,
            replies = self.replies,
            dup = self.duplicates,
            unans = self.unanswered,
            unfin = self.unfinished,
            stray = self.stray,
            tries = self.max_tries,
            integrity = self.integrity,
            secs = self.elapsed.as_secs_f64(),
            drain = self.drain.as_secs_f64(),
        )
    }
}

fn runner(workspace: &Path, n: usize, mock_delay_ms: u64) -> Child {
    binary::mock_runner(workspace, &workspace.join(format!("runner-{n}.log")))
        .env("NANOCLAW_MOCK_DELAY_MS", mock_delay_ms.to_string())
        .env("NANOCLAW_MAX_MESSAGES_PER_PROMPT", "1")
        .env("NANOCLAW_ACTIVE_POLL_MS", "20")
        .env("NANOCLAW_IDLE_POLL_MS", "50")
        .spawn()
        .unwrap()
}

fn sigkill(child: &mut Child) {
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    child.wait().unwrap();
}

/// `kills` SIGKILLs at random moments while a host inserts messages, then a last runner drains
/// the queue; returns the figures (the caller asserts).
pub(crate) fn run(kills: usize, seed: u64) -> Figures {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let db = SessionDb::open(dir.path().join("session.db")).unwrap();

    // The host: its own connection pool, as the real host is its own process.
    let host_done = Arc::new(AtomicBool::new(false));
    let host = {
        let done = Arc::clone(&host_done);
        let path = dir.path().join("session.db");
        std::thread::spawn(move || {
            let db = SessionDb::open(path).unwrap();
            let mut rng = Rng::new(seed ^ 0x9E37_79B9_7F4A_7C15);
            let mut ids = Vec::new();
            while !done.load(Ordering::SeqCst) {
                let text = format!("chaos message {}", ids.len());
                let row =
                    NewMessageIn::new("chat", json!({"sender": "Host", "text": text}).to_string());
                ids.push(db.insert_in(&row).unwrap().id);
                // Mostly short gaps, now and then a burst or a pause.
                let gap = match rng.below(10) {
                    0 => 0,
                    1 => 100 + rng.below(200),
                    _ => rng.below(50),
                };
                std::thread::sleep(Duration::from_millis(gap));
            }
            ids
        })
    };

    let mut rng = Rng::new(seed);
    let mut kills_mid_turn = 0;
    for n in 0..kills {
        // A short think time makes most kills land mid-turn, some between turns.
        let mut child = runner(dir.path(), n, 5 + rng.below(40));
        let life = match rng.below(8) {
            // Now and then during start-up recovery.
            0 => rng.below(40),
            _ => 40 + rng.below(400),
        };
        std::thread::sleep(Duration::from_millis(life));
        if db.counts(chrono::Utc::now()).unwrap().processing > 0 {
            kills_mid_turn += 1;
        }
        sigkill(&mut child);
    }
    host_done.store(true, Ordering::SeqCst);
    let ids = host.join().unwrap();

    let drain_started = Instant::now();
    let mut last = runner(dir.path(), kills, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let counts = db.counts(chrono::Utc::now()).unwrap();
        if counts.pending == 0 && counts.processing == 0 {
            break;
        }
        if Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let drain = drain_started.elapsed();
    kill(Pid::from_raw(last.id() as i32), Signal::SIGTERM).unwrap();
    last.wait().unwrap();

    let rows = db.all_messages_in().unwrap();
    let outs = db.all_messages_out().unwrap();
    let mut per_message: HashMap<&str, usize> = ids.iter().map(|id| (id.as_str(), 0)).collect();
    let mut stray = 0;
    for out in &outs {
        match out
            .in_reply_to
            .as_deref()
            .and_then(|id| per_message.get_mut(id))
        {
            Some(count) => *count += 1,
            None => stray += 1,
        }
    }
    let integrity = binary::integrity_check(db.path());
    let mut recoveries = 0;
    for n in 0..=kills {
        let log =
            std::fs::read_to_string(dir.path().join(format!("runner-{n}.log"))).unwrap_or_default();
        assert!(!log.contains("panicked"), "runner {n} panicked:\n{log}");
        if log.contains("reset rows left processing") {
            recoveries += 1;
        }
    }
    Figures {
        seed,
        kills,
        kills_mid_turn,
        messages: ids.len(),
        replies: outs.len(),
        duplicates: per_message.values().map(|c| c.saturating_sub(1)).sum(),
        unanswered: per_message.values().filter(|c| **c == 0).count(),
        unfinished: rows.iter().filter(|r| r.status != "completed").count(),
        stray,
        max_tries: rows.iter().map(|r| r.tries).max().unwrap_or(0),
        recoveries,
        integrity,
        elapsed: started.elapsed(),
        drain,
    }
}

/// Kills from `NANOCLAW_CHAOS_KILLS`, else `default`; seed from `NANOCLAW_CHAOS_SEED`, else the
/// clock (printed, so a failing run's gaps can be replayed).
pub(crate) fn settings(default_kills: usize) -> (usize, u64) {
    let kills = std::env::var("NANOCLAW_CHAOS_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_kills);
    let seed = std::env::var("NANOCLAW_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    (kills, seed)
}
