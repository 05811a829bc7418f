//! Writing archives: file names from a slug of the conversation's headline, new files created
//! atomically and never over an existing one, and appending only what the session's earlier
//! archives do not hold yet. Every archive file the agent could have replaced is opened through
//! `fsguard`.

use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use serde_json::Value;

use super::model::Transcript;
use super::render::{
    render_entries, render_markdown, RenderOptions, HEADER_MARKER, THROUGH_MARKER,
};

/// Longest file-name slug, in characters.
pub(crate) const MAX_SLUG_CHARS: usize = 50;

/// The slug when neither the title nor a user message gives one.
pub(crate) const FALLBACK_SLUG: &str = "conversation";

/// A file-name slug: lowercase ASCII letters and digits, words joined by `-`, at most
/// `MAX_SLUG_CHARS` (cut at a word boundary when one is near), `FALLBACK_SLUG` when
/// nothing is left.
pub(crate) fn slug(text: &str) -> String {
    let mut slug = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            slug.push(c.to_ascii_lowercase());
        } else if !slug.is_empty() && !slug.ends_with('-') {
            slug.push('-');
        }
    }
    if slug.len() > MAX_SLUG_CHARS {
        let cut = &slug[..=MAX_SLUG_CHARS];
        slug = match cut.rfind('-') {
            Some(dash) if dash >= MAX_SLUG_CHARS / 2 => cut[..dash].to_owned(),
            _ => slug[..MAX_SLUG_CHARS].to_owned(),
        };
    }
    let slug = slug.trim_matches('-');
    if slug.is_empty() {
        FALLBACK_SLUG.to_owned()
    } else {
        slug.to_owned()
    }
}

/// Writes the transcript into a NEW file `<dir>/<YYYY-MM-DD in tz>-<slug>.md` (`-2`, `-3`, …
/// when the name is taken: an existing archive is never replaced) and returns its path. The
/// folder is created when missing. The file appears atomically with its whole content. An
/// empty transcript still gets a file (header only): callers skip those.
pub fn write_archive(
    dir: &Path,
    transcript: &Transcript,
    now: DateTime<Utc>,
    tz: Tz,
) -> io::Result<PathBuf> {
    write_archive_with(dir, transcript, &RenderOptions::new(tz, now))
}

/// [`write_archive`] with explicit rendering options.
pub fn write_archive_with(
    dir: &Path,
    transcript: &Transcript,
    opts: &RenderOptions,
) -> io::Result<PathBuf> {
    let text = render_markdown(transcript, opts);
    let stem = format!(
        "{}-{}",
        opts.date(),
        slug(&transcript.headline().unwrap_or_default())
    );
    create_new_file(dir, &stem, text.as_bytes())
}

/// Archives the entries no earlier archive of this session holds (see the module docs):
/// appended to today's archive of the session when there is one, else in a new file. Returns
/// the file written, or `None` when there was nothing new.
pub fn archive_new_entries(
    dir: &Path,
    transcript: &Transcript,
    opts: &RenderOptions,
) -> io::Result<Option<PathBuf>> {
    if transcript.entries.is_empty() {
        return Ok(None);
    }
    let archives = session_archives(dir, &transcript.provider, &transcript.session_id)?;
    let mut start = 0;
    if let Some(latest) = newest(&archives) {
        match last_marker(&latest.path)? {
            Some(id) => match transcript
                .entries
                .iter()
                .rposition(|e| e.id.as_deref() == Some(id.as_str()))
            {
                Some(i) => start = i + 1,
                None => tracing::warn!(
                    archive = %latest.path.display(),
                    entry = %id,
                    "the last archived entry is not in the history any more; archiving all of it"
                ),
            },
            None => tracing::warn!(
                archive = %latest.path.display(),
                "the session's last archive has no end marker; archiving the whole history"
            ),
        }
    }
    let new = &transcript.entries[start..];
    if new.is_empty() {
        return Ok(None);
    }
    let date = opts.date();
    let today = archives
        .iter()
        .filter(|a| {
            a.path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{date}-")))
        })
        .max_by_key(|a| (a.modified, a.path.clone()));
    if let Some(today) = today {
        // Through fsguard: an agent can replace an archive with a link to the session DB.
        let mut file = fsguard::open_with(&today.path, fsguard::Access::Append)?;
        file.write_all(render_entries(new, opts).as_bytes())?;
        file.sync_all()?;
        return Ok(Some(today.path.clone()));
    }
    let part = Transcript {
        entries: new.to_vec(),
        ..transcript.clone()
    };
    write_archive_with(dir, &part, opts).map(Some)
}

