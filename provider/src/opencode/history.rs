//! OpenCode's history: `opencode serve`'s `GET /session/{id}/message`, parsed into the archive's
//! model. Unknown part shapes are skipped, never an error.

use serde_json::Value;

use crate::archive::model::{millis, summary, value_excerpt, Builder};
use crate::archive::Transcript;

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
    use crate::archive::fixtures::{check, opencode};

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
