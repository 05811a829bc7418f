//! `send_file`: copy a file from the agent's folders into `outbox/<row id>/<name>`, then write
//! the chat row that names it.
//!
//! The file is opened first and its real path read back from `/proc/self/fd` (falling back to
//! `canonicalize` elsewhere), so a symlink or `..` that leads outside the readable roots is
//! refused whatever the path looked like, and the check applies to the very file that is copied.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use schema::content::out;
use schema::{NewMessageOut, OutKind};

use super::routing::{self, Target};
use super::{check_text, Ctx};
use crate::config::Config;
use crate::error::{ToolError, ToolResult};
use crate::params::{present, SendFileParams};

/// `send_file`.
pub async fn send_file(ctx: &Ctx, p: SendFileParams) -> ToolResult {
    let path = p.path.trim().to_owned();
    if path.is_empty() {
        return Err(ToolError::invalid(
            "path is empty: give the path of the file to send",
        ));
    }
    if path.len() > 4096 || path.contains('\0') {
        return Err(ToolError::invalid("path is not a usable file path"));
    }
    let filename = present(&p.filename).map(str::to_owned);
    if let Some(name) = &filename {
        check_name(name)?;
    }
    let caption = p.text.clone().unwrap_or_default();
    if !caption.is_empty() {
        check_text(&ctx.config, "text", &caption)?;
    }
    let config = ctx.config.clone();
    let (name, seq) = ctx
        .db
        .run(move |db| {
            let source = open_source(&config, &path)?;
            let name = match filename {
                Some(name) => name,
                None => source.default_name.clone(),
            };
            check_name(&name)?;
            let route = routing::resolve(
                db,
                &Target {
                    to: present(&p.to),
                    ..Target::default()
                },
            )?;
            let id = uuid::Uuid::new_v4().to_string();
            let folder = config.outbox_dir().join(&id);
            copy_into(&config, source, &folder, &name)?;
            let mut row = NewMessageOut::new(
                OutKind::Chat,
                route.routing,
                &out::chat_files(&caption, std::slice::from_ref(&name)),
            )
            .replying_to(route.in_reply_to);
            row.id = Some(id);
            match db.insert_out(&row) {
                Ok(inserted) => Ok((name, inserted.seq)),
                Err(err) => {
                    // No row names the copy: do not leave it behind.
                    let _ = std::fs::remove_dir_all(&folder);
                    Err(err.into())
                }
            }
        })
        .await?;
    Ok(format!("File {name} sent (seq {seq})."))
}

/// An opened file that may be sent.
struct Source {
    file: File,
    size: u64,
    /// The name it was asked for by.
    default_name: String,
    /// The path it was asked for by (for messages).
    shown: String,
}

