//! Claude Code's history: the session file it writes (one JSON record per line, at
//! `$HOME/.claude/projects/<cwd>/<session id>.jsonl`), parsed into the archive's model, and the
//! `PreCompact` hook that archives it before Claude compacts its context (Claude runs
//! `agent-runner archive-hook`, which calls [`from_claude_jsonl`]; the provider only passes the
//! hook in `--settings`). Unknown record shapes are skipped, never an error.

use std::path::Path;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use super::quote::shell_quote;
use provider::archive::model::{nonempty, rfc3339, summary, update_id, Builder};
use provider::archive::{Role, Transcript};
use provider::prompt_xml;

/// The `"hooks"` value of Claude's `--settings` that archives before each compaction:
/// `{"PreCompact":[{"matcher":"","hooks":[{"type":"command","command":"'<runner>' archive-hook
/// --conversations-dir '<dir>' --timezone '<tz>'"}]}]}`.
pub(crate) fn claude_precompact_hooks(
    runner_exe: &Path,
    conversations_dir: &Path,
    timezone: &str,
) -> Value {
    let command = format!(
        "{} archive-hook --conversations-dir {} --timezone {}",
        shell_quote(&runner_exe.to_string_lossy()),
        shell_quote(&conversations_dir.to_string_lossy()),
        shell_quote(timezone),
    );
    json!({"PreCompact": [{"matcher": "", "hooks": [{"type": "command", "command": command}]}]})
}

/// A whole `--settings` object holding just `claude_precompact_hooks`.
pub fn claude_hook_settings(runner_exe: &Path, conversations_dir: &Path, timezone: &str) -> Value {
    json!({"hooks": claude_precompact_hooks(runner_exe, conversations_dir, timezone)})
}

/// Parses the session file Claude writes (one JSON record per line). Kept: user prompts
/// (including follow-ups folded into a running turn, recorded as `queued_command` attachments),
/// assistant text and tool calls with their results, compaction boundaries and summaries,
/// interruptions, slash commands. Skipped: meta and sidechain records, thinking, attachments,
/// bookkeeping lines, anything unknown.
pub fn from_claude_jsonl(text: &str) -> Transcript {
    let mut transcript = Transcript {
        provider: "claude".into(),
        ..Transcript::default()
    };
    let mut b = Builder::default();
    for line in text.lines() {
        let Ok(record) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if transcript.session_id.is_empty() {
            if let Some(id) =
                nonempty(&record["sessionId"]).or_else(|| nonempty(&record["session_id"]))
            {
                transcript.session_id = id;
            }
        }
        if record["isSidechain"] == Value::Bool(true) {
            continue;
        }
        let at = rfc3339(&record["timestamp"]);
        let id = record["uuid"].as_str();
        match record["type"].as_str().unwrap_or_default() {
            "summary" => {
                transcript.title = nonempty(&record["summary"]).or(transcript.title.take())
            }
            "custom-title" | "ai-title" => {
                if let Some(title) = ["customTitle", "aiTitle", "title"]
                    .iter()
                    .find_map(|k| nonempty(&record[*k]))
                {
                    transcript.title = Some(title);
                }
            }
            "user" => claude_user(&mut b, &record, at, id),
            // One record per content block: the builder merges them in order.
            "assistant" => claude_assistant(&mut b, &record, at, id),
            "attachment" => {
                let attachment = &record["attachment"];
                if attachment["type"] == "queued_command"
                    && attachment["commandMode"]
                        .as_str()
                        .is_none_or(|m| m == "prompt")
                {
                    let prompt = claude_text(&attachment["prompt"]);
                    b.user(
                        &prompt,
                        at.or_else(|| rfc3339(&attachment["timestamp"])),
                        id,
                    );
                }
            }
            "system" if record["subtype"] == "compact_boundary" => {
                let meta = &record["compactMetadata"];
                let mut text = "Conversation compacted".to_owned();
                let trigger = meta["trigger"].as_str();
                let tokens = meta["preTokens"].as_u64();
                match (trigger, tokens) {
                    (Some(t), Some(n)) => text.push_str(&format!(" ({t}, {n} tokens before)")),
                    (Some(t), None) => text.push_str(&format!(" ({t})")),
                    (None, Some(n)) => text.push_str(&format!(" ({n} tokens before)")),
                    (None, None) => {}
                }
                b.system(&text, at, id, true);
            }
            _ => {}
        }
    }
    transcript.entries = b.entries;
    transcript
}

