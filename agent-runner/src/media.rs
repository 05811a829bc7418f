//! Inbound attachments (docs/contract/prompt.md#attachments): each attachment of a message becomes
//! a file on disk the agent can open, or a note saying why it could not.
//!
//! - `localPath` (relative to the workspace root, or absolute) is referenced in place, without a
//!   copy, once its canonical path (symlinks resolved) is a regular file inside the canonical
//!   workspace. Copying would only duplicate a file the agent can already read.
//! - `data` (base64, optionally as a `data:` URL) and `url` (http/https only) are saved under
//!   `<workspace>/downloads/<messageId>/<safe name>`, never overwriting an existing file
//!   (`name.txt`, `name-1.txt`, ...). Downloads are capped in size (the announced
//!   `Content-Length` and the bytes actually received), in total time and in redirects; a
//!   partial file is removed.
//! - A failure becomes [`AttachmentNote::Unavailable`] with a reason and a `warn` log line, never
//!   a panic or a silently missing file.
//!
//! Images (JPEG, PNG, GIF, WebP) and PDFs also become [`MediaFile`]s for native content blocks,
//! within the caps of `provider::media` (the one table the Claude driver follows too).
//! The type comes from the file's magic bytes: the API rejects a block whose bytes do not match
//! its declared type, which would fail the whole turn, so a declared `mimeType` or an extension
//! alone never makes a native block (the file is still available by path).

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use provider::MediaFile;
use schema::Attachment;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::format::AttachmentNote;

/// Longest file name (in bytes) [`safe_file_name`] produces, extension included.
const MAX_NAME_BYTES: usize = 120;

/// Longest extension (dot included) kept when a long name is shortened.
const MAX_EXTENSION_BYTES: usize = 16;

/// Name of a file or folder whose name sanitises to nothing.
const FALLBACK_NAME: &str = "attachment";

/// How many `-N` suffixes are tried before giving up on a free name.
const MAX_DUPLICATES: usize = 1000;

/// Bytes read from the start of a file to recognise its type.
const SNIFF_BYTES: usize = 1024;

/// Limits of attachment resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaLimits {
    /// Largest file saved from `url` or `data`.
    pub max_bytes: u64,
    /// Total time of one download (connect, redirects, body).
    pub timeout: Duration,
    /// Redirects followed per download.
    pub max_redirects: usize,
}

impl Default for MediaLimits {
    /// 25 MiB, 30 s, 5 redirects.
    fn default() -> Self {
        Self {
            max_bytes: 25 * 1024 * 1024,
            timeout: Duration::from_secs(30),
            max_redirects: 5,
        }
    }
}

/// The attachments of one message, resolved.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResolvedAttachments {
    /// One note per attachment, in order.
    pub notes: Vec<AttachmentNote>,
    /// The available images and PDFs, in order, for native content blocks.
    pub media: Vec<MediaFile>,
}

/// Resolves the attachments of message `message_id`: saves `data` and `url` attachments under
/// `<workspace>/downloads/<messageId>/`, checks `localPath` ones, and reports each.
///
/// Never fails: a problem with one attachment becomes its `Unavailable` note (and a log line).
/// Downloads honour the usual proxy variables (`HTTPS_PROXY`, `NO_PROXY`, ...).
pub async fn resolve_attachments(
    message_id: &str,
    attachments: &[Attachment],
    workspace: &Path,
    limits: &MediaLimits,
) -> ResolvedAttachments {
    resolve(message_id, attachments, workspace, limits, true).await
}

