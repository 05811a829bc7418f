//! The session's journal, read back as a transcript for the archive.
//!
//! ACP has no call that reads a session's history (`session/load` replays it, but only into a
//! fresh load), so the driver writes its own journal per session (`journal.rs`'s records, one
//! JSON object a line, under the private home): `{"user": text}`, `{"assistant": text}`,
//! `{"tool": name, "id": call id, "input": raw input}`, `{"output": call id, "text": …,
//! "failed": bool}`, each with `"at"` (RFC 3339) and `"seq"` (unique in the journal, the
//! entry's id, so that an archive appends only what earlier ones do not hold). Unknown or
//! broken lines are skipped.

use serde_json::Value;

use provider::archive::model::{self, Builder};
use provider::archive::Transcript;

/// The transcript of `provider`'s session `session_id` from its journal's text.
pub(crate) fn from_journal(provider: &str, session_id: &str, journal: &str) -> Transcript {
    let mut builder = Builder::default();
    for line in journal.lines() {
        let Ok(record) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let at = record.get("at").and_then(model::rfc3339);
        let id = record.get("seq").map(|s| match s {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        });
        let id = id.as_deref();
        let text = |key: &str| record.get(key).and_then(Value::as_str);
        if let Some(user) = text("user") {
            builder.user(user, at, id);
        } else if let Some(reply) = text("assistant") {
            builder.assistant(reply, at, id);
        } else if let Some(tool) = text("tool") {
            let input = record.get("input").cloned().unwrap_or(Value::Null);
            builder.tool(text("id"), model::summary(tool, &input), at, id);
        } else if let Some(call) = text("output") {
            let failed = record
                .get("failed")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            builder.output(call, text("text").unwrap_or_default(), failed, at, id);
        }
    }
    Transcript {
        session_id: session_id.to_owned(),
        provider: provider.to_owned(),
        title: None,
        entries: builder.entries,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;

    #[test]
    fn a_journal_becomes_entries() {
        let journal = r#"{"seq":1,"at":"2026-12-07T10:00:00Z","user":"<messages>\n<message sender=\"Ann\" time=\"10:00\">list files</message>\n</messages>"}
{"seq":2,"at":"2026-12-07T10:00:01Z","assistant":"Looking."}
{"seq":3,"at":"2026-12-07T10:00:02Z","tool":"Bash","id":"c1","input":{"command":"ls"}}
not json
{"seq":4,"at":"2026-12-07T10:00:03Z","output":"c1","text":"a.txt\nb.txt","failed":false}
{"seq":5,"at":"2026-12-07T10:00:04Z","assistant":"Two files."}
"#;
        let transcript = from_journal("gemini", "s-1", journal);
        let shown: Vec<String> = transcript
            .entries
            .iter()
            .map(|e| {
                format!(
                    "{:?} {:?} {:?} {:?} {:?}",
                    e.role,
                    e.sender,
                    e.text,
                    e.id,
                    e.tool_calls
                        .iter()
                        .map(|c| format!(
                            "{}({}) → {:?}",
                            c.name, c.input_excerpt, c.output_excerpt
                        ))
                        .collect::<Vec<_>>()
                )
            })
            .collect();
        expect![[r#"
            User Some("Ann") "<messages>\n<message sender=\"Ann\" time=\"10:00\">list files</message>\n</messages>" Some("1") []
            Assistant None "Looking." Some("4") ["Bash({\"command\":\"ls\"}) → Some(\"a.txt b.txt\")"]
            Assistant None "Two files." Some("5") []"#]]
        .assert_eq(&shown.join("\n"));
    }
}