/// Opens `path` (relative to the agent folder) and checks it: it exists, is a regular file
/// within the size limit, and really lies inside a readable root.
fn open_source(config: &Config, path: &str) -> ToolResult<Source> {
    let requested = Path::new(path);
    let full = if requested.is_absolute() {
        requested.to_path_buf()
    } else {
        config.agent_dir().join(requested)
    };
    let shown = path.to_owned();
    let not_found = || {
        ToolError::invalid(format!(
            "no such file: {shown} (relative paths start at {})",
            config.agent_dir().display()
        ))
    };
    // Refuse directories and special files before opening (opening a FIFO would block).
    let meta = std::fs::metadata(&full).map_err(|err| match err.kind() {
        io::ErrorKind::NotFound => not_found(),
        _ => ToolError::Io(format!("cannot read {shown}: {err}")),
    })?;
    if meta.is_dir() {
        return Err(ToolError::invalid(format!(
            "{shown} is a directory: send a single file (zip the folder first if you need to)"
        )));
    }
    if !meta.is_file() {
        return Err(ToolError::invalid(format!("{shown} is not a regular file")));
    }
    // fsguard refuses the session DB's files by identity (links, /proc aliases, bind mounts),
    // without opening them: a plain open and close would drop this process's DB locks.
    let file = fsguard::open(&full).map_err(|err| match err.kind() {
        _ if fsguard::is_refused(&err) => ToolError::invalid(format!(
            "refused: {shown} is the session database (or a link to it); it is never sent"
        )),
        io::ErrorKind::NotFound => not_found(),
        _ => ToolError::Io(format!("cannot open {shown}: {err}")),
    })?;
    let real = real_path(&file, &full)
        .map_err(|err| ToolError::Io(format!("cannot resolve {shown}: {err}")))?;
    let roots: Vec<PathBuf> = config
        .readable_roots()
        .iter()
        .filter_map(|root| root.canonicalize().ok())
        .collect();
    if !roots.iter().any(|root| real.starts_with(root)) {
        return Err(ToolError::invalid(format!(
            "refused: {shown} resolves to {}, outside the folders files may be sent from ({})",
            real.display(),
            config
                .readable_roots()
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let meta = file
        .metadata()
        .map_err(|err| ToolError::Io(format!("cannot read {shown}: {err}")))?;
    if !meta.is_file() {
        return Err(ToolError::invalid(format!("{shown} is not a regular file")));
    }
    if meta.len() > config.max_file_bytes {
        return Err(ToolError::invalid(format!(
            "{shown} is too large: {} bytes, the limit is {} bytes",
            meta.len(),
            config.max_file_bytes
        )));
    }
    let default_name = requested
        .file_name()
        .and_then(|n| n.to_str())
        .map(str::to_owned)
        .ok_or_else(|| {
            ToolError::invalid(format!("{shown} has no usable file name: pass `filename`"))
        })?;
    Ok(Source {
        file,
        size: meta.len(),
        default_name,
        shown,
    })
}

/// The real path of an opened file.
fn real_path(file: &File, opened_as: &Path) -> io::Result<PathBuf> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        if let Ok(path) = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())) {
            return Ok(path);
        }
    }
    let _ = file;
    opened_as.canonicalize()
}

/// A file name the recipient may see: one plain path component.
fn check_name(name: &str) -> ToolResult<()> {
    let bad = name.is_empty()
        || name == "."
        || name.contains('/')
        || name.contains('\\')
        || name.contains("..")
        || name.chars().any(char::is_control)
        || name.len() > 255;
    if bad {
        return Err(ToolError::invalid(format!(
            "filename {name:?} is not a plain file name: no '/', '\\', '..' or control \
             characters, at most 255 bytes"
        )));
    }
    Ok(())
}

/// Copies `source` to `folder/name`, creating `folder`; removes it again on failure.
fn copy_into(config: &Config, source: Source, folder: &Path, name: &str) -> ToolResult<()> {
    let result = (|| -> ToolResult<()> {
        std::fs::create_dir_all(folder).map_err(|err| {
            ToolError::Io(format!(
                "cannot create the outbox folder {}: {err}",
                folder.display()
            ))
        })?;
        let target = folder.join(name);
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&target)
            .map_err(|err| ToolError::Io(format!("cannot write {}: {err}", target.display())))?;
        // Read at most one byte past the limit: a file that grows meanwhile is refused.
        let mut limited = (&source.file).take(config.max_file_bytes + 1);
        let copied = io::copy(&mut limited, &mut out)
            .map_err(|err| ToolError::Io(format!("cannot copy {}: {err}", source.shown)))?;
        if copied > config.max_file_bytes {
            return Err(ToolError::invalid(format!(
                "{} is too large: it grew past the limit of {} bytes while being copied",
                source.shown, config.max_file_bytes
            )));
        }
        if copied != source.size {
            tracing::debug!(file = %source.shown, copied, expected = source.size, "file changed while copied");
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(folder);
    }
    result
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn names_are_single_components() {
        for bad in ["", ".", "..", "a/b", "..x", "a\\b", "a\u{7}"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        for good in ["report.pdf", "Résumé 2026.docx", ".hidden"] {
            assert!(check_name(good).is_ok(), "{good:?}");
        }
    }
}
