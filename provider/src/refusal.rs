//! What a call the tool policy refuses tells the model and the runner (issue 41): the same
//! words on every CLI, and, when the command could not be decided ([`crate::Verdict`]'s
//! `undecidable`), the reason, so that the model can write the command literally and the
//! `tool_decision` row can say so.

use crate::policy::Call;
use crate::ProviderEvent;

/// The refusal the model reads for a `tool` call the policy denies; `undecidable`: why its
/// command could not be decided, when that is why.
pub(crate) fn message(tool: &str, undecidable: Option<&str>) -> String {
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

/// The event that reports `call` refused by the policy: [`ProviderEvent::ToolUndecidable`] with
/// the reason when its command could not be decided, else [`ProviderEvent::ToolDenied`].
pub(crate) fn event(call: Call, undecidable: Option<&str>) -> ProviderEvent {
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
}
