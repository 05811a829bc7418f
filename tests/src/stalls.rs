//! Scenarios of turns that make no progress: the model gateway down, a gateway that sends
//! headers and then stalls, rate limits (issue 10, point 1).
//!
//! The stall scenarios run with the runner's DEFAULT limits (progressNoticeSecs,
//! progressSilenceSecs, the CLIs' own timeouts and cliMaxRetries), since the bounds are
//! about what an operator gets without tuning anything.

use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::fake_model::{FakeModel, Step};
use crate::harness::{system_actions, text_of, Session};
use crate::support::{ok, some, WAIT};

/// Gateway down: a `query_error` within this long of sending the message (issue 10).
pub const GATEWAY_DOWN_BOUND: Duration = Duration::from_secs(90);
/// Headers then a stall: a `query_error` within this long.
pub const STALL_BOUND: Duration = Duration::from_secs(180);

/// The default of `cliMaxRetries`: the harness lowers it to 1 for speed; these scenarios run
/// with what an operator gets.
const DEFAULT_CLI_RETRIES: &str = "2";

/// A loopback address nothing listens on (bound, then released).
fn closed_port() -> SocketAddr {
    let listener = ok(TcpListener::bind("127.0.0.1:0"), "binding a loopback port");
    let addr = ok(listener.local_addr(), "its address");
    drop(listener);
    addr
}

/// The base URL each CLI is given for a gateway at `addr` (the harness's layout).
fn base_urls(addr: SocketAddr) -> (String, String) {
    (format!("http://{addr}"), format!("http://{addr}/v1"))
}

