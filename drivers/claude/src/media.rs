//! Native media for Claude (docs/contract/prompt.md#attachments, issue 6): images (JPEG, PNG, GIF,
//! WebP) and PDFs of a [`Prompt`] become base64 `image` / `document` content blocks of the
//! stream-json user message, placed before the text block (Anthropic recommends media first).
//!
//! Which files qualify and their limits are the one table in [`provider::media`]. A file over its
//! limit, of another type, or that cannot be read is skipped with a log line; the prompt text still names its path
//! (`[file available at: …]`), so the agent can open it with its own tools.

use std::path::Path;

use serde_json::{json, Value};

use base64::Engine as _;

use provider::media::{native_kind, NativeKind, MAX_TOTAL_BYTES};
use provider::{MediaFile, Prompt};

/// The content of one user message: media blocks (within the limits), then the text block.
pub(crate) async fn message_content(prompt: &Prompt) -> Vec<Value> {
    let mut content = Vec::new();
    let mut budget = MAX_TOTAL_BYTES;
    for file in &prompt.media {
        if let Some(block) = media_block(file, &mut budget).await {
            content.push(block);
        }
    }
    content.push(json!({"type": "text", "text": prompt.text}));
    content
}

/// One media block, or `None` (logged) when the file does not qualify.
async fn media_block(file: &MediaFile, budget: &mut u64) -> Option<Value> {
    let path = file.path.as_path();
    let Some((mime, kind)) = native_kind(&file.mime_type) else {
        tracing::debug!(path = %path.display(), mime = %file.mime_type, "not sent natively: not an image or PDF");
        return None;
    };
    let limit = kind.max_bytes();
    let size = match tokio::fs::metadata(path).await {
        Ok(meta) if meta.is_file() => meta.len(),
        Ok(_) => {
            tracing::warn!(path = %path.display(), "not sent natively: not a regular file");
            return None;
        }
        Err(err) => {
            tracing::warn!(path = %path.display(), %err, "not sent natively: cannot read the file");
            return None;
        }
    };
    if size > limit {
        tracing::warn!(path = %path.display(), size, limit, "not sent natively: over the API's size limit");
        return None;
    }
    if size > *budget {
        tracing::warn!(path = %path.display(), size, remaining = *budget, "not sent natively: the message's media budget is spent");
        return None;
    }
    let data = match read_limited(path, limit).await {
        Ok(data) => data,
        Err(err) => {
            tracing::warn!(path = %path.display(), %err, "not sent natively: cannot read the file");
            return None;
        }
    };
    *budget = budget.saturating_sub(data.len() as u64);
    Some(block(kind, mime, &data))
}

/// Reads a file, refusing one that grew past `limit` since its size was checked.
async fn read_limited(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    // Through fsguard: the path comes from a message, and closing a descriptor of a session DB
    // file would drop this process's locks on it.
    let owned = path.to_path_buf();
    let data = tokio::task::spawn_blocking(move || fsguard::read(&owned))
        .await
        .map_err(std::io::Error::other)??;
    if data.len() as u64 > limit {
        return Err(std::io::Error::other("the file grew past the size limit"));
    }
    Ok(data)
}

fn block(kind: NativeKind, mime: &str, data: &[u8]) -> Value {
    let data = base64::engine::general_purpose::STANDARD.encode(data);
    let source = json!({"type": "base64", "media_type": mime, "data": data});
    match kind {
        NativeKind::Image => json!({"type": "image", "source": source}),
        NativeKind::Pdf => json!({"type": "document", "source": source}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 9.1: a media path that is a link to the session DB's files is not read, and the
    /// DB's locks survive (a plain read and close would drop them).
    #[tokio::test]
    async fn links_to_the_session_db_are_never_read() {
        let dir = tempfile::tempdir().unwrap();
        let (db, _conn) = fsguard::testing::wal_db(dir.path());
        let shm = dir.path().join("session.db-shm");
        std::os::unix::fs::symlink(&shm, dir.path().join("shm.png")).unwrap();
        std::fs::hard_link(&db, dir.path().join("db.pdf")).unwrap();
        for (name, mime) in [("shm.png", "image/png"), ("db.pdf", "application/pdf")] {
            let prompt = Prompt {
                text: "look".into(),
                media: vec![MediaFile {
                    path: dir.path().join(name),
                    mime_type: mime.into(),
                }],
            };
            let content = message_content(&prompt).await;
            assert_eq!(
                content,
                vec![json!({"type": "text", "text": "look"})],
                "{name}"
            );
            assert!(
                fsguard::testing::locked_by_another_process(&shm),
                "{name}: the connection's lock is kept"
            );
        }
    }
}