/// The id of the last entry archived for `provider`'s session `session_id` (the end marker of
/// its newest archive in `dir`), or `None` when there is no archive of it. A reader of the CLI's
/// history needs only what comes after this entry.
pub fn archived_through(
    dir: &Path,
    provider: &str,
    session_id: &str,
) -> io::Result<Option<String>> {
    match newest(&session_archives(dir, provider, session_id)?) {
        Some(latest) => last_marker(&latest.path),
        None => Ok(None),
    }
}

/// The archive written last.
fn newest(archives: &[SessionArchive]) -> Option<&SessionArchive> {
    archives.iter().max_by_key(|a| (a.modified, a.path.clone()))
}

/// An archive file of one session.
struct SessionArchive {
    path: PathBuf,
    modified: std::time::SystemTime,
}

/// The `.md` files in `dir` whose first line names this provider and session.
fn session_archives(
    dir: &Path,
    provider: &str,
    session_id: &str,
) -> io::Result<Vec<SessionArchive>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(err),
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("md") {
            continue;
        }
        let Some((header_provider, session)) = read_header(&path) else {
            continue;
        };
        if header_provider == provider && session == session_id {
            let modified = entry
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            found.push(SessionArchive { path, modified });
        }
    }
    Ok(found)
}

/// Provider and session from an archive's first line.
fn read_header(path: &Path) -> Option<(String, String)> {
    use std::io::Read as _;
    let mut head = Vec::with_capacity(1024);
    fsguard::open(path)
        .ok()?
        .take(4096)
        .read_to_end(&mut head)
        .ok()?;
    let head = String::from_utf8_lossy(&head);
    let line = head.lines().next()?;
    let meta: Value =
        serde_json::from_str(line.strip_prefix(HEADER_MARKER)?.strip_suffix(" -->")?).ok()?;
    Some((
        meta["provider"].as_str()?.to_owned(),
        meta["session"].as_str()?.to_owned(),
    ))
}

/// The first tail of an archive that [`last_marker`] reads; each further try reads 8 times more.
const MARKER_WINDOW: u64 = 16 * 1024;

/// The entry id of the last end marker in an archive. The marker ends what each archive run
/// wrote, so it is read from the file's tail (a longer tail when the last one held no whole
/// marker line), never the whole of a day's archive: that grows with every query, and a read
/// of it would too. Text that is not UTF-8 (an edited archive) is read lossily.
fn last_marker(path: &Path) -> io::Result<Option<String>> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let mut file = fsguard::open(path)?;
    let len = file.metadata()?.len();
    let mut window = MARKER_WINDOW;
    loop {
        let start = len.saturating_sub(window);
        file.seek(SeekFrom::Start(start))?;
        let mut tail = Vec::new();
        (&mut file).take(len - start).read_to_end(&mut tail)?;
        let text = String::from_utf8_lossy(&tail);
        // A tail that starts mid-file starts mid-line: only the lines after its first newline
        // are whole.
        let whole = match start {
            0 => &text[..],
            _ => text.split_once('\n').map_or("", |(_, rest)| rest),
        };
        let marker = whole
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix(THROUGH_MARKER)?.strip_suffix(" -->"))
            .and_then(|json| serde_json::from_str::<Value>(json).ok())
            .and_then(|v| v["entry"].as_str().map(str::to_owned));
        if marker.is_some() || start == 0 {
            return Ok(marker);
        }
        window = window.saturating_mul(8);
    }
}

