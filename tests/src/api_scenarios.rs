//! The acceptance scenarios over the session API (issue 40): send → reply, question → answer,
//! and interrupt, with the host side driven **only** through `nanoclaw --url`, run as a user
//! that cannot read the session folder. `nanoclaw serve --workspace` runs next to the DB (as
//! the runner's user); the host's `nanoclaw --url` processes run as uid 65534 (`nobody`) when
//! the tests run as root, and the session folder is a `0700` folder of root's, so the only way
//! the host reaches the session is the API. `watch --json --mark-delivered` follows the event
//! stream for the whole scenario: every reply the host sees, it sees there.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::fake_model::{FakeModel, Step};
use crate::harness::{bin, Session};
use crate::support::{ok, some, WAIT};

/// The uid and gid of the host's processes: `nobody`, who cannot enter root's `0700` folders.
const HOST_UID: u32 = 65534;

/// How long `nanoclaw interrupt` may take to end the turn (as the local scenario's bound), plus
/// the start of the `nanoclaw --url` process.
const INTERRUPT_BOUND: Duration = Duration::from_secs(3);

/// Declares the API scenarios for the CLI `$cli`: `api_scenario_tests! { CLI }` in each
/// `tests/tests/e2e_<cli>.rs`.
#[macro_export]
macro_rules! api_scenario_tests {
    ($cli:expr) => {
        // Issue 40: the host side only through `nanoclaw --url` (tests/src/api_scenarios.rs).
        $crate::scenario_tests! { $cli;
            /// A chat message sent with `nanoclaw --url send` is answered; the reply comes over
            /// `nanoclaw --url watch` and is marked delivered.
            over_the_api_a_message_gets_its_reply();

            /// ask_user_question: the question comes over `watch`, `nanoclaw --url answer`
            /// answers it, the answer reaches the model and its reply comes over `watch`.
            over_the_api_a_question_is_answered();

            /// `nanoclaw --url interrupt` during a stalled turn: `Stopped.` comes over `watch`.
            over_the_api_interrupt_stops_the_turn();
        }
    };
}

/// `nanoclaw serve` next to the session's DB, and the host's side: a token file and the
/// `nanoclaw` binary where uid 65534 can reach them, a `watch` following the events.
pub struct ApiHost {
    serve: Child,
    url: String,
    session: String,
    /// Root-owned: the serve's token file.
    _keys: tempfile::TempDir,
    /// Owned by the host's user: its token file and its copy of `nanoclaw`.
    host_dir: tempfile::TempDir,
    nanoclaw: PathBuf,
    watch: Option<Child>,
    rows: mpsc::Receiver<Value>,
    seen: Vec<Value>,
}

/// True when the host's processes run as another user than the runner (the tests run as root).
fn switch_user() -> bool {
    nix::unistd::Uid::effective().is_root()
}