async fn resolve(
    message_id: &str,
    attachments: &[Attachment],
    workspace: &Path,
    limits: &MediaLimits,
    use_proxy: bool,
) -> ResolvedAttachments {
    let mut resolved = ResolvedAttachments::default();
    if attachments.is_empty() {
        return resolved;
    }
    // Symlinks in the workspace path itself (a bind mount, macOS /tmp) must not make every
    // local path look like an escape.
    let workspace = tokio::fs::canonicalize(workspace)
        .await
        .unwrap_or_else(|_| workspace.to_path_buf());
    let target = DownloadDir {
        workspace: &workspace,
        dir: workspace.join("downloads").join(safe_file_name(message_id)),
    };
    let mut client: Option<Result<reqwest::Client, String>> = None;
    for attachment in attachments {
        // The name shown in notes and logs; a saved file may also get an extension from its
        // magic bytes.
        let name = file_name(attachment, &[]);
        let result = match source(attachment) {
            Some(Source::LocalPath(local)) => resolve_local(&workspace, local).await,
            Some(Source::Data(data)) => save_data(&target, attachment, data, limits).await,
            Some(Source::Url(url)) => {
                let client = client.get_or_insert_with(|| build_client(limits, use_proxy));
                match client {
                    Ok(client) => download(client, &target, attachment, url, limits).await,
                    Err(err) => Err(err.clone()),
                }
            }
            None => Err("the attachment has no localPath, url or data".to_owned()),
        };
        match result {
            Ok(path) => {
                if let Some(media) = native_media(&path, attachment).await {
                    resolved.media.push(media);
                }
                resolved.notes.push(AttachmentNote::Available {
                    path: path.to_string_lossy().into_owned(),
                });
            }
            Err(reason) => {
                tracing::warn!(message_id, attachment = %name, %reason, "attachment unavailable");
                resolved
                    .notes
                    .push(AttachmentNote::Unavailable { name, reason });
            }
        }
    }
    resolved
}

/// Makes `name` safe as one file name: only its last path segment (`../../etc/passwd` →
/// `passwd`), without control or bidi-override characters, leading dots or surrounding
/// whitespace, at most 120 bytes with the extension kept; `attachment` when nothing is left.
pub fn safe_file_name(name: &str) -> String {
    let last = name
        .split(['/', '\\'])
        .rfind(|segment| !segment.trim().is_empty())
        .unwrap_or("");
    let cleaned: String = last
        .chars()
        .filter(|&c| !c.is_control() && !is_bidi_control(c))
        .collect();
    let cleaned = cleaned.trim().trim_start_matches('.').trim_start();
    if cleaned.is_empty() {
        return FALLBACK_NAME.to_owned();
    }
    if cleaned.len() <= MAX_NAME_BYTES {
        return cleaned.to_owned();
    }
    let (stem, extension) = split_extension(cleaned);
    let extension = if extension.len() <= MAX_EXTENSION_BYTES {
        extension
    } else {
        ""
    };
    let stem = truncate_to_boundary(stem, MAX_NAME_BYTES - extension.len()).trim_end();
    if stem.is_empty() {
        return FALLBACK_NAME.to_owned();
    }
    format!("{stem}{extension}")
}

/// Characters that reorder displayed text (`photo\u{202E}gpj.exe` shows as `photoexe.jpg`).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Splits `name.ext` into `name` and `.ext`; a name without a dot (or only a leading one) has no
/// extension.
fn split_extension(name: &str) -> (&str, &str) {
    match name.rfind('.') {
        Some(dot) if dot > 0 => name.split_at(dot),
        _ => (name, ""),
    }
}

