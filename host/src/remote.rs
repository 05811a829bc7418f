//! `nanoclaw --url URL --session NAME <subcommand>`: the subcommands over the session API
//! (docs/contract/api.md#the-cli-over-the-api), printing through [`crate::output`] exactly
//! what they print on a local DB.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use chrono::Utc;
use clap::Args;
use serde_json::Value;
use tokio::time::Instant;

use host::api::{
    AnswerBody, DeliveredBody, DeliveryStatus, DestinationBody, HealthQuery, InitBody, QuoteBody,
    RoutingBody, SendBody, SweepBody, UsageQuery,
};
use host::client::{retrying, ApiEvent, Client, ClientError, ClientOptions};
use host::SendRequest;

use crate::{
    output, AnswerArgs, Cli, Command, HealthArgs, InitArgs, SendArgs, SweepArgs, UsageArgs,
    WatchArgs,
};

/// How long `send` retries by default.
const DEFAULT_RETRY_FOR: Duration = Duration::from_secs(30);

/// The longest wait between two reconnects of `watch`.
const MAX_RECONNECT_WAIT: Duration = Duration::from_secs(5);

/// The global flags of the CLI over the API.
#[derive(Debug, Args)]
pub(crate) struct ApiArgs {
    /// Talk to `nanoclaw serve` at URL instead of opening a DB: http://HOST:PORT,
    /// https://HOST:PORT or unix:PATH
    #[arg(
        long,
        global = true,
        env = "NANOCLAW_URL",
        value_name = "URL",
        display_order = 880
    )]
    pub(crate) url: Option<String>,
    /// With --url: the file holding the bearer token on its first line (mode 600)
    #[arg(
        long,
        global = true,
        env = "NANOCLAW_TOKEN_FILE",
        value_name = "FILE",
        display_order = 881
    )]
    pub(crate) token_file: Option<PathBuf>,
    /// With --url: the session's name on the server
    #[arg(
        long,
        global = true,
        env = "NANOCLAW_SESSION",
        value_name = "NAME",
        display_order = 882
    )]
    pub(crate) session: Option<String>,
    /// With an https --url: a PEM file of CA certificates to trust beside the system's
    #[arg(long, global = true, value_name = "PEM", display_order = 883)]
    pub(crate) ca_cert: Option<PathBuf>,
}

/// Runs `cli.command` against the server `cli.api.url`.
pub(crate) fn run(cli: Cli) -> Result<ExitCode> {
    let url = cli.api.url.clone().unwrap_or_default();
    let token = cli
        .api
        .token_file
        .as_deref()
        .map(read_token_file)
        .transpose()?;
    let has_token = token.is_some();
    let client = Client::new(
        &url,
        ClientOptions {
            token,
            ca_cert: cli.api.ca_cert.clone(),
            ..ClientOptions::default()
        },
    )
    .context("--url")?;
    let session = cli.api.session.clone().ok_or_else(|| {
        anyhow!("--url needs --session NAME (or NANOCLAW_SESSION): the session on the server")
    })?;
    logging::set_session(format!("{url} session {session}"));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let remote = Remote {
        client,
        session,
        as_json: cli.json,
    };
    let work = async {
        match cli.command {
            Command::Init(args) => remote.init(args).await,
            Command::Send(args) => remote.send(*args).await,
            Command::Watch(args) => remote.watch(args).await,
            Command::Answer(args) => remote.answer(args).await,
            Command::Sweep(args) => remote.sweep(args).await,
            Command::Status => remote.status().await,
            Command::Health(args) => remote.health(&args).await,
            Command::Usage(args) => remote.usage(&args).await,
            Command::Interrupt => remote.interrupt().await,
            Command::Serve(_) | Command::Token(_) | Command::Fleet(_) => {
                bail!("serve, token and fleet run next to the DB: drop --url")
            }
        }
    };
    runtime.block_on(async {
        tokio::select! {
            result = work => result.map_err(|err| with_hint(err, has_token)),
            _ = tokio::signal::ctrl_c() => Ok(ExitCode::SUCCESS),
        }
    })
}

/// A 401 without a token names the flag that gives one.
fn with_hint(err: anyhow::Error, has_token: bool) -> anyhow::Error {
    let unauthorized = err.chain().any(|cause| {
        cause
            .downcast_ref::<ClientError>()
            .and_then(ClientError::status)
            == Some(401)
    });
    if unauthorized && !has_token {
        err.context("the server asks for a token: pass --token-file FILE (or NANOCLAW_TOKEN_FILE)")
    } else {
        err
    }
}

/// The token on the first line of `path`, which must not be readable by group or others.
pub(crate) fn read_token_file(path: &Path) -> Result<String> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("--token-file {}", path.display()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        bail!(
            "--token-file {}: readable by group or others (mode {mode:03o}); a token is a secret: run `chmod 600 {}`",
            path.display(),
            path.display()
        );
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--token-file {}", path.display()))?;
    let token = text.lines().next().unwrap_or_default().trim().to_owned();
    if token.is_empty() {
        bail!(
            "--token-file {}: its first line is empty (put the token `nanoclaw token add` printed there)",
            path.display()
        );
    }
    Ok(token)
}

