//! OpenCode's history: `opencode serve`'s `GET /session/{id}/message`, parsed into the archive's
//! model. Unknown part shapes are skipped, never an error.

use serde_json::Value;

use provider::archive::model::{millis, summary, value_excerpt, Builder};
use provider::archive::Transcript;

/// The path (under the server's base URL) whose JSON [`from_opencode_messages`] parses.
pub(crate) fn opencode_messages_path(session_id: &str) -> String {
    format!("/session/{session_id}/message")
}

/// Parses `opencode serve`'s `GET /session/{id}/message` (`[{info: {id, sessionID, role, time,
/// error?}, parts: [...]}]`). Kept: text parts (not `synthetic` or `ignored` ones), tool parts
/// with their state, file parts, compactions, message errors. Skipped: reasoning, step markers,
/// patches, snapshots, anything unknown. Consecutive steps of one answer become one section.
pub(crate) fn from_opencode_messages(value: &Value) -> Transcript {
    let messages = value
        .as_array()
        .or_else(|| value["messages"].as_array())
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut b = Builder::default();
    let mut session_id = String::new();
    for message in messages {
        let info = &message["info"];
        if session_id.is_empty() {
            session_id = info["sessionID"].as_str().unwrap_or_default().to_owned();
        }
        let at = millis(&info["time"]["created"]);
        let id = info["id"].as_str();
        let role = info["role"].as_str().unwrap_or_default();
        let parts = message["parts"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        if role == "user" {
            let mut texts = Vec::new();
            for part in parts {
                if part["synthetic"] == Value::Bool(true) || part["ignored"] == Value::Bool(true) {
                    continue;
                }
                match part["type"].as_str().unwrap_or_default() {
                    "text" => texts.push(part["text"].as_str().unwrap_or_default().to_owned()),
                    "file" => texts.push(format!(
                        "[file: {}]",
                        part["filename"]
                            .as_str()
                            .or(part["url"].as_str())
                            .unwrap_or_default()
                    )),
                    "compaction" => b.system("Conversation compacted", at, id, true),
                    _ => {}
                }
            }
            b.user(&texts.join("\n\n"), at, id);
            continue;
        }
        if role != "assistant" {
            continue;
        }
        if info["summary"] == Value::Bool(true) {
            // The summary an OpenCode compaction writes.
            let text: Vec<&str> = parts.iter().filter_map(|p| p["text"].as_str()).collect();
            b.system(&format!("Summary:\n{}", text.join("\n\n")), at, id, false);
            continue;
        }
        for part in parts {
            let part_at = millis(&part["time"]["start"]).or(at);
            match part["type"].as_str().unwrap_or_default() {
                "text" if part["synthetic"] != Value::Bool(true) => {
                    b.assistant(part["text"].as_str().unwrap_or_default(), part_at, id)
                }
                "tool" => {
                    let state = &part["state"];
                    let call_id = part["callID"].as_str().or(part["id"].as_str());
                    let name = part["tool"].as_str().unwrap_or("tool");
                    let started = millis(&state["time"]["start"]).or(at);
                    b.tool(call_id, summary(name, &state["input"]), started, id);
                    let call_id = call_id.unwrap_or_default();
                    match state["status"].as_str() {
                        Some("completed") => b.output(
                            call_id,
                            &value_excerpt(&state["output"]),
                            false,
                            started,
                            id,
                        ),
                        Some("error") => {
                            b.output(call_id, &value_excerpt(&state["error"]), true, started, id)
                        }
                        _ => {}
                    }
                }
                "file" => b.assistant(
                    &format!(
                        "[file: {}]",
                        part["filename"]
                            .as_str()
                            .or(part["url"].as_str())
                            .unwrap_or_default()
                    ),
                    part_at,
                    id,
                ),
                _ => {}
            }
        }
        if info["error"].is_object() {
            let error = &info["error"];
            let name = error["name"].as_str().unwrap_or("Error");
            let text = match error["data"]["message"].as_str() {
                Some(message) => format!("{name}: {message}"),
                None => name.to_owned(),
            };
            b.system(&text, millis(&info["time"]["completed"]).or(at), id, false);
        }
    }
    Transcript {
        session_id,
        provider: "opencode".into(),
        title: None,
        entries: b.entries,
    }
}

#[cfg(test)]
mod tests {
    use expect_test::expect;
    use serde_json::json;

    use super::*;
    use provider::archive::fixtures::{check, OPENCODE};

    fn opencode() -> Transcript {
        from_opencode_messages(&serde_json::from_str(OPENCODE).unwrap())
    }

    #[test]
    fn opencode_messages_parse() {
        check(
            &opencode(),
            expect![[r#"
            opencode ses_e01f4e94fffeKFELGILgUCv7Se title=None
            User [John, Jane] 12:18:22.364 msg_1fe0b181c001S74Jt8Pzz61Ere: <context timezone="UTC" /> <messages> <message id="2" from="slack-mai…
            Assistant 12:18:25.509 msg_1fe0b24970011X0mEn9ZpQpDql: 
              🔧 nanoclaw_send_message({"text":"Hi team! Checking the build now."}) → Some("message sent")
              🔧 bash({"command":"echo build ok","description":"check the build"}) → Some("build ok")
            Assistant 12:18:27.060 msg_1fe0b29ae0015E2sh3L6gOyRn3: The build is green: `echo build ok` printed build ok.
            User [John] 12:18:27.117 msg_1fe0b2aad001TajGbj0G1rgDzh: <context timezone="UTC" /> <message id="6" sender="John" time="Feb 4,…
            Assistant 12:18:27.287 msg_1fe0b2ad90012w5HMG3wswiU2v: Nothing else for now.
        "#]],
        );
    }

    #[test]
    fn unknown_shapes_are_skipped() {
        assert!(from_opencode_messages(&json!({"x": 1})).is_empty());
        assert!(
            from_opencode_messages(&json!([{"info": {"role": "tool"}, "parts": "x"}])).is_empty()
        );
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

    fn opencode() -> Transcript {
        from_opencode_messages(&serde_json::from_str(OPENCODE).unwrap())
    }

    #[test]
    fn renders_the_opencode_session() {
        expect![[r#"
            <!-- nanoclaw-archive {"provider":"opencode","session":"ses_e01f4e94fffeKFELGILgUCv7Se"} -->
            # Can you check the build & tell me if it's green?

            - Provider: opencode
            - Session: ses_e01f4e94fffeKFELGILgUCv7Se
            - Archived: 2026-11-21 20:30 (UTC)
            - Started: 2026-11-21 12:18

            ---

            ### John, Jane — 2026-11-21 12:18

            ```xml
            <context timezone="UTC" />
            <messages>
            <message id="2" from="slack-main" sender="John" time="Feb 4, 2026, 10:00 AM">Can you check the build &amp; tell me if it's green?</message>
            <message id="4" sender="Jane" time="Feb 4, 2026, 10:01 AM">And say hi to the team</message>
            </messages>
            ```

            ### Assistant — 2026-11-21 12:18

            - 🔧 nanoclaw_send_message({"text":"Hi team! Checking the build now."}) → message sent
            - 🔧 bash({"command":"echo build ok","description":"check the build"}) → build ok

            The build is green: `echo build ok` printed build ok.

            ### John — 2026-11-21 12:18

            ```xml
            <context timezone="UTC" />
            <message id="6" sender="John" time="Feb 4, 2026, 10:05 AM">Thanks! Anything else?</message>
            ```

            ### Assistant — 2026-11-21 12:18

            Nothing else for now.

            <!-- nanoclaw-archive-through {"entry":"msg_1fe0b2ad90012w5HMG3wswiU2v"} -->
        "#]].assert_eq(&render_markdown(&opencode(), &opts("UTC", MAX_MESSAGE_CHARS)));
    }

    #[test]
    fn archive_new_entries_writes_each_entry_once() {
        let dir = tempfile::tempdir().unwrap();
        let full = opencode();
        let mut first_query = full.clone();
        first_query.entries.truncate(3);
        let day1 = RenderOptions::new(Tz::UTC, at("2026-02-04T10:00:00Z"));
        let path = archive_new_entries(dir.path(), &first_query, &day1)
            .unwrap()
            .unwrap();
        assert!(path.ends_with("2026-02-04-can-you-check-the-build-tell-me-if-it-s-green.md"));
        assert_eq!(
            archive_new_entries(dir.path(), &first_query, &day1).unwrap(),
            None,
            "nothing new"
        );

        // The next query the same day: appended to the same file.
        let mut second_query = full.clone();
        second_query.entries.truncate(4);
        assert_eq!(
            archive_new_entries(dir.path(), &second_query, &day1).unwrap(),
            Some(path.clone())
        );
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.matches("### John, Jane —").count(), 1, "{text}");
        assert_eq!(text.matches("### John —").count(), 1, "{text}");
        assert_eq!(text.matches("Thanks! Anything else?").count(), 1, "{text}");
        assert_eq!(text.matches(THROUGH_MARKER).count(), 2, "{text}");

        // The next day: a new file with only the new entries, named after their first prompt.
        let day2 = RenderOptions::new(Tz::UTC, at("2026-02-05T08:00:00Z"));
        let next = archive_new_entries(dir.path(), &full, &day2)
            .unwrap()
            .unwrap();
        assert!(
            next.ends_with("2026-02-05-conversation.md"),
            "{}",
            next.display()
        );
        let text = std::fs::read_to_string(&next).unwrap();
        assert!(
            text.contains("Nothing else for now.") && !text.contains("Thanks! Anything else?"),
            "{text}"
        );
        assert_eq!(archive_new_entries(dir.path(), &full, &day2).unwrap(), None);

        // Another session is independent; an unknown cursor archives everything again.
        let other = Transcript {
            session_id: "ses_other".into(),
            ..full.clone()
        };
        assert!(archive_new_entries(dir.path(), &other, &day2)
            .unwrap()
            .is_some());
        let mut rewritten = full.clone();
        for e in &mut rewritten.entries {
            e.id = e.id.as_ref().map(|id| format!("{id}-new"));
        }
        let again = archive_new_entries(dir.path(), &rewritten, &day2)
            .unwrap()
            .unwrap();
        assert_eq!(again, next, "appended to today's file");
        assert_eq!(
            std::fs::read_to_string(&again)
                .unwrap()
                .matches("Thanks! Anything else?")
                .count(),
            1
        );
    }

    /// Issue 9.1: archive files the agent replaced with links to the session DB's files are
    /// neither read nor appended to; the DB and its locks are untouched and the entries go to a
    /// new file.
    #[test]
    fn archive_links_to_the_session_db_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (db, conn) = fsguard::testing::wal_db(dir.path());
        let shm = dir.path().join("session.db-shm");
        let before = std::fs::read(&db).unwrap();
        let archives = dir.path().join("conversations");
        std::fs::create_dir(&archives).unwrap();
        let full = opencode();
        let day = RenderOptions::new(Tz::UTC, at("2026-02-04T10:00:00Z"));
        let name = "2026-02-04-can-you-check-the-build-tell-me-if-it-s-green.md";
        std::os::unix::fs::symlink(&shm, archives.join(name)).unwrap();
        std::fs::hard_link(&db, archives.join("2026-02-04-a.md")).unwrap();
        let written = archive_new_entries(&archives, &full, &day)
            .unwrap()
            .unwrap();
        assert!(
            written.ends_with(name.replace(".md", "-2.md")),
            "{}",
            written.display()
        );
        assert!(fsguard::testing::locked_by_another_process(&shm));
        assert_eq!(std::fs::read(&db).unwrap(), before);
        assert_eq!(
            conn.query_row("SELECT x FROM t", [], |r| r.get::<_, i64>(0))
                .unwrap(),
            1
        );
    }
}
