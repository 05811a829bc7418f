#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use expect_test::expect;

use super::shortage::{soft_limit, Limit, Limits, Shortage, Step};
use super::{DbWatcher, WatchMode};
use crate::{NewMessageIn, SessionDb};

fn chat(text: &str) -> NewMessageIn {
    NewMessageIn::new("chat", serde_json::json!({ "text": text }).to_string())
}

/// Our DB handle and another one (its own pool, as another process would have).
fn two_handles() -> (tempfile::TempDir, SessionDb, Arc<SessionDb>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("session.db");
    let ours = SessionDb::open(&path).unwrap();
    let theirs = Arc::new(SessionDb::open(&path).unwrap());
    (dir, ours, theirs)
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

/// Commits a row through `theirs` after `after`, on a thread of its own; the handle returns
/// when the commit was done.
fn commit_later(theirs: &Arc<SessionDb>, after: Duration) -> std::thread::JoinHandle<Instant> {
    let theirs = Arc::clone(theirs);
    std::thread::spawn(move || {
        std::thread::sleep(after);
        theirs.insert_in(&chat("theirs")).unwrap();
        Instant::now()
    })
}

/// How late `watcher` notices a commit made `after` from now (by a wait that started now).
async fn lateness(watcher: &mut DbWatcher, theirs: &Arc<SessionDb>, after: Duration) -> Duration {
    let commit = commit_later(theirs, after);
    let changed = watcher.wait(Duration::from_secs(2)).await;
    let noticed = Instant::now();
    let committed = commit.join().unwrap();
    assert!(changed, "the commit {after:?} later was not noticed");
    assert!(
        !watcher.changed(),
        "the wait returned before the commit, which was seen only afterwards"
    );
    noticed.saturating_duration_since(committed)
}

/// Issue 12: after the process's own write, a stale file event sent the watcher through its
/// re-check ladder (1, 3, 10, 30 ms) without listening, so a commit 10-40 ms later was seen up
/// to 44 ms late. A commit must be noticed at once, whenever it comes.
#[tokio::test(flavor = "current_thread")]
async fn a_commit_after_our_own_write_is_noticed_at_once() {
    let (_dir, ours, theirs) = two_handles();
    let mut watcher = DbWatcher::with_mode(&ours, WatchMode::Notify).unwrap();
    assert_eq!(watcher.mode(), WatchMode::Notify);
    for after_ms in [5, 15, 25, 40] {
        let mut late = Vec::new();
        for _ in 0..7 {
            // Our own write (a reply, a heartbeat): a change for the watcher's connection, and
            // file events that are stale once that change was reported.
            ours.insert_in(&chat("ours")).unwrap();
            assert!(watcher.wait(Duration::from_secs(1)).await);
            late.push(lateness(&mut watcher, &theirs, Duration::from_millis(after_ms)).await);
        }
        let late = median(late);
        // No ladder explains this: its checks are 1, 4, 14 and 44 ms after the stale event.
        assert!(
            late < Duration::from_millis(8),
            "a commit {after_ms} ms after our own write was noticed {late:?} late (median)"
        );
    }
}

/// The events of our own write, once its change was reported, are no change.
#[tokio::test(flavor = "current_thread")]
async fn our_own_write_is_reported_once() {
    let (_dir, ours, _theirs) = two_handles();
    let mut watcher = DbWatcher::with_mode(&ours, WatchMode::Notify).unwrap();
    ours.insert_in(&chat("ours")).unwrap();
    assert!(watcher.wait(Duration::from_secs(1)).await);
    let started = Instant::now();
    assert!(!watcher.wait(Duration::from_millis(80)).await);
    assert!(started.elapsed() >= Duration::from_millis(80));
}

/// Issue 12: a loop waits between each of a turn's events, and every wait began with a
/// `PRAGMA data_version` (a statement and two lock calls) although nothing had been written:
/// with inotify, a wait with no new event and no re-check due asks the DB nothing. A commit
/// is still noticed.
#[tokio::test(flavor = "current_thread")]
async fn a_wait_with_nothing_new_asks_the_db_nothing() {
    let (_dir, ours, theirs) = two_handles();
    let pinned = ours.pinned().unwrap();
    let mut watcher = DbWatcher::with_mode(&pinned, WatchMode::Notify).unwrap();
    let statements = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    {
        let counter = Arc::clone(&statements);
        let conn = pinned.pinned_connection().unwrap();
        conn.lock()
            .unwrap()
            .progress_handler(
                1,
                Some(move || {
                    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    false
                }),
            )
            .unwrap();
    }
    for _ in 0..3 {
        let waited = tokio::time::timeout(
            Duration::from_millis(20),
            watcher.wait(Duration::from_secs(1)),
        );
        assert!(
            waited.await.is_err(),
            "a wait with nothing written returned"
        );
    }
    assert_eq!(
        statements.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "waits with nothing new ran statements on the watcher's connection"
    );
    let late = lateness(&mut watcher, &theirs, Duration::from_millis(5)).await;
    assert!(late < Duration::from_millis(50), "{late:?} late");
    assert!(statements.load(std::sync::atomic::Ordering::Relaxed) > 0);
}

/// A watcher made from a pinned handle is not woken by that handle's own commits (they were a
/// change for a dedicated connection, and a runner polled once more after each claim and reply),
/// in both modes; a commit of the pool's, of another handle's, or one made while the pinned
/// connection was in use, still wakes it at once.
#[tokio::test(flavor = "current_thread")]
async fn a_pinned_handles_own_commits_do_not_wake_its_watcher() {
    for mode in [WatchMode::Notify, WatchMode::Poll] {
        let (_dir, ours, theirs) = two_handles();
        let pinned = ours.pinned().unwrap();
        let mut watcher = DbWatcher::with_mode(&pinned, mode).unwrap();
        for round in 0..3 {
            pinned.insert_in(&chat("ours, pinned")).unwrap();
            let started = Instant::now();
            assert!(
                !watcher.wait(Duration::from_millis(60)).await,
                "{mode:?}, round {round}: the pinned handle's own commit woke its watcher"
            );
            assert!(started.elapsed() >= Duration::from_millis(60));

            let late = lateness(&mut watcher, &theirs, Duration::from_millis(5)).await;
            assert!(late < Duration::from_millis(50), "{mode:?}: {late:?} late");

            // The same process's pool is another connection: its commits are changes.
            ours.insert_in(&chat("ours, pooled")).unwrap();
            assert!(
                watcher.wait(Duration::from_secs(1)).await,
                "{mode:?}: pooled commit missed"
            );
        }

        // A call made while the pinned connection is in use takes a pooled one (no deadlock),
        // and its commit is a change like any other connection's.
        let nested = pinned.conn().unwrap();
        pinned
            .insert_in(&chat("while the pinned connection is held"))
            .unwrap();
        drop(nested);
        assert!(
            watcher.wait(Duration::from_secs(1)).await,
            "{mode:?}: nested commit missed"
        );
    }
}

/// The fallback without inotify notices commits within a few milliseconds, also a second
/// commit in the same clock tick into a `-wal` file reused after a checkpoint (same size, maybe
/// the same mtime).
#[tokio::test(flavor = "current_thread")]
async fn the_poll_fallback_notices_every_commit_within_milliseconds() {
    let (dir, ours, theirs) = two_handles();
    let mut watcher = DbWatcher::with_mode(&ours, WatchMode::Poll).unwrap();
    assert_eq!(watcher.mode(), WatchMode::Poll);
    let mut late = Vec::new();
    for after_ms in [0, 3, 7, 12, 20, 30, 45] {
        late.push(lateness(&mut watcher, &theirs, Duration::from_millis(after_ms)).await);
    }
    let late = median(late);
    assert!(
        late < Duration::from_millis(15),
        "the fallback noticed commits {late:?} late (median)"
    );

    let checkpointer = rusqlite::Connection::open(dir.path().join("session.db")).unwrap();
    for round in 0..10 {
        let _: (i64, i64, i64) = checkpointer
            .query_row("PRAGMA wal_checkpoint(RESTART)", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .unwrap();
        theirs.insert_in(&chat("first")).unwrap();
        assert!(watcher.wait(Duration::from_secs(2)).await);
        theirs.insert_in(&chat("second")).unwrap();
        let started = Instant::now();
        assert!(watcher.wait(Duration::from_secs(2)).await);
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "round {round}: the second commit was noticed only by the timeout's final check"
        );
    }
}

fn limits(open_fds: u64) -> Limits {
    Limits {
        open_fds: Some(open_fds),
        max_fds: Some(1024),
        instances: Limit {
            node: Some(128),
            namespace: Some(128),
        },
        watches: Limit {
            node: Some(8192),
            namespace: Some(8192),
        },
    }
}

fn said(step: Step, errno: i32, limits: &Limits) -> String {
    Shortage::classify_with(step, io::Error::from_raw_os_error(errno), limits).to_string()
}

#[test]
fn each_exhausted_limit_is_named_with_its_value_and_how_to_raise_it() {
    expect![[r#"no inotify instance left for this user: fs.inotify.max_user_instances = 128 (each agent-runner takes one, and so does each host watcher and waiting question); raise it on the node, e.g. `sysctl -w fs.inotify.max_user_instances=1024` (persist it in /etc/sysctl.d/)"#]]
    .assert_eq(&said(Step::Instance, libc::EMFILE, &limits(12)));
    // The same errno when the process itself is out of descriptors.
    expect![[r#"this process has no file descriptor left for inotify (open files limit 1024; raise `ulimit -n` / the container's nofile limit)"#]]
    .assert_eq(&said(Step::Instance, libc::EMFILE, &limits(1023)));
    expect![[r#"no inotify watch left for this user: fs.inotify.max_user_watches = 8192 (each watcher takes two); raise it on the node, e.g. `sysctl -w fs.inotify.max_user_watches=524288` (persist it in /etc/sysctl.d/)"#]]
    .assert_eq(&said(Step::Watch, libc::ENOSPC, &limits(12)));
    let mut in_namespace = limits(12);
    in_namespace.instances.namespace = Some(0);
    expect![[r#"no inotify instance left for this user: fs.inotify.max_user_instances = 128 (each agent-runner takes one, and so does each host watcher and waiting question), and this user namespace allows 0 (/proc/sys/user/max_inotify_instances); raise it on the node, e.g. `sysctl -w fs.inotify.max_user_instances=1024` (persist it in /etc/sysctl.d/)"#]]
    .assert_eq(&said(Step::Instance, libc::EMFILE, &in_namespace));
    expect![[r#"inotify is unavailable: Function not implemented (os error 38)"#]]
        .assert_eq(&said(Step::Instance, libc::ENOSYS, &limits(12)));
}

#[test]
fn the_descriptor_limit_is_read_from_proc_limits() {
    let text = "Limit                     Soft Limit           Hard Limit           Units     \n\
                Max processes             63459                63459                processes \n\
                Max open files            1024                 524288               files     \n";
    assert_eq!(soft_limit(text, "Max open files"), Some(1024));
    assert_eq!(soft_limit(text, "Max locked memory"), None);
}

const IN_NAMESPACE: &str = "NANOCLAW_WATCH_TEST_NO_INSTANCES";

/// The real path: a user namespace whose inotify instance limit is 0 (the kernel counts
/// instances per user and namespace, so nothing outside the child is touched). The watcher
/// falls back, the shortage is said once, and commits are still noticed within milliseconds.
#[test]
fn without_an_inotify_instance_the_watcher_polls_and_says_so_once() {
    if std::env::var_os(IN_NAMESPACE).is_some() {
        return in_a_namespace_without_instances();
    }
    let usable = std::process::Command::new("unshare")
        .args(["-Ur", "true"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !usable {
        eprintln!("no unprivileged user namespaces here: only the classification tests ran");
        return;
    }
    let out = std::process::Command::new("unshare")
        .args([
            "-Ur",
            "sh",
            "-c",
            "echo 0 > /proc/sys/user/max_inotify_instances && exec \"$0\" \"$@\"",
        ])
        .arg(std::env::current_exe().unwrap())
        .args([
            "watch::tests::without_an_inotify_instance_the_watcher_polls_and_says_so_once",
            "--exact",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(IN_NAMESPACE, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn in_a_namespace_without_instances() {
    let err = inotify::Inotify::init().unwrap_err();
    let shortage = Shortage::classify(Step::Instance, err);
    assert!(
        matches!(
            shortage,
            Shortage::Instances(Limit {
                namespace: Some(0),
                ..
            })
        ),
        "{shortage:?}"
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (_dir, ours, theirs) = two_handles();
        let mut watcher = DbWatcher::with_mode(&ours, WatchMode::Notify).unwrap();
        assert_eq!(watcher.mode(), WatchMode::Poll);
        let second = DbWatcher::with_mode(&ours, WatchMode::Notify).unwrap();
        assert_eq!(second.mode(), WatchMode::Poll);
        // The first watcher said it; nobody says it again.
        assert!(!shortage.warn_once());
        let late = lateness(&mut watcher, &theirs, Duration::from_millis(10)).await;
        assert!(late < Duration::from_millis(100), "{late:?}");
    });
}

/// The alarm the watcher and the runner's turn loop keep their timers in.
mod alarm {
    use std::time::Duration;

    use tokio::time::Instant;

    use crate::watch::Alarm;

    /// Whether `alarm` rings within `within` (of the paused clock, which advances by itself).
    async fn rings(alarm: &mut Alarm, within: Duration) -> bool {
        tokio::time::timeout(within, alarm.ring()).await.is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn an_alarm_rings_at_its_instant_again_when_set_again_and_never_unset() {
        let mut alarm = Alarm::new();
        assert!(!rings(&mut alarm, Duration::from_secs(3600)).await, "unset");
        let at = Instant::now() + Duration::from_millis(50);
        alarm.set(Some(at));
        assert!(!rings(&mut alarm, Duration::from_millis(49)).await, "early");
        assert!(
            rings(&mut alarm, Duration::from_millis(2)).await,
            "at its instant"
        );
        // Still set to a passed instant: it rings at once, as a new sleep to it would.
        alarm.set(Some(at));
        assert!(rings(&mut alarm, Duration::ZERO).await);
        // Moved later, then unset before that: it never rings.
        alarm.set(Some(Instant::now() + Duration::from_millis(30)));
        assert!(!rings(&mut alarm, Duration::from_millis(10)).await);
        alarm.set(None);
        assert!(
            !rings(&mut alarm, Duration::from_secs(3600)).await,
            "unset again"
        );
        // Set again after being unset: it rings at the new instant.
        alarm.set(Some(Instant::now() + Duration::from_millis(5)));
        assert!(rings(&mut alarm, Duration::from_millis(6)).await);
    }
}