/// Creates `<dir>/<stem>.md`, or `<stem>-2.md`, … when taken, holding `content`. The content
/// goes to a temporary file first, which is then hard-linked to the final name: the link fails
/// when the name exists (never replacing it) and the file appears complete. Where hard links
/// are not supported, the final name is opened with `create_new` and written directly.
fn create_new_file(dir: &Path, stem: &str, content: &[u8]) -> io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let nanos = Utc::now().timestamp_nanos_opt().unwrap_or_default();
    let tmp = dir.join(format!(".{stem}.{}.{nanos}.tmp", std::process::id()));
    let result = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        file.write_all(content)?;
        file.sync_all()?;
        drop(file);
        let mut link_works = true;
        for n in 1..=10_000u32 {
            let name = if n == 1 {
                format!("{stem}.md")
            } else {
                format!("{stem}-{n}.md")
            };
            let path = dir.join(name);
            if link_works {
                match std::fs::hard_link(&tmp, &path) {
                    Ok(()) => return Ok(path),
                    Err(err) if err.kind() == io::ErrorKind::AlreadyExists => continue,
                    Err(err) => {
                        tracing::debug!(error = %err, "hard link failed; writing the archive in place");
                        link_works = false;
                    }
                }
            }
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut file) => {
                    file.write_all(content)?;
                    file.sync_all()?;
                    return Ok(path);
                }
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(err) => return Err(err),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("every name for {stem} is taken"),
        ))
    })();
    let _ = std::fs::remove_file(&tmp);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs() {
        let cases = [
            (
                "Can you check the build & tell me if it's green?",
                "can-you-check-the-build-tell-me-if-it-s-green",
            ),
            (
                "  ¿Qué tal?  Ünïcode → ascii only ",
                "qu-tal-n-code-ascii-only",
            ),
            ("", "conversation"),
            ("!!! ???", "conversation"),
            (
                "a very long first message that goes on and on about nothing at all really",
                "a-very-long-first-message-that-goes-on-and-on",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(slug(text), want, "{text:?}");
            assert!(slug(text).len() <= MAX_SLUG_CHARS);
        }
        assert_eq!(
            slug(&"x".repeat(80)),
            "x".repeat(50),
            "no word boundary: a hard cut"
        );
    }

    /// The marker is read from the archive's tail: found past a long archive, across the edge
    /// of the first tail read, and behind text that is not UTF-8 (which a whole-file read
    /// refused, stopping every later archive of the session).
    #[test]
    fn the_last_marker_is_read_from_the_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.md");
        let marker = |id: &str| format!("{THROUGH_MARKER}{{\"entry\":\"{id}\"}} -->\n");
        let mut text = b"<!-- nanoclaw-archive {} -->\n\xff\xfe not UTF-8\n".to_vec();
        text.extend(marker("early").as_bytes());
        text.extend(vec![b'x'; 200_000]);
        text.extend(b"\n");
        text.extend(marker("last").as_bytes());
        std::fs::write(&path, &text).unwrap();
        assert_eq!(last_marker(&path).unwrap().as_deref(), Some("last"));
        // The last marker straddles the first window's edge, with a long line after it.
        let mut text = marker("straddling").into_bytes();
        text.extend(vec![b'y'; MARKER_WINDOW as usize - 10]);
        text.extend(b"\n");
        std::fs::write(&path, &text).unwrap();
        assert_eq!(last_marker(&path).unwrap().as_deref(), Some("straddling"));
        std::fs::write(&path, b"no marker\n").unwrap();
        assert_eq!(last_marker(&path).unwrap(), None);
    }
}
