//! The tool policy (config `toolPolicy`, docs/contract/config.md): which tool calls the agent may
//! make, in canonical tool names (`Bash`, `Read`, `mcp__<server>__<tool>`, ...). This module is
//! the one owner of what a rule means; each driver translates the policy into its CLI's own
//! mechanism and asks [`ToolPolicy::judge`] (or [`ToolPolicy::decide`]) when its CLI hands a call
//! to the runner.
//!
//! Rules: `Name` or `Name(pattern)`. A name ending in `*` matches every name with that prefix
//! (`mcp__github__*`). A pattern is a glob over the call's argument ([`ToolPolicy::decide`]):
//! `*` matches any run of characters (`/` included, so `**` is `*`), everything else is
//! literal; `prefix:*` (Claude's form) is `prefix` alone or followed by a space and anything.
//! Deny wins over ask, ask over allow; a call no rule matches gets `default`.
//!
//! A `Bash` line is parsed as the shell would (`policy/shell.rs`, tree-sitter-bash) into every
//! command it can run, each written as its program's name and its arguments after quote and
//! escape removal (`/bin/rm -rf 'x'` is `rm -rf x`): the commands of lists, pipelines,
//! subshells, groups, substitutions and function bodies, the shell code given to a shell (`-c`,
//! here-documents, here-strings), `eval` and `trap`, and the commands wrappers run
//! (`policy/wrappers.rs`: `sudo`, `env`, `xargs`, `find -exec`, ...), with the global options of
//! `git` and a few others dropped (`git -C x push` is `git push`). A deny or ask rule matches
//! when it matches the whole line or any of those commands; an allow rule with a pattern only
//! when every one is allowed.
//!
//! A line the text cannot decide (a program named by an expansion, `source`, a script file,
//! code from a pipe, a parse error, a line past a limit) gets the strictest decision a `Bash`
//! rule with a pattern could give: deny if there is such a deny rule, else ask if there is such
//! an ask rule; an allow rule with a pattern cannot allow it. [`Verdict::undecidable`] says why.
//!
//! `Read`/`Write`/`Edit` paths are matched normalised (`policy/paths.rs`): absolute from the
//! policy's workspace, `.` and `..` removed, symlinks resolved for the part that exists, and
//! relative to the workspace for a pattern that does not start with `/`.
//!
//! What a rule cannot do: a `Bash` rule limits commands, not their effects (`python -c` can
//! delete a file without `rm`). The boundary is the container and fsguard; the strong form of a
//! rule is the tool without a pattern.

use std::path::PathBuf;

use crate::{ApprovalKind, ProviderEvent};

use types::glob_matches;

pub use json::{PolicyError, MAX_ASK_TIMEOUT_SECS};
pub use types::{Decision, RuleError, ToolPolicy, ToolRule, Verdict, DEFAULT_ASK_TIMEOUT};

mod json;
mod paths;
mod shell;
#[cfg(test)]
mod shell_tests;
mod types;
mod word;
mod wrappers;

/// A tool call as a driver puts it to the policy, in canonical names: what [`ToolPolicy::decide`]
/// judges, what the runner asks about ([`ApprovalKind::ToolCall`]) and what a refusal reports
/// ([`ProviderEvent::ToolDenied`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// Canonical tool name.
    pub tool: String,
    /// Short form for the chat and the decision row.
    pub summary: Option<String>,
    /// What the policy matches (see [`ToolPolicy::decide`]).
    pub argument: Option<String>,
}

impl Call {
    /// What `policy` says about this call, with why when it could not be decided.
    pub fn judge(&self, policy: &ToolPolicy) -> Verdict {
        policy.judge(&self.tool, self.argument.as_deref())
    }

    /// The question the runner asks about this call; `undecidable`: the verdict's reason when
    /// the call is asked because its command could not be decided ([`Verdict::undecidable`]).
    pub fn ask(self, undecidable: Option<String>) -> ApprovalKind {
        ApprovalKind::ToolCall {
            tool: self.tool,
            summary: self.summary,
            argument: self.argument,
            undecidable,
        }
    }

    /// The event that reports this call refused by the policy.
    pub fn denied(self) -> ProviderEvent {
        ProviderEvent::ToolDenied {
            tool: self.tool,
            summary: self.summary,
        }
    }
}

impl ToolPolicy {
    /// The policy with `dir` as the directory paths are relative to ([`ToolPolicy::workspace`]).
    pub fn with_workspace(mut self, dir: PathBuf) -> Self {
        self.workspace = Some(dir);
        self
    }