/// `nanoclaw status` as text.
fn status_text(session: &Session) -> String {
    let out = session.nanoclaw(&["status"]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits for the `query_error` row of a turn that makes no progress, checking meanwhile that
/// `nanoclaw status` shows what the turn waits on (the endpoint `endpoint`). Returns the row's
/// payload, how long it took, and the status line seen while waiting.
fn wait_stalled_turn(
    session: &Session,
    endpoint: &str,
    started: Instant,
    bound: Duration,
) -> (Value, Duration, String) {
    let mut waiting_line = None;
    loop {
        if let Some(row) = system_actions(session, "query_error").pop() {
            let took = started.elapsed();
            let line = some(
                waiting_line,
                &format!(
                    "`nanoclaw status` showed what the turn waited on before the error\n{}",
                    session.runner_log()
                ),
            );
            return (row["payload"].clone(), took, line);
        }
        if waiting_line.is_none() {
            let text = status_text(session);
            waiting_line = text
                .lines()
                .find(|line| line.starts_with("waiting on") && line.contains(endpoint))
                .map(str::to_owned);
            if let Some(line) = &waiting_line {
                eprintln!(
                    "after {:.1?}, `nanoclaw status` shows: {line}",
                    started.elapsed()
                );
            }
        }
        assert!(
            started.elapsed() < bound + Duration::from_secs(30),
            "no query_error within {bound:?} (+30 s)\n{}",
            session.runner_log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Checks a stall's `query_error` payload and the status after it.
fn check_stall_error(session: &Session, payload: &Value, endpoint: &str, provider: &str) {
    assert_eq!(payload["provider"], provider, "{payload}");
    assert_eq!(
        payload["endpoint"], endpoint,
        "the row names the endpoint: {payload}"
    );
    let message = payload["message"].as_str().unwrap_or_default();
    assert!(!message.is_empty(), "the row names the cause: {payload}");
    let text = status_text(session);
    assert!(
        !text.contains("waiting on"),
        "the waiting state is cleared when the turn ends:\n{text}"
    );
}

/// The model gateway is down (connection refused): the turn ends with a `query_error` row that
/// names the endpoint within 90 s, with default settings; `nanoclaw status` showed what the
/// turn waited on meanwhile; once a gateway listens there, the next message is answered.
pub fn gateway_down_ends_the_turn_within_90s(provider: &str) {
    let addr = closed_port();
    let (anthropic, openai) = base_urls(addr);
    let endpoint = if provider == "claude" {
        anthropic.clone()
    } else {
        openai.clone()
    };
    // The harness's env points at a model; these override it with the closed port.
    let placeholder = ok(FakeModel::start(), "starting a placeholder model");
    let mut session = Session::new();
    session.start_runner(
        provider,
        &placeholder,
        &[
            ("ANTHROPIC_BASE_URL", &anthropic),
            ("OPENAI_BASE_URL", &openai),
            ("NANOCLAW_CLI_MAX_RETRIES", DEFAULT_CLI_RETRIES),
        ],
    );
    let started = Instant::now();
    let first = session.send_chat("is anyone there?").id;
    let (payload, took, line) = wait_stalled_turn(&session, &endpoint, started, GATEWAY_DOWN_BOUND);
    eprintln!(
        "{provider}, gateway down: query_error after {took:.1?} (bound {GATEWAY_DOWN_BOUND:?}): \
         {payload}"
    );
    assert!(
        took <= GATEWAY_DOWN_BOUND,
        "{provider}: the query_error came after {took:.1?}\n{}",
        session.runner_log()
    );
    assert!(line.contains(&endpoint), "{line}");
    check_stall_error(&session, &payload, &endpoint, provider);
    assert!(
        payload["messageIds"].to_string().contains(&first),
        "{payload}"
    );
    assert!(
        placeholder.model_requests().is_empty(),
        "nothing reached the placeholder"
    );

    // The gateway comes back on the same address.
    let model = ok(FakeModel::start_on(addr), "the gateway returns");
    model.set_default_text("Back online.");
    let second = session.send_chat("and now?").id;
    let reply = session.wait_reply(&second, WAIT);
    assert_eq!(text_of(&reply), "Back online.");
    session.stop_runner();
}

/// The gateway answers with response headers and then sends nothing: the turn ends with a
/// `query_error` row within 3 minutes, with default settings; `nanoclaw status` showed what the
/// turn waited on; after the gateway recovers, the next message is answered.
pub fn stalled_gateway_ends_the_turn_within_3min(provider: &str) {
    // Held longer than any bound here: the fake model would otherwise answer after 60 s.
    let stall = || Step::hang_after_headers().timeout_ms(600_000);
    let model = ok(
        FakeModel::start_with_script([stall()]),
        "starting the fake model",
    );
    let endpoint = if provider == "claude" {
        model.url()
    } else {
        model.openai_base_url()
    };
    let mut session = Session::new();
    session.start_runner(
        provider,
        &model,
        &[("NANOCLAW_CLI_MAX_RETRIES", DEFAULT_CLI_RETRIES)],
    );
    // Every further request of the turn stalls too (a CLI's own retries after its timeout).
    model.set_script(std::iter::repeat_with(stall).take(20));
    let started = Instant::now();
    let first = session.send_chat("hello?").id;
    let (payload, took, line) = wait_stalled_turn(&session, &endpoint, started, STALL_BOUND);
    eprintln!(
        "{provider}, headers then a stall: query_error after {took:.1?} (bound {STALL_BOUND:?}), \
         {} model requests: {payload}",
        model.model_requests().len()
    );
    assert!(
        took <= STALL_BOUND,
        "{provider}: the query_error came after {took:.1?}\n{}",
        session.runner_log()
    );
    assert!(line.contains(&endpoint), "{line}");
    check_stall_error(&session, &payload, &endpoint, provider);
    assert!(
        payload["messageIds"].to_string().contains(&first),
        "{payload}"
    );

    // The gateway recovers.
    model.set_script([]);
    model.release_hangs();
    model.set_default_text("Recovered from the stall.");
    let second = session.send_chat("still there?").id;
    let reply = session.wait_reply(&second, WAIT);
    assert_eq!(text_of(&reply), "Recovered from the stall.");
    session.stop_runner();
}

/// A 429 with a retry-after is a passing rate limit: `query_error` says `RateLimited`,
/// retryable, with the reset time where the CLI reports it (Claude and OpenCode do; Codex
/// honours the header but does not report it), never `Quota`.
pub fn rate_limit_is_retryable_with_its_reset(provider: &str) {
    let model = ok(FakeModel::start(), "starting the fake model");
    let mut session = Session::new();
    // The runner's own retries are off so one query's requests are counted.
    session.start_runner(provider, &model, &[("NANOCLAW_QUERY_RETRIES", "0")]);
    let step = match provider {
        // OpenCode honours retry-after-ms; the provider ends the turn past cliMaxRetries.
        "opencode" => Step::error(429, "fake 429 error").retry_after_ms(1_500),
        _ => Step::error(429, "fake 429 error").retry_after_secs(2),
    };
    model.set_script(std::iter::repeat_n(step, 10));
    let id = session.send_chat("too fast?").id;
    session.wait_until("a query_error row", WAIT, |s| {
        !system_actions(s, "query_error").is_empty()
    });
    let row = some(system_actions(&session, "query_error").pop(), "the row");
    let payload = &row["payload"];
    eprintln!("{provider}, 429: {payload}");
    assert_eq!(payload["classification"], "RateLimited", "{payload}");
    assert_eq!(payload["retryable"], true, "{payload}");
    assert!(payload["messageIds"].to_string().contains(&id));
    if provider == "codex" {
        assert!(payload.get("retryAfterSecs").is_none(), "{payload}");
    } else {
        // The gateway said 2 s (1.5 s for OpenCode); the CLI adds its jitter.
        let secs = payload["retryAfterSecs"].as_u64().unwrap_or(0);
        assert!((1..=4).contains(&secs), "{payload}");
        assert!(payload["retryAt"].as_str().is_some(), "{payload}");
    }
    session.stop_runner();
}

/// A tool call is not "no progress": ask_user_question held for `hold`, past a progress silence
/// limit lowered to `silence_secs`, still completes the turn with the user's answer. The limit
/// is lowered (the rule does not depend on its value) so the scenario takes seconds, not the
/// default 120 s.
pub fn ask_user_question_held_past_the_silence_limit(
    provider: &str,
    hold: Duration,
    silence_secs: u64,
) {
    assert!(
        hold > Duration::from_secs(silence_secs),
        "hold past the limit"
    );
    let silence = silence_secs.to_string();
    crate::questions::ask_user_question_answered_with_env(
        provider,
        hold,
        &[
            ("NANOCLAW_PROGRESS_SILENCE_SECS", &silence),
            ("NANOCLAW_PROGRESS_NOTICE_SECS", &silence),
        ],
    );
}
