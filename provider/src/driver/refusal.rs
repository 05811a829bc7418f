//! What a call the tool policy refuses tells the model and the runner (issue 41): the same
//! words on every CLI, and, when the command could not be decided ([`crate::Verdict`]'s
//! `undecidable`), the reason, so that the model can write the command literally and the
//! `tool_decision` row can say so.

use crate::policy::Call;
use crate::ProviderEvent;

/// The refusal the model reads for a `tool` call the policy denies; `undecidable`: why its
/// command could not be decided, when that is why.
pub fn message(tool: &str, undecidable: Option<&str>) -> String {
    match undecidable {
        // The policy's reason normally says what to do ("write the command literally").
        Some(reason) if reason.contains("literally") => {
            format!("denied by the tool policy: {reason}")
        }
        Some(reason) => format!(
            "denied by the tool policy: this {tool} command could not be decided ({reason}); \
             write the command literally, every program name a plain word"
        ),
        None => format!("denied by the tool policy: this {tool} call may not run; do not retry it"),
    }
}

/// The refusal the model reads for an asked call that was not approved: `reason` (the runner's:
/// "denied by the user", "no answer within N s", ...), and, when the call was asked because its
/// command could not be decided, that reason too, so that the model writes the command
/// literally instead of retrying it as it was.
pub fn not_approved(reason: &str, undecidable: Option<&str>) -> String {
    match undecidable {
        Some(why) if why.contains("literally") => format!("{reason}; {why}"),
        Some(why) => format!(
            "{reason}; this command could not be decided ({why}): write the command literally, \
             every program name a plain word"
        ),
        None => reason.to_owned(),
    }
}

/// The event that reports `call` refused by the policy: [`ProviderEvent::ToolUndecidable`] with
/// the reason when its command could not be decided, else [`ProviderEvent::ToolDenied`].
pub fn event(call: Call, undecidable: Option<&str>) -> ProviderEvent {
    match undecidable {
        Some(reason) => ProviderEvent::ToolUndecidable {
            tool: call.tool,
            summary: call.summary,
            reason: reason.to_owned(),
        },
        None => call.denied(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;

    fn call() -> Call {
        Call {
            tool: "Bash".into(),
            summary: Some("X=rm; $X -rf target".into()),
            argument: Some("X=rm; $X -rf target".into()),
        }
    }

    #[test]
    fn an_undecidable_refusal_carries_its_reason() {
        let reason = "the program name `$X` is not a literal";
        expect![[r#"denied by the tool policy: this Bash command could not be decided (the program name `$X` is not a literal); write the command literally, every program name a plain word"#]]
            .assert_eq(&message("Bash", Some(reason)));
        // As the policy words it (provider/src/policy.rs).
        let worded = "the command could not be decided: the program name is not a literal ($X): write the command literally";
        expect![[r#"denied by the tool policy: the command could not be decided: the program name is not a literal ($X): write the command literally"#]]
            .assert_eq(&message("Bash", Some(worded)));
        expect!["denied by the tool policy: this Bash call may not run; do not retry it"]
            .assert_eq(&message("Bash", None));
        expect![[r#"ToolUndecidable { tool: "Bash", summary: Some("X=rm; $X -rf target"), reason: "the program name `$X` is not a literal" }"#]]
            .assert_eq(&format!("{:?}", event(call(), Some(reason))));
        expect![[r#"ToolDenied { tool: "Bash", summary: Some("X=rm; $X -rf target") }"#]]
            .assert_eq(&format!("{:?}", event(call(), None)));
    }

    #[test]
    fn an_asked_undecidable_call_not_approved_tells_the_model_why() {
        let worded = "the command could not be decided: the program name is not a literal ($X): write the command literally";
        expect![[r#"denied by the user; the command could not be decided: the program name is not a literal ($X): write the command literally"#]]
            .assert_eq(&not_approved("denied by the user", Some(worded)));
        expect![[r#"no answer within 300 s; this command could not be decided (a parse error): write the command literally, every program name a plain word"#]]
            .assert_eq(&not_approved("no answer within 300 s", Some("a parse error")));
        expect!["denied by the user"].assert_eq(&not_approved("denied by the user", None));
    }
}
