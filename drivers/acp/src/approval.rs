//! The tool policy at `session/request_permission` (docs/contract/providers.md#acp).
//!
//! Every permission request is judged with [`ToolPolicy::judge`] on the canonical call
//! ([`super::tools::call`]): allowed → the agent's `allow_once` option, denied → its
//! `reject_once` option (and `ToolDenied`), `ask` → an [`ApprovalKind::ToolCall`] the runner
//! answers later, with the option of the answer's kind. An "always" option is never chosen: it
//! would let the agent skip the next request, which the policy must see. An agent offering no
//! option of the wanted kind gets `cancelled`.

use serde_json::Value;

use super::protocol::{permission_outcome, PermissionOption};
use provider::policy::Call;
use provider::{ApprovalKind, Decision, ToolPolicy};

/// What to do with a permission request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Verdict {
    /// Answer now with `result`; `denied`: the call the policy refused, with why it could not
    /// be decided when that is why.
    Answer {
        result: Value,
        denied: Option<(Call, Option<String>)>,
    },
    /// Ask the runner.
    Ask { kind: ApprovalKind },
}

/// The answer that allows (`true`) or refuses the call, from the options offered.
pub(crate) fn answer(options: &[PermissionOption], allow: bool) -> Value {
    let wanted: &[&str] = if allow {
        &["allow_once"]
    } else {
        &["reject_once", "reject_always"]
    };
    let chosen = wanted
        .iter()
        .find_map(|kind| options.iter().find(|o| o.kind == *kind));
    if chosen.is_none() {
        tracing::warn!(
            allow,
            offered = ?options.iter().map(|o| o.kind.as_str()).collect::<Vec<_>>(),
            "the agent offered no option of the wanted kind; answering cancelled"
        );
    }
    permission_outcome(chosen.map(|o| o.option_id.as_str()))
}

/// Judges `call` by `policy`.
pub(crate) fn judge(call: Call, options: &[PermissionOption], policy: &ToolPolicy) -> Verdict {
    let verdict = call.judge(policy);
    match verdict.decision {
        Decision::Allow => Verdict::Answer {
            result: answer(options, true),
            denied: None,
        },
        Decision::Deny => Verdict::Answer {
            result: answer(options, false),
            denied: Some((call, verdict.undecidable)),
        },
        Decision::Ask => Verdict::Ask {
            kind: call.ask(verdict.undecidable),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;

    fn options(kinds: &[(&str, &str)]) -> Vec<PermissionOption> {
        kinds
            .iter()
            .map(|(id, kind)| PermissionOption {
                option_id: (*id).to_owned(),
                name: (*id).to_owned(),
                kind: (*kind).to_owned(),
            })
            .collect()
    }

    /// Gemini CLI's options for a shell call (measured): the once options are chosen, never
    /// the always one; an agent without a reject option gets `cancelled`.
    #[test]
    fn the_once_options_are_chosen_by_kind() {
        let gemini = options(&[
            ("proceed_always", "allow_always"),
            ("proceed_once", "allow_once"),
            ("cancel", "reject_once"),
        ]);
        let only_always = options(&[("always", "allow_always")]);
        let answers = [
            answer(&gemini, true),
            answer(&gemini, false),
            answer(&only_always, true),
            answer(&only_always, false),
        ];
        expect![[r#"
            {"outcome":{"optionId":"proceed_once","outcome":"selected"}}
            {"outcome":{"optionId":"cancel","outcome":"selected"}}
            {"outcome":{"outcome":"cancelled"}}
            {"outcome":{"outcome":"cancelled"}}"#]]
        .assert_eq(
            &answers
                .iter()
                .map(Value::to_string)
                .collect::<Vec<_>>()
                .join("\n"),
        );
    }
}
