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
mod tests {

    use std::time::Instant;

    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0";

    fn limits() -> MediaLimits {
        MediaLimits {
            max_bytes: 1000,
            timeout: Duration::from_millis(500),
            max_redirects: 3,
        }
    }

    fn data(name: &str, body: &[u8]) -> Attachment {
        Attachment {
            name: Some(name.to_owned()),
            data: Some(base64::engine::general_purpose::STANDARD.encode(body)),
            ..Attachment::default()
        }
    }

    fn url(url: String) -> Attachment {
        Attachment {
            url: Some(url),
            ..Attachment::default()
        }
    }

    fn local(path: &str) -> Attachment {
        Attachment {
            local_path: Some(path.to_owned()),
            ..Attachment::default()
        }
    }

    /// A workspace folder inside a scratch root, so tests can put files just outside it.
    fn workspace() -> (tempfile::TempDir, PathBuf) {
        let root = tempfile::tempdir().unwrap();
        let workspace = root.path().join("workspace");
        std::fs::create_dir(&workspace).unwrap();
        let workspace = std::fs::canonicalize(workspace).unwrap();
        (root, workspace)
    }

    async fn run(workspace: &Path, attachments: &[Attachment]) -> ResolvedAttachments {
        resolve("msg-1", attachments, workspace, &limits(), false).await
    }

    fn available(note: &AttachmentNote) -> PathBuf {
        match note {
            AttachmentNote::Available { path } => PathBuf::from(path),
            other => panic!("expected an available note, got {other:?}"),
        }
    }

    fn unavailable(note: &AttachmentNote) -> (&str, &str) {
        match note {
            AttachmentNote::Unavailable { name, reason } => (name, reason),
            other => panic!("expected an unavailable note, got {other:?}"),
        }
    }

