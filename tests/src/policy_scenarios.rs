//! Scenarios of the tool policy (issue 16, points 1-3), shared by every CLI: a `deny` rule the
//! CLI enforces (the command never runs, the model receives the refusal), an `ask` rule answered
//! with `nanoclaw answer` (Deny, Approve), not at all (denied after `askTimeoutSeconds`) or cut
//! short by `/stop`, and an approval-stop tool that ends the turn right after its result; and
//! issue 41's acceptance: the bypass forms of a `deny` and an `ask` rule, an undecidable command
//! refused with its reason, all judged by the runner on every CLI. The
//! runner's config.json carries `toolPolicy` and `approvalStopTools` (docs/contract/config.md).
//! Re-exported by [`crate::scenarios`] so that `scenario_tests!` finds them.
//!
//! What differs per CLI is data here: whether the driver learns of a call refused by a `deny`
//! rule and reports it (a `tool_decision` row by `policy`), see [`reports_policy_denials`].

use std::path::PathBuf;

use schema::MessageOut;
use serde_json::{json, Value};

use crate::fake_model::{FakeModel, LoggedRequest, Step};
use crate::harness::{chat_outs, content, system_actions, test_routing, text_of, Session};
use crate::secrets::shell_step;
use crate::support::{cli_pids, ok, some, user_texts, WAIT};

/// The policy scenarios every CLI runs alike, declared once: `policy_scenario_tests! { CLI }` in
/// each `tests/tests/e2e_<cli>.rs`.
#[macro_export]
macro_rules! policy_scenario_tests {
    ($cli:expr) => {
        // Issue 16: tool policy, approvals, approval stops (tests/src/policy_scenarios.rs).
        $crate::scenario_tests! { $cli;
            /// `deny: ["Bash(rm *)"]`: `rm -rf target` never runs, the model's next request
            /// carries the refusal as the tool result.
            policy_deny_rule_refuses_the_command();

            /// `ask: ["Bash"]` answered Deny with `nanoclaw answer`: the command waited, the file
            /// system is unchanged, a `tool_decision` row says deny by user.
            policy_ask_answered_deny_leaves_the_files_unchanged();

            /// `ask: ["Bash"]` answered Approve: the command runs, a row says allow by user.
            policy_ask_answered_approve_runs_the_command();

            /// `ask: ["Bash"]` unanswered: denied after `askTimeoutSeconds`, a row says deny by
            /// timeout, the turn ends with the model's reply.
            policy_ask_without_an_answer_is_denied_after_the_timeout();

            /// `approvalStopTools: ["mcp__nanoclaw__send_message"]`: the message is delivered,
            /// no model request follows its result until the next user message, which continues
            /// the same session.
            policy_approval_stop_ends_the_turn_after_the_tool_result();

            /// `/stop` while an approval waits: `Stopped.`, the question withdrawn, a row says
            /// deny by stop, the command never runs, the next message is answered.
            policy_stop_while_an_approval_waits_denies_it();

            /// Issue 41: `deny: ["Bash(rm *)", "Bash(cat *)"]` against the bypass forms in one
            /// turn (`sh -c`, `/bin/rm`, `'rm'`, `xargs rm`, `find -exec rm`, a known-safe
            /// `cat`): `target` stays, a deny row per call; `X=rm; $X -rf target` is refused
            /// with the reason and an `undecidable` row; `touch still-runs` runs.
            policy_deny_rules_hold_against_bypass_forms();

            /// Issue 41: `ask: ["Bash(git push*)"]`: `git -C repo push` waits for `nanoclaw
            /// answer` (nothing pushed before), runs once approved, a row says allow by user.
            policy_ask_rule_holds_for_git_dash_c_push();

            /// Issue 41: `ask: ["Bash(rm *)"]` only: `X=rm; $X -rf target` is asked, the
            /// question says the runner could not tell what it runs; answered Deny, `target`
            /// stays, the row says deny by user and `undecidable`, the model is told to write
            /// the command literally; `touch still-runs` in the same turn runs.
            policy_undecidable_command_under_an_ask_rule_is_asked_with_the_reason();
        }
    };
}

