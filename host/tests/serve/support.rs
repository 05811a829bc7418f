//! A real server on 127.0.0.1:0 (in this process, as `nanoclaw serve` runs it) over a temp
//! root with two sessions, and helpers to talk to it and to read the DBs.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use host::serve::tokens::{hash_token, new_token, TokenEntry, TokenFile};
use host::serve::{Limits, Listen, ServeConfig, Served, Server};
use schema::SessionDb;
use serde_json::Value;
use tempfile::TempDir;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The tokens of a test root.
#[derive(Debug, Clone)]
pub(crate) struct Tokens {
    /// `'*'`, read-write.
    pub(crate) admin: String,
    /// `alpha` only, read-write.
    pub(crate) alpha: String,
    /// `alpha` only, read-only.
    pub(crate) reader: String,
}

/// A running server.
pub(crate) struct TestServer {
    pub(crate) root: PathBuf,
    pub(crate) addr: SocketAddr,
    pub(crate) url: String,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

/// A root with sessions `alpha` and `beta` and a token file.
pub(crate) fn make_root(dir: &TempDir) -> (PathBuf, Tokens) {
    let root = dir.path().join("root");
    for name in ["alpha", "beta"] {
        host::init(&host::InitOptions {
            workspace: root.join(name),
            db: Some(root.join(name).join("session.db")),
            routing: None,
            destinations: Vec::new(),
        })
        .unwrap();
    }
    let tokens = Tokens {
        admin: new_token().unwrap(),
        alpha: new_token().unwrap(),
        reader: new_token().unwrap(),
    };
    let entry = |name: &str, token: &str, sessions: &[&str], read_only| TokenEntry {
        name: name.into(),
        sha256: hash_token(token),
        sessions: sessions.iter().map(|s| (*s).to_owned()).collect(),
        read_only,
        created_at: "2026-12-07T00:00:00.000Z".into(),
    };
    TokenFile {
        tokens: vec![
            entry("admin", &tokens.admin, &["*"], false),
            entry("alpha-rw", &tokens.alpha, &["alpha"], false),
            entry("alpha-ro", &tokens.reader, &["alpha"], true),
        ],
    }
    .save(&root.join("tokens.json"))
    .unwrap();
    (root, tokens)
}

impl TestServer {
    /// Starts a server over `root` with `limits`.
    pub(crate) async fn start(root: &Path, limits: Limits) -> Self {
        let config = ServeConfig {
            served: Served::Root(root.to_path_buf()),
            listen: Listen::Tcp("127.0.0.1:0".parse().unwrap()),
            tokens: None,
            tls: None,
            plain_http: false,
            limits,
        };
        let server = Server::bind(config).await.unwrap();
        let addr = server.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async move {
            let _ = stopped.await;
        }));
        Self {
            root: root.to_path_buf(),
            url: format!("http://{addr}"),
            addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops the server and waits for it.
    pub(crate) async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
        }
    }

    /// The session DB of `name`, opened as a second process would.
    pub(crate) fn db(&self, name: &str) -> SessionDb {
        SessionDb::open(self.root.join(name).join("session.db")).unwrap()
    }

    /// `path` on this server.
    pub(crate) fn at(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }
}

/// A plain client.
pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// What a session DB holds, in numbers a refused request must leave unchanged.
pub(crate) fn db_state(db: &SessionDb) -> (i64, i64, usize) {
    let out = db.messages_out_after(i64::MIN, 10_000).unwrap();
    let delivered = out
        .iter()
        .filter(|row| db.delivered(&row.id).unwrap().is_some())
        .count();
    (
        db.max_seq().unwrap(),
        db.idempotency_keys().unwrap(),
        delivered,
    )
}

/// `value` with its ids, times and paths replaced by placeholders, pretty, for snapshots.
pub(crate) fn redact(value: &Value) -> String {
    fn walk(value: &mut Value) {
        match value {
            Value::Object(map) => {
                for (key, field) in map.iter_mut() {
                    let lower = key.to_ascii_lowercase();
                    let redacted = lower == "id"
                        || lower.ends_with("at")
                        || lower == "timestamp"
                        || lower == "since"
                        || lower == "now"
                        || lower == "path"
                        || lower == "db"
                        || lower == "nextdue";
                    if redacted && field.is_string() {
                        *field = Value::String(format!("<{key}>"));
                    } else {
                        walk(field);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    let mut value = value.clone();
    walk(&mut value);
    serde_json::to_string_pretty(&value).unwrap()
}

/// An out row in session `db` (what a runner would write).
pub(crate) fn agent_reply(db: &SessionDb, text: &str) -> i64 {
    let row = schema::NewMessageOut::new(
        schema::OutKind::Chat,
        schema::Routing::default(),
        &serde_json::json!({ "text": text }),
    );
    db.insert_out(&row).unwrap().seq
}