    /// A loopback HTTP/1.1 server with fixed routes; it lives as long as the test's runtime.
    async fn serve() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(handle(socket));
            }
        });
        format!("http://{addr}")
    }

    async fn handle(mut socket: TcpStream) {
        let mut request = Vec::new();
        let mut buf = [0u8; 1024];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 16 * 1024 {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => request.extend_from_slice(&buf[..n]),
            }
        }
        let request = String::from_utf8_lossy(&request);
        let path = request.split_whitespace().nth(1).unwrap_or("/").to_owned();
        let head = |status: &str, extra: &str| {
            format!("HTTP/1.1 {status}\r\nConnection: close\r\n{extra}\r\n").into_bytes()
        };
        // Write errors are expected: the client hangs up on purpose in several tests.
        let _ = match path.as_str() {
            "/hello.txt" => {
                let mut out = head("200 OK", "Content-Length: 11\r\n");
                out.extend_from_slice(b"hello world");
                socket.write_all(&out).await
            }
            "/image" => {
                let mut out = head(
                    "200 OK",
                    &format!(
                        "Content-Type: application/octet-stream\r\nContent-Length: {}\r\n",
                        PNG.len()
                    ),
                );
                out.extend_from_slice(PNG);
                socket.write_all(&out).await
            }
            "/missing" => {
                let mut out = head("404 Not Found", "Content-Length: 9\r\n");
                out.extend_from_slice(b"not found");
                socket.write_all(&out).await
            }
            "/big" => {
                let mut out = head("200 OK", "Content-Length: 5000\r\n");
                out.extend_from_slice(&[b'x'; 5000]);
                socket.write_all(&out).await
            }
            "/big-unannounced" => {
                // No Content-Length: the body ends when the connection closes.
                let mut out = head("200 OK", "");
                out.extend_from_slice(&[b'x'; 5000]);
                socket.write_all(&out).await
            }
            "/slow" => {
                let mut out = head("200 OK", "Content-Length: 100\r\n");
                out.extend_from_slice(b"0123456789");
                let _ = socket.write_all(&out).await;
                tokio::time::sleep(Duration::from_secs(10)).await;
                Ok(())
            }
            "/redirect" => {
                socket
                    .write_all(&head(
                        "302 Found",
                        "Location: /hello.txt\r\nContent-Length: 0\r\n",
                    ))
                    .await
            }
            loop_path if loop_path.starts_with("/loop/") => {
                let n: u32 = loop_path["/loop/".len()..].parse().unwrap_or(0);
                let location = format!("Location: /loop/{}\r\nContent-Length: 0\r\n", n + 1);
                socket.write_all(&head("302 Found", &location)).await
            }
            _ => {
                socket
                    .write_all(&head("500 Oops", "Content-Length: 0\r\n"))
                    .await
            }
        };
        let _ = socket.shutdown().await;
    }

    fn files_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    #[tokio::test]
    async fn url_attachment_is_saved_after_a_redirect() {
        let base = serve().await;
        let (_root, ws) = workspace();
        let resolved = run(
            &ws,
            &[
                url(format!("{base}/hello.txt")),
                url(format!("{base}/redirect")),
            ],
        )
        .await;
        let first = available(&resolved.notes[0]);
        assert_eq!(first, ws.join("downloads/msg-1/hello.txt"));
        assert_eq!(std::fs::read(&first).unwrap(), b"hello world");
        // The second is named after the URL it was asked for, and does not overwrite the first.
        let second = available(&resolved.notes[1]);
        assert_eq!(second, ws.join("downloads/msg-1/redirect"));
        assert_eq!(std::fs::read(&second).unwrap(), b"hello world");
        assert!(resolved.media.is_empty());
    }

    #[tokio::test]
    async fn http_error_is_unavailable() {
        let base = serve().await;
        let (_root, ws) = workspace();
        let resolved = run(&ws, &[url(format!("{base}/missing"))]).await;
        let (name, reason) = unavailable(&resolved.notes[0]);
        assert_eq!(name, "missing");
        assert_eq!(reason, "download failed: HTTP 404 Not Found");
        assert!(files_in(&ws.join("downloads/msg-1")).is_empty());
    }

    #[tokio::test]
    async fn oversized_bodies_are_refused_and_not_kept() {
        let base = serve().await;
        let (_root, ws) = workspace();
        let resolved = run(
            &ws,
            &[
                url(format!("{base}/big")),
                url(format!("{base}/big-unannounced")),
            ],
        )
        .await;
        let (_, announced) = unavailable(&resolved.notes[0]);
        assert_eq!(announced, "too large: 5000 bytes, the limit is 1000 bytes");
        let (_, streamed) = unavailable(&resolved.notes[1]);
        assert!(
            streamed.starts_with("too large: more than 1000 bytes received"),
            "{streamed}"
        );
        assert!(files_in(&ws.join("downloads/msg-1")).is_empty());
    }

    #[tokio::test]
    async fn slow_body_times_out() {
        let base = serve().await;
        let (_root, ws) = workspace();
        let started = Instant::now();
        let resolved = run(&ws, &[url(format!("{base}/slow"))]).await;
        assert!(started.elapsed() < Duration::from_secs(5));
        let (_, reason) = unavailable(&resolved.notes[0]);
        assert_eq!(reason, "download timed out after 500 ms");
        assert!(files_in(&ws.join("downloads/msg-1")).is_empty());
    }

    #[tokio::test]
    async fn too_many_redirects() {
        let base = serve().await;
        let (_root, ws) = workspace();
        let resolved = run(&ws, &[url(format!("{base}/loop/0"))]).await;
        let (_, reason) = unavailable(&resolved.notes[0]);
        assert!(
            reason.contains("too many redirects (more than 3)"),
            "{reason}"
        );
        assert!(
            !reason.contains("127.0.0.1"),
            "the URL is left out: {reason}"
        );
    }

    #[tokio::test]
    async fn other_schemes_and_bad_urls_are_refused() {
        let (_root, ws) = workspace();
        let resolved = run(
            &ws,
            &[
                url("ftp://127.0.0.1/file.txt".to_owned()),
                url("file:///etc/passwd".to_owned()),
                url("not a url".to_owned()),
            ],
        )
        .await;
        let (name, reason) = unavailable(&resolved.notes[0]);
        assert_eq!(name, "file.txt");
        assert!(reason.contains("only http and https"), "{reason}");
        let (name, reason) = unavailable(&resolved.notes[1]);
        assert_eq!(name, "passwd");
        assert!(reason.contains("only http and https"), "{reason}");
        let (_, reason) = unavailable(&resolved.notes[2]);
        assert!(reason.starts_with("invalid URL"), "{reason}");
    }

    #[tokio::test]
    async fn path_tricks_in_names_and_message_ids_stay_in_downloads() {
        let (_root, ws) = workspace();
        let resolved = resolve(
            "../../escape",
            &[data("../../etc/passwd", b"root:x:0:0")],
            &ws,
            &limits(),
            false,
        )
        .await;
        let path = available(&resolved.notes[0]);
        assert_eq!(path, ws.join("downloads/escape/passwd"));
        assert_eq!(std::fs::read(path).unwrap(), b"root:x:0:0");
    }

    #[tokio::test]
    async fn base64_forms_and_invalid_base64() {
        let (_root, ws) = workspace();
        let resolved = run(
            &ws,
            &[
                Attachment {
                    name: Some("bad.bin".to_owned()),
                    data: Some("this is not base64!".to_owned()),
                    ..Attachment::default()
                },
                Attachment {
                    name: Some("url.txt".to_owned()),
                    data: Some("data:text/plain;base64,aGVs\nbG8".to_owned()),
                    ..Attachment::default()
                },
                data("exact.bin", &[7u8; 1000]),
                Attachment {
                    name: Some("big.bin".to_owned()),
                    data: Some("A".repeat(4000)),
                    ..Attachment::default()
                },
            ],
        )
        .await;
        let (name, reason) = unavailable(&resolved.notes[0]);
        assert_eq!(name, "bad.bin");
        assert!(reason.starts_with("invalid base64 data"), "{reason}");
        let path = available(&resolved.notes[1]);
        assert_eq!(std::fs::read(path).unwrap(), b"hello");
        let path = available(&resolved.notes[2]);
        assert_eq!(
            std::fs::read(path).unwrap().len(),
            1000,
            "the limit itself is allowed"
        );
        let (_, reason) = unavailable(&resolved.notes[3]);
        assert!(reason.starts_with("too large"), "{reason}");
    }

    #[tokio::test]
    async fn local_paths_must_stay_in_the_workspace() {
        let (root, ws) = workspace();
        let secret = root.path().join("secret");
        std::fs::write(&secret, "top secret").unwrap();
        std::fs::create_dir(ws.join("agent")).unwrap();
        std::fs::write(ws.join("agent/notes.txt"), "fine").unwrap();
        std::os::unix::fs::symlink(&secret, ws.join("agent/link")).unwrap();
        let absolute_outside = secret.to_string_lossy().into_owned();
        let absolute_inside = ws.join("agent/notes.txt").to_string_lossy().into_owned();
        let resolved = run(
            &ws,
            &[
                local("agent/notes.txt"),
                local(&absolute_inside),
                local("../secret"),
                local(&absolute_outside),
                local("agent/link"),
                local("agent/missing.txt"),
                local("agent"),
            ],
        )
        .await;
        // Referenced in place, not copied.
        assert_eq!(available(&resolved.notes[0]), ws.join("agent/notes.txt"));
        assert_eq!(available(&resolved.notes[1]), ws.join("agent/notes.txt"));
        for (i, name) in [(2, "secret"), (3, "secret"), (4, "link")] {
            let (shown, reason) = unavailable(&resolved.notes[i]);
            assert_eq!(shown, name);
            assert!(reason.ends_with("is outside the workspace"), "{reason}");
        }
        let (_, reason) = unavailable(&resolved.notes[5]);
        assert!(reason.ends_with("does not exist"), "{reason}");
        let (_, reason) = unavailable(&resolved.notes[6]);
        assert!(reason.ends_with("is not a regular file"), "{reason}");
        assert!(!ws.join("downloads").exists(), "nothing is copied");
    }

    #[tokio::test]
    async fn duplicate_names_do_not_overwrite() {
        let (_root, ws) = workspace();
        let resolved = run(
            &ws,
            &[
                data("name.txt", b"one"),
                data("name.txt", b"two"),
                data("dir/name.txt", b"three"),
            ],
        )
        .await;
        let dir = ws.join("downloads/msg-1");
        let paths: Vec<PathBuf> = resolved.notes.iter().map(available).collect();
        assert_eq!(
            paths,
            vec![
                dir.join("name.txt"),
                dir.join("name-1.txt"),
                dir.join("name-2.txt")
            ]
        );
        assert_eq!(std::fs::read(&paths[0]).unwrap(), b"one");
        assert_eq!(std::fs::read(&paths[2]).unwrap(), b"three");
    }

    #[tokio::test]
    async fn images_are_detected_by_content() {
        let base = serve().await;
        let (_root, ws) = workspace();
        let resolved = run(
            &ws,
            &[
                // No name, no extension, a generic declared type: sniffed, named by type.
                Attachment {
                    data: Some(base64::engine::general_purpose::STANDARD.encode(PNG)),
                    mime_type: Some("application/octet-stream".to_owned()),
                    ..Attachment::default()
                },
                url(format!("{base}/image")),
                // Claims to be an image but is text: available by path, no native block.
                Attachment {
                    name: Some("fake.png".to_owned()),
                    data: Some(base64::engine::general_purpose::STANDARD.encode(b"hello")),
                    mime_type: Some("image/png".to_owned()),
                    ..Attachment::default()
                },
                Attachment {
                    name: Some("doc".to_owned()),
                    data: Some(base64::engine::general_purpose::STANDARD.encode(b"%PDF-1.7\n")),
                    mime_type: Some("application/pdf".to_owned()),
                    ..Attachment::default()
                },
            ],
        )
        .await;
        let paths: Vec<PathBuf> = resolved.notes.iter().map(available).collect();
        assert_eq!(paths[0], ws.join("downloads/msg-1/attachment.png"));
        assert_eq!(paths[1], ws.join("downloads/msg-1/image.png"));
        assert_eq!(paths[3], ws.join("downloads/msg-1/doc.pdf"));
        assert_eq!(
            resolved.media,
            vec![
                MediaFile {
                    path: paths[0].clone(),
                    mime_type: "image/png".to_owned()
                },
                MediaFile {
                    path: paths[1].clone(),
                    mime_type: "image/png".to_owned()
                },
                MediaFile {
                    path: paths[3].clone(),
                    mime_type: "application/pdf".to_owned()
                },
            ]
        );
    }

    /// A nameless attachment is named by its MIME type (parameters and case ignored), else by
    /// its `type` (any case), else by its magic bytes; a name's own extension always wins.
    #[tokio::test]
    async fn nameless_attachments_get_an_extension() {
        let base = serve().await;
        let (_root, ws) = workspace();
        let nameless = |mime_type: Option<&str>, kind: Option<&str>, body: &[u8]| Attachment {
            kind: kind.map(str::to_owned),
            mime_type: mime_type.map(str::to_owned),
            data: Some(base64::engine::general_purpose::STANDARD.encode(body)),
            ..Attachment::default()
        };
        let jpeg = b"\xFF\xD8\xFF\xE0\0\x10JFIF\0";
        let resolved = run(
            &ws,
            &[
                nameless(Some("text/plain; charset=utf-8"), None, b"hello"),
                nameless(Some("audio/ogg"), Some("file"), b"OggS\0\x02"),
                nameless(None, Some("VOICE"), b"OggS\0\x02"),
                nameless(None, Some("photo"), jpeg),
                nameless(None, Some("Sticker"), b"RIFF\0\0\0\0WEBPVP8 "),
                nameless(None, Some("animation"), b"\0\0\0\x18ftypmp42"),
                // An unknown declared type and kind: the magic bytes decide.
                nameless(Some("application/octet-stream"), Some("file"), PNG),
                // The MIME type comes before the kind, and the kind before the content.
                nameless(Some("Audio/OGG"), Some("photo"), PNG),
                nameless(None, Some("photo"), PNG),
                // Nothing to go by: no extension.
                nameless(None, None, b"just bytes"),
                Attachment {
                    name: Some("notes".to_owned()),
                    ..nameless(Some("text/plain"), None, b"hi")
                },
                Attachment {
                    name: Some("clip.oga".to_owned()),
                    ..nameless(Some("audio/ogg"), Some("voice"), b"OggS\0\x02")
                },
                // A download is named by its bytes too.
                url(format!("{base}/image")),
            ],
        )
        .await;
        let names: Vec<String> = resolved
            .notes
            .iter()
            .map(|note| {
                let path = available(note);
                assert_eq!(path.parent(), Some(ws.join("downloads/msg-1").as_path()));
                path.file_name().unwrap().to_string_lossy().into_owned()
            })
            .collect();
        assert_eq!(
            names,
            [
                "attachment.txt",
                "attachment.ogg",
                "attachment-1.ogg",
                "attachment.jpg",
                "attachment.webp",
                "attachment.mp4",
                "attachment.png",
                "attachment-2.ogg",
                "attachment-1.jpg",
                "attachment",
                "notes.txt",
                "clip.oga",
                "image.png",
            ]
        );
    }

    #[tokio::test]
    async fn an_attachment_without_a_source_is_reported() {
        let (_root, ws) = workspace();
        let resolved = run(
            &ws,
            &[Attachment {
                name: Some("ghost.txt".to_owned()),
                data: Some(String::new()),
                ..Attachment::default()
            }],
        )
        .await;
        let (name, reason) = unavailable(&resolved.notes[0]);
        assert_eq!(name, "ghost.txt");
        assert_eq!(reason, "the attachment has no localPath, url or data");
    }

    #[test]
    fn safe_file_names() {
        assert_eq!(safe_file_name("../../etc/passwd"), "passwd");
        assert_eq!(safe_file_name("..\\..\\boot.ini"), "boot.ini");
        assert_eq!(safe_file_name("dir/"), "dir");
        assert_eq!(safe_file_name(".."), "attachment");
        assert_eq!(safe_file_name(""), "attachment");
        assert_eq!(safe_file_name("  ...hidden  "), "hidden");
        assert_eq!(safe_file_name("a\u{0}b\nc\u{7f}.txt"), "abc.txt");
        assert_eq!(safe_file_name("photo\u{202E}gpj.exe"), "photogpj.exe");
        assert_eq!(safe_file_name("Résumé 2026.pdf"), "Résumé 2026.pdf");
        let long = format!("{}.tar.gz", "é".repeat(100));
        let short = safe_file_name(&long);
        assert!(short.len() <= MAX_NAME_BYTES, "{}", short.len());
        assert!(short.ends_with("é.gz"), "{short}");
        let no_extension = "x".repeat(300);
        assert_eq!(safe_file_name(&no_extension), "x".repeat(MAX_NAME_BYTES));
    }

    #[test]
    fn percent_decoding_of_url_names() {
        assert_eq!(percent_decode("my%20file.pdf"), "my file.pdf");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }
}