/// The command the `ask` scenarios run: it leaves a file behind when it runs.
const TOUCH: &str = "touch approved-file";
/// The file [`TOUCH`] creates, in the agent's directory (the CLI's working directory).
const TOUCHED: &str = "approved-file";
/// How long an `ask` waits in the timeout scenario.
const SHORT_ASK_TIMEOUT_SECS: u64 = 3;
/// How long an `ask` may wait in the scenarios that answer it: far beyond the test's pace, so
/// the answer, never the timeout, decides.
const LONG_ASK_TIMEOUT_SECS: u64 = 300;
/// Words one of which a refusal the model receives contains, whichever CLI or driver words it
/// (Claude's "Permission … has been denied" or the driver's hook "the tool policy does not allow
/// this Bash call", Codex's "rejected", OpenCode's "prevents you from using", or the runner's own
/// reason: "denied by the user", "no answer within N s").
const REFUSAL_WORDS: [&str; 7] = [
    "denied",
    "rejected",
    "declined",
    "not allow",
    "prevent",
    "no answer",
    "refused",
];

/// Whether the driver learns of a call that a `deny` rule refuses (and emits `ToolDenied`,
/// recorded as a `tool_decision` row by `policy`), rather than the CLI refusing it without
/// telling (then no row; the refusal is still the model's tool result). Measured: all three do.
/// Claude hands the call to the driver's PreToolUse hook, which refuses it; Codex (approval
/// policy `untrusted`) sends an approval request the driver declines; OpenCode refuses it by its
/// own `permission` rule and the driver reads the refusal from the tool part's error.
pub fn reports_policy_denials(provider: &str) -> bool {
    match provider {
        "claude" | "codex" | "opencode" => true,
        other => panic!("no policy behaviour known for provider {other}: add it here"),
    }
}

fn fake_model(steps: impl IntoIterator<Item = Step>) -> FakeModel {
    ok(
        FakeModel::start_with_script(steps),
        "starting the fake model",
    )
}

/// The agent's directory: the CLI's working directory, where a relative path lands.
fn agent_dir(session: &Session) -> PathBuf {
    session.workspace.join("agent")
}

/// The `tool_decision` rows so far: their payloads, with the row itself (for its routing).
fn decisions(session: &Session) -> Vec<(Value, MessageOut)> {
    session
        .outs()
        .into_iter()
        .filter(|o| o.kind == "system")
        .filter_map(|o| {
            let c = content(&o);
            (c["action"] == "tool_decision").then(|| (c["payload"].clone(), o))
        })
        .collect()
}

/// Asserts that the one `tool_decision` row is `decision` by `by` for the shell command
/// `command`, routed like the turn's replies.
fn assert_one_decision(session: &Session, command: &str, decision: &str, by: &str) {
    let rows = decisions(session);
    assert_eq!(rows.len(), 1, "one tool_decision row: {rows:#?}");
    let (payload, row) = &rows[0];
    assert_eq!(payload["tool"], "Bash", "{payload}");
    assert_eq!(payload["decision"], decision, "{payload}");
    assert_eq!(payload["by"], by, "{payload}");
    let summary = payload["summary"].as_str().unwrap_or_default();
    assert!(
        summary.contains(command),
        "the summary names the command: {payload}"
    );
    assert_eq!(
        row.routing,
        test_routing(),
        "routed like the replies: {row:#?}"
    );
}

/// The tool result the model received for the one tool call of the turn: the last tool result
/// of the request after it (the second model request).
fn refusal_seen_by_the_model(model: &FakeModel) -> String {
    let requests = model.model_requests();
    let request: &LoggedRequest = some(requests.get(1), "the request after the tool call");
    assert!(
        request.tail_is_tool_result(),
        "the second request answers the tool call: {}",
        request.summary()
    );
    let result = some(request.tool_results().pop(), "a tool result");
    let lower = result.to_lowercase();
    assert!(
        REFUSAL_WORDS.iter().any(|w| lower.contains(w)),
        "the model received no refusal as the tool result: {result:?}"
    );
    result
}

