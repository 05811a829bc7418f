//! The generic ACP driver against a third ACP agent (issue 44, acceptance): the real
//! `agent-runner` with `provider: acp` and `acpCommand` = the pinned OpenCode's `opencode acp`
//! answers a message and an interrupt, against the fake model (Chat Completions), with the real
//! `mcp-tools` and `nanoclaw`, in a loopback-only namespace when the machine allows it.
//!
//! Nothing here reaches the driver but ACP: OpenCode is configured the way any ACP agent is,
//! through `cliEnv` (`OPENCODE_CONFIG_CONTENT`, pointing it at the fake model), and the driver
//! gets only the command line. Needs `cargo build --workspace --bins` and the opencode CLI
//! (`scripts/install-clis.sh`); `NANOCLAW_SKIP_CLI_TESTS=1` skips.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use e2e::fake_model::{FakeModel, Step};
use e2e::harness::{
    descendants_matching, provider_cli, start_cli_test, system_actions, text_of, Session, FAKE_KEY,
    FAKE_MODEL,
};
use e2e::scenarios::WAIT;
use serde_json::json;

/// The agent's CLI (found like the opencode tests find it).
const AGENT_CLI: &str = "opencode";

/// The chat's promise for a stop.
const STOP_BOUND: Duration = Duration::from_secs(2);

fn start(test: &str) -> bool {
    start_cli_test(AGENT_CLI, test)
}

/// The runner's environment for `provider: acp` running `opencode acp` against `model`.
fn acp_env(model: &FakeModel) -> Vec<(String, String)> {
    acp_env_with(model, json!({"*": "allow", "question": "deny"}))
}

/// [`acp_env`] with OpenCode's own `permission` config: an ACP agent asks the client only where
/// its own configuration says "ask".
fn acp_env_with(model: &FakeModel, permission: serde_json::Value) -> Vec<(String, String)> {
    let opencode = provider_cli(AGENT_CLI).expect("the opencode CLI");
    let config = json!({
        "model": format!("fake/{FAKE_MODEL}"),
        "small_model": format!("fake/{FAKE_MODEL}"),
        "autoupdate": false,
        "share": "disabled",
        "provider": {"fake": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "Fake",
            "options": {"baseURL": model.openai_base_url(), "apiKey": FAKE_KEY},
            "models": {FAKE_MODEL: {"name": FAKE_MODEL, "tool_call": true}},
        }},
        "permission": permission,
    });
    let cli_env = json!({
        "OPENCODE_CONFIG_CONTENT": config.to_string(),
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    });
    vec![
        (
            "ACP_COMMAND".into(),
            json!([opencode.display().to_string(), "acp"]).to_string(),
        ),
        ("NANOCLAW_CLI_ENV".into(), cli_env.to_string()),
    ]
}

fn start_runner(session: &mut Session, model: &FakeModel) {
    start_runner_with(session, model, acp_env(model));
}

fn start_runner_with(session: &mut Session, model: &FakeModel, env: Vec<(String, String)>) {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    session.start_runner("acp", model, &env);
}

/// The `opencode acp` processes under the session's runner.
fn agent_pids(session: &Session) -> Vec<u32> {
    descendants_matching(session.runner_pid().expect("a runner"), "opencode acp")
}

/// A chat message is answered through `opencode acp`; the ACP session id is the continuation,
/// and mcp-tools runs under the agent (handed over at `session/new`).
#[test]
fn acp_opencode_answers_a_message() {
    if !start("acp_opencode_answers_a_message") {
        return;
    }
    let model = FakeModel::start_with_script([Step::text("Hello over ACP.")]).unwrap();
    let mut session = Session::new();
    start_runner(&mut session, &model);
    let id = session.send_chat("hi there").id;
    let reply = session.wait_reply(&id, WAIT);
    session.wait_completed(&id, WAIT);
    assert_eq!(text_of(&reply), "Hello over ACP.");
    let request = model.model_requests().pop().expect("a model request");
    let last = request.last_user_text().unwrap_or_default();
    assert!(last.contains("hi there"), "{}", request.summary());
    assert!(
        request.offers_mcp_tool("send_message"),
        "mcp-tools reached the agent through session/new: {}",
        request.summary()
    );
    let continuation = session.db.continuation("acp").unwrap();
    assert!(
        continuation.as_deref().is_some_and(|c| !c.is_empty()),
        "the ACP session id is the continuation"
    );
    let agents = agent_pids(&session);
    assert_eq!(agents.len(), 1, "one agent process");
    assert_eq!(descendants_matching(agents[0], "mcp-tools").len(), 1);
    session.stop_runner();
    std::thread::sleep(Duration::from_millis(300));
    for pid in agents {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(
            stat.is_empty() || stat.contains(") Z "),
            "{pid} outlived the runner: {stat}"
        );
    }
    let log = session.runner_log();
    assert!(log.contains("ACP agent initialized"), "{log}");
}