fn truncate_to_boundary(text: &str, max: usize) -> &str {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Where an attachment comes from. Exactly one source is used, the first of `localPath`,
/// `data`, `url` (empty strings do not count).
enum Source<'a> {
    LocalPath(&'a str),
    Data(&'a str),
    Url(&'a str),
}

fn source(attachment: &Attachment) -> Option<Source<'_>> {
    fn present(value: &Option<String>) -> Option<&str> {
        value
            .as_deref()
            .map(str::trim)
            .filter(|value| !value.is_empty())
    }
    present(&attachment.local_path)
        .map(Source::LocalPath)
        .or_else(|| present(&attachment.data).map(Source::Data))
        .or_else(|| present(&attachment.url).map(Source::Url))
}

/// The safe file name of an attachment: its `name`, else the last segment of its URL or local
/// path. A name without an extension gets one from the declared MIME type (parameters and case
/// ignored), else from the attachment's `type` ([`extension_for_kind`]), else from `head`, the
/// first bytes of the file when they are known (empty otherwise), by [`sniff`].
fn file_name(attachment: &Attachment, head: &[u8]) -> String {
    let raw = attachment
        .name
        .clone()
        .filter(|name| !name.trim().is_empty())
        .or_else(|| {
            let url = reqwest::Url::parse(attachment.url.as_deref()?).ok()?;
            let segment = url.path_segments()?.rfind(|s| !s.is_empty())?;
            Some(percent_decode(segment))
        })
        .or_else(|| {
            let local = attachment.local_path.as_deref()?;
            local
                .rsplit(['/', '\\'])
                .find(|s| !s.is_empty())
                .map(str::to_owned)
        })
        .unwrap_or_default();
    let name = safe_file_name(&raw);
    if !split_extension(&name).1.is_empty() {
        return name;
    }
    let extension = attachment
        .mime_type
        .as_deref()
        .and_then(extension_for_mime)
        .or_else(|| attachment.kind.as_deref().and_then(extension_for_kind))
        .or_else(|| sniff(&head[..head.len().min(SNIFF_BYTES)]).and_then(extension_for_mime));
    match extension {
        // Through safe_file_name again: a name at the length limit is shortened, not the extension.
        Some(extension) => safe_file_name(&format!("{name}.{extension}")),
        None => name,
    }
}

/// Decodes `%XX` escapes of a URL path segment (invalid escapes stay as they are).
fn percent_decode(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(high), Some(low)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((high * 16 + low) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Checks a `localPath`: relative to the workspace root (or absolute), and after resolving `..`
/// and symlinks, a regular file inside the workspace.
async fn resolve_local(workspace: &Path, local: &str) -> Result<PathBuf, String> {
    let joined = workspace.join(local);
    let canonical = match tokio::fs::canonicalize(&joined).await {
        Ok(path) => path,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!("localPath {local} does not exist"))
        }
        Err(err) => return Err(format!("cannot resolve localPath {local}: {err}")),
    };
    if !canonical.starts_with(workspace) || canonical == workspace {
        return Err(format!("localPath {local} is outside the workspace"));
    }
    match tokio::fs::metadata(&canonical).await {
        Ok(meta) if meta.is_file() => {}
        Ok(_) => return Err(format!("localPath {local} is not a regular file")),
        Err(err) => return Err(format!("cannot read localPath {local}: {err}")),
    }
    // The session DB lives in the workspace: a localPath may name it (or a link to it).
    match fsguard::check(&canonical) {
        Ok(()) => Ok(canonical),
        Err(err) if fsguard::is_refused(&err) => Err(format!(
            "localPath {local} is the session database; it is never read as an attachment"
        )),
        Err(err) => Err(format!("cannot read localPath {local}: {err}")),
    }
}

/// The folder of one message's downloads.
struct DownloadDir<'a> {
    workspace: &'a Path,
    dir: PathBuf,
}

impl DownloadDir<'_> {
    /// Creates a new file named `name` (or `name-N`), never replacing an existing one. The
    /// returned guard removes the file unless the caller keeps it.
    async fn create(&self, name: &str) -> Result<(tokio::fs::File, PartialFile), String> {
        tokio::fs::create_dir_all(&self.dir)
            .await
            .map_err(|err| format!("cannot create {}: {err}", self.dir.display()))?;
        // A `downloads` symlinked elsewhere must not turn a save into a write outside.
        let dir = tokio::fs::canonicalize(&self.dir)
            .await
            .map_err(|err| format!("cannot resolve {}: {err}", self.dir.display()))?;
        if !dir.starts_with(self.workspace) {
            return Err(format!(
                "{} resolves outside the workspace",
                self.dir.display()
            ));
        }
        let (stem, extension) = split_extension(name);
        for n in 0..MAX_DUPLICATES {
            let candidate = if n == 0 {
                name.to_owned()
            } else {
                format!("{stem}-{n}{extension}")
            };
            let path = dir.join(candidate);
            // create_new: O_EXCL, so neither an existing file nor a planted symlink is followed.
            match tokio::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .await
            {
                Ok(file) => return Ok((file, PartialFile { path: Some(path) })),
                Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(err) => return Err(format!("cannot create {}: {err}", path.display())),
            }
        }
        Err(format!("no free file name for {name} in {}", dir.display()))
    }
}

