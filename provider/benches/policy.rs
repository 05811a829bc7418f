//! What one tool-policy decision costs (issue 41): the median and 99th percentile time of
//! [`ToolPolicy::judge`] on typical `Bash` lines, on wrapped and nested ones, and on the worst
//! inputs (a 1 MiB line, 10,000 nested parentheses, lines at the 8 KiB limit, arbitrary bytes).
//!
//! `cargo bench -p provider --bench policy` (`POLICY_BENCH_ROUNDS`: calls per line, default
//! 2000; the worst inputs get a tenth).

use std::time::{Duration, Instant};

use provider::{Decision, ToolPolicy, ToolRule};

/// The median and the 99th percentile of `rounds` calls of `f`, after a warm-up.
fn figures(rounds: usize, mut f: impl FnMut()) -> (Duration, Duration) {
    for _ in 0..rounds.min(20) {
        f();
    }
    let mut times: Vec<Duration> = (0..rounds.max(1))
        .map(|_| {
            let started = Instant::now();
            f();
            started.elapsed()
        })
        .collect();
    times.sort_unstable();
    let at = |q: f64| {
        let index = ((times.len() - 1) as f64 * q).round() as usize;
        times.get(index).copied().unwrap_or_default()
    };
    (at(0.5), at(0.99))
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rounds: usize = std::env::var("POLICY_BENCH_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2000);
    let rules = |list: &[&str]| -> Result<Vec<ToolRule>, Box<dyn std::error::Error>> {
        list.iter()
            .map(|r| ToolRule::parse(r).map_err(Into::into))
            .collect()
    };
    let policy = ToolPolicy {
        allow: rules(&["Bash(git *)", "Bash(cargo *)", "Bash(ls*)"])?,
        deny: rules(&["Bash(rm *)"])?,
        ask: rules(&["Bash(git push*)"])?,
        default: Decision::Ask,
        ..ToolPolicy::default()
    };
    let mut nested_shells = "rm -rf y".to_owned();
    for _ in 0..3 {
        nested_shells = format!("sh -c '{}'", nested_shells.replace('\'', "'\\''"));
    }
    let typical: Vec<(&str, String)> = vec![
        ("ls -la", "ls -la".into()),
        (
            "git -C repo push origin main",
            "git -C repo push origin main".into(),
        ),
        (
            "cargo test && git commit -m msg",
            "cargo test -p x && git commit -m \"fix: y\"".into(),
        ),
        (
            "find | xargs grep | sort | head",
            "find . -name '*.rs' | xargs grep -n 'TODO' | sort | head -20".into(),
        ),
        (
            "sudo nice env rm -rf y",
            "sudo nice env A=1 rm -rf y".into(),
        ),
        ("sh -c three levels deep", nested_shells),
        (
            "a 40-line script in a here-document",
            format!(
                "bash <<'EOF'\n{}EOF",
                "cd /tmp && ls -la | grep x || true\n".repeat(40)
            ),
        ),
        ("X=rm; $X -rf y (undecidable)", "X=rm; $X -rf y".into()),
    ];
    let bytes: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let worst: Vec<(&str, String)> = vec![
        ("a 1 MiB line", format!("rm {}", "a".repeat(1 << 20))),
        (
            "10,000 nested parentheses",
            format!("{}rm x{}", "(".repeat(10_000), ")".repeat(10_000)),
        ),
        (
            "3,000 nested parentheses (6 KB)",
            format!("{}rm x{}", "(".repeat(3_000), ")".repeat(3_000)),
        ),
        ("20,000 commands (120 KB)", "ls && ".repeat(20_000) + "rm x"),
        (
            "1,300 commands (8 KB, under the limit)",
            "ls && ".repeat(1_300) + "rm x",
        ),
        (
            "8 KB of one command's arguments",
            format!("echo {}", "word ".repeat(1_600)),
        ),
        (
            "8 KB here-document given to bash",
            format!(
                "bash <<'EOF'\n{}EOF",
                "cd /tmp && ls -la | grep x || true\n".repeat(220)
            ),
        ),
        (
            "4 KiB of arbitrary bytes",
            String::from_utf8_lossy(&bytes).into_owned(),
        ),
    ];
    println!("tool policy: one judge(\"Bash\", line), {rounds} calls per line (worst: a tenth)");
    println!(
        "{:<40} {:>12} {:>12}  decision",
        "line", "median µs", "p99 µs"
    );
    for (rounds, group) in [(rounds, &typical), (rounds / 10, &worst)] {
        for (name, line) in group {
            let verdict = policy.judge("Bash", Some(line));
            let (median, p99) = figures(rounds, || {
                std::hint::black_box(policy.judge("Bash", Some(std::hint::black_box(line))));
            });
            println!(
                "{name:<40} {:>12.1} {:>12.1}  {}{}",
                micros(median),
                micros(p99),
                verdict.decision,
                if verdict.undecidable.is_some() {
                    " (undecidable)"
                } else {
                    ""
                }
            );
        }
    }
    Ok(())
}