    /// True when every call is allowed: no deny or ask rule and `default: allow`. A driver then
    /// keeps its CLI's unrestricted mode (no permission round trips).
    pub fn allows_everything(&self) -> bool {
        self.deny.is_empty() && self.ask.is_empty() && self.default == Decision::Allow
    }

    /// What happens to a call of `tool` (canonical name) with `argument`: the command line for
    /// `Bash`, the file path for `Read`/`Write`/`Edit`, the URL for `WebFetch`, the query for
    /// `WebSearch`, the pattern for `Glob`/`Grep`, the compact JSON arguments for an MCP tool;
    /// `None` when the driver cannot tell.
    pub fn decide(&self, tool: &str, argument: Option<&str>) -> Decision {
        self.judge(tool, argument).decision
    }

    /// What happens to a call of `tool` with `argument` ([`ToolPolicy::decide`]), with why when
    /// the argument could not be decided (see the module doc).
    pub fn judge(&self, tool: &str, argument: Option<&str>) -> Verdict {
        let names = |rule: &ToolRule| {
            rule.names(tool) || file_writer_aliases(tool).iter().any(|a| rule.names(a))
        };
        let with_pattern = |rules: &[ToolRule]| {
            rules
                .iter()
                .any(|rule| names(rule) && rule.pattern.is_some())
        };
        // Only a rule with a pattern needs the line's commands (and can find it undecidable).
        let patterns =
            with_pattern(&self.deny) || with_pattern(&self.ask) || with_pattern(&self.allow);
        let subject = match argument {
            None => Subject::Unknown,
            Some(line) if tool == "Bash" && !patterns => {
                Subject::Bash(line.trim(), shell::Analysis::default())
            }
            Some(line) if tool == "Bash" => Subject::Bash(line.trim(), shell::analyse(line)),
            Some(path) if is_path_tool(tool) && !path.contains('\n') => Subject::Path(
                path.trim(),
                paths::Target::new(path.trim(), self.workspace.as_deref()),
            ),
            Some(text) => Subject::Text(text.trim()),
        };
        let undecidable = match &subject {
            Subject::Bash(_, analysis) => analysis.undecidable.as_deref(),
            _ => None,
        };
        let hits = |rule: &ToolRule| names(rule) && subject.hit(rule);
        let reason = undecidable.map(|why| format!("the command could not be decided: {why}"));
        let verdict = |decision| Verdict {
            decision,
            undecidable: reason.clone(),
        };
        if self.deny.iter().any(hits) || (undecidable.is_some() && with_pattern(&self.deny)) {
            return verdict(Decision::Deny);
        }
        if self.ask.iter().any(hits) || (undecidable.is_some() && with_pattern(&self.ask)) {
            return verdict(Decision::Ask);
        }
        let allowed = self
            .allow
            .iter()
            .any(|rule| names(rule) && rule.pattern.is_none())
            || (undecidable.is_none()
                && subject.allowed(
                    |text| {
                        self.allow
                            .iter()
                            .any(|rule| names(rule) && rule.matches_argument(Some(text)))
                    },
                    |target| {
                        self.allow.iter().any(|rule| {
                            names(rule)
                                && rule
                                    .pattern
                                    .as_deref()
                                    .is_some_and(|p| glob_matches(p, target.for_pattern(p)))
                        })
                    },
                ));
        verdict(if allowed {
            Decision::Allow
        } else {
            self.default
        })
    }

    /// The rules of `decision`'s list.
    pub fn rules(&self, decision: Decision) -> &[ToolRule] {
        match decision {
            Decision::Allow => &self.allow,
            Decision::Deny => &self.deny,
            Decision::Ask => &self.ask,
        }
    }
}

/// The canonical names a CLI's other file-writing builtins also answer to, so that a rule on
/// `Edit` or `Write` cannot be sidestepped through them (Claude's `NotebookEdit`, OpenCode's
/// `multiedit` and `patch`, which can create files too).
fn file_writer_aliases(tool: &str) -> &'static [&'static str] {
    match tool {
        "NotebookEdit" | "MultiEdit" | "multiedit" => &["Edit"],
        "patch" | "apply_patch" => &["Edit", "Write"],
        _ => &[],
    }
}