impl ApiHost {
    /// Starts `serve --workspace` for `session` on a free loopback port with a token for it,
    /// checks the host's user cannot read the session folder, and starts the host's `watch`.
    pub fn start(session: &Session) -> Self {
        let workspace = &session.workspace;
        let name = some(
            workspace.file_name().and_then(|n| n.to_str()),
            "the session folder's name",
        )
        .to_owned();
        let keys = ok(tempfile::tempdir(), "a folder for the token file");
        let tokens = keys.path().join("tokens.json");
        let token = output_of(
            Command::new(bin("nanoclaw"))
                .args(["token", "add", "host", "--sessions", &name, "--tokens"])
                .arg(&tokens),
            "nanoclaw token add",
        );
        let mut serve = ok(
            Command::new(bin("nanoclaw"))
                .args(["serve", "--workspace"])
                .arg(workspace)
                .arg("--tokens")
                .arg(&tokens)
                .args(["--listen", "127.0.0.1:0", "--log-format", "json"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn(),
            "starting nanoclaw serve",
        );
        let url = format!("http://{}", listening_addr(&mut serve));

        let host_dir = ok(tempfile::tempdir(), "the host's folder");
        let token_file = host_dir.path().join("token");
        ok(std::fs::write(&token_file, token), "writing the token file");
        ok(
            std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)),
            "chmod 600 the token file",
        );
        let nanoclaw = placed(&bin("nanoclaw"), host_dir.path());
        if switch_user() {
            for path in [host_dir.path(), &token_file, &nanoclaw] {
                ok(
                    std::os::unix::fs::chown(path, Some(HOST_UID), Some(HOST_UID)),
                    "chown to the host's user",
                );
            }
        } else {
            eprintln!(
                "not root: the host's nanoclaw runs as this user (the API is still the only way it \
                 is driven; the unreadable session folder is checked only as root)"
            );
        }
        let (sender, rows) = mpsc::channel();
        let mut host = Self {
            serve,
            url,
            session: name,
            _keys: keys,
            host_dir,
            nanoclaw,
            watch: None,
            rows,
            seen: Vec::new(),
        };
        if switch_user() {
            // The session folder is the runner's (root's) alone, as a pod's volume would be.
            ok(
                std::fs::set_permissions(workspace, std::fs::Permissions::from_mode(0o700)),
                "chmod 700 the session folder",
            );
            host.assert_session_folder_closed(workspace);
        }
        let mut watch = ok(
            host.command(&["--json", "watch", "--mark-delivered"])
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn(),
            "starting nanoclaw --url watch",
        );
        let stdout = some(watch.stdout.take(), "watch's stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                match serde_json::from_str::<Value>(&line) {
                    Ok(row) => {
                        if sender.send(row).is_err() {
                            break;
                        }
                    }
                    Err(err) => eprintln!("watch printed a line that is no JSON ({err}): {line}"),
                }
            }
        });
        host.watch = Some(watch);
        host
    }

    /// `nanoclaw --url … --token-file … --session … ARGS` as the host's user, from its folder
    /// (std drops root's supplementary groups when it sets the uid).
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.nanoclaw);
        command
            .current_dir(self.host_dir.path())
            .env_remove("SESSION_DB")
            .args(["--url", &self.url, "--token-file"])
            .arg(self.host_dir.path().join("token"))
            .args(["--session", &self.session])
            .args(args)
            .stdin(Stdio::null());
        if switch_user() {
            command.uid(HOST_UID).gid(HOST_UID);
        }
        command
    }

    /// Runs `nanoclaw --url … ARGS`; its stdout, or a panic with its stderr.
    pub fn run(&self, args: &[&str]) -> String {
        output_of(&mut self.command(args), &format!("nanoclaw --url {args:?}"))
    }

    /// `nanoclaw --url --json send --text TEXT`: the row's id.
    pub fn send_chat(&self, text: &str) -> String {
        let sent: Value = ok(
            serde_json::from_str(&self.run(&["--json", "send", "--text", text])),
            "send's JSON",
        );
        some(sent["id"].as_str(), "the sent row's id").to_owned()
    }

    /// The first row `watch` printed (now or earlier) that `matches`, within `timeout`.
    pub fn wait_row(
        &mut self,
        what: &str,
        timeout: Duration,
        matches: impl Fn(&Value) -> bool,
    ) -> Value {
        if let Some(row) = self.seen.iter().find(|row| matches(row)) {
            return row.clone();
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rows.recv_timeout(left) {
                Ok(row) => {
                    self.seen.push(row.clone());
                    if matches(&row) {
                        return row;
                    }
                }
                Err(_) => panic!(
                    "{what}: not printed by `nanoclaw --url watch` within {timeout:?}; it printed {:#?}",
                    self.seen
                ),
            }
        }
    }

    /// The chat reply to the row `id`, as `watch` printed it.
    pub fn wait_reply(&mut self, id: &str) -> Value {
        self.wait_row(&format!("the reply to {id}"), WAIT, |row| {
            row["inReplyTo"] == id && row["kind"] == "chat"
        })
    }

    /// Asserts the host's user can neither list the session folder nor open the DB locally:
    /// `nanoclaw --db <folder>/session.db status` as that user fails.
    fn assert_session_folder_closed(&self, workspace: &Path) {
        let mut local = Command::new(&self.nanoclaw);
        local
            .current_dir(self.host_dir.path())
            .arg("--db")
            .arg(workspace.join("session.db"))
            .arg("status")
            .uid(HOST_UID)
            .gid(HOST_UID);
        let out = ok(local.output(), "nanoclaw --db as the host's user");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("session.db"),
            "the host's user opened the session DB: {}{stderr}",
            String::from_utf8_lossy(&out.stdout)
        );
        eprintln!(
            "as uid {HOST_UID}, the local DB is out of reach: {}",
            stderr.trim()
        );
    }

    /// The rows `watch` printed so far.
    pub fn seen(&self) -> &[Value] {
        &self.seen
    }
}

impl Drop for ApiHost {
    fn drop(&mut self) {
        if let Some(mut watch) = self.watch.take() {
            let _ = watch.kill();
            let _ = watch.wait();
        }
        let _ = self.serve.kill();
        let _ = self.serve.wait();
    }
}

/// The address in serve's `listening` log line.
fn listening_addr(serve: &mut Child) -> String {
    let stderr = some(serve.stderr.take(), "serve's stderr");
    let (sender, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("serve: {line}");
            let _ = sender.send(line);
        }
    });
    let deadline = Instant::now() + WAIT;
    loop {
        let line = match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => line,
            Err(_) => panic!("nanoclaw serve did not say where it listens"),
        };
        let Ok(entry) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if entry["message"] == "serve: listening" {
            return some(entry["addr"].as_str(), "the listening address").to_owned();
        }
    }
}

