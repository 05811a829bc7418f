//! Claude Code provider: one long-lived `claude -p` stream-json process per session.