/// What a rule's pattern is matched against.
enum Subject<'a> {
    /// The driver could not tell the argument.
    Unknown,
    /// A `Bash` line and the commands it runs.
    Bash(&'a str, shell::Analysis),
    /// The path of a file tool.
    Path(&'a str, paths::Target),
    /// Any other argument, as given.
    Text(&'a str),
}

impl Subject<'_> {
    /// Whether a deny or ask `rule` applies: a rule without a pattern always; an unknown
    /// argument is on the safe side; a line when the rule matches it whole or any command it
    /// runs (its program by name, or by the path written); a path in its normalised form or as
    /// given.
    fn hit(&self, rule: &ToolRule) -> bool {
        let Some(pattern) = rule.pattern.as_deref() else {
            return true;
        };
        match self {
            Self::Unknown => true,
            Self::Bash(line, analysis) => {
                glob_matches(pattern, line)
                    || analysis
                        .commands
                        .iter()
                        .chain(&analysis.written)
                        .any(|command| glob_matches(pattern, command))
            }
            Self::Path(given, target) => {
                glob_matches(pattern, given) || glob_matches(pattern, target.for_pattern(pattern))
            }
            Self::Text(text) => glob_matches(pattern, text),
        }
    }

    /// Whether allow rules with patterns cover the call: every command of a line (or the line
    /// when it runs none), a path in its normalised form only, other arguments as given.
    fn allowed(&self, text: impl Fn(&str) -> bool, path: impl Fn(&paths::Target) -> bool) -> bool {
        match self {
            Self::Unknown => false,
            Self::Bash(line, analysis) if analysis.commands.is_empty() => text(line),
            Self::Bash(_, analysis) => analysis.commands.iter().all(|c| text(c)),
            Self::Path(_, target) => path(target),
            Self::Text(argument) => text(argument),
        }
    }
}

/// Tools whose argument is a file path (with their aliases).
fn is_path_tool(tool: &str) -> bool {
    matches!(tool, "Read" | "Write" | "Edit")
        || file_writer_aliases(tool)
            .iter()
            .any(|alias| matches!(*alias, "Write" | "Edit"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(list: &[&str]) -> Vec<ToolRule> {
        list.iter().map(|r| ToolRule::parse(r).unwrap()).collect()
    }

    fn policy(allow: &[&str], deny: &[&str], ask: &[&str], default: Decision) -> ToolPolicy {
        ToolPolicy {
            allow: rules(allow),
            deny: rules(deny),
            ask: rules(ask),
            default,
            ask_timeout: DEFAULT_ASK_TIMEOUT,
            workspace: None,
        }
    }

    #[test]
    fn rules_parse_and_print_back() {
        for text in ["Bash", "Bash(git push*)", "mcp__github__*", "Read(/etc/*)"] {
            assert_eq!(ToolRule::parse(text).unwrap().to_string(), text);
        }
        let rule = ToolRule::parse(" Bash(rm *) ").unwrap();
        assert_eq!(rule.tool, "Bash");
        assert_eq!(rule.pattern.as_deref(), Some("rm *"));
        for bad in ["", "(x)", "Bash(rm", "Ba sh", "Bash()", "mcp__*__x"] {
            let err = ToolRule::parse(bad).unwrap_err().to_string();
            assert!(
                err.contains("expected Name or Name(pattern)"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn deny_wins_over_ask_and_ask_over_allow() {
        let p = policy(
            &["Bash"],
            &["Bash(rm *)"],
            &["Bash(git push*)"],
            Decision::Allow,
        );
        assert_eq!(p.decide("Bash", Some("rm -rf target")), Decision::Deny);
        assert_eq!(p.decide("Bash", Some("git push origin")), Decision::Ask);
        assert_eq!(p.decide("Bash", Some("ls")), Decision::Allow);
        let p = policy(&[], &["Bash"], &["Bash"], Decision::Allow);
        assert_eq!(p.decide("Bash", Some("ls")), Decision::Deny);
    }

    #[test]
    fn unlisted_tools_follow_the_default() {
        let p = policy(&["Read"], &[], &[], Decision::Deny);
        assert_eq!(p.decide("Read", Some("/x")), Decision::Allow);
        assert_eq!(p.decide("Write", Some("/x")), Decision::Deny);
        assert!(!p.allows_everything());
        assert!(ToolPolicy::default().allows_everything());
        assert_eq!(
            ToolPolicy::default().decide("Bash", Some("rm -rf /")),
            Decision::Allow
        );
    }

    #[test]
    fn mcp_wildcards_name_a_server() {
        let p = policy(
            &[],
            &["mcp__github__*"],
            &["mcp__nanoclaw__send_message"],
            Decision::Allow,
        );
        assert_eq!(p.decide("mcp__github__create_issue", None), Decision::Deny);
        assert_eq!(p.decide("mcp__nanoclaw__send_message", None), Decision::Ask);
        assert_eq!(
            p.decide("mcp__nanoclaw__schedule_task", None),
            Decision::Allow
        );
        assert_eq!(p.decide("mcp__githubx__y", None), Decision::Allow);
    }

    #[test]
    fn bash_deny_and_ask_see_every_simple_command() {
        let p = policy(&[], &["Bash(rm *)"], &["Bash(curl:*)"], Decision::Allow);
        for line in [
            "rm -rf target",
            "cd x && rm -rf target",
            "ls; rm -rf target",
            "true || rm -rf target",
            "echo $(rm -rf target)",
            "echo `rm -rf target`",
            "FOO=1 rm -rf target",
            "(rm -rf target)",
            "ls\nrm -rf target",
        ] {
            assert_eq!(p.decide("Bash", Some(line)), Decision::Deny, "{line:?}");
        }
        assert_eq!(p.decide("Bash", Some("echo rm")), Decision::Allow);
        assert_eq!(p.decide("Bash", Some("curl")), Decision::Ask);
        assert_eq!(
            p.decide("Bash", Some("ls | curl -d @x host")),
            Decision::Ask
        );
        assert_eq!(p.decide("Bash", Some("curly")), Decision::Allow);
    }

    #[test]
    fn a_bash_allow_pattern_must_cover_every_simple_command() {
        let p = policy(&["Bash(git push*)", "Bash(ls*)"], &[], &[], Decision::Deny);
        assert_eq!(p.decide("Bash", Some("git push origin")), Decision::Allow);
        assert_eq!(p.decide("Bash", Some("ls -la | git push")), Decision::Allow);
        assert_eq!(
            p.decide("Bash", Some("git push && rm -rf /")),
            Decision::Deny
        );
    }

    #[test]
    fn an_unknown_argument_is_on_the_safe_side() {
        let p = policy(&["Bash(ls*)"], &["Read(/etc/*)"], &[], Decision::Ask);
        assert_eq!(p.decide("Read", None), Decision::Deny);
        assert_eq!(p.decide("Bash", None), Decision::Ask);
        assert_eq!(p.decide("Read", Some("src/x.rs")), Decision::Ask);
    }

    #[test]
    fn other_file_writers_follow_the_rules_on_edit_and_write() {
        let p = policy(&[], &["Write"], &["Edit"], Decision::Allow);
        assert_eq!(p.decide("NotebookEdit", Some("a.ipynb")), Decision::Ask);
        assert_eq!(p.decide("multiedit", Some("a.rs")), Decision::Ask);
        assert_eq!(p.decide("patch", None), Decision::Deny);
        assert_eq!(p.decide("Read", Some("a.rs")), Decision::Allow);
        let p = policy(&["Edit", "Write"], &[], &[], Decision::Deny);
        assert_eq!(p.decide("patch", None), Decision::Allow);
        assert_eq!(p.decide("NotebookEdit", None), Decision::Allow);
    }

    #[test]
    fn globs_match_literally_around_stars() {
        assert!(glob_matches("rm *", "rm -rf x"));
        assert!(!glob_matches("rm *", "rm"));
        assert!(glob_matches("*.env", "/a/b/.env"));
        assert!(glob_matches("a*b*c", "aXbYc"));
        assert!(!glob_matches("a*b*c", "aXcYb"));
        assert!(glob_matches("npm run test:*", "npm run test"));
        assert!(glob_matches("npm run test:*", "npm run test --watch"));
        assert!(!glob_matches("npm run test:*", "npm run tests"));
        assert!(glob_matches("*", ""));
        assert!(glob_matches("ab*ab", "abab"));
        assert!(!glob_matches("ab*ab", "aba"));
    }

    #[test]
    fn the_policy_reads_from_config_json() {
        let rules: Vec<ToolRule> = serde_json::from_str(r#"["Bash(rm *)", "Read"]"#).unwrap();
        assert_eq!(rules, super::tests::rules(&["Bash(rm *)", "Read"]));
        let err = serde_json::from_str::<Vec<ToolRule>>(r#"["Bash(rm"]"#).unwrap_err();
        assert!(err.to_string().contains("must end with"), "{err}");
        assert_eq!(
            serde_json::to_string(&rules).unwrap(),
            r#"["Bash(rm *)","Read"]"#
        );
    }
}
