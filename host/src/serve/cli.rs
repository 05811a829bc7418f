//! The `nanoclaw serve` and `nanoclaw token` commands.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};

use super::limits::Limits;
use super::server::{Listen, ServeConfig, Server};
use super::sessions::Served;
use super::tokens::{hash_token, new_token, TokenEntry, TokenFile, ALL_SESSIONS};

/// `nanoclaw serve`'s flags (`--workspace` is the global flag).
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Serve every ROOT/<name>/session.db as session <name> (found per request)
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// ADDR:PORT, or unix:PATH for a socket of mode 0600 (no token asked there)
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7450")]
    pub listen: Listen,
    /// The token file [default: ROOT/tokens.json with --root; required with --workspace on TCP]
    #[arg(long, value_name = "FILE")]
    pub tokens: Option<PathBuf>,
    /// TLS certificate chain (PEM)
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM)
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Allow plain HTTP on an address that is not loopback (behind a TLS-terminating proxy)
    #[arg(long, conflicts_with = "tls_cert")]
    pub plain_http: bool,
    /// Request body limit in bytes
    #[arg(long, value_name = "BYTES", default_value_t = 1024 * 1024)]
    pub max_body: usize,
    /// Open connections at most (more wait in the kernel's backlog)
    #[arg(long, value_name = "N", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
}

/// Where the token file is: `--tokens FILE`, or `ROOT/tokens.json`.
#[derive(Debug, Args)]
pub struct TokenFileArgs {
    /// The token file
    #[arg(long, value_name = "FILE", conflicts_with = "root")]
    pub tokens: Option<PathBuf>,
    /// The served root: the file is ROOT/tokens.json
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
}

impl TokenFileArgs {
    fn path(&self) -> Result<PathBuf> {
        match (&self.tokens, &self.root) {
            (Some(file), _) => Ok(fsguard::absolute("--tokens", file)?),
            (None, Some(root)) => Ok(fsguard::absolute("--root", root)?.join("tokens.json")),
            (None, None) => bail!("give the token file: --tokens FILE or --root DIR"),
        }
    }
}

/// `nanoclaw token`'s subcommands.
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Make a token and print it once (only its SHA-256 is stored)
    Add {
        /// Its name (audit lines say `token=<name>`)
        name: String,
        /// The sessions it may see: names separated by commas, or '*' for all (and creating
        /// sessions)
        #[arg(long, value_name = "a,b|'*'", value_delimiter = ',', required = true)]
        sessions: Vec<String>,
        /// It may only read
        #[arg(long)]
        read_only: bool,
        /// Where the token file is.
        #[command(flatten)]
        file: TokenFileArgs,
    },
    /// List the tokens (names and scopes, never the tokens)
    List {
        /// Where the token file is.
        #[command(flatten)]
        file: TokenFileArgs,
    },
    /// Revoke a token: `serve` refuses it at its next request
    Revoke {
        /// Its name
        name: String,
        /// Where the token file is.
        #[command(flatten)]
        file: TokenFileArgs,
    },
}

