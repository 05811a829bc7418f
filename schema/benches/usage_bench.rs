//! What the ledger's queries cost on a large session, beside two floors measured in the same
//! run: a primary-key read of `session_state` on the same pool (one statement, one row: the
//! least a query costs) and one `sum(cost_usd)` over the whole ledger (the least a session
//! total costs: every row read once). The runner's budget reads `usage_between` (today) once a
//! day and `usage_total` once per run, then keeps the figures current in memory.
//!
//! `cargo bench -p schema --bench usage_bench` (`USAGE_BENCH_TURNS`: ledger rows, default
//! 100000, one turn every 5 minutes back from now).

use std::time::{Duration, Instant};

use chrono::Utc;
use schema::{NewTurnUsage, SessionDb, UsageGroup, UsageOutcome};

/// Runs `f` `rounds` times (after a warm-up) and returns the median time per call.
fn per_call(rounds: usize, mut f: impl FnMut()) -> Duration {
    for _ in 0..rounds.min(10) {
        f();
    }
    let mut times: Vec<Duration> = (0..rounds)
        .map(|_| {
            let started = Instant::now();
            f();
            started.elapsed()
        })
        .collect();
    times.sort_unstable();
    times[times.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let turns: usize = std::env::var("USAGE_BENCH_TURNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000);
    let dir = tempfile::tempdir()?;
    let db = SessionDb::open(dir.path().join("session.db"))?;
    let now = Utc::now();
    let filled = Instant::now();
    let conn = db.dedicated_connection()?;
    conn.execute_batch("BEGIN")?;
    {
        let mut insert = conn.prepare(
            "INSERT INTO turn_usage (created_at, provider, model, input_tokens, output_tokens,
               cache_read_tokens, cost_usd, requests, duration_ms, outcome, message_ids)
             VALUES (?1, 'claude', 'opus', 1200, 300, 5000, ?2, 2, 4000, 'result', '[\"in\"]')",
        )?;
        for i in 0..turns {
            let at = now - chrono::Duration::minutes(5 * i as i64);
            let cost = (i % 7 != 0).then_some(0.0125);
            insert.execute(rusqlite::params![schema::time::format_ts(at), cost])?;
        }
    }
    conn.execute_batch("COMMIT")?;
    drop(conn);
    // One turn through the runner's own write, so the schema's path is part of the ledger.
    db.record_usage(
        &NewTurnUsage {
            provider: "codex".into(),
            model: None,
            input_tokens: None,
            output_tokens: None,
            cache_read_tokens: None,
            cache_write_tokens: None,
            reasoning_tokens: None,
            cost_usd: None,
            requests: None,
            duration_ms: None,
            outcome: UsageOutcome::Aborted,
            message_ids: Vec::new(),
            series_id: None,
        },
        now,
    )?;
    db.set_state("bench", "x")?;
    println!(
        "ledger: {turns} turns over {} days, filled in {:.1?}",
        turns * 5 / (60 * 24),
        filled.elapsed()
    );

    let (today_start, today_end) = schema::day_window(now, db.timezone());
    let floor = per_call(2000, || {
        let _ = db.state("bench");
    });
    let scan_conn = db.dedicated_connection()?;
    let mut scan = scan_conn.prepare("SELECT sum(cost_usd) FROM turn_usage")?;
    let scan_floor = per_call(50, || {
        let _ = scan.query_row([], |row| row.get::<_, Option<f64>>(0));
    });
    let rows: Vec<(&str, usize, Duration)> = vec![
        ("floor: session_state by key", 2000, floor),
        ("floor: one sum over the ledger", 50, scan_floor),
        (
            "usage_between (today, budget)",
            2000,
            per_call(2000, || {
                let _ = db.usage_between(today_start, today_end);
            }),
        ),
        (
            "usage_total (session, budget)",
            50,
            per_call(50, || {
                let _ = db.usage_total();
            }),
        ),
        (
            "usage_by day, last 7 days",
            50,
            per_call(50, || {
                let _ = db.usage_by(UsageGroup::Day, Some(now - chrono::Duration::days(7)));
            }),
        ),
        (
            "usage_by model, whole session",
            20,
            per_call(20, || {
                let _ = db.usage_by(UsageGroup::Model, None);
            }),
        ),
    ];
    println!(
        "{:<32} {:>7} {:>12} {:>12} {:>12}",
        "query", "rounds", "median", "× key read", "× one sum"
    );
    for (name, rounds, time) in rows {
        println!(
            "{name:<32} {rounds:>7} {:>12} {:>12.1} {:>12.2}",
            format!("{time:.1?}"),
            time.as_secs_f64() / floor.as_secs_f64(),
            time.as_secs_f64() / scan_floor.as_secs_f64()
        );
    }
    Ok(())
}
