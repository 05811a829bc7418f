//! Preparing a prompt: script gating, attachments, rendering, and what a query starts from.

use std::sync::Arc;

use anyhow::Result;
use provider::Prompt;
use schema::content::out;
use schema::{
    Destination, InKind, InboundContent, MessageIn, NewMessageOut, OutKind, Reads, StartKeys,
};
use serde_json::json;

use crate::format::{self, FormatContext, PromptRow};
use crate::media::resolve_attachments;
use crate::script::{run_script, ScriptOutcome};
use crate::system_prompt::{build_system_prompt, PromptSources};

use super::types::{Claimed, Gated, Prepared, QueryStart, Runner, StartReads, Target};

impl Runner {
    /// Turns claimed rows into a prompt: script gating, then rendering. `None` when nothing is
    /// left for the agent. With `start` (a new query, not a follow-up), also what the query
    /// starts from, read with the prompt's destinations.
    pub(super) async fn prepare(
        &mut self,
        rows: Vec<Claimed>,
        start: bool,
    ) -> Result<Option<(Prepared, Option<QueryStart>)>> {
        match self.gate(rows).await? {
            Some(gated) => Ok(Some(self.render(gated, start).await?)),
            None => Ok(None),
        }
    }

    /// Script gating: which claimed rows go to the agent. A task's pre-agent script may skip
    /// its row or fail; that row is completed here without the agent. Context-only rows (no
    /// triggering row, or none left after the scripts) go back to `pending` to wait for a
    /// triggering row. `None` when nothing is left for the agent.
    pub(super) async fn gate(&mut self, rows: Vec<Claimed>) -> Result<Option<Gated>> {
        if rows.is_empty() {
            return Ok(None);
        }
        if !rows.iter().any(|claimed| claimed.row.trigger) {
            // Context-only rows wait for a triggering row; they were claimed with others.
            self.release_rows(rows.iter().map(|claimed| &claimed.row))
                .await?;
            return Ok(None);
        }
        let mut kept = Vec::with_capacity(rows.len());
        let mut parsed = Vec::with_capacity(rows.len());
        let mut finished_early = Vec::new();
        for Claimed {
            row,
            content,
            problems,
        } in rows
        {
            let kind = row.kind();
            for problem in &problems {
                tracing::warn!(
                    row = %row.id,
                    field = %problem.field,
                    issue = %problem.issue,
                    "content field of an unexpected type; the rest of the message stands"
                );
            }
            if let InboundContent::Unparsable { reason, .. } = &content {
                tracing::warn!(row = %row.id, %reason, "unparsable content; passing it on as text");
            }
            if let InKind::Other(kind) = &kind {
                tracing::warn!(row = %row.id, %kind, "unknown message kind; passing it on labelled");
            }
            // (A row whose process_after cannot be read never gets here: the poll takes it out of
            // the queue, see `SessionDb::eligible`.)
            let mut script_output = None;
            if let Some(script) = pre_agent_script(&content) {
                let Some(outcome) = self.run_pre_agent_script(&row.id, script).await else {
                    // The claimed rows stay `processing` for the next start's recovery, as
                    // after a query.
                    return Ok(None);
                };
                match outcome {
                    ScriptOutcome::Wake { data } => {
                        script_output = Some(data.unwrap_or(serde_json::Value::Null))
                    }
                    ScriptOutcome::Skip => {
                        tracing::info!(
                            task = %row.id,
                            "pre-agent script: wakeAgent=false; task completed without the agent"
                        );
                        finished_early.push((row, None));
                        continue;
                    }
                    ScriptOutcome::Failed { reason } => {
                        tracing::warn!(
                            task = %row.id,
                            %reason,
                            "pre-agent script failed; task skipped"
                        );
                        finished_early.push((row, Some(reason)));
                        continue;
                    }
                }
            }
            parsed.push((content, script_output));
            kept.push(row);
        }
        for (row, failure) in finished_early {
            self.finish_without_agent(row, failure).await?;
        }
        if !kept.iter().any(|row| row.trigger) {
            // Scripts removed every triggering row; context rows wait for the next one.
            self.release_rows(&kept).await?;
            return Ok(None);
        }
        Ok(Some(Gated { rows: kept, parsed }))
    }

