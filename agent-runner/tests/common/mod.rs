//! The in-process runner fixture shared by the loop tests: a session DB in a temp dir, the
//! mock provider, and the runner on a task (tests/loop.rs, approvals.rs, budgets.rs, tasks.rs).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use agent_runner::runner::{Runner, RunnerOptions};
use provider::mock::MockProvider;
use schema::{MessageIn, MessageOut, NewMessageIn, Routing, SessionDb};
use serde_json::{json, Value};
use tokio::sync::oneshot;

/// A runner on the mock over a session DB in a temp dir.
pub(crate) struct Fixture {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) db: SessionDb,
    pub(crate) mock: MockProvider,
    /// What `start` runs the runner with (before its tweak): [`options`] unless a test file
    /// sets its own.
    pub(crate) options: RunnerOptions,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

pub(crate) fn options(dir: &std::path::Path) -> RunnerOptions {
    let mut options = RunnerOptions::for_workspace(dir);
    options.idle_poll = Duration::from_millis(200);
    options.active_poll = Duration::from_millis(50);
    options.heartbeat = Duration::from_secs(1);
    options.query_retries = 1;
    options
}

impl Fixture {
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let db = SessionDb::open(dir.path().join("session.db")).unwrap();
        Self::with_db(dir, db)
    }

    /// A fixture over `db`, a session DB in `dir` opened by the caller.
    pub(crate) fn with_db(dir: tempfile::TempDir, db: SessionDb) -> Self {
        Self {
            options: options(dir.path()),
            dir,
            db,
            mock: MockProvider::new(),
            stop: None,
            task: None,
        }
    }

    pub(crate) fn with_delay(delay: Duration) -> Self {
        let mut fixture = Self::new();
        fixture.mock = MockProvider::with_delay(delay);
        fixture
    }

    pub(crate) fn start(&mut self) {
        self.start_with(|_| {});
    }

    pub(crate) fn start_with(&mut self, tweak: impl FnOnce(&mut RunnerOptions)) {
        let mut options = self.options.clone();
        tweak(&mut options);
        let runner = Runner::new(self.db.clone(), Arc::new(self.mock.clone()), options).unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        self.stop = Some(tx);
        self.task = Some(tokio::spawn(runner.run(async move {
            let _ = rx.await;
        })));
    }

    /// Stops the runner; panics unless it ended cleanly.
    pub(crate) async fn stop(&mut self) {
        self.stop_with_result().await.unwrap();
    }

    /// Stops the runner and returns what it returned.
    pub(crate) async fn stop_with_result(&mut self) -> anyhow::Result<()> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        self.finished().await
    }

    /// Waits for the runner to end (by itself unless stopped) and returns what it returned.
    pub(crate) async fn finished(&mut self) -> anyhow::Result<()> {
        let Some(task) = self.task.take() else {
            return Ok(());
        };
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .unwrap()
            .unwrap()
    }

    pub(crate) fn insert(&self, row: NewMessageIn) -> String {
        self.db.insert_in(&row).unwrap().id
    }

    pub(crate) fn chat(&self, text: &str) -> String {
        self.insert(chat(text))
    }

    pub(crate) fn row(&self, id: &str) -> MessageIn {
        self.db.message_in(id).unwrap().unwrap()
    }

    pub(crate) fn outs(&self) -> Vec<MessageOut> {
        self.db.all_messages_out().unwrap()
    }

    /// Every `system` row of `action`, its content as JSON.
    pub(crate) fn system_outs(&self, action: &str) -> Vec<Value> {
        self.outs()
            .iter()
            .filter(|o| o.kind == "system")
            .map(|o| serde_json::from_str::<Value>(&o.content).unwrap())
            .filter(|c| c["action"] == action)
            .collect()
    }

    /// Polls `cond` until it holds; 15 s of real time at most (real, so that tests on paused
    /// tokio time can wait for a process too).
    pub(crate) async fn wait_for(&self, what: &str, mut cond: impl FnMut(&Self) -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        while !cond(self) {
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub(crate) async fn wait_completed(&self, id: &str) {
        self.wait_for("completion", |f| f.row(id).status == "completed")
            .await;
    }
}

pub(crate) fn routing() -> Routing {
    Routing {
        channel_type: Some("slack".into()),
        platform_id: Some("C1".into()),
        thread_id: Some("T9".into()),
    }
}

pub(crate) fn chat(text: &str) -> NewMessageIn {
    chat_with(text, routing())
}

/// A chat row from Ann with `routing`.
pub(crate) fn chat_with(text: &str, routing: Routing) -> NewMessageIn {
    let mut row = NewMessageIn::new(
        "chat",
        json!({"sender": "Ann", "senderId": "u1", "text": text}).to_string(),
    );
    row.routing = routing;
    row
}

pub(crate) fn text_of(row: &MessageOut) -> String {
    serde_json::from_str::<Value>(&row.content).unwrap()["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}
