//! OpenCode provider: one long-lived `opencode serve` on loopback, `prompt_async` + `/event` SSE.