/// A file being written; removed on drop unless [`PartialFile::keep`] was called, so a failed or
/// timed-out save leaves nothing half-written behind.
struct PartialFile {
    path: Option<PathBuf>,
}

impl PartialFile {
    fn keep(mut self) -> PathBuf {
        self.path.take().unwrap_or_default()
    }
}

impl Drop for PartialFile {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            // Best effort: a leftover partial file is harmless next to the reported failure.
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Saves base64 `data` (plain, or a `data:<type>;base64,` URL; standard or URL-safe alphabet;
/// padding and line breaks optional).
async fn save_data(
    target: &DownloadDir<'_>,
    attachment: &Attachment,
    data: &str,
    limits: &MediaLimits,
) -> Result<PathBuf, String> {
    let payload = match data.strip_prefix("data:") {
        Some(rest) => match rest.split_once(',') {
            Some((header, payload)) if header.ends_with(";base64") => payload,
            _ => return Err("invalid base64 data: a data: URL without ;base64".to_owned()),
        },
        None => data,
    };
    let compact: String = payload
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    // Checked before decoding so a huge body is refused without a second huge buffer.
    let estimate = compact.trim_end_matches('=').len() as u64 * 3 / 4;
    if estimate > limits.max_bytes {
        return Err(too_large(estimate, limits.max_bytes));
    }
    let bytes = base64::engine::general_purpose::STANDARD_PAD_INDIFFERENT
        .decode(&compact)
        .or_else(|err| {
            base64::engine::general_purpose::URL_SAFE_PAD_INDIFFERENT
                .decode(&compact)
                .map_err(|_| err)
        })
        .map_err(|err| format!("invalid base64 data: {err}"))?;
    if bytes.len() as u64 > limits.max_bytes {
        return Err(too_large(bytes.len() as u64, limits.max_bytes));
    }
    let (mut file, partial, name) = start_file(target, attachment, &bytes).await?;
    file.flush()
        .await
        .map_err(|err| format!("cannot write {name}: {err}"))?;
    Ok(partial.keep())
}

/// Creates the file of an attachment once its first bytes are known (they may name it, see
/// [`file_name`]) and writes them.
async fn start_file(
    target: &DownloadDir<'_>,
    attachment: &Attachment,
    head: &[u8],
) -> Result<(tokio::fs::File, PartialFile, String), String> {
    let name = file_name(attachment, head);
    let (mut file, partial) = target.create(&name).await?;
    file.write_all(head)
        .await
        .map_err(|err| format!("cannot write {name}: {err}"))?;
    Ok((file, partial, name))
}

fn too_large(bytes: u64, max: u64) -> String {
    format!("too large: {bytes} bytes, the limit is {max} bytes")
}

fn build_client(limits: &MediaLimits, use_proxy: bool) -> Result<reqwest::Client, String> {
    let max_redirects = limits.max_redirects;
    let policy = reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() > max_redirects {
            attempt.error(format!("too many redirects (more than {max_redirects})"))
        } else if !matches!(attempt.url().scheme(), "http" | "https") {
            let scheme = attempt.url().scheme().to_owned();
            attempt.error(format!("redirect to a {scheme}: URL refused"))
        } else {
            attempt.follow()
        }
    });
    let mut builder = reqwest::Client::builder()
        .redirect(policy)
        .timeout(limits.timeout)
        .user_agent(concat!("nanoclaw-agent-runner/", env!("CARGO_PKG_VERSION")));
    if !use_proxy {
        builder = builder.no_proxy();
    }
    builder
        .build()
        .map_err(|err| format!("cannot set up downloads: {}", logging::error_chain(&err)))
}