/// The labels of a question row's options (plain strings or `{label, …}` objects).
fn option_labels(question: &Value) -> Vec<String> {
    question["options"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| match o {
            Value::String(label) => label.clone(),
            other => other["label"].as_str().unwrap_or_default().to_owned(),
        })
        .collect()
}

/// The runner's status now.
fn runner_status(session: &Session) -> String {
    some(
        ok(session.db.runner_state(), "reading the runner state"),
        "a runner state",
    )
    .status
}

/// `deny: ["Bash(rm *)"]`: the model asks to run `rm -rf target`; after the turn the directory
/// still exists, the model's next request carries the refusal as the tool result, and (where the
/// CLI reports the refusal to the driver) one `tool_decision` row says deny by policy.
pub fn policy_deny_rule_refuses_the_command(provider: &str) {
    let model = fake_model([
        shell_step(provider, "rm -rf target"),
        Step::text("The directory stays."),
    ]);
    let mut session = Session::new();
    let target = agent_dir(&session).join("target");
    ok(
        std::fs::create_dir_all(target.join("debug")),
        "creating target/",
    );
    session.write_config(&json!({"toolPolicy": {"deny": ["Bash(rm *)"]}}));
    session.start_runner(provider, &model, &[]);
    let id = session.send_chat("clean the build").id;
    let reply = session.wait_reply(&id, WAIT);
    assert_eq!(text_of(&reply), "The directory stays.");
    assert!(
        target.join("debug").is_dir(),
        "rm -rf target ran despite the deny rule"
    );
    let refusal = refusal_seen_by_the_model(&model);
    eprintln!("{provider}: the model received the refusal {refusal:?}");
    // Codex refuses `rm -f` style commands on its own when nobody is asked (approval policy
    // `never`, the allow-everything setting), measured on 0.169: the refusal must be the
    // policy's ("rejected by user", Codex's words for a declined approval), not that one.
    assert!(
        !refusal.contains("rm -f style commands are not permitted"),
        "{provider} refused by its own rule, the policy never acted: {refusal}"
    );
    if reports_policy_denials(provider) {
        assert_one_decision(&session, "rm -rf target", "deny", "policy");
    } else {
        assert!(decisions(&session).is_empty(), "{:#?}", decisions(&session));
    }
    // No question was asked: a deny rule never becomes a question.
    assert!(
        session
            .outs()
            .iter()
            .all(|o| content(o).get("questionId").is_none()),
        "a deny rule asked the user"
    );
    session.stop_runner();
}

/// How an `ask` scenario answers the question.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Answer {
    Approve,
    Deny,
    Nothing,
}

/// A runner whose policy asks about every `Bash` call (`askTimeoutSeconds`: `timeout`), sent a
/// message that makes `model`'s agent run [`TOUCH`], up to the question the runner posts: the
/// session, the file [`TOUCH`] would create, the message's id and the question row.
fn asked_to_touch(
    provider: &str,
    model: &FakeModel,
    timeout: u64,
) -> (Session, PathBuf, String, Value) {
    let mut session = Session::new();
    session.write_config(&json!({
        "toolPolicy": {"ask": ["Bash"], "askTimeoutSeconds": timeout}
    }));
    session.start_runner(provider, model, &[]);
    let touched = agent_dir(&session).join(TOUCHED);
    let id = session.send_chat("make the file").id;
    let question = session.wait_question(WAIT);
    (session, touched, id, question)
}

