//! Codex provider: `codex app-server` JSON-RPC over stdio.