/// Runs `nanoclaw serve` until SIGTERM or SIGINT.
pub fn run_serve(args: ServeArgs, workspace: Option<&Path>) -> Result<()> {
    let served = match (workspace, &args.root) {
        (Some(_), Some(_)) => bail!("give --workspace DIR or --root DIR, not both"),
        (None, None) => {
            bail!("give --workspace DIR (one session) or --root DIR (every ROOT/<name>/)")
        }
        (Some(dir), None) => {
            let dir = fsguard::absolute("--workspace", dir)?;
            let name = dir
                .file_name()
                .and_then(|n| n.to_str())
                .filter(|n| crate::api::valid_session_name(n))
                .with_context(|| format!("--workspace {}: its last component must be a session name (A-Z a-z 0-9 . _ -, at most 64)", dir.display()))?
                .to_owned();
            if !dir.join("session.db").is_file() {
                bail!(
                    "no session DB at {} (create it with `nanoclaw init --workspace {}`)",
                    dir.join("session.db").display(),
                    dir.display()
                );
            }
            // serve is the process next to the DB: on a shared filesystem it is in the wrong
            // place, and refuses to start (exit 78, as every command on such a DB).
            fsguard::refuse_shared_filesystem(&dir.join("session.db"))?;
            Served::Workspace { name, dir }
        }
        (None, Some(root)) => {
            let root = fsguard::absolute("--root", root)?;
            if !root.is_dir() {
                bail!("--root {}: no such folder", root.display());
            }
            // A session folder mounted under the root from a share is refused per request.
            fsguard::refuse_shared_filesystem(&root.join("session.db"))?;
            Served::Root(root)
        }
    };
    let config = ServeConfig {
        served,
        listen: args.listen.clone(),
        tokens: args.tokens.clone(),
        tls: args.tls_cert.clone().zip(args.tls_key.clone()),
        plain_http: args.plain_http,
        limits: Limits {
            max_body: args.max_body,
            max_connections: usize::try_from(args.max_connections).unwrap_or(512),
            ..Limits::default()
        },
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let server = Server::bind(config).await?;
        match (&args.listen, server.local_addr()) {
            (Listen::Unix(path), _) => tracing::warn!(socket = %path.display(), "serve: listening"),
            (_, Some(addr)) => {
                tracing::warn!(%addr, tls = args.tls_cert.is_some(), "serve: listening")
            }
            _ => {}
        }
        server.run(shutdown_signal()).await
    })
}

/// Resolves at SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Runs a `nanoclaw token` subcommand; prints to stdout.
pub fn run_token(command: TokenCommand, as_json: bool) -> Result<String> {
    match command {
        TokenCommand::Add {
            name,
            sessions,
            read_only,
            file,
        } => {
            let path = file.path()?;
            if !crate::api::valid_session_name(&name) {
                bail!("token name {name:?}: expected 1 to 64 of A-Z a-z 0-9 . _ -");
            }
            let sessions: Vec<String> = sessions.into_iter().map(|s| s.trim().to_owned()).collect();
            for session in &sessions {
                if session != ALL_SESSIONS && !crate::api::valid_session_name(session) {
                    bail!("--sessions: {session:?} is not a session name (or '*')");
                }
            }
            let mut tokens = TokenFile::load(&path)?;
            if tokens.tokens.iter().any(|t| t.name == name) {
                bail!("a token named {name:?} exists: revoke it first, or choose another name");
            }
            let token = new_token()?;
            tokens.tokens.push(TokenEntry {
                name: name.clone(),
                sha256: hash_token(&token),
                sessions,
                read_only,
                created_at: schema::time::now_ts(),
            });
            tokens.save(&path)?;
            Ok(if as_json {
                format!("{}\n", serde_json::json!({ "name": name, "token": token }))
            } else {
                format!("{token}\n")
            })
        }
        TokenCommand::List { file } => {
            let tokens = TokenFile::load(&file.path()?)?;
            if as_json {
                let list: Vec<_> = tokens
                    .tokens
                    .iter()
                    .map(|t| serde_json::json!({"name": t.name, "sessions": t.sessions, "readOnly": t.read_only, "createdAt": t.created_at}))
                    .collect();
                return Ok(format!("{}\n", serde_json::json!({ "tokens": list })));
            }
            Ok(tokens
                .tokens
                .iter()
                .map(|t| {
                    format!(
                        "{} sessions={} {} created={}\n",
                        t.name,
                        t.sessions.join(","),
                        if t.read_only {
                            "read-only"
                        } else {
                            "read-write"
                        },
                        t.created_at
                    )
                })
                .collect())
        }
        TokenCommand::Revoke { name, file } => {
            let path = file.path()?;
            let mut tokens = TokenFile::load(&path)?;
            let before = tokens.tokens.len();
            tokens.tokens.retain(|t| t.name != name);
            if tokens.tokens.len() == before {
                bail!("no token named {name:?} (see `nanoclaw token list`)");
            }
            tokens.save(&path)?;
            Ok(format!("revoked {name}\n"))
        }
    }
}