/// An `ask: ["Bash"]` turn that runs [`TOUCH`], answered by `answer`: the command waits (the
/// question row with Approve/Deny naming the command, status `waiting_user`, no second model
/// request, no file), then the answer decides: the file exists only when approved, one
/// `tool_decision` row records it, the question is closed and the turn ends with the model's
/// reply.
fn ask_scenario(provider: &str, answer: Answer) {
    let model = fake_model([shell_step(provider, TOUCH), Step::text("Finished.")]);
    let timeout = match answer {
        Answer::Nothing => SHORT_ASK_TIMEOUT_SECS,
        Answer::Approve | Answer::Deny => LONG_ASK_TIMEOUT_SECS,
    };
    let (mut session, touched, id, question) = asked_to_touch(provider, &model, timeout);
    // The runner posts the question and switches the status in one transaction.
    assert_eq!(runner_status(&session), "waiting_user");
    assert_eq!(question["title"], "Approve Bash?", "{question:#}");
    let text = question["question"].as_str().unwrap_or_default();
    assert!(
        text.contains("Bash") && text.contains(TOUCH),
        "the question names the tool and the command: {question:#}"
    );
    assert_eq!(
        option_labels(&question),
        ["Approve", "Deny"],
        "{question:#}"
    );
    let question_id = some(question["questionId"].as_str(), "a question id").to_owned();
    assert!(!touched.exists(), "the command ran before the answer");
    assert_eq!(
        model.model_requests().len(),
        1,
        "the CLI waits for the answer"
    );
    let (option, decision, by) = match answer {
        Answer::Approve => (Some("Approve"), "allow", "user"),
        Answer::Deny => (Some("Deny"), "deny", "user"),
        Answer::Nothing => (None, "deny", "timeout"),
    };
    if let Some(option) = option {
        session.answer_question(&question_id, option);
    }
    let reply = session.wait_reply(&id, WAIT);
    assert_eq!(text_of(&reply), "Finished.");
    assert_eq!(
        touched.exists(),
        answer == Answer::Approve,
        "the file exists exactly when the command was approved"
    );
    assert_one_decision(&session, TOUCH, decision, by);
    if answer != Answer::Approve {
        let refusal = refusal_seen_by_the_model(&model);
        eprintln!("{provider}: the model received the refusal {refusal:?} ({answer:?})");
    }
    assert!(
        !ok(
            session.db.question_open(&question_id),
            "reading the question"
        ),
        "the question is still open after the {answer:?} case"
    );
    assert_eq!(
        chat_outs(&session).iter().map(text_of).collect::<Vec<_>>(),
        ["Finished."]
    );
    session.wait_until("the runner idle", WAIT, |s| runner_status(s) == "idle");
    session.stop_runner();
}

/// `ask: ["Bash"]` answered Deny: see [`ask_scenario`].
pub fn policy_ask_answered_deny_leaves_the_files_unchanged(provider: &str) {
    ask_scenario(provider, Answer::Deny);
}

/// `ask: ["Bash"]` answered Approve: see [`ask_scenario`].
pub fn policy_ask_answered_approve_runs_the_command(provider: &str) {
    ask_scenario(provider, Answer::Approve);
}

/// `ask: ["Bash"]` with a short `askTimeoutSeconds` and no answer: see [`ask_scenario`].
pub fn policy_ask_without_an_answer_is_denied_after_the_timeout(provider: &str) {
    ask_scenario(provider, Answer::Nothing);
}