/// `nanoclaw interrupt` while the model stalls: `session/cancel`, the row gets `Stopped.` within
/// 2 s, and the next message continues the same session in the same agent process.
#[test]
fn acp_opencode_stops_on_interrupt_and_continues() {
    if !start("acp_opencode_stops_on_interrupt_and_continues") {
        return;
    }
    let model = FakeModel::start_with_script([Step::hang().timeout_ms(120_000)]).unwrap();
    model.set_default_text("Still here.");
    let mut session = Session::new();
    start_runner(&mut session, &model);
    let id = session.send_chat("a long turn").id;
    model.wait_for_model_requests(1, WAIT).unwrap();
    let continuation = session.db.continuation("acp").unwrap();
    let agents = agent_pids(&session);
    let asked = Instant::now();
    let out = session.nanoclaw(&["interrupt"]);
    assert!(out.status.success(), "{out:?}");
    let reply = session.wait_reply(&id, WAIT);
    let took = asked.elapsed();
    eprintln!("nanoclaw interrupt during the acp (opencode acp) turn: stopped after {took:.2?}");
    assert!(
        took <= STOP_BOUND,
        "took {took:.2?}\n{}",
        session.runner_log()
    );
    assert_eq!(text_of(&reply), "Stopped.");
    model.release_hangs();
    session.wait_until("the runner idle", WAIT, |s| {
        s.db.runner_state()
            .ok()
            .flatten()
            .is_some_and(|r| r.status == "idle")
    });
    let next = session.send_chat("still there?").id;
    let reply = session.wait_reply(&next, WAIT);
    assert_eq!(text_of(&reply), "Still here.");
    assert_eq!(session.db.continuation("acp").unwrap(), continuation);
    assert_eq!(agent_pids(&session), agents, "the agent survived the stop");
    session.stop_runner();
}

/// OpenCode's shell tool call as the fake model scripts it (Chat Completions).
fn shell(command: &str) -> Step {
    Step::raw_tool_call("bash", json!({"command": command, "description": "run it"}))
}

/// The agent asks permission for its shell (its own config says "ask" for `bash`); the runner's
/// deny rule answers `reject_once` through ACP: the command never runs and a `tool_decision` row
/// records the policy's refusal. OpenCode 1.18.33 ends its turn on a rejection (measured: no
/// further model request), so the message completes without a reply; the next one is answered.
#[test]
fn acp_opencode_permission_request_denied_by_the_policy() {
    if !start("acp_opencode_permission_request_denied_by_the_policy") {
        return;
    }
    let model =
        FakeModel::start_with_script([shell("rm -rf target"), Step::text("The directory stays.")])
            .unwrap();
    let mut session = Session::new();
    let target = session.workspace.join("agent/target");
    std::fs::create_dir_all(target.join("debug")).unwrap();
    session.write_config(&json!({"toolPolicy": {"deny": ["Bash(rm *)"]}}));
    let env = acp_env_with(
        &model,
        json!({"*": "allow", "bash": "ask", "question": "deny"}),
    );
    start_runner_with(&mut session, &model, env);
    let id = session.send_chat("clean the build").id;
    session.wait_completed(&id, WAIT);
    assert_eq!(
        model.model_requests().len(),
        1,
        "OpenCode stops at a rejection"
    );
    assert!(
        target.join("debug").is_dir(),
        "rm -rf target ran despite the deny rule"
    );
    let decisions = system_actions(&session, "tool_decision");
    assert_eq!(decisions.len(), 1, "{decisions:#?}");
    let decision = decisions[0].to_string();
    assert!(
        decision.contains("deny") && decision.contains("rm -rf target"),
        "{decision}"
    );
    let next = session.send_chat("and now?").id;
    let reply = session.wait_reply(&next, WAIT);
    assert_eq!(text_of(&reply), "The directory stays.");
    session.stop_runner();
}

/// The policy asks: the runner's chat question is answered Approve, the option `allow_once`
/// goes back over ACP and the command runs.
#[test]
fn acp_opencode_permission_request_asked_and_approved() {
    if !start("acp_opencode_permission_request_asked_and_approved") {
        return;
    }
    let model =
        FakeModel::start_with_script([shell("touch approved-file"), Step::text("Finished.")])
            .unwrap();
    let mut session = Session::new();
    session.write_config(&json!({"toolPolicy": {"ask": ["Bash"], "askTimeoutSeconds": 300}}));
    let env = acp_env_with(
        &model,
        json!({"*": "allow", "bash": "ask", "question": "deny"}),
    );
    start_runner_with(&mut session, &model, env);
    let id = session.send_chat("make the file").id;
    let question = session.wait_question(WAIT);
    let text = question["question"].as_str().unwrap_or_default();
    assert!(
        text.contains("Bash") && text.contains("touch approved-file"),
        "{question:#}"
    );
    let touched = session.workspace.join("agent/approved-file");
    assert!(!touched.exists(), "the command ran before the answer");
    let question_id = question["questionId"].as_str().unwrap().to_owned();
    session.answer_question(&question_id, "Approve");
    let reply = session.wait_reply(&id, WAIT);
    assert_eq!(text_of(&reply), "Finished.");
    assert!(touched.exists(), "the approved command did not run");
    session.stop_runner();
}
