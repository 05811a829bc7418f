//! What one reply of the fake model is made of (its blocks, its usage, the frames of its SSE
//! body) and what the per-API renderers (`anthropic.rs`, `responses.rs`, `chat.rs`) need of the
//! request they answer ([`Reply`]): below the server core and the renderers, so that neither
//! imports the other.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Token figures one reply reports (module docs, "Usage"). Counted like Anthropic: `input`
/// excludes cache reads and writes; `output` includes `reasoning`. Missing JSON fields are 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StepUsage {
    /// Input tokens neither read from nor written to the cache.
    pub input: u64,
    /// Output tokens, reasoning included.
    pub output: u64,
    /// Input tokens read from the prompt cache.
    pub cache_read: u64,
    /// Input tokens written to the prompt cache (Anthropic only: OpenAI reports none).
    pub cache_write: u64,
    /// Reasoning tokens, part of `output` (OpenAI APIs only: Anthropic reports none apart).
    pub reasoning: u64,
}

impl StepUsage {
    /// All input tokens, as OpenAI counts them (cached ones included).
    fn openai_input(&self) -> u64 {
        self.input.saturating_add(self.cache_read)
    }

    /// Anthropic's `usage` object with `output_tokens` as given (`message_start` carries at
    /// most 1; the final count comes in `message_delta`).
    pub(super) fn anthropic(&self, output_tokens: u64) -> Value {
        json!({"input_tokens": self.input,
               "cache_creation_input_tokens": self.cache_write,
               "cache_read_input_tokens": self.cache_read,
               "output_tokens": output_tokens})
    }

    /// The Responses API's `response.usage`.
    pub(super) fn responses(&self) -> Value {
        let input = self.openai_input();
        json!({"input_tokens": input,
               "input_tokens_details": {"cached_tokens": self.cache_read},
               "output_tokens": self.output,
               "output_tokens_details": {"reasoning_tokens": self.reasoning},
               "total_tokens": input.saturating_add(self.output)})
    }

    /// The Gemini API's `usageMetadata`: the prompt with the cache reads (as Google counts),
    /// candidates without the thoughts, the total of all.
    pub(super) fn gemini(&self) -> Value {
        let input = self.openai_input();
        let candidates = self.output.saturating_sub(self.reasoning);
        json!({"promptTokenCount": input,
               "cachedContentTokenCount": self.cache_read,
               "candidatesTokenCount": candidates,
               "thoughtsTokenCount": self.reasoning,
               "totalTokenCount": input.saturating_add(self.output)})
    }

    /// Chat Completions' `usage`.
    pub(super) fn chat(&self) -> Value {
        let input = self.openai_input();
        json!({"prompt_tokens": input,
               "completion_tokens": self.output,
               "total_tokens": input.saturating_add(self.output),
               "prompt_tokens_details": {"cached_tokens": self.cache_read},
               "completion_tokens_details": {"reasoning_tokens": self.reasoning}})
    }
}

/// Content of one reply.
#[derive(Clone, Debug)]
pub(super) enum Block {
    Text {
        text: String,
        chunks: usize,
        delay_ms: u64,
    },
    Call {
        name: String,
        namespace: Option<String>,
        arguments: String,
    },
}

impl Block {
    pub(super) fn text(text: impl Into<String>, chunks: usize, delay_ms: u64) -> Block {
        Block::Text {
            text: text.into(),
            chunks: chunks.max(1),
            delay_ms,
        }
    }
}

/// What happens between the first SSE event(s) and the content.
#[derive(Clone, Copy, Debug)]
pub(super) enum Pause {
    Sleep(u64),
    /// Wait for a release (generation > the one seen at arrival) or the timeout.
    Release {
        timeout_ms: u64,
    },
}

#[derive(Clone, Debug, Default)]
pub(super) struct Plan {
    pub(super) blocks: Vec<Block>,
    /// What the reply reports.
    pub(super) usage: StepUsage,
    pub(super) pause: Option<Pause>,
    /// Close the connection after the first event(s) instead of sending content.
    pub(super) abort_after_start: bool,
    /// Close the connection right after the headers.
    pub(super) abort_at_once: bool,
}

/// One unit of the SSE body.
pub(super) enum Frame {
    Data(String),
    Sleep(u64),
    Pause(Pause),
    Abort,
}

/// The request a reply answers, as the API renderers see it.
pub(super) struct Reply<'a> {
    /// The model the request named, echoed in the reply.
    pub(super) model: &'a str,
    /// Chat Completions: the request asked for a final usage chunk (`stream_options`).
    pub(super) include_usage: bool,
    /// The server's id counter (ids are unique across the server's replies).
    ids: &'a AtomicU64,
}

impl<'a> Reply<'a> {
    pub(super) fn new(model: &'a str, include_usage: bool, ids: &'a AtomicU64) -> Self {
        Self {
            model,
            include_usage,
            ids,
        }
    }

    /// A fresh id such as `msg_fake7`.
    pub(super) fn id(&self, prefix: &str) -> String {
        format!(
            "{prefix}_fake{}",
            self.ids.fetch_add(1, Ordering::Relaxed) + 1
        )
    }

    /// Frames after the start event(s): pause / abort.
    pub(super) fn after_start(plan: &Plan, frames: &mut Vec<Frame>) -> bool {
        if let Some(p) = plan.pause {
            frames.push(Frame::Pause(p));
        }
        if plan.abort_after_start {
            frames.push(Frame::Abort);
            return false;
        }
        true
    }
}

pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Split `text` into `n` roughly equal pieces on char boundaries (no empty pieces, except a
/// single empty piece for empty text).
pub(super) fn split_chunks(text: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let n = n.clamp(1, chars.len().max(1));
    let size = chars.len().div_ceil(n).max(1);
    let mut out: Vec<String> = chars.chunks(size).map(|c| c.iter().collect()).collect();
    if out.is_empty() {
        out.push(String::new());
    }
    out
}
