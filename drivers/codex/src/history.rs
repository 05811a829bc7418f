//! Codex's history: turns of `codex app-server`'s `thread/turns/list` (or a whole `thread/read`
//! result), parsed into the archive's model. Unknown item shapes are skipped, never an error.

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use provider::archive::model::{millis, nonempty, seconds, summary, Builder};
use provider::archive::Transcript;

/// The params of a `thread/read` request for the thread's metadata only (its name), not its
/// turns.
pub(crate) fn codex_thread_meta_params(thread_id: &str) -> Value {
    json!({"threadId": thread_id, "includeTurns": false})
}

/// The params of one `thread/turns/list` page: `limit` turns with every item, newest first,
/// after `cursor` (the previous page's `nextCursor`).
pub(crate) fn codex_turns_page_params(thread_id: &str, cursor: Option<&str>, limit: u32) -> Value {
    json!({
        "threadId": thread_id,
        "cursor": cursor,
        "limit": limit,
        "sortDirection": "desc",
        "itemsView": "full",
    })
}

/// The thread's name from a `thread/read` result (`{thread: {name}}`, or the bare thread).
pub(crate) fn thread_title(value: &Value) -> Option<String> {
    let thread = if value["thread"].is_object() {
        &value["thread"]
    } else {
        value
    };
    nonempty(&thread["name"])
}

/// Parses `codex app-server`'s `thread/read` result (`{thread: {id, name, turns: [{items}]}}`;
/// the bare thread object works too). Kept: user messages, agent messages, MCP tool calls,
/// commands, file changes, dynamic tool calls, web searches, plans, compactions, failed and
/// interrupted turns. Skipped: reasoning and anything unknown. (The driver reads pages of turns,
/// [`from_codex_turns`]; the captured fixture is a whole thread.)
#[cfg(test)]
pub(crate) fn from_codex_thread(value: &Value) -> Transcript {
    let thread = if value["thread"].is_object() {
        &value["thread"]
    } else {
        value
    };
    from_codex_turns(
        thread["id"].as_str().unwrap_or_default(),
        thread_title(value),
        thread["turns"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default(),
    )
}

/// Parses turns (oldest first) of thread `thread_id`, as in [`from_codex_thread`].
pub(crate) fn from_codex_turns<'a>(
    thread_id: &str,
    title: Option<String>,
    turns: impl IntoIterator<Item = &'a Value>,
) -> Transcript {
    let mut b = Builder::default();
    for turn in turns {
        let turn_at = seconds(&turn["startedAt"]);
        for item in turn["items"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            let at = millis(&item["startedAtMs"]).or(turn_at);
            codex_item(&mut b, item, at);
        }
        let end_at = seconds(&turn["completedAt"]).or(turn_at);
        // The turn's end gets the id of its last item, never one of its own: a turn can read
        // differently later (measured: turns interrupted before any item, by a follow-up's
        // restart, were in no later read), and an archive whose last entry's id is gone would
        // read and archive the whole history again. A turn interrupted before any item has
        // nothing to show (its prompt goes again in the next turn) and adds no entry.
        let last_item = turn["items"]
            .as_array()
            .and_then(|items| items.iter().rev().find_map(|item| item["id"].as_str()));
        match turn["status"].as_str() {
            Some("failed") => {
                let message = turn["error"]["message"].as_str().unwrap_or("unknown error");
                b.system(&format!("Turn failed: {message}"), end_at, last_item, false);
            }
            Some("interrupted") if last_item.is_some() => {
                b.system("Interrupted", end_at, last_item, false)
            }
            _ => {}
        }
    }
    Transcript {
        session_id: thread_id.to_owned(),
        provider: "codex".into(),
        title,
        entries: b.entries,
    }
}