/// `approvalStopTools: ["mcp__nanoclaw__send_message"]`: the model calls send_message and its
/// script would go on; the message row is delivered, the turn ends right after the tool result
/// (the model gets no request until the next user message, and the runner writes no reply of its
/// own), the CLI process lives on, and the next user message is answered in the same session.
pub fn policy_approval_stop_ends_the_turn_after_the_tool_result(provider: &str) {
    const PLAN: &str = "Plan: 1. back up 2. migrate. Approve?";
    let model = fake_model([
        Step::tool_call("send_message", json!({"text": PLAN})),
        Step::text("Migrating now."),
    ]);
    let mut session = Session::new();
    session.write_config(&json!({"approvalStopTools": ["mcp__nanoclaw__send_message"]}));
    session.start_runner(provider, &model, &[]);
    let first = session.send_chat("plan the migration").id;
    session.wait_completed(&first, WAIT);
    let pids = cli_pids(&session, provider);
    assert!(!pids.is_empty(), "no CLI process after the stop");
    assert_eq!(
        chat_outs(&session).iter().map(text_of).collect::<Vec<_>>(),
        [PLAN],
        "the plan delivered, and no reply of the runner's own"
    );
    assert!(system_actions(&session, "query_error").is_empty());
    let requests = model.model_requests();
    assert_eq!(
        requests.len(),
        1,
        "a model request followed the approval-stop tool's result: {:#?}",
        requests
            .iter()
            .map(LoggedRequest::summary)
            .collect::<Vec<_>>()
    );
    session.wait_until("the runner idle", WAIT, |s| runner_status(s) == "idle");

    let next = session.send_chat("approved, go ahead").id;
    let reply = session.wait_reply(&next, WAIT);
    assert_eq!(text_of(&reply), "Migrating now.");
    let requests = model.model_requests();
    assert_eq!(requests.len(), 2, "one request for the next message");
    let texts = user_texts(provider, &requests[1]).join("\n");
    assert!(
        texts.contains("plan the migration") && texts.contains("approved, go ahead"),
        "the next request lost the history: {texts}"
    );
    let results = requests[1].tool_results().join("\n");
    assert!(
        !requests[1].tool_results().is_empty(),
        "the send_message result is in the history: {results}"
    );
    assert_eq!(
        cli_pids(&session, provider),
        pids,
        "the CLI process lived on"
    );
    assert_eq!(
        chat_outs(&session).iter().map(text_of).collect::<Vec<_>>(),
        [PLAN, "Migrating now."]
    );
    session.stop_runner();
}

/// `/stop` while an `ask` approval waits: the turn ends with `Stopped.`, the question is
/// withdrawn (an answer now would be an ordinary message), one `tool_decision` row says deny by
/// stop, the command never runs (not even later), and the next message is answered in the same
/// session with no model request in between.
pub fn policy_stop_while_an_approval_waits_denies_it(provider: &str) {
    let model = fake_model([shell_step(provider, TOUCH)]);
    model.set_default_text("Still here.");
    let (mut session, touched, id, question) =
        asked_to_touch(provider, &model, LONG_ASK_TIMEOUT_SECS);
    let question_id = some(question["questionId"].as_str(), "a question id").to_owned();
    let stop = session.send_chat("/stop").id;
    let reply = session.wait_reply(&id, WAIT);
    assert_eq!(text_of(&reply), "Stopped.");
    session.wait_completed(&stop, WAIT);
    assert!(
        !ok(
            session.db.question_open(&question_id),
            "reading the question"
        ),
        "the question still waits after /stop"
    );
    assert_one_decision(&session, TOUCH, "deny", "stop");
    session.wait_until("the runner idle", WAIT, |s| runner_status(s) == "idle");
    let next = session.send_chat("anything else?").id;
    let reply = session.wait_reply(&next, WAIT);
    assert_eq!(text_of(&reply), "Still here.");
    let requests = model.model_requests();
    assert_eq!(
        requests.len(),
        2,
        "one request per message: {:#?}",
        requests
            .iter()
            .map(LoggedRequest::summary)
            .collect::<Vec<_>>()
    );
    assert!(
        user_texts(provider, &requests[1])
            .join("\n")
            .contains("anything else?"),
        "the second request is the next message's"
    );
    assert!(!touched.exists(), "the stopped command ran");
    assert_eq!(
        chat_outs(&session).iter().map(text_of).collect::<Vec<_>>(),
        ["Stopped.", "Still here."]
    );
    session.stop_runner();
}

/// The bypass forms of issue 41: each would remove `target` if it ran.
const BYPASS_FORMS: [&str; 5] = [
    "sh -c 'rm -rf target'",
    "/bin/rm -rf target",
    "'rm' -rf target",
    "echo target | xargs rm -rf",
    "find . -maxdepth 1 -name target -exec rm -rf {} +",
];
/// A command whose program name is not a literal: the policy cannot tell what it runs.
const UNDECIDABLE: &str = "X=rm; $X -rf target";
/// A command Codex counts as known-safe (it runs such commands unasked under `untrusted`
/// unless told otherwise), denied here by `Bash(cat *)`.
const KNOWN_SAFE_DENIED: &str = "cat secret.txt";
/// What `secret.txt` holds: the model must never see it.
const SECRET: &str = "s3cr3t-c0ntent";
/// An allowed command in the same turn: it leaves `still-runs` behind.
const ALLOWED: &str = "touch still-runs";
/// What the model is told when a command could not be decided (crate `provider`'s refusal).
const WRITE_LITERALLY: &str = "write the command literally";