struct Remote {
    client: Client,
    session: String,
    as_json: bool,
}

impl Remote {
    async fn init(&self, args: InitArgs) -> Result<ExitCode> {
        let routing = args
            .routing
            .as_deref()
            .map(host::parse_routing)
            .transpose()
            .context("--routing")?
            .map(|routing| RoutingBody {
                channel_type: routing.channel_type.unwrap_or_default(),
                platform_id: routing.platform_id.unwrap_or_default(),
                thread_id: routing.thread_id,
            });
        let destinations = args
            .destination
            .iter()
            .map(|spec| {
                let parsed = host::parse_destination(spec)?;
                Ok(DestinationBody {
                    channel_type: parsed.channel_type.unwrap_or(parsed.kind),
                    platform_id: parsed
                        .platform_id
                        .or(parsed.agent_group_id)
                        .unwrap_or_default(),
                    name: parsed.name,
                    display_name: parsed.display_name,
                })
            })
            .collect::<Result<Vec<_>>>()
            .context("--destination")?;
        let body = InitBody {
            name: self.session.clone(),
            routing,
            destinations,
        };
        let report = self.client.init(&body).await?;
        output::init(&report, self.as_json)?;
        Ok(ExitCode::SUCCESS)
    }

    async fn send(&self, args: SendArgs) -> Result<ExitCode> {
        let retry_for = args
            .retry_for
            .map_or(DEFAULT_RETRY_FOR, Duration::from_secs);
        let body = send_body(args.into_request())?;
        let outcome = self
            .client
            .send_retrying(&self.session, &body, retry_for)
            .await?;
        if outcome.replayed {
            tracing::info!(id = %outcome.sent.id, "an earlier attempt had written the row");
        }
        output::sent(&outcome.sent, self.as_json)?;
        Ok(ExitCode::SUCCESS)
    }

    async fn answer(&self, args: AnswerArgs) -> Result<ExitCode> {
        let body = AnswerBody {
            question_id: args.question,
            option: args.option,
            user_id: args.user_id,
            force: args.force,
        };
        let answered = self.client.answer(&self.session, &body).await?;
        output::answered(&answered, self.as_json)?;
        Ok(ExitCode::SUCCESS)
    }

    async fn sweep(&self, args: SweepArgs) -> Result<ExitCode> {
        if args.max_tries < 1 {
            bail!("--max-tries must be at least 1");
        }
        let body = SweepBody {
            stale_after_secs: Some(args.stale_after),
            max_tries: Some(args.max_tries),
            backoff_secs: Some(args.backoff),
        };
        let outcome = self.client.sweep(&self.session, &body).await?;
        output::sweep(&outcome, Utc::now(), self.as_json)?;
        Ok(ExitCode::SUCCESS)
    }

    async fn status(&self) -> Result<ExitCode> {
        let report = self.client.status(&self.session).await?;
        // Rendered at the server's `now`: the ages in the report were measured then.
        let now = schema::time::parse_ts(&report.now).unwrap_or_else(|_| Utc::now());
        output::status(&report, now, self.as_json)?;
        Ok(ExitCode::SUCCESS)
    }

    async fn health(&self, args: &HealthArgs) -> Result<ExitCode> {
        let query = HealthQuery {
            stale_after_secs: Some(args.stale_after),
            max_turn_silence_secs: Some(args.max_turn_silence),
        };
        let verdict = self.client.session_health(&self.session, &query).await?;
        output::health(&verdict, self.as_json)
    }

    async fn usage(&self, args: &UsageArgs) -> Result<ExitCode> {
        let query = UsageQuery {
            by: args.by.map(|by| by.as_str().to_owned()),
            since: args.since.clone(),
        };
        let report = self.client.usage(&self.session, &query).await?;
        output::usage(&report, self.as_json)?;
        Ok(ExitCode::SUCCESS)
    }

    async fn interrupt(&self) -> Result<ExitCode> {
        let sent = self.client.interrupt(&self.session).await?;
        output::interrupt(&sent, self.as_json)?;
        Ok(ExitCode::SUCCESS)
    }

