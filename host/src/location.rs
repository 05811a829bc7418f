//! Which session DB a `nanoclaw` command works on: `--db`, else `--workspace` (its
//! `session.db`), else `SESSION_DB`. `--workspace` beats the environment, so a stale exported
//! `SESSION_DB` never sends a command to another session; when it is overridden, the choice
//! says so.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use crate::init::DB_FILE_NAME;

/// Where a command's DB is, and anything the user should know about how it was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbChoice {
    /// The session DB.
    pub db: PathBuf,
    /// The workspace root: `--workspace`, else the DB's folder.
    pub workspace: PathBuf,
    /// A note for stderr, e.g. that `SESSION_DB` was ignored.
    pub note: Option<String>,
}

/// Chooses the DB from `--db` (`flag_db`), `--workspace` and the `SESSION_DB` value (`env_db`).
/// `--db` and `--workspace` together are allowed only for `init` (`db_outside_workspace`): a
/// DB kept outside its workspace tree; for any other command they must name the same DB.
pub fn choose_db(
    flag_db: Option<&Path>,
    workspace: Option<&Path>,
    env_db: Option<&Path>,
    db_outside_workspace: bool,
) -> Result<DbChoice> {
    let in_workspace = workspace.map(|ws| ws.join(DB_FILE_NAME));
    let (db, note) = match (flag_db, &in_workspace) {
        (Some(db), Some(implied)) if db != implied && !db_outside_workspace => bail!(
            "--db {} and --workspace {} name different session DBs ({}): pass one of them",
            db.display(),
            workspace
                .map(Path::display)
                .map(|d| d.to_string())
                .unwrap_or_default(),
            implied.display()
        ),
        (Some(db), _) => (db.to_path_buf(), None),
        (None, Some(implied)) => {
            let note = env_db.filter(|env| *env != implied.as_path()).map(|env| {
                format!(
                    "SESSION_DB={} is ignored: --workspace means the session DB {}",
                    env.display(),
                    implied.display()
                )
            });
            (implied.clone(), note)
        }
        (None, None) => match env_db {
            // `init` creates what it is given: say where, so a stale export is noticed.
            Some(env) if db_outside_workspace => (
                env.to_path_buf(),
                Some(format!(
                    "the session DB is SESSION_DB={} (pass --workspace DIR for <DIR>/session.db)",
                    env.display()
                )),
            ),
            Some(env) => (env.to_path_buf(), None),
            None => bail!("no session DB given: pass --workspace DIR, --db PATH or set SESSION_DB"),
        },
    };
    let workspace = match workspace {
        Some(ws) => ws.to_path_buf(),
        None => match db.parent().filter(|p| !p.as_os_str().is_empty()) {
            Some(parent) => parent.to_path_buf(),
            None => PathBuf::from("."),
        },
    };
    Ok(DbChoice {
        db,
        workspace,
        note,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choose(
        db: Option<&str>,
        ws: Option<&str>,
        env: Option<&str>,
        init: bool,
    ) -> Result<DbChoice> {
        choose_db(
            db.map(Path::new),
            ws.map(Path::new),
            env.map(Path::new),
            init,
        )
    }

    #[test]
    fn the_workspace_implies_its_db_and_beats_a_stale_session_db() {
        let choice = choose(None, Some("/b"), Some("/a/session.db"), false).unwrap();
        assert_eq!(choice.db, Path::new("/b/session.db"));
        assert_eq!(choice.workspace, Path::new("/b"));
        assert_eq!(
            choice.note.as_deref(),
            Some("SESSION_DB=/a/session.db is ignored: --workspace means the session DB /b/session.db")
        );
        // The same DB through both: nothing to say.
        let same = choose(None, Some("/b"), Some("/b/session.db"), false).unwrap();
        assert_eq!(same.note, None);
    }

    #[test]
    fn db_flag_env_and_conflicts() {
        let flag = choose(Some("/x/s.db"), None, Some("/a/session.db"), false).unwrap();
        assert_eq!(
            (flag.db.as_path(), flag.workspace.as_path()),
            (Path::new("/x/s.db"), Path::new("/x"))
        );
        let env = choose(None, None, Some("/a/session.db"), false).unwrap();
        assert_eq!(
            (env.db.as_path(), env.note),
            (Path::new("/a/session.db"), None)
        );
        let init = choose(None, None, Some("/a/session.db"), true).unwrap();
        assert_eq!(
            init.note.as_deref(),
            Some("the session DB is SESSION_DB=/a/session.db (pass --workspace DIR for <DIR>/session.db)")
        );
        let err = choose(Some("/x/s.db"), Some("/b"), None, false).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--db /x/s.db and --workspace /b name different session DBs (/b/session.db): pass \
             one of them"
        );
        // init keeps a DB outside its workspace on request.
        let outside = choose(Some("/x/s.db"), Some("/b"), None, true).unwrap();
        assert_eq!(
            (outside.db.as_path(), outside.workspace.as_path()),
            (Path::new("/x/s.db"), Path::new("/b"))
        );
        choose(Some("/b/session.db"), Some("/b"), None, false).unwrap();
        let none = choose(None, None, None, false).unwrap_err();
        assert!(
            none.to_string().contains("pass --workspace DIR, --db PATH"),
            "{none}"
        );
    }
}