/// The `tool_decision` row whose summary is exactly `command`.
fn decision_for(session: &Session, command: &str) -> Option<Value> {
    decisions(session)
        .into_iter()
        .map(|(payload, _)| payload)
        .find(|payload| payload["summary"].as_str() == Some(command))
}

/// Issue 41, `deny`: the model runs, in one turn, every bypass form of `rm -rf target`, a
/// known-safe `cat` a rule denies, the undecidable `X=rm; $X -rf target` and the allowed
/// `touch still-runs`. After the turn `target` and its content are in place, the secret never
/// reached the model, each refused call has its `tool_decision` deny row by policy (the
/// undecidable one with `undecidable`), the model learned the reason ("write the command
/// literally") right after the undecidable call, and `still-runs` exists. No question asked.
pub fn policy_deny_rules_hold_against_bypass_forms(provider: &str) {
    let refused: Vec<&str> = BYPASS_FORMS
        .iter()
        .copied()
        .chain([KNOWN_SAFE_DENIED, UNDECIDABLE])
        .collect();
    let mut steps: Vec<Step> = refused.iter().map(|c| shell_step(provider, c)).collect();
    steps.push(shell_step(provider, ALLOWED));
    steps.push(Step::text("The directory stays."));
    let model = fake_model(steps);
    let mut session = Session::new();
    let dir = agent_dir(&session);
    let target = dir.join("target");
    ok(
        std::fs::create_dir_all(target.join("debug")),
        "creating target/",
    );
    ok(
        std::fs::write(dir.join("secret.txt"), SECRET),
        "writing secret.txt",
    );
    session.write_config(&json!({"toolPolicy": {"deny": ["Bash(rm *)", "Bash(cat *)"]}}));
    session.start_runner(provider, &model, &[]);
    let id = session.send_chat("clean the build").id;
    let reply = session.wait_reply(&id, WAIT);
    assert_eq!(text_of(&reply), "The directory stays.");

    let requests = model.model_requests();
    for (i, request) in requests.iter().enumerate() {
        eprintln!(
            "{provider}: request {i}: {} results {:?}",
            request.summary(),
            request.tool_results().last()
        );
    }
    for (payload, _) in decisions(&session) {
        eprintln!("{provider}: tool_decision {payload}");
    }
    assert!(
        target.join("debug").is_dir(),
        "{provider}: a bypass form removed target/"
    );
    assert!(
        dir.join("still-runs").exists(),
        "{provider}: the allowed command did not run"
    );
    assert!(
        requests.iter().all(|r| !r.raw_body.contains(SECRET)),
        "{provider}: the model saw the secret: cat ran despite Bash(cat *)"
    );
    assert_eq!(
        requests.len(),
        refused.len() + 2,
        "{provider}: one request per tool call and one for the reply"
    );
    let mut missing = Vec::new();
    for command in &refused {
        match decision_for(&session, command) {
            Some(payload) => {
                assert_eq!(payload["tool"], "Bash", "{payload}");
                assert_eq!(payload["decision"], "deny", "{payload}");
                assert_eq!(payload["by"], "policy", "{payload}");
            }
            None => missing.push(*command),
        }
    }
    assert!(
        missing.is_empty(),
        "{provider}: no tool_decision deny row for {missing:?}"
    );
    assert_eq!(
        decisions(&session).len(),
        refused.len(),
        "{provider}: one row per refused call, none for the allowed one"
    );
    let undecidable = some(decision_for(&session, UNDECIDABLE), "the undecidable row");
    let reason = undecidable["undecidable"].as_str().unwrap_or_default();
    assert!(
        !reason.is_empty(),
        "{provider}: the row does not say the command was not decidable: {undecidable}"
    );
    // The request after the undecidable call (its index among the calls, plus one) tells the
    // model why: in the tool result (Claude, OpenCode) or a developer note beside Codex's
    // "rejected by user" result.
    let at = refused.len();
    let next = &requests[at];
    let told = next.raw_body.to_lowercase().contains(WRITE_LITERALLY);
    assert!(
        told,
        "{provider}: the model was not told to write the command literally: {:?} / {}",
        next.tool_results().last(),
        next.system_text()
    );
    if provider != "codex" {
        let result = some(next.tool_results().pop(), "the undecidable call's result");
        assert!(
            result.to_lowercase().contains(WRITE_LITERALLY),
            "{provider}: the reason is not in the tool result: {result:?}"
        );
    }
    assert!(
        session
            .outs()
            .iter()
            .all(|o| content(o).get("questionId").is_none()),
        "{provider}: a deny rule asked the user"
    );
    session.stop_runner();
}

