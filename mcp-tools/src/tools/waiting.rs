//! The questions of `ask_user_question` this process is waiting for, shared by every call
//! through [`super::Ctx`]: the first one switches the runner's status to `waiting_user`, the
//! last one switches it back.

use std::time::Duration;

use chrono::{DateTime, Utc};
use schema::content::out;
use schema::{NewMessageOut, OutKind, RunnerStatus};
use serde_json::Value;
use tokio::sync::{Mutex, Notify};

use super::routing::{self, Target};
use crate::db::Db;
use crate::error::ToolResult;

/// The questions this process is waiting for, and whether it switched the runner's status.
#[derive(Debug, Default)]
pub struct Waiting {
    state: Mutex<WaitingState>,
    idle: Notify,
}

#[derive(Debug, Default)]
struct WaitingState {
    count: usize,
    swapped: bool,
}

impl Waiting {
    /// Posts the question (see [`schema::SessionDb::post_question`]) and registers it as
    /// waiting: the first waiting question of this process switches `busy` → `waiting_user` in
    /// the same transaction as the question row, so no reader sees the question with the runner
    /// `busy`.
    pub(super) async fn enter(
        &self,
        db: &Db,
        question_id: &str,
        deadline: DateTime<Utc>,
        title: &str,
        question: &str,
        options: &[Value],
    ) -> ToolResult<()> {
        // Held across the write so two questions cannot both believe they are the first.
        let mut state = self.state.lock().await;
        let first = state.count == 0;
        let qid = question_id.to_owned();
        let content = out::ask_question(question_id, title, question, options);
        let (_, switched) = db
            .run(move |db| {
                let route = routing::resolve(db, &Target::default())?;
                let row = NewMessageOut::new(OutKind::ChatSdk, route.routing, &content)
                    .replying_to(route.in_reply_to);
                Ok(db.post_question(&qid, deadline, &row, first)?)
            })
            .await?;
        if first {
            state.swapped = switched;
        }
        state.count += 1;
        Ok(())
    }

    /// Unregisters a question; the last one switches `waiting_user` → `busy` back.
    pub(super) async fn leave(&self, db: &Db) {
        let mut state = self.state.lock().await;
        state.count = state.count.saturating_sub(1);
        if state.count == 0 {
            if state.swapped {
                let restored = db
                    .run(|db| {
                        Ok(db.swap_runner_status(RunnerStatus::WaitingUser, RunnerStatus::Busy)?)
                    })
                    .await;
                if let Err(err) = restored {
                    tracing::warn!(%err, "could not set runner status back to busy");
                }
            }
            state.swapped = false;
            self.idle.notify_waiters();
        }
    }

    /// Number of questions waiting now.
    pub async fn count(&self) -> usize {
        self.state.lock().await.count
    }

    /// Waits until no question waits (shutdown: lets cleanups finish), at most `limit`.
    pub async fn wait_idle(&self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.idle.notified();
            if self.count().await == 0 {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                tracing::warn!("shutting down with a question still being cleaned up");
                return;
            }
        }
    }
}