    /// Runs a task's pre-agent script; `None` when the runner stops meanwhile. Shutdown must
    /// not wait out the script's timeout (Docker allows 10 s): dropping the run SIGKILLs its
    /// process group at once.
    pub(super) async fn run_pre_agent_script(
        &self,
        task_id: &str,
        script: &str,
    ) -> Option<ScriptOutcome> {
        let run = run_script(
            script,
            &self.options.agent_dir,
            &self.options.script_env,
            &self.options.script_limits,
        );
        tokio::select! {
            outcome = run => Some(outcome),
            () = self.stop.cancelled() => {
                tracing::info!(task = %task_id, "stopping: pre-agent script killed");
                None
            }
        }
    }

    /// What a query starts from, read now in one read transaction (when the claim did not).
    pub(super) async fn read_start(&mut self) -> Result<StartReads> {
        let provider = self.provider.name();
        let known = self.start_keys.clone();
        let reads = self
            .call_inline(move |db| db.read_in(|reads| read_start(reads, provider, known.as_ref())))
            .await?;
        self.start_keys = Some(Arc::clone(&reads.keys));
        Ok(reads)
    }

    /// Puts claimed rows back to `pending` (without counting a try).
    pub(super) async fn release_rows<'a>(
        &self,
        rows: impl IntoIterator<Item = &'a MessageIn>,
    ) -> Result<()> {
        let ids: Vec<String> = rows.into_iter().map(|r| r.id.clone()).collect();
        if !ids.is_empty() {
            self.call(move |db| db.release(&ids)).await?;
        }
        Ok(())
    }

    /// Rendering: the gated rows with their attachments, formatted as one prompt. With
    /// `start` (a new query), what the query starts from comes with it: read by the claim when
    /// it started these very rows' batch, else now, in one read transaction with the
    /// destinations. The system prompt lists the same destinations as the prompt.
    pub(super) async fn render(
        &mut self,
        gated: Gated,
        start: bool,
    ) -> Result<(Prepared, Option<QueryStart>)> {
        let Gated { rows: kept, parsed } = gated;
        let (destinations, query_start) = if start {
            let claimed_start = self.claimed_start.as_mut();
            let claimed = claimed_start.and_then(|claimed| {
                let batch = &claimed.batch;
                let same = batch.ids.len() == kept.len()
                    && batch.ids.iter().zip(&kept).all(|(id, row)| *id == row.id);
                claimed.reads.take().filter(|_| same)
            });
            let reads = match claimed {
                Some(reads) => reads,
                None => self.read_start().await?,
            };
            let (destinations, start) = query_start(reads, self.options.prompt_sources.as_ref());
            (destinations, Some(start))
        } else {
            (
                self.call_inline(|db| Ok(destinations_or_none(db.destinations())))
                    .await?,
                None,
            )
        };
        let mut media = Vec::new();
        let mut prompt_rows = Vec::with_capacity(kept.len());
        for (row, (content, script_output)) in kept.iter().zip(parsed) {
            let attachments = match &content {
                InboundContent::Chat(chat) => chat.attachments.clone(),
                InboundContent::ChatSdk(sdk) => sdk.attachments.clone(),
                _ => Vec::new(),
            };
            let notes = if attachments.is_empty() {
                Vec::new()
            } else {
                let resolved = resolve_attachments(
                    &row.id,
                    &attachments,
                    &self.options.workspace,
                    &self.options.media_limits,
                )
                .await;
                media.extend(resolved.media);
                resolved.notes
            };
            prompt_rows.push(PromptRow {
                row,
                content,
                attachments: notes,
                script_output,
            });
        }
        let context = FormatContext {
            timezone: self.options.timezone,
            destinations: &destinations,
        };
        let text = format::format_prompt(&prompt_rows, &context);
        let target = target_parsed(&kept, prompt_rows.iter().map(|row| &row.content));
        let prepared = Prepared {
            prompt: Prompt { text, media },
            row_ids: kept.iter().map(|r| r.id.clone()).collect(),
            seqs: kept.iter().filter_map(|r| r.seq).collect(),
            target,
            series_id: kept.iter().find_map(|r| r.series_id.clone()),
        };
        Ok((prepared, query_start))
    }

    /// Completes a task row whose pre-agent script said not to wake the agent, or failed; a
    /// failure is also written as a `task_skipped` system row so the host can show it. The next
    /// occurrence of a recurring task is inserted in the same transaction.
    pub(super) async fn finish_without_agent(
        &self,
        row: MessageIn,
        failure: Option<String>,
    ) -> Result<()> {
        let mut rows = Vec::new();
        if let Some(reason) = failure {
            let task_id = row.series_id.clone().unwrap_or_else(|| row.id.clone());
            let content = out::system_action(
                "task_skipped",
                json!({ "taskId": task_id, "reason": reason }),
            );
            rows.push(
                NewMessageOut::new(OutKind::System, row.routing.clone(), &content)
                    .replying_to(Some(row.id.clone())),
            );
        }
        let ids = vec![row.id];
        let now = (self.options.clock)();
        self.call(move |db| db.complete_at(&ids, &rows, now))
            .await?;
        Ok(())
    }
}