/// Runs `git` with `args` in `dir` (a test-side setup step); panics when it fails.
fn git(dir: &std::path::Path, args: &[&str]) {
    let out = ok(
        std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .args(["-c", "init.defaultBranch=main"])
            .args(args)
            .current_dir(dir)
            .output(),
        "running git",
    );
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The branches `remote.git` has (what a push adds).
fn pushed_refs(remote: &std::path::Path) -> Vec<String> {
    ok(std::fs::read_dir(remote.join("refs/heads")), "listing refs")
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Issue 41, `ask`: `git -C repo push`, which a textual `git push*` misses, waits for the
/// user: the question names the command, status `waiting_user`, nothing pushed and no second
/// model request before the answer; approved, the push runs (the bare remote has the branch),
/// one row says allow by user, and the turn ends with the model's reply.
pub fn policy_ask_rule_holds_for_git_dash_c_push(provider: &str) {
    const PUSH: &str = "git -C repo push";
    let model = fake_model([shell_step(provider, PUSH), Step::text("Pushed.")]);
    let mut session = Session::new();
    let dir = agent_dir(&session);
    ok(std::fs::create_dir_all(&dir), "creating the agent dir");
    git(&dir, &["init", "--bare", "-q", "remote.git"]);
    git(&dir, &["init", "-q", "repo"]);
    let repo = dir.join("repo");
    ok(std::fs::write(repo.join("a.txt"), "a"), "writing a.txt");
    git(&repo, &["add", "a.txt"]);
    git(&repo, &["commit", "-q", "-m", "a"]);
    git(&repo, &["remote", "add", "origin", "../remote.git"]);
    // An upstream, so that the bare `git push` of the issue pushes `main`.
    git(&repo, &["config", "branch.main.remote", "origin"]);
    git(&repo, &["config", "branch.main.merge", "refs/heads/main"]);
    let remote = dir.join("remote.git");
    session.write_config(&json!({
        "toolPolicy": {"ask": ["Bash(git push*)"], "askTimeoutSeconds": LONG_ASK_TIMEOUT_SECS}
    }));
    session.start_runner(provider, &model, &[]);
    let id = session.send_chat("push it").id;
    let question = session.wait_question(WAIT);
    assert_eq!(runner_status(&session), "waiting_user");
    let text = question["question"].as_str().unwrap_or_default();
    assert!(
        text.contains(PUSH),
        "the question names the command: {question:#}"
    );
    assert!(
        pushed_refs(&remote).is_empty(),
        "{provider}: the push ran before the answer"
    );
    assert_eq!(
        model.model_requests().len(),
        1,
        "the CLI waits for the answer"
    );
    let question_id = some(question["questionId"].as_str(), "a question id").to_owned();
    session.answer_question(&question_id, "Approve");
    let reply = session.wait_reply(&id, WAIT);
    assert_eq!(text_of(&reply), "Pushed.");
    assert_eq!(
        pushed_refs(&remote),
        ["main"],
        "{provider}: the approved push did not run"
    );
    assert_one_decision(&session, PUSH, "allow", "user");
    session.stop_runner();
}

/// Issue 41, an undecidable command under an `ask` rule only (`ask: ["Bash(rm *)"]`, no deny
/// rule): the model runs `X=rm; $X -rf target`, then `touch still-runs`. The first waits for the
/// user: the question names the command and says that the runner could not tell what it runs
/// (status `waiting_user`, one model request, `target` in place). Answered Deny: `target` and
/// its content stay, the one `tool_decision` row says deny by the user with `undecidable`, the
/// model's next request tells it to write the command literally, and the allowed command of the
/// same turn runs (no row: allowed without asking).
pub fn policy_undecidable_command_under_an_ask_rule_is_asked_with_the_reason(provider: &str) {
    let model = fake_model([
        shell_step(provider, UNDECIDABLE),
        shell_step(provider, ALLOWED),
        Step::text("The directory stays."),
    ]);
    let mut session = Session::new();
    let dir = agent_dir(&session);
    let target = dir.join("target");
    ok(
        std::fs::create_dir_all(target.join("debug")),
        "creating target/",
    );
    session.write_config(&json!({
        "toolPolicy": {"ask": ["Bash(rm *)"], "askTimeoutSeconds": LONG_ASK_TIMEOUT_SECS}
    }));
    session.start_runner(provider, &model, &[]);
    let id = session.send_chat("clean the build").id;
    let question = session.wait_question(WAIT);
    assert_eq!(runner_status(&session), "waiting_user");
    let text = question["question"].as_str().unwrap_or_default();
    eprintln!("{provider}: the question {text:?}");
    assert!(
        text.contains(UNDECIDABLE),
        "{provider}: the question names the command: {question:#}"
    );
    assert!(
        text.contains("could not tell what this command runs"),
        "{provider}: the question does not say the command was not decidable: {question:#}"
    );
    assert!(
        target.join("debug").is_dir(),
        "{provider}: ran before the answer"
    );
    assert_eq!(
        model.model_requests().len(),
        1,
        "{provider}: the CLI waits for the answer"
    );
    let question_id = some(question["questionId"].as_str(), "a question id").to_owned();
    session.answer_question(&question_id, "Deny");
    let reply = session.wait_reply(&id, WAIT);
    assert_eq!(text_of(&reply), "The directory stays.");

    let requests = model.model_requests();
    for (i, request) in requests.iter().enumerate() {
        eprintln!(
            "{provider}: request {i}: {} results {:?}",
            request.summary(),
            request.tool_results().last()
        );
    }
    assert!(
        target.join("debug").is_dir(),
        "{provider}: the denied command removed target/"
    );
    assert!(
        dir.join("still-runs").exists(),
        "{provider}: the allowed command did not run"
    );
    assert_eq!(
        requests.len(),
        3,
        "{provider}: one request per tool call and one for the reply"
    );
    let rows = decisions(&session);
    assert_eq!(
        rows.len(),
        1,
        "{provider}: one tool_decision row: {rows:#?}"
    );
    let payload = some(decision_for(&session, UNDECIDABLE), "the undecidable row");
    assert_eq!(payload["tool"], "Bash", "{payload}");
    assert_eq!(payload["decision"], "deny", "{payload}");
    assert_eq!(payload["by"], "user", "{payload}");
    let reason = payload["undecidable"].as_str().unwrap_or_default();
    assert!(
        reason.contains("not a literal"),
        "{provider}: the row does not say the command was not decidable: {payload}"
    );
    // The request after the denied call tells the model why: in the tool result (Claude,
    // OpenCode) or a developer note beside Codex's "rejected by user" result.
    let next = &requests[1];
    assert!(
        next.raw_body.to_lowercase().contains(WRITE_LITERALLY),
        "{provider}: the model was not told to write the command literally: {:?} / {}",
        next.tool_results().last(),
        next.system_text()
    );
    if provider != "codex" {
        let result = some(next.tool_results().pop(), "the denied call's result");
        let lower = result.to_lowercase();
        assert!(
            lower.contains("denied by the user") && lower.contains(WRITE_LITERALLY),
            "{provider}: the user's refusal and the reason are not in the tool result: {result:?}"
        );
    }
    session.stop_runner();
}
