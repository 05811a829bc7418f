//! `init`: the workspace folder tree (docs/contract/README.md), the session DB, its default routing
//! and its destinations. Idempotent: existing folders and rows are kept, given values are upserted.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use schema::{Destination, Routing, SessionDb};
use serde::{Deserialize, Serialize};

/// The folders of a workspace, relative to its root, in creation order.
pub const WORKSPACE_FOLDERS: &[&str] = &[
    "agent",
    "agent/conversations",
    "global",
    "extra",
    "downloads",
    "outbox",
];

/// File name of the session DB inside a workspace.
pub const DB_FILE_NAME: &str = "session.db";

/// What to initialise.
#[derive(Debug, Clone, Default)]
pub struct InitOptions {
    /// Workspace root (created if missing).
    pub workspace: PathBuf,
    /// Session DB path; `<workspace>/session.db` when `None`.
    pub db: Option<PathBuf>,
    /// Default routing to store in `session_routing`.
    pub routing: Option<Routing>,
    /// Destinations to upsert.
    pub destinations: Vec<Destination>,
}

/// One path `init` looked at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PathReport {
    /// The path.
    pub path: PathBuf,
    /// True when this run created it; false when it already existed.
    pub created: bool,
}

/// What `init` did.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitReport {
    /// Workspace root.
    pub workspace: PathReport,
    /// Folders of the tree.
    pub folders: Vec<PathReport>,
    /// The session DB file.
    pub db: PathReport,
    /// Routing stored by this run, if any.
    pub routing: Option<Routing>,
    /// Destinations upserted by this run.
    pub destinations: Vec<Destination>,
}

impl InitReport {
    /// Human-readable lines, one per path or row.
    pub fn render(&self) -> String {
        let verb = |created: bool| if created { "created" } else { "exists " };
        let mut out = String::new();
        let mut line = |text: String| {
            out.push_str(&text);
            out.push('\n');
        };
        line(format!(
            "{} workspace {}",
            verb(self.workspace.created),
            self.workspace.path.display()
        ));
        for folder in &self.folders {
            line(format!(
                "{} folder    {}",
                verb(folder.created),
                folder.path.display()
            ));
        }
        line(format!(
            "{} session DB {}",
            verb(self.db.created),
            self.db.path.display()
        ));
        if let Some(routing) = &self.routing {
            line(format!("set routing {}", format_routing(routing)));
        }
        for destination in &self.destinations {
            line(format!(
                "set destination {} → {}{}",
                destination.name,
                format_routing(&destination.routing()),
                destination
                    .display_name
                    .as_deref()
                    .map(|name| format!(" ({name})"))
                    .unwrap_or_default()
            ));
        }
        out
    }
}

/// Creates the workspace tree and the session DB, then stores routing and destinations.
pub fn init(options: &InitOptions) -> Result<InitReport> {
    let db_path = options
        .db
        .clone()
        .unwrap_or_else(|| options.workspace.join(DB_FILE_NAME));
    // Before any folder is made: a DB on a shared filesystem is refused (`SessionDb::open`
    // checks again).
    fsguard::refuse_shared_filesystem(&db_path)?;
    let workspace = PathReport {
        created: ensure_dir(&options.workspace)?,
        path: options.workspace.clone(),
    };
    let mut folders = Vec::with_capacity(WORKSPACE_FOLDERS.len());
    for folder in WORKSPACE_FOLDERS {
        let path = options.workspace.join(folder);
        folders.push(PathReport {
            created: ensure_dir(&path)?,
            path,
        });
    }
    if let Some(parent) = db_path.parent().filter(|p| !p.as_os_str().is_empty()) {
        ensure_dir(parent)?;
    }
    let db_existed = db_path.exists();
    let db = SessionDb::open(&db_path)
        .with_context(|| format!("creating the session DB {}", db_path.display()))?;
    if let Some(routing) = &options.routing {
        db.set_session_routing(routing)
            .context("storing the session routing")?;
    }
    for destination in &options.destinations {
        db.upsert_destination(destination)
            .with_context(|| format!("storing destination {:?}", destination.name))?;
    }
    Ok(InitReport {
        workspace,
        folders,
        db: PathReport {
            path: db_path,
            created: !db_existed,
        },
        routing: options.routing.clone(),
        destinations: options.destinations.clone(),
    })
}