/// Downloads `url` into a new file, within the size, time and redirect limits.
async fn download(
    client: &reqwest::Client,
    target: &DownloadDir<'_>,
    attachment: &Attachment,
    url: &str,
    limits: &MediaLimits,
) -> Result<PathBuf, String> {
    let parsed = reqwest::Url::parse(url).map_err(|err| format!("invalid URL: {err}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!(
            "only http and https URLs are downloaded, not {}:",
            parsed.scheme()
        ));
    }
    let fetch = async {
        let mut response = client
            .get(parsed)
            .send()
            .await
            .map_err(|err| download_error(err, limits))?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("download failed: HTTP {status}"));
        }
        if let Some(length) = response.content_length() {
            if length > limits.max_bytes {
                return Err(too_large(length, limits.max_bytes));
            }
        }
        // The first bytes are held back until there are enough to name the file by them.
        let mut head = Vec::new();
        let mut started: Option<(tokio::fs::File, PartialFile, String)> = None;
        let mut received: u64 = 0;
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|err| download_error(err, limits))?
        {
            received += chunk.len() as u64;
            if received > limits.max_bytes {
                return Err(format!(
                    "too large: more than {} bytes received, the limit is {} bytes",
                    limits.max_bytes, limits.max_bytes
                ));
            }
            match &mut started {
                Some((file, _, name)) => file
                    .write_all(&chunk)
                    .await
                    .map_err(|err| format!("cannot write {name}: {err}"))?,
                None => {
                    head.extend_from_slice(&chunk);
                    if head.len() >= SNIFF_BYTES {
                        started = Some(start_file(target, attachment, &head).await?);
                    }
                }
            }
        }
        let (mut file, partial, name) = match started {
            Some(started) => started,
            // The whole body was shorter than the head.
            None => start_file(target, attachment, &head).await?,
        };
        file.flush()
            .await
            .map_err(|err| format!("cannot write {name}: {err}"))?;
        Ok(partial.keep())
    };
    // The client has the same timeout; this one also covers writing and gives the clear message.
    match tokio::time::timeout(limits.timeout, fetch).await {
        Ok(result) => result,
        Err(_) => Err(timed_out(limits.timeout)),
    }
}

fn timed_out(timeout: Duration) -> String {
    if timeout.subsec_millis() == 0 {
        format!("download timed out after {} s", timeout.as_secs())
    } else {
        format!("download timed out after {} ms", timeout.as_millis())
    }
}

/// A download error as a reason, without the URL (signed URLs carry credentials).
fn download_error(err: reqwest::Error, limits: &MediaLimits) -> String {
    if err.is_timeout() {
        return timed_out(limits.timeout);
    }
    format!(
        "download failed: {}",
        logging::error_chain(&err.without_url())
    )
}

/// The native block of an available file, if it is an image or PDF the API accepts.
async fn native_media(path: &Path, attachment: &Attachment) -> Option<MediaFile> {
    // Through fsguard: closing a descriptor of a DB file would drop the DB's locks.
    let owned = path.to_path_buf();
    let file = tokio::task::spawn_blocking(move || fsguard::open(&owned))
        .await
        .ok()?
        .ok()?;
    let mut file = tokio::fs::File::from_std(file);
    let size = file.metadata().await.ok()?.len();
    let mut head = Vec::with_capacity(SNIFF_BYTES);
    (&mut file)
        .take(SNIFF_BYTES as u64)
        .read_to_end(&mut head)
        .await
        .ok()?;
    let Some(mime_type) = sniff(&head) else {
        let claimed = attachment
            .mime_type
            .as_deref()
            .and_then(|declared| provider::media::native_kind(declared).map(|(mime, _)| mime))
            .or_else(|| {
                let extension = path.extension()?.to_str()?.to_ascii_lowercase();
                mime_for_extension(&extension)
            });
        if let Some(claimed) = claimed {
            tracing::debug!(
                path = %path.display(),
                claimed,
                "not attached natively: the content does not look like its type"
            );
        }
        return None;
    };
    // Which types go natively and their caps: the one table in `provider::media`.
    let cap = provider::media::native_kind(mime_type)?.1.max_bytes();
    if size > cap {
        tracing::info!(
            path = %path.display(),
            size,
            cap,
            "not attached natively: too large for a content block; available by path"
        );
        return None;
    }
    Some(MediaFile {
        path: path.to_path_buf(),
        mime_type: mime_type.to_owned(),
    })
}

