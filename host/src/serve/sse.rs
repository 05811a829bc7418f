//! `GET /v1/sessions/{name}/events`: `messages_out` rows and runner status as server-sent
//! events, woken by the DB's changes ([`schema::DbWatcher`]), not a poll.
//!
//! Each client has its own producer task and a bounded channel of events: a client that stops
//! reading fills its channel and is dropped (its producer ends); the others never wait for it.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, Uri};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use futures::StreamExt;
use schema::{DbWatcher, SessionDb};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::SendTimeoutError;

use super::auth::Caller;
use super::errors::ApiError;
use super::state::{query, shorten, AppState};
use crate::api::{EventsQuery, StatusEvent, LAST_EVENT_ID};

/// Rows read per page.
const PAGE: usize = 200;

/// `GET /v1/sessions/{name}/events?after=SEQ` (`Last-Event-ID` wins over `after`).
#[utoipa::path(get, path = "/v1/sessions/{name}/events", params(("name" = String, Path), EventsQuery),
    responses((status = 200, description = "text/event-stream: `message` events (id = seq, data = watch --json object), `status` events (StatusEvent), one `caught-up` event ({\"lastSeq\"}) once the rows there at the start are sent, `: keep-alive` comments", content_type = "text/event-stream")))]
pub(crate) async fn events(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(name): Path<String>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, ApiError> {
    let path = state.session_db_path(&caller, &name)?;
    let query: EventsQuery = query(&uri)?;
    let after = match headers.get(LAST_EVENT_ID) {
        Some(value) => {
            let text = value.to_str().unwrap_or_default().trim();
            text.parse::<i64>().map_err(|_| {
                ApiError::bad_request(format!(
                    "bad Last-Event-ID {}: expected the seq of the last message event",
                    shorten(text)
                ))
            })?
        }
        None => query.after.unwrap_or(0),
    };
    let state2 = state.clone();
    let db = tokio::task::spawn_blocking(move || state2.dbs.get(&path))
        .await?
        .map_err(ApiError::from_library)?;
    let watcher = DbWatcher::new(&db).map_err(|err| ApiError::from_library(err.into()))?;
    let (events, receiver) = mpsc::channel(state.sse_buffer);
    let producer = Producer {
        db,
        events,
        every: state.keep_alive_every,
        stall: state.write_timeout,
        session: name,
    };
    tokio::spawn(producer.run(watcher, after, state.stopping.clone()));
    let stream = tokio_stream_from(receiver).map(Ok::<Event, Infallible>);
    Ok(Sse::new(stream)
        .keep_alive(
            KeepAlive::new()
                .interval(state.keep_alive_every)
                .text("keep-alive"),
        )
        .into_response())
}

/// The receiver as a stream.
fn tokio_stream_from(mut receiver: mpsc::Receiver<Event>) -> impl futures::Stream<Item = Event> {
    futures::stream::poll_fn(move |cx| receiver.poll_recv(cx))
}

/// Why the producer stopped.
enum Stop {
    /// The client went away.
    Gone,
    /// The client's buffer is full: it stopped reading.
    Full,
}

/// Queues `event`; a client whose buffer stays full for `stall` stopped reading.
async fn offer(events: &mpsc::Sender<Event>, event: Event, stall: Duration) -> Result<(), Stop> {
    events
        .send_timeout(event, stall)
        .await
        .map_err(|err| match err {
            SendTimeoutError::Timeout(_) => Stop::Full,
            SendTimeoutError::Closed(_) => Stop::Gone,
        })
}

/// One client's producer: what it reads, where it offers events, and its bounds.
struct Producer {
    db: Arc<SessionDb>,
    events: mpsc::Sender<Event>,
    /// The longest wait between two looks at the DB (the keep-alive interval).
    every: Duration,
    /// How long the client's buffer may stay full.
    stall: Duration,
    session: String,
}

impl Producer {
    /// Reads rows after `after` and status changes, and offers them to the client until it
    /// goes away, stops reading, or the server stops.
    async fn run(
        self,
        mut watcher: DbWatcher,
        mut after: i64,
        mut stopping: tokio::sync::watch::Receiver<bool>,
    ) {
        let Self {
            db,
            events,
            every,
            stall,
            session,
        } = self;
        let mut last_status: Option<StatusEvent> = None;
        let mut caught_up = false;
        let stop = loop {
            match step(&db, &mut after, &mut last_status, &events, stall).await {
                Ok(true) => continue,
                Ok(false) => {}
                Err(stop) => break stop,
            }
            // Once, when the rows there at the start are sent: `watch --no-follow` stops here,
            // `watch --new` starts printing here (docs/contract/api.md, "Events").
            if !caught_up {
                caught_up = true;
                let data = serde_json::json!({ "lastSeq": after }).to_string();
                let event = Event::default().event("caught-up").data(data);
                if let Err(stop) = offer(&events, event, stall).await {
                    break stop;
                }
            }
            if *stopping.borrow() {
                break Stop::Gone;
            }
            tokio::select! {
                _ = watcher.wait(every) => {}
                () = events.closed() => break Stop::Gone,
                _ = stopping.changed() => break Stop::Gone,
            }
        };
        if let Stop::Full = stop {
            tracing::warn!(
                session,
                "serve: dropped an event stream client that stopped reading (its buffer is full)"
            );
        }
    }
}

/// One round: new rows (true when a full page was read: more may follow), then the status.
/// The rows are offered before the status is read: a reply's event does not wait for the
/// status queries (issue 40, send → reply latency).
async fn step(
    db: &Arc<SessionDb>,
    after: &mut i64,
    last_status: &mut Option<StatusEvent>,
    events: &mpsc::Sender<Event>,
    stall: Duration,
) -> Result<bool, Stop> {
    let from = *after;
    let reader = db.clone();
    let rows = read(move || Ok(reader.messages_out_after(from, PAGE)?)).await?;
    let Some(rows) = rows else { return Ok(false) };
    let full_page = rows.len() == PAGE;
    for row in &rows {
        let Some(seq) = row.seq else { continue };
        *after = seq;
        let data = crate::row_json(row).to_string();
        offer(
            events,
            Event::default()
                .event("message")
                .id(seq.to_string())
                .data(data),
            stall,
        )
        .await?;
    }
    let reader = db.clone();
    let status = read(move || {
        let status = crate::status(&reader, Utc::now(), &crate::status::default_limits())?;
        Ok(StatusEvent::from_report(&status))
    })
    .await?;
    let Some(status) = status else {
        return Ok(false);
    };
    if last_status.as_ref() != Some(&status) {
        let data = serde_json::to_string(&status).unwrap_or_default();
        offer(events, Event::default().event("status").data(data), stall).await?;
        *last_status = Some(status);
    }
    Ok(full_page)
}

/// Runs the DB read `f` on a blocking thread: `None` after a failed read (logged; the next
/// round tries again), [`Stop::Gone`] when the runtime is going away.
async fn read<T: Send + 'static>(
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> Result<Option<T>, Stop> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(read)) => Ok(Some(read)),
        Ok(Err(err)) => {
            tracing::warn!(
                error = format!("{err:#}"),
                "serve: reading events; trying again"
            );
            Ok(None)
        }
        Err(_) => Err(Stop::Gone),
    }
}