/// Creates `path` (and its parents) if missing; true when it was created. A non-folder in the
/// way is an error.
fn ensure_dir(path: &Path) -> Result<bool> {
    if path.is_dir() {
        return Ok(false);
    }
    if path.exists() {
        bail!("{} exists and is not a folder", path.display());
    }
    std::fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))?;
    Ok(true)
}

/// Parses `channel_type:platform_id[:thread_id]`. The platform id may not contain `:`; the
/// thread id is everything after the second `:`.
pub fn parse_routing(spec: &str) -> Result<Routing> {
    let mut parts = spec.splitn(3, ':');
    let channel_type = parts.next().unwrap_or_default().trim();
    let platform_id = parts.next().map(str::trim).unwrap_or_default();
    let thread_id = parts.next().map(str::trim).filter(|t| !t.is_empty());
    if channel_type.is_empty() || platform_id.is_empty() {
        bail!("bad routing {spec:?}: expected channel_type:platform_id[:thread_id], e.g. slack:C123 or slack:C123:1700000000.1234");
    }
    Ok(Routing {
        channel_type: Some(channel_type.to_owned()),
        platform_id: Some(platform_id.to_owned()),
        thread_id: thread_id.map(str::to_owned),
    })
}

/// Parses `name=channel_type:platform_id[:display name]` into a destination. Channel type
/// `agent` makes an agent destination (`type` = `agent`, `agent_group_id` = the platform id);
/// any other is a `channel` destination.
pub fn parse_destination(spec: &str) -> Result<Destination> {
    let usage =
        "expected name=channel_type:platform_id[:display name], e.g. team=slack:C123:Team room";
    let Some((name, target)) = spec.split_once('=') else {
        bail!("bad destination {spec:?}: {usage}");
    };
    let name = name.trim();
    if name.is_empty() {
        bail!("bad destination {spec:?}: empty name; {usage}");
    }
    if let Some(bad) = name
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || matches!(c, '"' | '<' | '>' | '&' | '\''))
    {
        bail!("bad destination name {name:?}: {bad:?} is not allowed (the agent writes it in <message to=\"name\">)");
    }
    let mut parts = target.splitn(3, ':');
    let channel_type = parts.next().unwrap_or_default().trim();
    let platform_id = parts.next().map(str::trim).unwrap_or_default();
    let display_name = parts.next().map(str::trim).filter(|d| !d.is_empty());
    if channel_type.is_empty() || platform_id.is_empty() {
        bail!("bad destination {spec:?}: {usage}");
    }
    let is_agent = channel_type == "agent";
    Ok(Destination {
        name: name.to_owned(),
        display_name: display_name.map(str::to_owned),
        kind: if is_agent { "agent" } else { "channel" }.to_owned(),
        channel_type: Some(channel_type.to_owned()),
        platform_id: Some(platform_id.to_owned()),
        agent_group_id: is_agent.then(|| platform_id.to_owned()),
    })
}

/// `slack:C123` / `slack:C123:thread` / `-` for no routing.
pub fn format_routing(routing: &Routing) -> String {
    if routing.is_empty() {
        return "-".to_owned();
    }
    let mut out = format!(
        "{}:{}",
        routing.channel_type.as_deref().unwrap_or("?"),
        routing.platform_id.as_deref().unwrap_or("?")
    );
    if let Some(thread) = &routing.thread_id {
        out.push(':');
        out.push_str(thread);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_specs() {
        let routing = parse_routing("slack:C123:1700.1").unwrap();
        assert_eq!(routing.channel_type.as_deref(), Some("slack"));
        assert_eq!(routing.platform_id.as_deref(), Some("C123"));
        assert_eq!(routing.thread_id.as_deref(), Some("1700.1"));
        assert_eq!(format_routing(&routing), "slack:C123:1700.1");
        assert_eq!(parse_routing("discord:42").unwrap().thread_id, None);
        for bad in ["", "slack", "slack:", ":C1"] {
            assert!(parse_routing(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn destination_specs() {
        let team = parse_destination("team=slack:C123:Team room").unwrap();
        assert_eq!(team.kind, "channel");
        assert_eq!(team.display_name.as_deref(), Some("Team room"));
        let agent = parse_destination("helper=agent:grp-1").unwrap();
        assert_eq!(agent.kind, "agent");
        assert_eq!(agent.agent_group_id.as_deref(), Some("grp-1"));
        for bad in [
            "team",
            "=slack:C1",
            "a b=slack:C1",
            "t=slack",
            "t\"=slack:C1",
        ] {
            assert!(parse_destination(bad).is_err(), "{bad}");
        }
    }
}
