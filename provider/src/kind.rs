//! Which provider to run: the one list of provider names. Config validation, the config help
//! and [`crate::create`] all go through [`ProviderKind`], so adding a provider is a variant here,
//! an arm in `create` and its own module.

use std::fmt;
use std::str::FromStr;

/// A provider the runner can drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProviderKind {
    /// Claude Code (`claude`).
    Claude,
    /// Codex (`codex`).
    Codex,
    /// OpenCode (`opencode`).
    OpenCode,
    /// Gemini CLI over ACP (`gemini`: the ACP driver's preset).
    Gemini,
    /// Qwen Code over ACP (`qwen`: the ACP driver's preset).
    Qwen,
    /// Any Agent Client Protocol agent, run as `acpCommand` says (`acp`).
    Acp,
    /// The echoing mock for demos and tests (`mock`).
    Mock,
}

impl ProviderKind {
    /// Every provider, in the order help texts list them.
    pub const ALL: [ProviderKind; 7] = [
        Self::Claude,
        Self::Codex,
        Self::OpenCode,
        Self::Gemini,
        Self::Qwen,
        Self::Acp,
        Self::Mock,
    ];

    /// The name used in the configuration (`provider`), in `continuation:<name>` keys and as the
    /// folder of the CLI's private home.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Claude => "claude",
            Self::Codex => "codex",
            Self::OpenCode => "opencode",
            Self::Gemini => "gemini",
            Self::Qwen => "qwen",
            Self::Acp => "acp",
            Self::Mock => "mock",
        }
    }

    /// Every name, joined by `separator` (`"claude, codex, opencode, gemini, qwen, acp, mock"`).
    pub fn names(separator: &str) -> String {
        Self::ALL.map(Self::name).join(separator)
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A provider name that is not one of [`ProviderKind::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("provider {name:?} is not one of {}", ProviderKind::names(", "))]
pub struct UnknownProvider {
    /// The name as given.
    pub name: String,
}

impl FromStr for ProviderKind {
    type Err = UnknownProvider;

    /// Exact names only: the config has always taken them as written.
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.name() == name)
            .ok_or_else(|| UnknownProvider {
                name: name.to_owned(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for kind in ProviderKind::ALL {
            assert_eq!(kind.to_string().parse::<ProviderKind>(), Ok(kind));
        }
        assert_eq!(
            ProviderKind::names(", "),
            "claude, codex, opencode, gemini, qwen, acp, mock",
            "the order help texts show"
        );
        assert_eq!(
            "Claude"
                .parse::<ProviderKind>()
                .map_err(|err| err.to_string()),
            Err("provider \"Claude\" is not one of claude, codex, opencode, gemini, qwen, acp, mock".to_owned())
        );
    }
}