/// `program` in `dir` for the host's user: a hard link, else a copy (the checkout may be in a
/// folder that user cannot search).
fn placed(program: &Path, dir: &Path) -> PathBuf {
    let placed = dir.join(some(program.file_name(), "a file name"));
    if std::fs::hard_link(program, &placed).is_err() {
        ok(std::fs::copy(program, &placed), "copying nanoclaw");
    }
    placed
}

fn output_of(command: &mut Command, what: &str) -> String {
    let out: Output = ok(command.output(), what);
    assert!(
        out.status.success(),
        "{what}: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn fake_model(steps: impl IntoIterator<Item = Step>) -> FakeModel {
    ok(
        FakeModel::start_with_script(steps),
        "starting the fake model",
    )
}

/// Every row `watch` printed was marked delivered through the API (checked in the DB, the
/// runner's side).
fn assert_delivered(session: &Session, host: &ApiHost) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for row in host.seen() {
        let id = some(row["id"].as_str(), "a row id");
        loop {
            let delivered = ok(session.db.delivered(id), "reading delivered");
            if delivered.as_ref().is_some_and(|d| d.status == "delivered") {
                break;
            }
            assert!(Instant::now() < deadline, "{id} was not marked delivered");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Send → reply over the API.
pub fn over_the_api_a_message_gets_its_reply(provider: &str) {
    let model = fake_model([Step::text("Hello over the API.").chunks(3)]);
    let mut session = Session::new();
    session.start_runner(provider, &model, &[]);
    let mut host = ApiHost::start(&session);
    let id = host.send_chat("hi from afar");
    let reply = host.wait_reply(&id);
    assert_eq!(reply["content"]["text"], "Hello over the API.", "{reply}");
    assert_eq!(reply["channelType"], "slack");
    let status: Value = ok(
        serde_json::from_str(&host.run(&["--json", "status"])),
        "status's JSON",
    );
    assert!(status["runner"]["status"].is_string(), "{status}");
    assert_delivered(&session, &host);
    let chats = host
        .seen()
        .iter()
        .filter(|row| row["kind"] == "chat")
        .count();
    assert_eq!(chats, 1, "{:#?}", host.seen());
    session.stop_runner();
}

/// ask_user_question → `nanoclaw --url answer` → the reply.
pub fn over_the_api_a_question_is_answered(provider: &str) {
    let model = fake_model([
        Step::tool_call(
            "ask_user_question",
            json!({"question": "Deploy to production?", "options": ["Yes", "No"]}),
        ),
        Step::text("Deploying now."),
    ]);
    let mut session = Session::new();
    session.start_runner(provider, &model, &[]);
    let mut host = ApiHost::start(&session);
    let id = host.send_chat("deploy it");
    let question = host.wait_row("the question", WAIT, |row| {
        row["content"]["operation"] == "ask_question"
    });
    let question_id = some(question["content"]["questionId"].as_str(), "a questionId").to_owned();
    let answered: Value = ok(
        serde_json::from_str(&host.run(&[
            "--json",
            "answer",
            "--question",
            &question_id,
            "--option",
            "Yes",
        ])),
        "answer's JSON",
    );
    assert_eq!(answered["questionFound"], true, "{answered}");
    let reply = host.wait_reply(&id);
    assert_eq!(reply["content"]["text"], "Deploying now.", "{reply}");
    let request = some(model.model_requests().pop(), "a model request");
    let results = request.tool_results().join("\n");
    assert!(
        results.contains("Yes"),
        "the answer reached the model: {results}"
    );
    assert_delivered(&session, &host);
    session.stop_runner();
}

/// `nanoclaw --url interrupt` during a stalled turn → `Stopped.`.
pub fn over_the_api_interrupt_stops_the_turn(provider: &str) {
    let model = fake_model([Step::hang().timeout_ms(120_000)]);
    let mut session = Session::new();
    session.start_runner(provider, &model, &[]);
    let mut host = ApiHost::start(&session);
    let id = host.send_chat("a long turn");
    ok(model.wait_for_model_requests(1, WAIT), "the first request");
    let asked = Instant::now();
    let interrupt: Value = ok(
        serde_json::from_str(&host.run(&["--json", "interrupt"])),
        "interrupt's JSON",
    );
    assert_eq!(interrupt["runnerStatus"], "busy", "{interrupt}");
    let reply = host.wait_reply(&id);
    let took = asked.elapsed();
    eprintln!("nanoclaw --url interrupt during the {provider} turn: stopped after {took:.2?}");
    assert!(
        took <= INTERRUPT_BOUND,
        "took {took:.2?}\n{}",
        session.runner_log()
    );
    assert_eq!(reply["content"]["text"], "Stopped.", "{reply}");
    model.release_hangs();
    assert_delivered(&session, &host);
    session.stop_runner();
}