fn codex_item(b: &mut Builder, item: &Value, at: Option<DateTime<Utc>>) {
    let id = item["id"].as_str();
    match item["type"].as_str().unwrap_or_default() {
        "userMessage" => {
            let parts: Vec<String> = item["content"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .filter_map(|input| match input["type"].as_str()? {
                    "text" => input["text"].as_str().map(str::to_owned),
                    "image" => Some("[image]".to_owned()),
                    "localImage" => Some(format!(
                        "[image: {}]",
                        input["path"].as_str().unwrap_or_default()
                    )),
                    _ => None,
                })
                .collect();
            b.user(&parts.join("\n\n"), at, id);
        }
        "agentMessage" => b.assistant(item["text"].as_str().unwrap_or_default(), at, id),
        "plan" => b.assistant(
            &format!("Plan:\n{}", item["text"].as_str().unwrap_or_default()),
            at,
            id,
        ),
        "mcpToolCall" => {
            let name = format!(
                "mcp__{}__{}",
                item["server"].as_str().unwrap_or_default(),
                item["tool"].as_str().unwrap_or_default()
            );
            b.tool(id, summary(name, &item["arguments"]), at, id);
            if let Some(message) = item["error"]["message"].as_str() {
                b.output(id.unwrap_or_default(), message, true, at, id);
            } else if item["result"].is_object() {
                let output = codex_content_text(&item["result"]["content"]);
                b.output(id.unwrap_or_default(), &output, codex_failed(item), at, id);
            } else if codex_failed(item) {
                b.output(id.unwrap_or_default(), "", true, at, id);
            }
        }
        "commandExecution" => {
            b.tool(id, summary("shell", &item["command"]), at, id);
            let failed = codex_failed(item) || item["exitCode"].as_i64().is_some_and(|c| c != 0);
            if let Some(output) = item["aggregatedOutput"].as_str() {
                b.output(id.unwrap_or_default(), output, failed, at, id);
            } else if failed {
                b.output(id.unwrap_or_default(), "", true, at, id);
            }
        }
        "fileChange" => {
            let files: Vec<String> = item["changes"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .map(|c| {
                    let kind = c["kind"]["type"]
                        .as_str()
                        .or(c["kind"].as_str())
                        .unwrap_or("change");
                    format!("{kind} {}", c["path"].as_str().unwrap_or_default())
                })
                .collect();
            b.tool(
                id,
                summary("apply_patch", &Value::String(files.join(", "))),
                at,
                id,
            );
            let status = item["status"].as_str().unwrap_or_default();
            b.output(id.unwrap_or_default(), status, codex_failed(item), at, id);
        }
        "dynamicToolCall" => {
            let name = match item["namespace"].as_str() {
                Some(ns) => format!("{ns}.{}", item["tool"].as_str().unwrap_or_default()),
                None => item["tool"].as_str().unwrap_or("tool").to_owned(),
            };
            b.tool(id, summary(name, &item["arguments"]), at, id);
            let failed = codex_failed(item) || item["success"] == Value::Bool(false);
            if item["contentItems"].is_array() || failed {
                let output = codex_content_text(&item["contentItems"]);
                b.output(id.unwrap_or_default(), &output, failed, at, id);
            }
        }
        "functionCallOutput" => {
            let name = item["name"].as_str().unwrap_or("tool");
            b.tool(id, summary(name, &Value::Null), at, id);
            let output = match &item["output"] {
                Value::String(s) => s.clone(),
                other => codex_content_text(other),
            };
            b.output(id.unwrap_or_default(), &output, false, at, id);
        }
        "webSearch" => b.tool(id, summary("web_search", &item["query"]), at, id),
        "imageView" => b.tool(id, summary("view_image", &item["path"]), at, id),
        "contextCompaction" => b.system("Conversation compacted", at, id, true),
        "enteredReviewMode" => b.system("Review started", at, id, false),
        "exitedReviewMode" => b.system("Review finished", at, id, false),
        _ => {}
    }
}

fn codex_failed(item: &Value) -> bool {
    matches!(item["status"].as_str(), Some("failed" | "declined"))
}

/// Text of MCP/dynamic tool content items (`text`, `inputText`, `input_text`).
fn codex_content_text(content: &Value) -> String {
    content
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|c| match c["type"].as_str()? {
            "text" | "inputText" | "input_text" => c["text"].as_str().map(str::to_owned),
            "image" | "inputImage" | "input_image" => Some("[image]".to_owned()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;
    use provider::archive::fixtures::{check, CODEX};

    fn codex() -> Transcript {
        from_codex_thread(&serde_json::from_str(CODEX).unwrap())
    }

    #[test]
    fn codex_thread_read_parses() {
        check(
            &codex(),
            expect![[r#"
            codex 01a1fe0a-f503-74f0-ba0e-e1241b980a77 title=None
            User [John, Jane] 12:18:13.495 01a1fe0a-f576-7972-871d-f99b56b794e1: <context timezone="UTC" /> <messages> <message id="2" from="slack-mai…
            Assistant 12:18:13.564 call_fake6: 
              🔧 mcp__nanoclaw__send_message({"text":"Hi team! Checking the build now."}) → Some("message sent")
              🔧 shell(/bin/bash -lc 'echo build ok') → Some("build ok")
            Assistant 12:18:13.713 msg_fake8: The build is green: `echo build ok` printed build ok.
            User [John] 12:18:13.781 01a1fe0a-f68e-7f41-a252-2936e087df96: <context timezone="UTC" /> <message id="6" sender="John" time="Feb 4,…
            Assistant 12:18:13.801 msg_fake10: Nothing else for now.
        "#]],
        );
    }

    #[test]
    fn unknown_shapes_are_skipped() {
        assert!(from_codex_thread(&json!(null)).is_empty());
        assert!(from_codex_thread(
            &json!({"thread": {"turns": [{"items": [{"type": "future"}, 7]}]}})
        )
        .is_empty());
    }
}

/// The archive's rendering and store on this CLI's captured history: they live with the parser,
/// since the provider core cannot parse a CLI's history.
#[cfg(test)]
mod archive_tests {
    use chrono_tz::Tz;
    use expect_test::expect;

    use super::*;
    use provider::archive::fixtures::*;
    use provider::archive::*;

    fn codex() -> Transcript {
        from_codex_thread(&serde_json::from_str(CODEX).unwrap())
    }

    #[test]
    fn renders_the_codex_thread() {
        let mut options = opts("Europe/Berlin", MAX_MESSAGE_CHARS);
        options.assistant_name = Some("Andy".into());
        expect![[r#"
            <!-- nanoclaw-archive {"provider":"codex","session":"01a1fe0a-f503-74f0-ba0e-e1241b980a77"} -->
            # Can you check the build & tell me if it's green?

            - Provider: codex
            - Session: 01a1fe0a-f503-74f0-ba0e-e1241b980a77
            - Archived: 2026-11-21 21:30 (Europe/Berlin)
            - Started: 2026-11-21 13:18

            ---

            ### John, Jane — 2026-11-21 13:18

            ```xml
            <context timezone="UTC" />
            <messages>
            <message id="2" from="slack-main" sender="John" time="Feb 4, 2026, 10:00 AM">Can you check the build &amp; tell me if it's green?</message>
            <message id="4" sender="Jane" time="Feb 4, 2026, 10:01 AM">And say hi to the team</message>
            </messages>
            ```

            ### Andy — 2026-11-21 13:18

            - 🔧 mcp__nanoclaw__send_message({"text":"Hi team! Checking the build now."}) → message sent
            - 🔧 shell(/bin/bash -lc 'echo build ok') → build ok

            The build is green: `echo build ok` printed build ok.

            ### John — 2026-11-21 13:18

            ```xml
            <context timezone="UTC" />
            <message id="6" sender="John" time="Feb 4, 2026, 10:05 AM">Thanks! Anything else?</message>
            ```

            ### Andy — 2026-11-21 13:18

            Nothing else for now.

            <!-- nanoclaw-archive-through {"entry":"msg_fake10"} -->
        "#]].assert_eq(&render_markdown(&codex(), &options));
    }

    #[test]
    fn write_archive_never_replaces_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let conversations = dir.path().join("agent/conversations");
        let now = at("2026-02-04T23:30:00Z");
        let tz: Tz = "Asia/Tokyo".parse().unwrap(); // already Feb 5 there
        let t = codex();
        let first = write_archive(&conversations, &t, now, tz).unwrap();
        let name = "2026-02-05-can-you-check-the-build-tell-me-if-it-s-green";
        assert_eq!(first, conversations.join(format!("{name}.md")));
        let content = std::fs::read_to_string(&first).unwrap();
        let second = write_archive(&conversations, &t, now, tz).unwrap();
        assert_eq!(second, conversations.join(format!("{name}-2.md")));
        let other = Transcript {
            session_id: "another".into(),
            ..t.clone()
        };
        let third = write_archive(&conversations, &other, now, tz).unwrap();
        assert_eq!(third, conversations.join(format!("{name}-3.md")));
        assert_eq!(std::fs::read_to_string(&first).unwrap(), content);
        assert_eq!(std::fs::read_to_string(&second).unwrap(), content);
        let mut names: Vec<String> = std::fs::read_dir(&conversations)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names.len(), 3, "no temporary file is left: {names:?}");
    }
}