fn claude_user(b: &mut Builder, record: &Value, at: Option<DateTime<Utc>>, id: Option<&str>) {
    if record["isMeta"] == Value::Bool(true) {
        return;
    }
    let content = &record["message"]["content"];
    if record["isCompactSummary"] == Value::Bool(true) {
        let summary = claude_text(content);
        match b.entries.last_mut() {
            Some(last) if last.compaction && last.role == Role::System => {
                last.text.push_str("\n\n");
                last.text.push_str(summary.trim());
                update_id(last, id);
            }
            _ => b.system(&summary, at, id, false),
        }
        return;
    }
    if let Some(text) = content.as_str() {
        claude_user_text(b, text, at, id);
        return;
    }
    let Some(blocks) = content.as_array() else {
        return;
    };
    let mut texts = Vec::new();
    for block in blocks {
        match block["type"].as_str().unwrap_or_default() {
            "text" => texts.push(block["text"].as_str().unwrap_or_default().to_owned()),
            "image" => texts.push("[image]".to_owned()),
            "document" => texts.push("[document]".to_owned()),
            "tool_result" => {
                let call_id = block["tool_use_id"].as_str().unwrap_or_default();
                let output = claude_text(&block["content"]);
                let is_error = block["is_error"] == Value::Bool(true);
                b.output(call_id, &output, is_error, at, id);
            }
            _ => {}
        }
    }
    let text = texts.join("\n\n");
    if !text.trim().is_empty() {
        claude_user_text(b, &text, at, id);
    }
}

/// A user text: a prompt, or one of the CLI's own notes (interruptions, slash commands).
fn claude_user_text(b: &mut Builder, text: &str, at: Option<DateTime<Utc>>, id: Option<&str>) {
    let trimmed = text.trim();
    if trimmed.starts_with("[Request interrupted by user") {
        b.system("Interrupted", at, id, false);
    } else if trimmed.starts_with("<local-command-caveat>") {
    } else if trimmed.starts_with("<command-name>") {
        let name = prompt_xml::element_content(trimmed, "command-name")
            .unwrap_or_default()
            .trim();
        let args = prompt_xml::element_content(trimmed, "command-args")
            .unwrap_or_default()
            .trim();
        let command = if args.is_empty() {
            name.to_owned()
        } else {
            format!("{name} {args}")
        };
        b.system(&format!("Command: {command}"), at, id, false);
    } else if trimmed.starts_with("<local-command-stdout>")
        || trimmed.starts_with("<local-command-stderr>")
    {
        let output = prompt_xml::unescape(prompt_xml::strip_tags(trimmed).trim()).into_owned();
        if !output.is_empty() {
            b.system(&output, at, id, false);
        }
    } else {
        b.user(trimmed, at, id);
    }
}

fn claude_assistant(b: &mut Builder, record: &Value, at: Option<DateTime<Utc>>, id: Option<&str>) {
    let content = &record["message"]["content"];
    if record["isApiErrorMessage"] == Value::Bool(true) {
        b.system(
            &format!("API error: {}", claude_text(content)),
            at,
            id,
            false,
        );
        return;
    }
    if let Some(text) = content.as_str() {
        b.assistant(text, at, id);
        return;
    }
    for block in content.as_array().map(Vec::as_slice).unwrap_or_default() {
        match block["type"].as_str().unwrap_or_default() {
            "text" => b.assistant(block["text"].as_str().unwrap_or_default(), at, id),
            "tool_use" | "server_tool_use" => {
                let name = block["name"].as_str().unwrap_or("tool");
                b.tool(block["id"].as_str(), summary(name, &block["input"]), at, id);
            }
            "web_search_tool_result" | "web_fetch_tool_result" => {
                let call_id = block["tool_use_id"].as_str().unwrap_or_default();
                b.output(call_id, &claude_text(&block["content"]), false, at, id);
            }
            _ => {}
        }
    }
}

