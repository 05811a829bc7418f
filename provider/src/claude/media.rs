//! Native media for Claude (SPEC §9, issue 6): images (JPEG, PNG, GIF, WebP) and PDFs of a
//! [`Prompt`] become base64 `image` / `document` content blocks of the stream-json user message,
//! placed before the text block (Anthropic recommends media first).
//!
//! Limits follow the Messages API, which measures the base64 data: an image may be at most
//! 5 MiB of base64 and a request at most 32 MB. A file over its limit, of another type, or that
//! cannot be read is skipped with a log line; the prompt text still names its path
//! (`[file available at: …]`), so the agent can open it with its own tools.

use std::path::Path;

use serde_json::{json, Value};

use crate::{MediaFile, Prompt};

/// Largest image file sent natively: its base64 must stay within the API's 5 MiB per image.
pub(crate) const MAX_IMAGE_BYTES: u64 = 5 * 1024 * 1024 / 4 * 3;
/// Largest PDF sent natively: its base64 must fit in the API's 32 MB request.
pub(crate) const MAX_PDF_BYTES: u64 = 24_000_000;
/// Raw bytes of all media in one message together, for the same 32 MB request limit (the
/// conversation itself needs room too).
pub(crate) const MAX_TOTAL_BYTES: u64 = 24_000_000;

/// The kind of content block a MIME type maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Image,
    Pdf,
}

/// Normalises a MIME type (lower case, no parameters, `image/jpg` → `image/jpeg`) and says how
/// Claude takes it natively, if at all.
fn classify(mime: &str) -> Option<(&'static str, Kind)> {
    let base = mime
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    match base.as_str() {
        "image/jpeg" | "image/jpg" | "image/pjpeg" => Some(("image/jpeg", Kind::Image)),
        "image/png" => Some(("image/png", Kind::Image)),
        "image/gif" => Some(("image/gif", Kind::Image)),
        "image/webp" => Some(("image/webp", Kind::Image)),
        "application/pdf" => Some(("application/pdf", Kind::Pdf)),
        _ => None,
    }
}

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
    let Some((mime, kind)) = classify(&file.mime_type) else {
        tracing::debug!(path = %path.display(), mime = %file.mime_type, "not sent natively: not an image or PDF");
        return None;
    };
    let limit = match kind {
        Kind::Image => MAX_IMAGE_BYTES,
        Kind::Pdf => MAX_PDF_BYTES,
    };
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

fn block(kind: Kind, mime: &str, data: &[u8]) -> Value {
    let source = json!({"type": "base64", "media_type": mime, "data": base64(data)});
    match kind {
        Kind::Image => json!({"type": "image", "source": source}),
        Kind::Pdf => json!({"type": "document", "source": source}),
    }
}

/// Standard base64 with padding (RFC 4648 §4).
pub(crate) fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let sextet = |shift: u32| char::from(ALPHABET[((n >> shift) & 63) as usize]);
        out.push(sextet(18));
        out.push(sextet(12));
        out.push(if chunk.len() > 1 { sextet(6) } else { '=' });
        out.push(if chunk.len() > 2 { sextet(0) } else { '=' });
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        let vectors = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, encoded) in vectors {
            assert_eq!(base64(plain.as_bytes()), encoded, "{plain:?}");
        }
        assert_eq!(base64(&[0xff, 0xfe, 0xfd]), "//79");
    }

    #[test]
    fn mime_types_are_normalised() {
        assert_eq!(classify("IMAGE/JPG"), Some(("image/jpeg", Kind::Image)));
        assert_eq!(
            classify("application/pdf; charset=binary"),
            Some(("application/pdf", Kind::Pdf))
        );
        assert_eq!(classify("image/svg+xml"), None);
        assert_eq!(classify("text/plain"), None);
    }

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
