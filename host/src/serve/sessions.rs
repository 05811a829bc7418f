//! Which sessions a server serves, where their DBs are, and a bounded cache of open DBs.
//!
//! A name is never a path: it is checked ([`crate::api::valid_session_name`]) before it is
//! joined to the root, and a session folder that is a symlink is not served.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Result;
use schema::{OpenOptions, SessionDb};

use crate::api::valid_session_name;

/// Open DBs kept at most; the least recently used is closed beyond this.
const CACHE_CAPACITY: usize = 256;

/// Page cache of each connection `serve` opens, in KiB. A request reads a page of rows or a
/// status; SQLite's default (2,000 KiB a connection) let every session's connections keep what
/// they once read resident, per session (issue 40, D-HOST-09).
pub(crate) const SERVE_CACHE_KIB: u32 = 64;

/// How `serve` opens a session DB: connections opened when requests need them (none kept idle
/// ahead of need: as many stay open as requests once overlapped on the session) and a small
/// page cache, since one process holds many DBs.
pub(crate) fn serve_open_options() -> OpenOptions {
    OpenOptions {
        cache_kib: Some(SERVE_CACHE_KIB),
        keep_idle: false,
        ..OpenOptions::default()
    }
}

/// What `serve` serves.
#[derive(Debug, Clone)]
pub enum Served {
    /// One session: `DIR/session.db`, named by the folder's last component.
    Workspace {
        /// The session's name.
        name: String,
        /// Its folder.
        dir: PathBuf,
    },
    /// Every `ROOT/<name>/session.db`.
    Root(PathBuf),
}

impl Served {
    /// The session folder of `name`, if `name` is valid and served (whether or not its DB
    /// exists yet).
    pub fn folder(&self, name: &str) -> Option<PathBuf> {
        if !valid_session_name(name) {
            return None;
        }
        match self {
            Self::Workspace { name: served, dir } => (served == name).then(|| dir.clone()),
            Self::Root(root) => Some(root.join(name)),
        }
    }

    /// The DB of session `name`, when it exists (a real folder holding a `session.db` file).
    pub fn db_path(&self, name: &str) -> Option<PathBuf> {
        let folder = self.folder(name)?;
        let meta = std::fs::symlink_metadata(&folder).ok()?;
        if !meta.is_dir() {
            return None;
        }
        let db = folder.join("session.db");
        std::fs::symlink_metadata(&db)
            .ok()
            .filter(std::fs::Metadata::is_file)
            .map(|_| db)
    }

    /// Every served session's name, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = match self {
            Self::Workspace { name, .. } => vec![name.clone()],
            Self::Root(root) => std::fs::read_dir(root)
                .map(|entries| {
                    entries
                        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
                        .filter(|name| self.db_path(name).is_some())
                        .collect()
                })
                .unwrap_or_default(),
        };
        names.sort();
        names
    }

    /// The folder a token file must not be in: a session's (the agent can write there).
    pub fn token_file_allowed(&self, tokens: &Path) -> Result<(), String> {
        let tokens = tokens
            .parent()
            .and_then(|p| std::fs::canonicalize(p).ok())
            .unwrap_or_else(|| tokens.to_path_buf());
        let inside = match self {
            Self::Workspace { dir, .. } => {
                let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.clone());
                tokens.starts_with(&dir)
            }
            Self::Root(root) => {
                let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.clone());
                tokens.starts_with(&root) && tokens != root
            }
        };
        if inside {
            return Err("the token file is inside a served session folder, which its agent can write: keep it outside (with --root, in the root itself)".to_owned());
        }
        Ok(())
    }
}

/// Open session DBs by path, the least recently used closed beyond [`CACHE_CAPACITY`].
#[derive(Debug, Default)]
pub struct DbCache {
    open: Mutex<HashMap<PathBuf, (Arc<SessionDb>, Instant)>>,
}

impl DbCache {
    /// The open DB at `path`, opened (and migrated) on first use. Blocking: call it from a
    /// blocking task.
    pub fn get(&self, path: &Path) -> Result<Arc<SessionDb>> {
        {
            let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((db, used)) = open.get_mut(path) {
                *used = Instant::now();
                return Ok(db.clone());
            }
        }
        let db = Arc::new(crate::open_existing_with(path, serve_open_options())?);
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.len() >= CACHE_CAPACITY {
            if let Some(oldest) = open
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(path, _)| path.clone())
            {
                open.remove(&oldest);
            }
        }
        let entry = open
            .entry(path.to_path_buf())
            .or_insert_with(|| (db, Instant::now()));
        Ok(entry.0.clone())
    }
}