    /// Follows the event stream, reconnecting from the last row printed after a dropped
    /// connection or a restart of the server, so no row is lost or printed twice.
    async fn watch(&self, args: WatchArgs) -> Result<ExitCode> {
        let timeout = args
            .timeout
            .map(|secs| {
                Duration::try_from_secs_f64(secs)
                    .map_err(|_| anyhow!("--timeout {secs}: expected a number of seconds ≥ 0"))
            })
            .transpose()?;
        let started = Instant::now();
        let deadline = timeout.map(|timeout| started + timeout);
        let follow = !args.no_follow;
        let mut state = WatchState {
            last_seq: args.after.unwrap_or(0),
            // `--new`: the rows already there are skipped until the server says it caught up.
            skipping: args.new,
            rows: 0,
        };
        let mut wait = Duration::from_millis(100);
        let outcome = async {
            loop {
                match self.follow_once(&args, follow, &mut state).await {
                    Ok(Some(code)) => return Ok(code),
                    Ok(None) => {
                        // The stream ended (a restart of the server): reconnect at once.
                        wait = Duration::from_millis(100);
                    }
                    Err(err) if is_retryable(&err) => {
                        tracing::warn!(error = %format!("{err:#}"), retry_in_ms = wait.as_millis() as u64, last_seq = state.last_seq, "watch: the event stream broke; reconnecting");
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(MAX_RECONNECT_WAIT);
                    }
                    Err(err) => return Err(err),
                }
            }
        };
        let result = match deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline, outcome).await {
                Ok(result) => result,
                Err(_) => {
                    if let Some(count) = args.until_count {
                        bail!(
                            "timed out after {:.1}s: {} of {count} messages_out rows arrived (last seq {})",
                            started.elapsed().as_secs_f64(),
                            state.rows,
                            state.last_seq
                        );
                    }
                    Ok(ExitCode::SUCCESS)
                }
            },
            None => outcome.await,
        };
        tracing::debug!(
            rows = state.rows,
            last_seq = state.last_seq,
            "watch finished"
        );
        result
    }

    /// One connection of `watch`: `Some(exit)` when the watch is done, `None` when the server
    /// ended the stream.
    async fn follow_once(
        &self,
        args: &WatchArgs,
        follow: bool,
        state: &mut WatchState,
    ) -> Result<Option<ExitCode>> {
        let mut stream = self.client.events(&self.session, state.last_seq).await?;
        while let Some(event) = stream.next().await {
            match event? {
                ApiEvent::Message { seq, row } => {
                    if seq <= state.last_seq {
                        continue;
                    }
                    if state.skipping {
                        state.last_seq = seq;
                        continue;
                    }
                    let message = host::watch::row_from_json(&row)
                        .with_context(|| format!("the message event of seq {seq}"))?;
                    if self.as_json {
                        output::print_json(&row)?;
                    } else {
                        output::row(&message, false)?;
                    }
                    state.last_seq = seq;
                    state.rows += 1;
                    if args.mark_delivered {
                        self.mark_delivered(seq).await?;
                    }
                    if args.until_count.is_some_and(|count| state.rows >= count) {
                        return Ok(Some(ExitCode::SUCCESS));
                    }
                }
                ApiEvent::CaughtUp { last_seq } => {
                    tracing::info!(
                        last_seq = state.last_seq.max(last_seq),
                        "watch: caught up with the event stream"
                    );
                    if state.skipping {
                        state.skipping = false;
                        state.last_seq = state.last_seq.max(last_seq);
                    }
                    if !follow {
                        return Ok(Some(ExitCode::SUCCESS));
                    }
                }
                ApiEvent::Status(_) | ApiEvent::Other(_) => {}
            }
        }
        Ok(None)
    }

    /// Records `seq` delivered, retrying across a restart of the server (a repeat is harmless:
    /// the server keeps the first record).
    async fn mark_delivered(&self, seq: i64) -> Result<()> {
        let body = DeliveredBody {
            status: DeliveryStatus::Delivered,
            reason: None,
            platform_message_id: None,
        };
        retrying(DEFAULT_RETRY_FOR, "watch --mark-delivered", || {
            self.client.delivered(&self.session, seq, &body)
        })
        .await
        .with_context(|| format!("marking seq {seq} delivered"))?;
        Ok(())
    }
}

struct WatchState {
    last_seq: i64,
    skipping: bool,
    rows: u64,
}

fn is_retryable(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<ClientError>()
            .is_some_and(ClientError::is_retryable)
    })
}

/// The API body for a send: the same fields, JSON flags parsed here so a typo is named by its
/// flag before anything is sent.
fn send_body(request: SendRequest) -> Result<SendBody> {
    let json = |flag: &str, text: Option<String>| {
        text.map(|text| {
            serde_json::from_str::<Value>(&text).with_context(|| format!("{flag}: not valid JSON"))
        })
        .transpose()
    };
    Ok(SendBody {
        kind: request.kind.into(),
        content: json("--content", request.content)?,
        id: request.id,
        text: request.text,
        sender: request.sender,
        sender_id: request.sender_id,
        reply_to: request.reply_to.map(|quote| QuoteBody {
            id: quote.id,
            sender: quote.sender,
            text: quote.text,
        }),
        attach_paths: request.attach_paths,
        attach_urls: request.attach_urls,
        prompt: request.prompt,
        script: request.script,
        recurrence: request.recurrence,
        source: request.source,
        event: request.event,
        payload: json("--payload", request.payload)?,
        channel_type: request.routing.channel_type,
        platform_id: request.routing.platform_id,
        thread_id: request.routing.thread_id,
        no_trigger: request.no_trigger,
        process_after: request.process_after,
        on_wake: request.on_wake,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_token_file_others_can_read_is_refused_naming_chmod() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "ncl_secret\nignored\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = read_token_file(&file).unwrap_err().to_string();
        assert!(err.contains("chmod 600"), "{err}");
        assert!(!err.contains("ncl_secret"), "{err}");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_token_file(&file).unwrap(), "ncl_secret");
    }
}
