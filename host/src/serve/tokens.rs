//! API tokens (docs/contract/api.md#tokens): the token file, its checks, hashing and
//! constant-time lookup, and the store `serve` rereads when the file changes.
//!
//! The file holds only each token's SHA-256; the token itself is printed once by `add`. It is
//! refused when it is a symlink or writable by group or others, so nobody but its owner can
//! plant a token.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{bail, Context, Result};
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Every token starts with this, so a leaked one is recognisable (secret scanners).
pub const TOKEN_PREFIX: &str = "ncl_";

/// The sessions entry that means every session.
pub const ALL_SESSIONS: &str = "*";

/// One token as stored: its name, hash and scope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenEntry {
    /// Its name, shown in audit lines (`token=<name>`).
    pub name: String,
    /// Hex SHA-256 of the token.
    pub sha256: String,
    /// Session names it may see, or `["*"]` for all (and `POST /v1/sessions`).
    pub sessions: Vec<String>,
    /// May only read (no send, answer, delivered, interrupt, sweep, init).
    #[serde(default)]
    pub read_only: bool,
    /// When it was made (RFC 3339 UTC).
    pub created_at: String,
}

impl TokenEntry {
    /// True when the token may see the session `name`.
    pub fn sees(&self, name: &str) -> bool {
        self.sessions.iter().any(|s| s == ALL_SESSIONS || s == name)
    }

    /// True when the token may see every session.
    pub fn sees_all(&self) -> bool {
        self.sessions.iter().any(|s| s == ALL_SESSIONS)
    }
}

/// The token file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenFile {
    /// The tokens, by name.
    pub tokens: Vec<TokenEntry>,
}

/// Hex SHA-256 of `token`.
pub fn hash_token(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A new token: [`TOKEN_PREFIX`] and 43 base64url characters (256 bits from the OS).
pub fn new_token() -> Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|err| anyhow::anyhow!("no random bytes from the OS: {err}"))?;
    Ok(format!(
        "{TOKEN_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    ))
}

impl TokenFile {
    /// Reads and checks the file at `path` (see [`check_file`]); a missing file is empty.
    pub fn load(path: &Path) -> Result<Self> {
        match std::fs::symlink_metadata(path) {
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(err) => return Err(err).with_context(|| format!("token file {}", path.display())),
            Ok(meta) => check_meta(path, &meta)?,
        }
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the token file {}", path.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("the token file {} is not valid", path.display()))
    }

    /// Writes the file atomically (a temporary file renamed over it), mode `0600`.
    pub fn save(&self, path: &Path) -> Result<()> {
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            check_meta(path, &meta)?;
        }
        let mut text = serde_json::to_string_pretty(self)?;
        text.push('\n');
        fsguard::write_private(path, text.as_bytes())
            .with_context(|| format!("writing the token file {}", path.display()))
    }

    /// The entry whose hash matches `token`, compared in constant time against every entry.
    pub fn find(&self, token: &str) -> Option<&TokenEntry> {
        let hash = hash_token(token);
        let mut found = None;
        for entry in &self.tokens {
            if bool::from(entry.sha256.as_bytes().ct_eq(hash.as_bytes())) {
                found = Some(entry);
            }
        }
        found
    }
}

/// Refuses a token file that is a symlink, not a regular file, or writable by group or others.
fn check_meta(path: &Path, meta: &std::fs::Metadata) -> Result<()> {
    if meta.file_type().is_symlink() {
        bail!(
            "the token file {} is a symlink: refused (give the real path)",
            path.display()
        );
    }
    if !meta.is_file() {
        bail!("the token file {} is not a regular file", path.display());
    }
    if meta.permissions().mode() & 0o022 != 0 {
        bail!(
            "the token file {} is writable by group or others: refused (chmod 600 it)",
            path.display()
        );
    }
    Ok(())
}

/// What identifies a version of the file without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    ino: u64,
    size: u64,
    mtime: i64,
    mtime_nsec: i64,
    ctime: i64,
    ctime_nsec: i64,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            ino: meta.ino(),
            size: meta.size(),
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec(),
            ctime: meta.ctime(),
            ctime_nsec: meta.ctime_nsec(),
        }
    }
}

/// The tokens `serve` checks requests against: the file is `stat`ed per request and reread
/// when it changed, so a revocation holds at the next request without a restart. A file that
/// became invalid (a symlink, group-writable, bad JSON) or vanished lets no token in until fixed.
#[derive(Debug)]
pub struct TokenStore {
    path: PathBuf,
    loaded: Mutex<(Option<Stamp>, TokenFile)>,
}

impl TokenStore {
    /// Loads `path` once (an error when it is refused).
    pub fn open(path: PathBuf) -> Result<Self> {
        let meta = std::fs::symlink_metadata(&path)
            .with_context(|| format!("no token file at {} (make a token with `nanoclaw token add NAME --sessions ... --tokens {}`)", path.display(), path.display()))?;
        let file = TokenFile::load(&path)?;
        Ok(Self {
            path,
            loaded: Mutex::new((Some(Stamp::of(&meta)), file)),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The entry for `token`, from the file as it is now.
    pub fn authenticate(&self, token: &str) -> Option<TokenEntry> {
        let stamp = std::fs::symlink_metadata(&self.path)
            .ok()
            .map(|m| Stamp::of(&m));
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if loaded.0 != stamp {
            let file = match stamp {
                None => {
                    tracing::error!(path = %self.path.display(), "serve: the token file is gone; no token is accepted until it is back");
                    TokenFile::default()
                }
                Some(_) => match TokenFile::load(&self.path) {
                    Ok(file) => {
                        tracing::info!(path = %self.path.display(), tokens = file.tokens.len(), "serve: token file reread");
                        file
                    }
                    Err(err) => {
                        tracing::error!(
                            error = format!("{err:#}"),
                            "serve: no token is accepted until the token file is fixed"
                        );
                        TokenFile::default()
                    }
                },
            };
            *loaded = (stamp, file);
        }
        loaded.1.find(token).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_prefixed_256_bit_base64url() {
        let token = new_token().unwrap();
        assert!(token.starts_with(TOKEN_PREFIX));
        assert_eq!(token.len(), TOKEN_PREFIX.len() + 43);
        assert_ne!(token, new_token().unwrap());
    }

    #[test]
    fn the_file_keeps_hashes_and_finds_by_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.json");
        let token = new_token().unwrap();
        let file = TokenFile {
            tokens: vec![TokenEntry {
                name: "ci".into(),
                sha256: hash_token(&token),
                sessions: vec!["a".into()],
                read_only: false,
                created_at: "2026-12-07T00:00:00.000Z".into(),
            }],
        };
        file.save(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(&token));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let loaded = TokenFile::load(&path).unwrap();
        assert_eq!(loaded.find(&token).map(|e| e.name.as_str()), Some("ci"));
        assert!(loaded.find("ncl_other").is_none());
    }

    #[test]
    fn refuses_symlinks_and_group_writable_files() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.json");
        TokenFile::default().save(&real).unwrap();
        let link = dir.path().join("link.json");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let err = TokenFile::load(&link).unwrap_err();
        assert!(format!("{err:#}").contains("symlink"), "{err:#}");
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o620)).unwrap();
        let err = TokenFile::load(&real).unwrap_err();
        assert!(format!("{err:#}").contains("chmod 600"), "{err:#}");
    }
}
