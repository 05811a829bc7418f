use std::path::PathBuf;

use chrono::{DateTime, Utc};
use schema::{RunnerState, Work};

use super::*;

fn t(secs: i64) -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp(1_800_000_000 + secs, 0).unwrap_or_default()
}

fn spec(name: &str) -> SessionSpec {
    SessionSpec {
        name: name.into(),
        folder: PathBuf::from("/r").join(name),
        db: PathBuf::from("/r").join(name).join("session.db"),
    }
}

fn due(at: DateTime<Utc>) -> Observation {
    Observation {
        work: Work {
            due_since: Some(at),
            ..Work::default()
        },
        ..Observation::default()
    }
}

fn row(status: &str, pid: u32, updated: DateTime<Utc>) -> Option<RunnerState> {
    Some(RunnerState {
        status: status.into(),
        pid: Some(i64::from(pid)),
        provider: None,
        current_tool: None,
        heartbeat_at: schema::time::format_ts(updated),
        updated_at: schema::time::format_ts(updated),
        waiting_on: None,
        last_event: None,
    })
}

fn runner(pid: u32) -> RunnerRecord {
    RunnerRecord { pid, started: 1 }
}

fn starts(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Start(name) => Some(name.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn backoff_doubles_up_to_the_cap() {
    let policy = Policy::default();
    let delays: Vec<u64> = (1..=9).map(|n| policy.backoff(n).as_secs()).collect();
    assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
}

#[test]
fn oldest_due_work_first_and_never_more_than_max_running() {
    let mut s = Scheduler::new(Policy {
        max_running: 2,
        ..Policy::default()
    });
    s.sync(["a", "b", "c", "d"].map(spec).to_vec(), t(0));
    // d's work is the oldest, then b, then c, then a.
    for (name, at) in [("a", 40), ("b", 20), ("c", 30), ("d", 10)] {
        s.observe(name, due(t(at)), t(50));
    }
    let first = s.decide(t(50));
    assert_eq!(starts(&first), ["d", "b"]);
    s.runner_started("d", runner(1), false, t(50));
    s.runner_started("b", runner(2), false, t(50));
    assert_eq!(
        starts(&s.decide(t(51))),
        Vec::<String>::new(),
        "no slot is free"
    );
    let lines = s.lines();
    let why = |name: &str| lines.iter().find(|l| l.name == name).map(|l| l.why.clone());
    assert_eq!(
        why("c").as_deref(),
        Some("queued: maxRunning 2 reached (0 ahead)")
    );
    assert_eq!(
        why("a").as_deref(),
        Some("queued: maxRunning 2 reached (1 ahead)")
    );
    // b goes idle: with sessions waiting it gives its slot up at once, and c is next.
    s.observe(
        "b",
        Observation {
            runner: row("idle", 2, t(52)),
            ..Observation::default()
        },
        t(52),
    );
    let actions = s.decide(t(52));
    assert_eq!(actions, [Action::Stop("b".into(), runner(2))]);
    s.exited("b", runner(2), String::new(), t(53));
    assert_eq!(starts(&s.decide(t(53))), ["c"]);
}

#[test]
fn idle_stop_after_idle_stop_secs_and_never_during_a_turn() {
    let mut s = Scheduler::new(Policy {
        idle_stop: std::time::Duration::from_secs(10),
        ..Policy::default()
    });
    s.sync(vec![spec("a")], t(0));
    s.observe("a", due(t(0)), t(0));
    assert_eq!(starts(&s.decide(t(0))), ["a"]);
    s.runner_started("a", runner(7), false, t(0));
    let busy = Observation {
        runner: row("busy", 7, t(1)),
        ..Observation::default()
    };
    s.observe("a", busy, t(1));
    assert!(s.decide(t(100)).is_empty(), "a turn is never stopped");
    s.observe(
        "a",
        Observation {
            runner: row("idle", 7, t(100)),
            ..Observation::default()
        },
        t(100),
    );
    assert_eq!(s.next_wake(), Some(t(110)));
    assert!(s.decide(t(109)).is_empty());
    assert_eq!(s.decide(t(110)), [Action::Stop("a".into(), runner(7))]);
    s.exited("a", runner(7), String::new(), t(111));
    assert_eq!(s.lines()[0].state, SessionState::Stopped);
    assert_eq!(s.lines()[0].crashes, 0);
}

#[test]
fn a_question_counts_as_idle_only_after_its_deadline() {
    let mut s = Scheduler::new(Policy {
        idle_stop: std::time::Duration::from_secs(10),
        ..Policy::default()
    });
    s.sync(vec![spec("a")], t(0));
    s.runner_started("a", runner(7), false, t(0));
    let waiting = Observation {
        runner: row("waiting_user", 7, t(1)),
        work: Work {
            question_deadline: Some(t(100)),
            ..Work::default()
        },
        error: None,
    };
    s.observe("a", waiting.clone(), t(50));
    assert_eq!(s.lines()[0].state, SessionState::Running);
    assert!(s.decide(t(50)).is_empty());
    s.observe("a", waiting, t(100));
    assert_eq!(s.lines()[0].state, SessionState::Idle);
    assert!(s.decide(t(105)).is_empty());
    assert_eq!(s.decide(t(110)), [Action::Stop("a".into(), runner(7))]);
}

#[test]
fn five_crashes_in_a_row_fail_the_session_until_the_retry() {
    let mut s = Scheduler::new(Policy::default());
    s.sync(vec![spec("a")], t(0));
    let mut now = t(0);
    for n in 1..=5u32 {
        s.observe("a", due(t(0)), now);
        assert_eq!(starts(&s.decide(now)), ["a"], "start {n}");
        s.runner_started("a", runner(n), false, now);
        now += chrono::Duration::seconds(1);
        s.exited("a", runner(n), format!("boom {n}"), now);
        let line = &s.lines()[0];
        if n < 5 {
            assert_eq!(line.state, SessionState::BackingOff);
            assert!(s.decide(now).is_empty(), "not before the backoff");
            now = s.next_wake().unwrap_or(now);
        } else {
            assert_eq!(line.state, SessionState::Failed);
            assert_eq!(line.last_error.as_deref(), Some("boom 5"));
        }
    }
    assert!(s.decide(now + chrono::Duration::seconds(599)).is_empty());
    assert_eq!(
        starts(&s.decide(now + chrono::Duration::seconds(600))),
        ["a"]
    );
}

#[test]
fn work_due_before_the_runner_polled_keeps_it_running_until_held_for_long() {
    let mut s = Scheduler::new(Policy {
        max_running: 1,
        idle_stop: std::time::Duration::from_secs(60),
        ..Policy::default()
    });
    s.sync(vec![spec("a"), spec("b")], t(0));
    s.observe("a", due(t(0)), t(0));
    s.observe("b", due(t(1)), t(1));
    assert_eq!(starts(&s.decide(t(1))), ["a"]);
    s.runner_started("a", runner(7), false, t(1));
    // The runner reports idle before its first poll took the message sent before it started:
    // it keeps its slot although b waits.
    let idle_with_work = Observation {
        runner: row("idle", 7, t(2)),
        ..due(t(0))
    };
    s.observe("a", idle_with_work.clone(), t(2));
    assert_eq!(s.lines()[0].state, SessionState::Running);
    assert!(s.decide(t(2)).is_empty());
    assert_eq!(s.next_wake(), Some(t(12)));
    // Still there 10 s on: the runner holds it; idle, and its slot goes to b.
    s.observe("a", idle_with_work, t(12));
    assert_eq!(s.lines()[0].state, SessionState::Idle);
    assert_eq!(s.decide(t(12)), [Action::Stop("a".into(), runner(7))]);
}