/// Text of a string or of content blocks (`text` blocks joined, images as `[image]`).
fn claude_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|block| match block["type"].as_str() {
                Some("text") => block["text"].as_str().map(str::to_owned),
                Some("image") => Some("[image]".to_owned()),
                Some("document") => Some("[document]".to_owned()),
                None => block.as_str().map(str::to_owned),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use expect_test::expect;

    use super::*;
    use provider::archive::fixtures::{check, CLAUDE, CLAUDE_COMPACTED, CLAUDE_HOOK};

    /// Where Claude keeps a session: `<home>/.claude/projects/<cwd, every character but ASCII
    /// letters and digits replaced by ->/<session id>.jsonl` (docs/contract/providers.md#claude-code; the hook also passes
    /// it as `transcript_path`).
    fn claude_transcript_path(home: &Path, cwd: &Path, session_id: &str) -> PathBuf {
        let project: String = cwd
            .to_string_lossy()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        home.join(".claude")
            .join("projects")
            .join(project)
            .join(format!("{session_id}.jsonl"))
    }

    #[test]
    fn claude_session_file_parses() {
        check(
            &from_claude_jsonl(CLAUDE_COMPACTED),
            expect![[r#"
                claude 1c42be55-1c59-4cda-b3df-58149ba01880 title=None
                User [John, Jane] 12:17:45.025 4fcf039a-b57d-4ab2-a48c-95fa7d980f73: <context timezone="UTC" /> <messages> <message id="2" from="slack-mai…
                Assistant 12:17:45.589 ea287a2b-85b0-4a83-aa1c-da675667cbdf: 
                  🔧 mcp__nanoclaw__send_message({"text":"Hi team! Checking the build now."}) → Some("message sent")
                  🔧 Bash({"command":"sleep 2; echo build ok","description":"check th…) → Some("build ok")
                User [John] 12:17:46.446 871870a4-7278-4679-91be-2ba6c69021c0: <context timezone="UTC" /> <message id="6" sender="John" time="Feb 4,…
                Assistant 12:17:48.051 72921db0-b90b-47dc-b722-18cf03d036b5: The build is green: `echo build ok` printed build ok. All checks pass…
                User [Jane] 12:17:48.175 bcdfe0d1-b273-437c-b944-74ffea670bae: <context timezone="UTC" /> <message id="8" sender="Jane" time="Feb 4,…
                Assistant 12:17:48.245 5cff14ea-6c8e-42a2-b716-93a9d91f4f93: Nothing else for now.
                System 12:17:48.465 e0f896d0-de83-4584-80cc-347fbc6e8266 COMPACTION: Conversation compacted (manual, 15 tokens before) This session is bei…
                System 12:17:48.363 eda171c4-5789-496b-a928-95254d5ce99b: Command: /compact
                System 12:17:48.582 827e0501-18d5-4427-9968-390b1faa3542: Compacted PreCompact [tee /tmp/archive-claude-4tb17a59/hook.json | py…
            "#]],
        );
    }

    #[test]
    fn claude_since_last_compaction_keeps_the_marker_and_what_follows() {
        check(
            &from_claude_jsonl(CLAUDE_COMPACTED).since_last_compaction(),
            expect![[r#"
                claude 1c42be55-1c59-4cda-b3df-58149ba01880 title=None
                System 12:17:48.465 e0f896d0-de83-4584-80cc-347fbc6e8266 COMPACTION: Conversation compacted (manual, 15 tokens before) This session is bei…
                System 12:17:48.363 eda171c4-5789-496b-a928-95254d5ce99b: Command: /compact
                System 12:17:48.582 827e0501-18d5-4427-9968-390b1faa3542: Compacted PreCompact [tee /tmp/archive-claude-4tb17a59/hook.json | py…
            "#]],
        );
        let whole = from_claude_jsonl(CLAUDE);
        assert_eq!(
            whole.since_last_compaction(),
            whole,
            "no marker: everything"
        );
    }

    #[test]
    fn unknown_shapes_are_skipped() {
        let t = from_claude_jsonl(
            "not json\n{}\n[1,2]\n{\"type\":\"user\",\"message\":{\"content\":42}}\n",
        );
        assert!(t.is_empty());
    }

    #[test]
    fn claude_paths_and_hook_settings() {
        let hook: Value = serde_json::from_str(CLAUDE_HOOK).unwrap();
        let transcript = hook["transcript_path"].as_str().unwrap();
        let home = &transcript[..transcript.find("/.claude/").unwrap()];
        let path = claude_transcript_path(
            Path::new(home),
            Path::new(hook["cwd"].as_str().unwrap()),
            hook["session_id"].as_str().unwrap(),
        );
        assert_eq!(path, Path::new(transcript));
        let settings = claude_hook_settings(
            Path::new("/usr/local/bin/agent-runner"),
            Path::new("/workspace/agent/conversations"),
            "America/Los_Angeles",
        );
        expect![[r#"
            {
              "hooks": {
                "PreCompact": [
                  {
                    "hooks": [
                      {
                        "command": "'/usr/local/bin/agent-runner' archive-hook --conversations-dir '/workspace/agent/conversations' --timezone 'America/Los_Angeles'",
                        "type": "command"
                      }
                    ],
                    "matcher": ""
                  }
                ]
              }
            }"#]].assert_eq(&serde_json::to_string_pretty(&settings).unwrap());
        let quoted = claude_precompact_hooks(Path::new("/opt/it's/runner"), Path::new("/w"), "UTC");
        assert_eq!(
            quoted["PreCompact"][0]["hooks"][0]["command"],
            r"'/opt/it'\''s/runner' archive-hook --conversations-dir '/w' --timezone 'UTC'"
        );
    }
}

/// The archive's rendering and store on this CLI's captured history: they live with the parser,
/// since the provider core cannot parse a CLI's history.
#[cfg(test)]
mod archive_tests {
    use expect_test::expect;

    use super::*;
    use provider::archive::fixtures::*;
    use provider::archive::*;

    #[test]
    fn renders_the_claude_session() {
        let md = render_markdown(
            &from_claude_jsonl(CLAUDE),
            &opts("America/Los_Angeles", 120),
        );
        expect![[r#"
            <!-- nanoclaw-archive {"provider":"claude","session":"1c42be55-1c59-4cda-b3df-58149ba01880"} -->
            # Can you check the build & tell me if it's green?

            - Provider: claude
            - Session: 1c42be55-1c59-4cda-b3df-58149ba01880
            - Archived: 2026-11-21 12:30 (America/Los_Angeles)
            - Started: 2026-11-21 04:17

            ---

            ### John, Jane — 2026-11-21 04:17

            ```xml
            <context timezone="UTC" />
            <messages>
            <message id="2" from="slack-main" sender="John" time="Feb 4, 2026, 10:00 AM">Can y
            ```

            [… 161 more characters]

            ### Assistant — 2026-11-21 04:17

            - 🔧 mcp__nanoclaw__send_message({"text":"Hi team! Checking the build now."}) → message sent
            - 🔧 Bash({"command":"sleep 2; echo build ok","description":"check the build"}) → build ok

            ### John — 2026-11-21 04:17

            ```xml
            <context timezone="UTC" />
            <message id="6" sender="John" time="Feb 4, 2026, 10:05 AM">Thanks! Anything else?</message>
            ```

            ### Assistant — 2026-11-21 04:17

            The build is green: `echo build ok` printed build ok. All checks passed. All checks passed. All checks passed. All check

            [… 4683 more characters]

            ### Jane — 2026-11-21 04:17

            ```xml
            <context timezone="UTC" />
            <message id="8" sender="Jane" time="Feb 4, 2026, 10:07 AM">Great, see you tomorrow</message>
            ```

            ### Assistant — 2026-11-21 04:17

            Nothing else for now.

            <!-- nanoclaw-archive-through {"entry":"5cff14ea-6c8e-42a2-b716-93a9d91f4f93"} -->
        "#]].assert_eq(&md);
        // With the default limit, the 4,803-character answer keeps its first 4,000.
        let md = render_markdown(&from_claude_jsonl(CLAUDE), &opts("UTC", MAX_MESSAGE_CHARS));
        assert!(md.contains("\n[… 803 more characters]\n"), "{md}");
    }
}
