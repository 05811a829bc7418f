//! The harness itself, with the mock provider: the runner binary answers through the session DB,
//! and the host CLI sees the reply.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use e2e::fake_model::FakeModel;
use e2e::harness::{run_in_loopback_netns, test_routing, text_of, Session};

#[test]
fn mock_session_through_the_harness() {
    if !run_in_loopback_netns("mock_session_through_the_harness") {
        return;
    }
    let model = FakeModel::start().unwrap();
    let mut session = Session::new();
    session.start_runner("mock", &model, &[]);
    let id = session.send_chat("hello through the harness").id;
    let reply = session.wait_reply(&id, Duration::from_secs(20));
    assert_eq!(reply.routing, test_routing());
    assert!(text_of(&reply).contains("hello through the harness"));
    let watched = session.nanoclaw(&["watch", "--no-follow", "--json"]);
    assert!(watched.status.success());
    assert!(String::from_utf8_lossy(&watched.stdout).contains("hello through the harness"));
    session.stop_runner();
    assert_eq!(
        session.db.runner_state().unwrap().unwrap().status,
        "stopped"
    );
}
