//! The CLI over the API (`nanoclaw --url`, docs/contract/api.md#the-cli-over-the-api) against a
//! real `nanoclaw serve` process on a free loopback port: each subcommand prints over the URL
//! what it prints on the local DB, `watch` loses and repeats nothing across a restart of
//! `serve`, `send` retried across a restart writes one row.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use schema::{NewMessageOut, OutKind, Routing, RunnerStatus, SessionDb};
use serde_json::{json, Value};
use tempfile::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_nanoclaw");

fn nanoclaw(args: &[&str]) -> Output {
    Command::new(BIN)
        .env_remove("SESSION_DB")
        .env_remove("NANOCLAW_URL")
        .env_remove("NANOCLAW_TOKEN_FILE")
        .env_remove("NANOCLAW_SESSION")
        .env_remove("RUST_LOG")
        .env("TZ", "UTC")
        .args(args)
        .output()
        .expect("running nanoclaw")
}

#[track_caller]
fn ok(output: Output) -> String {
    assert!(
        output.status.success(),
        "expected success, got {:?}\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[track_caller]
fn fails(output: Output) -> String {
    assert!(
        !output.status.success(),
        "expected failure\nstdout: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A served root with the session `main` (routing `slack:C123`, a destination) and a token for
/// every session in a `0600` file.
struct Served {
    dir: TempDir,
    token_file: PathBuf,
    server: Option<Child>,
    addr: String,
    /// `--tls-cert` and `--tls-key`, for https.
    tls: Option<(PathBuf, PathBuf)>,
}

impl Served {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        ok(nanoclaw(&[
            "init",
            "--workspace",
            root.join("main").to_str().unwrap(),
            "--routing",
            "slack:C123",
            "--destination",
            "team=slack:C9:The team",
        ]));
        let token = ok(nanoclaw(&[
            "token",
            "add",
            "ci",
            "--sessions",
            "*",
            "--root",
            root.to_str().unwrap(),
        ]));
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, token).unwrap();
        std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut served = Self {
            dir,
            token_file,
            server: None,
            addr: "127.0.0.1:0".to_owned(),
            tls: None,
        };
        served.start();
        served
    }

    /// Serves on `listen` (`unix:PATH`, or an address) instead, with TLS when `tls`.
    fn restart_on(&mut self, listen: &str, tls: Option<(PathBuf, PathBuf)>) {
        self.kill();
        self.addr = listen.to_owned();
        self.tls = tls;
        self.start();
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn db_path(&self) -> PathBuf {
        self.root().join("main/session.db")
    }

    fn db(&self) -> SessionDb {
        SessionDb::open(self.db_path()).unwrap()
    }

    /// Starts `serve` on `self.addr` (the first time a free port, then the same one) and waits
    /// for its "listening" line.
    fn start(&mut self) {
        let mut child = Command::new(BIN)
            .env_remove("RUST_LOG")
            .args(["serve", "--root"])
            .arg(self.root())
            .args(["--listen", &self.addr, "--log-format", "json"])
            .args(self.tls.iter().flat_map(|(cert, key)| {
                [
                    "--tls-cert".into(),
                    cert.clone().into_os_string(),
                    "--tls-key".into(),
                    key.clone().into_os_string(),
                ]
            }))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let line = rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .expect("serve did not say it listens");
            let Ok(entry) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if entry["message"] == "serve: listening" {
                if let Some(addr) = entry["addr"].as_str() {
                    self.addr = addr.to_owned();
                }
                break;
            }
        }
        self.server = Some(child);
    }

    /// Ends `serve` with SIGKILL (no goodbye to its clients).
    fn kill(&mut self) {
        if let Some(mut child) = self.server.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    fn url(&self) -> String {
        if self.addr.starts_with("unix:") {
            return self.addr.clone();
        }
        match &self.tls {
            // The certificate names `localhost`.
            Some(_) => format!(
                "https://localhost:{}",
                self.addr.rsplit(':').next().unwrap()
            ),
            None => format!("http://{}", self.addr),
        }
    }

    /// `nanoclaw --url … --session main ARGS`.
    fn remote_args(&self, args: &[&str]) -> Vec<String> {
        let mut all = vec![
            "--url".to_owned(),
            self.url(),
            "--token-file".to_owned(),
            self.token_file.display().to_string(),
            "--session".to_owned(),
            "main".to_owned(),
        ];
        all.extend(args.iter().map(|arg| (*arg).to_owned()));
        all
    }

    fn remote(&self, args: &[&str]) -> Output {
        let all = self.remote_args(args);
        nanoclaw(&all.iter().map(String::as_str).collect::<Vec<_>>())
    }

    fn local(&self, args: &[&str]) -> Output {
        let db = self.db_path();
        let mut all = vec!["--db", db.to_str().unwrap()];
        all.extend_from_slice(args);
        nanoclaw(&all)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.kill();
    }
}

fn out_row(db: &SessionDb, kind: OutKind, content: Value) -> i64 {
    db.insert_out(&NewMessageOut::new(
        kind,
        Routing {
            channel_type: Some("slack".into()),
            platform_id: Some("C123".into()),
            thread_id: None,
        },
        &content,
    ))
    .unwrap()
    .seq
}

/// A session with something in every part of `status`, `usage` and `watch`.
fn fill(served: &Served) {
    let db = served.db();
    ok(served.local(&[
        "send",
        "--kind",
        "task",
        "--prompt",
        "Write the weekly report",
        "--recurrence",
        "0 9 * * 1",
    ]));
    // Nothing due now: a due row's time is `now`, different in every report.
    ok(served.local(&["send", "--text", "hello", "--process-after", "+1h"]));
    db.set_runner_state(RunnerStatus::Busy, Some(4242), Some("mock"))
        .unwrap();
    // Busy for 5 minutes, the last heartbeat 2 minutes ago: unhealthy by the default limits.
    let ago =
        |secs: i64| schema::time::format_ts(chrono::Utc::now() - chrono::Duration::seconds(secs));
    db.dedicated_connection()
        .unwrap()
        .execute(
            "UPDATE runner_state SET updated_at = ?1, heartbeat_at = ?2",
            [ago(300), ago(120)],
        )
        .unwrap();
    out_row(&db, OutKind::Chat, json!({"text": "Hello there"}));
    out_row(
        &db,
        OutKind::ChatSdk,
        json!({"operation":"ask_question","questionId":"q1","title":"Deploy",
               "question":"Pick one","options":[
                   {"label":"a","selectedLabel":"a","value":"a"},
                   {"label":"b","selectedLabel":"b","value":"b"}]}),
    );
    out_row(
        &db,
        OutKind::System,
        json!({"action":"query_error","payload":{"message":"boom","retryable":true}}),
    );
    out_row(
        &db,
        OutKind::System,
        json!({"action":"progress","payload":{"tool":"Bash","summary":"cargo test","elapsedSecs":12}}),
    );
    db.record_usage(
        &schema::NewTurnUsage {
            provider: "claude".into(),
            model: Some("claude-model".into()),
            input_tokens: Some(1000),
            output_tokens: Some(250),
            cache_read_tokens: Some(4000),
            cache_write_tokens: None,
            reasoning_tokens: None,
            cost_usd: Some(0.0421),
            requests: Some(1),
            duration_ms: Some(2500),
            outcome: schema::UsageOutcome::Result,
            message_ids: vec!["in-1".into()],
            series_id: None,
        },
        schema::time::parse_ts("2026-11-20T09:00:00Z").unwrap(),
    )
    .unwrap();
}

/// The output of `args` over the URL equals the local one. Reports with ages (seconds since
/// …) are compared between two local runs that agree, so the remote run between them saw the
/// same second; `strip` removes what differs by nature (`now`).
#[track_caller]
fn same_output(served: &Served, args: &[&str], strip: fn(&str) -> String) -> String {
    for _ in 0..5 {
        let before = strip(&ok(served.local(args)));
        let remote = strip(&ok(served.remote(args)));
        let after = strip(&ok(served.local(args)));
        if before == after {
            pretty_assertions::assert_eq!(remote, before, "nanoclaw {args:?}");
            return remote;
        }
    }
    panic!("nanoclaw {args:?}: the local output never held still");
}

fn as_is(text: &str) -> String {
    text.to_owned()
}

/// `--json status` without its `now` (the instant of the report).
fn without_now(text: &str) -> String {
    let mut report: Value = serde_json::from_str(text).unwrap();
    report.as_object_mut().unwrap().remove("now");
    report.to_string()
}

#[test]
fn reports_print_the_same_over_the_url_as_locally() {
    let served = Served::new();
    fill(&served);
    let status = same_output(&served, &["status"], as_is);
    assert!(status.contains("runner      busy for"), "{status}");
    assert!(status.contains("boom"), "{status}");
    let json = same_output(&served, &["--json", "status"], without_now);
    assert!(json.contains("\"lastError\":{"), "{json}");
    for args in [
        &["usage"][..],
        &["usage", "--by", "model"],
        &["usage", "--by", "day", "--since", "2026-11-01"],
        &["--json", "usage", "--by", "provider"],
        &["watch", "--no-follow"],
        &["--json", "watch", "--no-follow"],
        &["watch", "--no-follow", "--after", "3"],
        &["watch", "--until-count", "2"],
        &["--json", "health", "--stale-after", "3600"],
        &["health", "--stale-after", "3600", "--max-turn-silence", "0"],
    ] {
        same_output(&served, args, as_is);
    }
    expect_test::expect![[r#"
        [seq 5 → slack:C123] Hello there
        [seq 7 → slack:C123] (question q1) Deploy: Pick one: [a] [b]
        [seq 9 → slack:C123] (query error: ?, retryable) boom
        [seq 11 → slack:C123] (progress ?) Bash: cargo test
    "#]]
    .assert_eq(&ok(served.remote(&["watch", "--no-follow"])));

    // Unhealthy: exit 1 and the reason on stderr, as locally (its age in seconds: compared
    // between two local runs that agree, as `same_output`).
    let outcome = |output: Output| {
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let mut compared = false;
    for _ in 0..5 {
        let before = outcome(served.local(&["health"]));
        let remote = outcome(served.remote(&["health"]));
        let after = outcome(served.local(&["health"]));
        if before == after {
            assert_eq!(remote, before);
            assert_eq!(remote.0, Some(1));
            assert!(remote.2.contains("heartbeat"), "{}", remote.2);
            compared = true;
            break;
        }
    }
    assert!(compared, "the local health verdict never held still");
}

/// The row `send` wrote, without what differs between two sends (id, seq, time).
fn row_shape(db: &SessionDb, id: &str) -> Value {
    let row = db.message_in(id).unwrap().expect("the row exists");
    json!({
        "kind": row.kind,
        "content": serde_json::from_str::<Value>(&row.content).unwrap(),
        "processAfter": row.process_after.is_some(),
        "routing": [row.routing.channel_type, row.routing.platform_id, row.routing.thread_id],
        "trigger": row.trigger,
        "seriesId": row.series_id.is_some(),
        "recurrence": row.recurrence,
    })
}

/// `id=… seq=…` or a JSON object with `id` and `seq`: the id.
fn sent_id(text: &str) -> String {
    if let Ok(object) = serde_json::from_str::<Value>(text) {
        return object["id"].as_str().unwrap().to_owned();
    }
    text.split_whitespace()
        .find_map(|field| field.strip_prefix("id="))
        .unwrap()
        .to_owned()
}

/// `text` with each id and seq in it replaced, so two writes compare.
fn masked(text: &str, id: &str) -> String {
    let text = text.replace(id, "<id>");
    let mut object: Value = match serde_json::from_str(&text) {
        Ok(object) => object,
        Err(_) => {
            return text
                .split_whitespace()
                .map(|field| {
                    if field.starts_with("seq=") {
                        "seq=<seq>"
                    } else {
                        field
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        }
    };
    object["seq"] = json!("<seq>");
    object.to_string()
}

#[test]
fn writes_over_the_url_write_what_they_write_locally() {
    let served = Served::new();
    fill(&served);
    let db = served.db();
    for args in [
        &[
            "send",
            "--text",
            "hi",
            "--sender",
            "Ann",
            "--thread-id",
            "T1",
        ][..],
        &[
            "--json",
            "send",
            "--kind",
            "webhook",
            "--source",
            "github",
            "--event",
            "push",
            "--payload",
            r#"{"ref":"main"}"#,
        ],
        &[
            "send",
            "--kind",
            "task",
            "--prompt",
            "p",
            "--process-after",
            "2030-01-01T00:00:00Z",
        ],
        &[
            "send",
            "--content",
            r#"{"text":"raw","extra":[1,2]}"#,
            "--no-trigger",
        ],
        &["--json", "send", "--text", "quoted", "--reply-to", "1"],
    ] {
        let local = ok(served.local(args));
        let remote = ok(served.remote(args));
        let (local_id, remote_id) = (sent_id(&local), sent_id(&remote));
        assert_ne!(local_id, remote_id);
        assert_eq!(
            masked(&remote, &remote_id),
            masked(&local, &local_id),
            "{args:?}"
        );
        assert_eq!(
            row_shape(&db, &remote_id),
            row_shape(&db, &local_id),
            "{args:?}"
        );
    }

    // answer: the question's row, the stored choice.
    let remote = ok(served.remote(&["--json", "answer", "--question", "q1", "--option", "b"]));
    let local = ok(served.local(&["--json", "answer", "--question", "q1", "--option", "a"]));
    let (remote, local): (Value, Value) = (
        serde_json::from_str(&remote).unwrap(),
        serde_json::from_str(&local).unwrap(),
    );
    assert_eq!(remote["selectedOption"], "b");
    assert_eq!(remote["questionFound"], local["questionFound"]);
    let text = ok(served.remote(&["answer", "--question", "q1", "--option", "a"]));
    assert!(text.ends_with(" selectedOption=\"a\"\n"), "{text}");
    let err = fails(served.remote(&["answer", "--question", "nope", "--option", "a"]));
    assert!(
        err.contains("400 bad_request") && err.contains("--force"),
        "{err}"
    );

    // interrupt, sweep: the same lines.
    let remote = ok(served.remote(&["--json", "interrupt"]));
    let local = ok(served.local(&["--json", "interrupt"]));
    let remote_id = sent_id(&remote);
    assert_eq!(
        masked(&remote, &remote_id),
        masked(&local, &sent_id(&local))
    );
    assert_eq!(db.message_in(&remote_id).unwrap().unwrap().kind, "system");
    // Rows are due now, so the next due time is the instant of each report: left out.
    let json = same_output(&served, &["--json", "sweep"], |text| {
        let mut outcome: Value = serde_json::from_str(text).unwrap();
        outcome.as_object_mut().unwrap().remove("nextDue");
        outcome.to_string()
    });
    assert!(json.contains("\"due\":"), "{json}");
    let text = same_output(&served, &["sweep", "--stale-after", "1"], |text| {
        text.split("; next due").next().unwrap().to_owned()
    });
    assert!(text.contains("reset  0 stale"), "{text}");

    // init: a new session over the URL, then the same report as a local re-run.
    let created = ok(served.remote_with_session("other", &["init", "--routing", "slack:C5"]));
    assert!(created.contains("created workspace"), "{created}");
    let other = served.root().join("other");
    let local = ok(nanoclaw(&[
        "init",
        "--workspace",
        other.to_str().unwrap(),
        "--routing",
        "slack:C5",
    ]));
    let remote = ok(served.remote_with_session("other", &["init", "--routing", "slack:C5"]));
    assert_eq!(remote, local);
    let local = ok(nanoclaw(&[
        "--json",
        "init",
        "--workspace",
        other.to_str().unwrap(),
    ]));
    let remote = ok(served.remote_with_session("other", &["--json", "init"]));
    assert_eq!(remote, local);
}

impl Served {
    fn remote_with_session(&self, session: &str, args: &[&str]) -> Output {
        let mut all = self.remote_args(args);
        all[5] = session.to_owned();
        nanoclaw(&all.iter().map(String::as_str).collect::<Vec<_>>())
    }
}

#[test]
fn the_flags_of_the_url_are_checked_before_anything_is_sent() {
    let served = Served::new();
    let url = served.url();
    let err = fails(nanoclaw(&[
        "--url",
        &url,
        "--db",
        "x.db",
        "--session",
        "main",
        "status",
    ]));
    assert!(err.contains("cannot be used with"), "{err}");
    let err = fails(nanoclaw(&[
        "--url",
        &url,
        "--workspace",
        "w",
        "--session",
        "main",
        "status",
    ]));
    assert!(err.contains("cannot be used with"), "{err}");
    let err = fails(nanoclaw(&["--url", &url, "status"]));
    assert!(err.contains("--session NAME"), "{err}");
    // Without a token the server says 401, and the CLI names the flag.
    let err = fails(nanoclaw(&["--url", &url, "--session", "main", "status"]));
    assert!(err.contains("401") && err.contains("--token-file"), "{err}");
    // A token others can read is refused, naming the fix, before it is sent.
    let token = served.dir.path().join("open-token");
    std::fs::copy(&served.token_file, &token).unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = fails(nanoclaw(&[
        "--url",
        &url,
        "--token-file",
        token.to_str().unwrap(),
        "--session",
        "main",
        "status",
    ]));
    assert!(err.contains("chmod 600"), "{err}");
    // The environment works as the flags.
    let out = Command::new(BIN)
        .env("NANOCLAW_URL", &url)
        .env("NANOCLAW_TOKEN_FILE", &served.token_file)
        .env("NANOCLAW_SESSION", "main")
        .args(["--json", "health", "--stale-after", "0"])
        .output()
        .unwrap();
    let verdict: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(verdict["healthy"], false, "{verdict}");
    // A session the server does not have: 404, named.
    let err = fails(served.remote_with_session("nope", &["status"]));
    assert!(err.contains("404 not_found"), "{err}");
    // --retry-for is for --url only.
    let err = fails(served.local(&["send", "--text", "x", "--retry-for", "5"]));
    assert!(err.contains("--url"), "{err}");
}

/// Waits for `count` lines on `rx`.
fn lines(rx: &mpsc::Receiver<String>, count: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    (0..count)
        .map(|n| {
            rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|_| panic!("line {n} of {count} did not come"))
        })
        .collect()
}

#[test]
fn watch_follows_across_a_restart_of_serve_without_losing_or_repeating_a_row() {
    let mut served = Served::new();
    let db = served.db();
    let mut first = vec![];
    for n in 0..3 {
        first.push(out_row(
            &db,
            OutKind::Chat,
            json!({"text": format!("before {n}")}),
        ));
    }
    let args = served.remote_args(&[
        "--json",
        "watch",
        "--mark-delivered",
        "--until-count",
        "7",
        "--timeout",
        "60",
    ]);
    let mut watch = Command::new(BIN)
        .env("RUST_LOG", "warn")
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = watch.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut printed = lines(&rx, 3);
    // The printed rows were marked delivered before the next was printed.
    let deadline = Instant::now() + Duration::from_secs(10);
    while first
        .iter()
        .any(|seq| db.delivered(&seq_id(&db, *seq)).unwrap().is_none())
    {
        assert!(
            Instant::now() < deadline,
            "the rows were not marked delivered"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // A SIGKILL of serve; rows written while it is down; then serve again, twice.
    served.kill();
    out_row(&db, OutKind::Chat, json!({"text": "while down"}));
    out_row(&db, OutKind::Chat, json!({"text": "while down 2"}));
    std::thread::sleep(Duration::from_millis(700));
    served.start();
    printed.extend(lines(&rx, 2));
    served.kill();
    served.start();
    out_row(&db, OutKind::Chat, json!({"text": "after"}));
    out_row(&db, OutKind::Chat, json!({"text": "after 2"}));
    printed.extend(lines(&rx, 2));
    let status = watch.wait().unwrap();
    let stderr = std::io::read_to_string(watch.stderr.take().unwrap()).unwrap();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("reconnecting"), "{stderr}");

    let seqs: Vec<i64> = printed
        .iter()
        .map(|line| {
            serde_json::from_str::<Value>(line).unwrap()["seq"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(seqs, [1, 3, 5, 7, 9, 11, 13], "{printed:#?}");
    let texts: Vec<String> = printed
        .iter()
        .map(|line| {
            serde_json::from_str::<Value>(line).unwrap()["content"]["text"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        texts,
        [
            "before 0",
            "before 1",
            "before 2",
            "while down",
            "while down 2",
            "after",
            "after 2"
        ]
    );
    for seq in seqs {
        let delivered = db.delivered(&seq_id(&db, seq)).unwrap();
        assert_eq!(
            delivered.map(|d| d.status),
            Some("delivered".to_owned()),
            "seq {seq}"
        );
    }
}

fn seq_id(db: &SessionDb, seq: i64) -> String {
    db.messages_out_after(seq - 1, 1).unwrap()[0].id.clone()
}

#[test]
fn send_retries_until_serve_is_back_and_writes_the_message_once() {
    let mut served = Served::new();
    let db = served.db();
    served.kill();
    let args = served.remote_args(&[
        "--json",
        "send",
        "--text",
        "sent while down",
        "--retry-for",
        "30",
    ]);
    let sender = Command::new(BIN)
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    served.start();
    let output = sender.wait_with_output().unwrap();
    let sent: Value = serde_json::from_str(&ok(output)).unwrap();
    let rows = db.all_messages_in().unwrap();
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(rows[0].id, sent["id"].as_str().unwrap());

    // Without --retry-for time left, a server that is down is an error naming the address.
    served.kill();
    let err = fails(served.remote(&["send", "--text", "x", "--retry-for", "0"]));
    assert!(
        err.contains("cannot connect to") && err.contains("nanoclaw serve"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_repeated_after_a_restart_replays_the_first_result() {
    let mut served = tokio::task::block_in_place(Served::new);
    let token = std::fs::read_to_string(&served.token_file)
        .unwrap()
        .trim()
        .to_owned();
    let client = host::client::Client::new(
        &served.url(),
        host::client::ClientOptions {
            token: Some(token),
            ..host::client::ClientOptions::default()
        },
    )
    .unwrap();
    let body = host::api::SendBody {
        text: Some("once".into()),
        ..host::api::SendBody::default()
    };
    let first = client.send("main", &body, Some("key-1")).await.unwrap();
    assert!(!first.replayed);
    tokio::task::block_in_place(|| {
        served.kill();
        served.start();
    });
    let again = client.send("main", &body, Some("key-1")).await.unwrap();
    assert!(again.replayed);
    assert_eq!(
        (again.sent.id, again.sent.seq),
        (first.sent.id.clone(), first.sent.seq)
    );
    let rows = served.db().all_messages_in().unwrap();
    assert_eq!(rows.len(), 1);
    // The same key with another body is refused, typed.
    let other = host::api::SendBody {
        text: Some("other".into()),
        ..host::api::SendBody::default()
    };
    let err = client
        .send("main", &other, Some("key-1"))
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(422), "{err}");
    assert!(!err.is_retryable());
}

#[test]
fn the_cli_works_the_same_over_tls_and_a_unix_socket() {
    let mut served = Served::new();
    fill(&served);
    let local = ok(served.local(&["watch", "--no-follow"]));

    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert = served.dir.path().join("cert.pem");
    let key = served.dir.path().join("key.pem");
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    served.restart_on("127.0.0.1:0", Some((cert.clone(), key)));
    // Not signed by a root the system trusts: refused at once (no retry cures it), naming the
    // flag that would.
    let err = fails(served.remote(&["watch", "--no-follow"]));
    assert!(
        err.contains("TLS handshake with https://localhost:") && err.contains("--ca-cert"),
        "{err}"
    );
    let mut args = vec!["--ca-cert", cert.to_str().unwrap()];
    args.extend(["watch", "--no-follow"]);
    assert_eq!(ok(served.remote(&args)), local);

    // A unix socket: its mode is the access control, no token is asked for.
    let socket = served.dir.path().join("serve.sock");
    served.restart_on(&format!("unix:{}", socket.display()), None);
    let out = nanoclaw(&[
        "--url",
        &served.url(),
        "--session",
        "main",
        "watch",
        "--no-follow",
    ]);
    assert_eq!(ok(out), local);
}

#[test]
fn watch_new_prints_only_rows_written_after_it_starts() {
    let served = Served::new();
    fill(&served);
    let db = served.db();
    let args = served.remote_args(&["watch", "--new", "--until-count", "1", "--timeout", "30"]);
    let mut watch = Command::new(BIN)
        .env("RUST_LOG", "info")
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The row is written once the watch says it caught up (a row written before would be
    // skipped, and the watch would time out: a failure, never a false pass).
    let stderr = BufReader::new(watch.stderr.take().unwrap());
    let mut log = Vec::new();
    for line in stderr.lines().map_while(Result::ok) {
        let caught_up = line.contains("caught up");
        log.push(line);
        if caught_up {
            break;
        }
    }
    assert!(
        log.last().is_some_and(|line| line.contains("caught up")),
        "{log:#?}"
    );
    let seq = out_row(&db, OutKind::Chat, json!({"text": "fresh"}));
    let printed = ok(watch.wait_with_output().unwrap());
    assert_eq!(printed, format!("[seq {seq} → slack:C123] fresh\n"));
}

/// The acceptance loop (issue 40): 500 sends with idempotency keys while `serve` is killed with
/// SIGKILL 20 times, and a `watch --mark-delivered` follows the replies over the event stream
/// (a replier thread answers each message as a runner would): every message is in `messages_in`
/// exactly once, every reply printed exactly once and marked delivered, the DB intact.
#[test]
fn five_hundred_sends_across_twenty_kills_of_serve_lose_and_double_nothing() {
    const MESSAGES: usize = 500;
    const KILLS: usize = 20;
    let served = std::sync::Arc::new(std::sync::Mutex::new(Served::new()));
    let (db, watch_args, send_base) = {
        let served = served.lock().unwrap();
        (
            served.db(),
            served.remote_args(&[
                "--json",
                "watch",
                "--mark-delivered",
                "--until-count",
                "500",
                "--timeout",
                "600",
            ]),
            served.remote_args(&["--json", "send", "--retry-for", "60", "--text"]),
        )
    };
    let mut watch = Command::new(BIN)
        .args(&watch_args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = watch.stdout.take().unwrap();
    let printer = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<String>>()
    });

    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The "runner": one reply per message, in the order they arrive.
    let replier = {
        let db = served.lock().unwrap().db();
        let done = done.clone();
        std::thread::spawn(move || {
            let mut answered = std::collections::HashSet::new();
            loop {
                let finished = done.load(std::sync::atomic::Ordering::SeqCst);
                for row in db.all_messages_in().unwrap() {
                    if answered.insert(row.id.clone()) {
                        let mut reply = NewMessageOut::new(
                            OutKind::Chat,
                            Routing::default(),
                            &json!({"text": format!("re: {}", row.id)}),
                        );
                        reply.in_reply_to = Some(row.id.clone());
                        db.insert_out(&reply).unwrap();
                    }
                }
                if finished {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    // The killer: SIGKILL and a restart on the same port, spread over the sends.
    let killer = {
        let served = served.clone();
        let done = done.clone();
        std::thread::spawn(move || {
            let mut kills = 0;
            while kills < KILLS && !done.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(150 + 37 * (kills as u64 % 5)));
                let mut served = served.lock().unwrap();
                served.kill();
                std::thread::sleep(Duration::from_millis(50));
                served.start();
                kills += 1;
            }
            kills
        })
    };
    let started = Instant::now();
    let (mut retried, mut replayed) = (0, 0);
    for n in 0..MESSAGES {
        let output = Command::new(BIN)
            .env("RUST_LOG", "info")
            .args(&send_base)
            .arg(format!("message {n}"))
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&output.stderr).into_owned();
        ok(output);
        retried += usize::from(log.contains("send: retrying"));
        replayed += usize::from(log.contains("an earlier attempt had written the row"));
    }
    let sending = started.elapsed();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let kills = killer.join().unwrap();
    replier.join().unwrap();
    let status = watch.wait().unwrap();
    let printed = printer.join().unwrap();
    eprintln!(
        "{MESSAGES} sends across {kills} kills of serve in {sending:.1?}: {retried} retried, \
         {replayed} answered by a replay of an earlier attempt"
    );
    assert!(
        retried > 0,
        "no send met a killed serve: the kills proved nothing"
    );
    assert!(status.success(), "watch: {status:?}");
    assert!(kills >= 10, "only {kills} kills happened during the sends");

    let rows = db.all_messages_in().unwrap();
    let texts: std::collections::BTreeSet<String> = rows
        .iter()
        .map(|row| {
            serde_json::from_str::<Value>(&row.content).unwrap()["text"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(rows.len(), MESSAGES, "a message written twice or lost");
    assert_eq!(texts.len(), MESSAGES);

    let replies: Vec<Value> = printed
        .iter()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let seqs: std::collections::BTreeSet<i64> =
        replies.iter().map(|r| r["seq"].as_i64().unwrap()).collect();
    let answered: std::collections::BTreeSet<&str> = replies
        .iter()
        .map(|r| r["inReplyTo"].as_str().unwrap())
        .collect();
    assert_eq!(replies.len(), MESSAGES);
    assert_eq!(seqs.len(), MESSAGES, "a reply printed twice");
    assert_eq!(answered.len(), MESSAGES, "a reply missing");
    for reply in &replies {
        let delivered = db.delivered(reply["id"].as_str().unwrap()).unwrap();
        assert_eq!(delivered.map(|d| d.status), Some("delivered".to_owned()));
    }
    let integrity: String = db
        .dedicated_connection()
        .unwrap()
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .unwrap();
    assert_eq!(integrity, "ok");
}