/// Recognises the supported types by their magic bytes.
fn sniff(head: &[u8]) -> Option<&'static str> {
    if head.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if head.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some("image/jpeg")
    } else if head.starts_with(b"GIF87a") || head.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if head.len() >= 12 && head.starts_with(b"RIFF") && &head[8..12] == b"WEBP" {
        Some("image/webp")
    } else if head.windows(5).any(|window| window == b"%PDF-") {
        // Readers accept the header anywhere in the first KiB.
        Some("application/pdf")
    } else {
        None
    }
}

/// The essence of a declared MIME type: `Text/Plain; charset=utf-8` → `text/plain`.
fn mime_essence(declared: &str) -> String {
    declared
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

fn mime_for_extension(extension: &str) -> Option<&'static str> {
    match extension {
        "png" => Some("image/png"),
        "jpg" | "jpeg" => Some("image/jpeg"),
        "gif" => Some("image/gif"),
        "webp" => Some("image/webp"),
        "pdf" => Some("application/pdf"),
        _ => None,
    }
}

/// The usual extension of a declared MIME type (parameters and case ignored), for the common
/// chat attachment types; `None` for others (`application/octet-stream`).
fn extension_for_mime(declared: &str) -> Option<&'static str> {
    let extension = match mime_essence(declared).as_str() {
        "image/png" => "png",
        "image/jpeg" | "image/jpg" | "image/pjpeg" => "jpg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        "image/heic" => "heic",
        "image/heif" => "heif",
        "image/bmp" => "bmp",
        "image/tiff" => "tif",
        "image/svg+xml" => "svg",
        "application/pdf" => "pdf",
        "text/plain" => "txt",
        "text/markdown" => "md",
        "text/csv" => "csv",
        "text/html" => "html",
        "text/calendar" => "ics",
        "text/vcard" | "text/x-vcard" => "vcf",
        "application/json" => "json",
        "application/xml" | "text/xml" => "xml",
        "application/zip" => "zip",
        "application/gzip" => "gz",
        "application/msword" => "doc",
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document" => "docx",
        "application/vnd.ms-excel" => "xls",
        "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet" => "xlsx",
        "application/vnd.ms-powerpoint" => "ppt",
        "application/vnd.openxmlformats-officedocument.presentationml.presentation" => "pptx",
        "audio/ogg" | "audio/opus" => "ogg",
        "audio/mpeg" | "audio/mp3" => "mp3",
        "audio/mp4" | "audio/m4a" | "audio/x-m4a" => "m4a",
        "audio/aac" => "aac",
        "audio/wav" | "audio/wave" | "audio/x-wav" => "wav",
        "audio/flac" => "flac",
        "audio/amr" => "amr",
        "audio/webm" | "video/webm" => "webm",
        "video/mp4" => "mp4",
        "video/quicktime" => "mov",
        "video/3gpp" => "3gp",
        _ => return None,
    };
    Some(extension)
}

/// The extension implied by a chat platform's attachment `type` (any case), where that type
/// always has the same format in practice (Telegram, WhatsApp): a photo is a JPEG, a sticker a
/// WebP, a voice note Ogg/Opus, and an animation an MP4 (the platforms convert GIFs to silent
/// MP4 clips; a real GIF is still named `.gif` by its MIME type or magic bytes).
fn extension_for_kind(kind: &str) -> Option<&'static str> {
    match kind.trim().to_ascii_lowercase().as_str() {
        "photo" => Some("jpg"),
        "sticker" => Some("webp"),
        "voice" => Some("ogg"),
        "animation" => Some("mp4"),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