/// The destinations `read`; none, with a warning, when they could not be read (the prompt then
/// names no destination and the system prompt lists none).
pub(super) fn destinations_or_none(
    read: Result<Vec<Destination>, schema::Error>,
) -> Vec<Destination> {
    read.unwrap_or_else(|err| {
        tracing::warn!("{err:#}: the prompt and the system prompt list no destinations");
        Vec::new()
    })
}

/// What a query starts from in the DB, read through `reads` (one snapshot); the
/// `session_state` keys are `known` while their stamp holds.
pub(super) fn read_start(
    reads: &Reads<'_>,
    provider: &str,
    known: Option<&Arc<StartKeys>>,
) -> Result<StartReads, schema::Error> {
    let keys = reads.start_keys(provider, known)?;
    Ok(StartReads {
        destinations: destinations_or_none(reads.destinations()),
        query: QueryStart {
            continuation: keys.continuation.clone(),
            start_seq: reads.max_out_seq()?,
            system_prompt: None,
            model: keys.model.clone(),
            // A `/model` switch waits for its first successful turn.
            model_on_trial: keys.model_previous.is_some(),
        },
        keys,
    })
}

/// The query's start from what was read: the system prompt's files are re-read now, so
/// changes made mid-session reach the next query. On the runtime's thread: regular files
/// only, each capped, so this is bounded (docs/decisions/perf.md#D-PERF-06). Also returns the
/// destinations, for the prompt.
pub(super) fn query_start(
    reads: StartReads,
    sources: Option<&PromptSources>,
) -> (Vec<Destination>, QueryStart) {
    let StartReads {
        destinations,
        mut query,
        ..
    } = reads;
    query.system_prompt = sources.map(|sources| build_system_prompt(sources, &destinations));
    (destinations, query)
}

/// A task's pre-agent script, if it has one.
pub(super) fn pre_agent_script(content: &InboundContent) -> Option<&str> {
    match content {
        InboundContent::Task(task) => task.script.as_deref().filter(|s| !s.trim().is_empty()),
        _ => None,
    }
}

/// Replies of a batch go to the latest triggering row's origin; it is also the `in_reply_to`.
pub(super) fn target_of(rows: &[MessageIn]) -> Target {
    let contents: Vec<InboundContent> = rows
        .iter()
        .map(|row| InboundContent::parse(&row.kind(), &row.content))
        .collect();
    target_parsed(rows, contents.iter())
}

/// [`target_of`] with the rows' contents already parsed, in the rows' order: a row's content
/// is parsed once on its way to the prompt, not once per use.
pub(super) fn target_parsed<'a>(
    rows: &[MessageIn],
    contents: impl DoubleEndedIterator<Item = &'a InboundContent>,
) -> Target {
    let origin = rows
        .iter()
        .rev()
        .find(|r| r.trigger)
        .or_else(|| rows.last());
    let sender_id = contents
        .rev()
        .find_map(|content| content.sender_id().map(str::to_owned));
    match origin {
        Some(row) => Target {
            routing: row.routing.clone(),
            in_reply_to: Some(row.id.clone()),
            sender_id,
        },
        None => Target::default(),
    }
}
