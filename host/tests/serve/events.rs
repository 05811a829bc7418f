//! The event stream: rows in seq order with their seq as id, status at the start and on
//! change, keep-alive comments, resumption, and a stalled client dropped while another reads.

use std::time::{Duration, Instant};

use futures::StreamExt;
use host::serve::Limits;
use schema::RunnerStatus;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::serve::support::{agent_reply, client, make_root, TestServer};

/// One parsed event.
#[derive(Debug, Clone, PartialEq)]
struct Sse {
    event: Option<String>,
    id: Option<String>,
    data: Option<String>,
    comment: Option<String>,
}

fn parse(block: &str) -> Sse {
    let mut event = Sse {
        event: None,
        id: None,
        data: None,
        comment: None,
    };
    for line in block.lines() {
        if let Some(rest) = line.strip_prefix(':') {
            event.comment = Some(rest.trim().to_owned());
        } else if let Some((field, value)) = line.split_once(": ") {
            match field {
                "event" => event.event = Some(value.to_owned()),
                "id" => event.id = Some(value.to_owned()),
                "data" => event.data = Some(value.to_owned()),
                _ => {}
            }
        }
    }
    event
}

/// Reads events from `response` until `done` says so or `within` passes.
async fn read_until<B: AsRef<[u8]> + std::fmt::Debug>(
    response: &mut (impl futures::Stream<Item = reqwest::Result<B>> + Unpin),
    buffer: &mut String,
    within: Duration,
    mut done: impl FnMut(&[Sse]) -> bool,
) -> Vec<Sse> {
    let mut events = Vec::new();
    let deadline = Instant::now() + within;
    loop {
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            events.push(parse(&block));
            if done(&events) {
                return events;
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, response.next()).await {
            Ok(Some(Ok(bytes))) => buffer.push_str(&String::from_utf8_lossy(bytes.as_ref())),
            other => panic!(
                "stream ended or timed out ({:?}) after {} events, the last id {:?}",
                other.map(|o| o.map(|r| r.map(|_| ()))),
                events.len(),
                events.last().and_then(|e| e.id.clone())
            ),
        }
    }
}

fn messages(events: &[Sse]) -> Vec<&Sse> {
    events
        .iter()
        .filter(|e| e.event.as_deref() == Some("message"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_and_status_stream_in_order_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let (root, tokens) = make_root(&dir);
    let limits = Limits {
        keep_alive_every: Duration::from_millis(300),
        ..Limits::default()
    };
    let server = TestServer::start(&root, limits).await;
    let db = server.db("alpha");
    let first = agent_reply(&db, "one");
    let second = agent_reply(&db, "two");
    let http = client();
    let response = http
        .get(server.at("/v1/sessions/alpha/events"))
        .bearer_auth(&tokens.alpha)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let mut stream = response.bytes_stream();
    let mut buffer = String::new();
    let events = read_until(&mut stream, &mut buffer, Duration::from_secs(10), |e| {
        messages(e).len() == 2 && e.iter().any(|e| e.event.as_deref() == Some("status"))
    })
    .await;
    let rows = messages(&events);
    assert_eq!(rows[0].id.as_deref(), Some(first.to_string().as_str()));
    assert_eq!(rows[1].id.as_deref(), Some(second.to_string().as_str()));
    let row: Value = serde_json::from_str(rows[1].data.as_deref().unwrap()).unwrap();
    let stored = db.message_out_by_seq(second).unwrap().unwrap();
    assert_eq!(row, host::row_json(&stored));
    let status = events
        .iter()
        .find(|e| e.event.as_deref() == Some("status"))
        .unwrap();
    assert_eq!(status.id, None);
    expect_test::expect![[r#"{"runnerStatus":null,"since":null,"currentTool":null,"waitingOn":null,"progress":null,"lastError":null}"#]]
        .assert_eq(status.data.as_deref().unwrap());

    // A new row arrives well before the next keep-alive round would find it by polling: the
    // DB's watcher wakes the stream. A keep-alive comment comes while idle.
    let written = Instant::now();
    let third = agent_reply(&db, "three");
    let events = read_until(&mut stream, &mut buffer, Duration::from_secs(10), |e| {
        !messages(e).is_empty()
    })
    .await;
    assert_eq!(messages(&events)[0].id, Some(third.to_string()));
    assert!(
        written.elapsed() < Duration::from_secs(5),
        "{:?}",
        written.elapsed()
    );
    let events = read_until(&mut stream, &mut buffer, Duration::from_secs(10), |e| {
        e.iter().any(|e| e.comment.as_deref() == Some("keep-alive"))
    })
    .await;
    assert!(messages(&events).is_empty());

    // A status change is an event.
    db.set_runner_state(RunnerStatus::Busy, Some(42), Some("claude"))
        .unwrap();
    let events = read_until(&mut stream, &mut buffer, Duration::from_secs(10), |e| {
        e.iter().any(|e| e.event.as_deref() == Some("status"))
    })
    .await;
    let status = events
        .iter()
        .find(|e| e.event.as_deref() == Some("status"))
        .unwrap();
    let status: Value = serde_json::from_str(status.data.as_deref().unwrap()).unwrap();
    assert_eq!(status["runnerStatus"], "busy");
    drop(stream);

    // Resume: Last-Event-ID wins over after; rows after it only.
    let resumed = http
        .get(server.at("/v1/sessions/alpha/events?after=0"))
        .bearer_auth(&tokens.alpha)
        .header("Last-Event-ID", first.to_string())
        .send()
        .await
        .unwrap();
    let mut stream = resumed.bytes_stream();
    let mut buffer = String::new();
    let events = read_until(&mut stream, &mut buffer, Duration::from_secs(10), |e| {
        messages(e).len() == 2
    })
    .await;
    let ids: Vec<_> = messages(&events)
        .iter()
        .map(|e| e.id.clone().unwrap())
        .collect();
    assert_eq!(ids, [second.to_string(), third.to_string()]);
    let after = http
        .get(server.at(&format!("/v1/sessions/alpha/events?after={second}")))
        .bearer_auth(&tokens.alpha)
        .send()
        .await
        .unwrap();
    let mut stream = after.bytes_stream();
    let mut buffer = String::new();
    let events = read_until(&mut stream, &mut buffer, Duration::from_secs(10), |e| {
        !messages(e).is_empty()
    })
    .await;
    assert_eq!(messages(&events)[0].id, Some(third.to_string()));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_dropped_and_the_others_keep_receiving() {
    let dir = tempfile::tempdir().unwrap();
    let (root, tokens) = make_root(&dir);
    let limits = Limits {
        write_timeout: Duration::from_secs(1),
        ..Limits::default()
    };
    let server = TestServer::start(&root, limits).await;
    let db = server.db("alpha");

    // The stalled client: asks for the stream, then never reads.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stalled = socket.connect(server.addr).await.unwrap();
    let request = format!(
        "GET /v1/sessions/alpha/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\r\n",
        tokens.alpha
    );
    stalled.write_all(request.as_bytes()).await.unwrap();

    let http = client();
    let reader = http
        .get(server.at("/v1/sessions/alpha/events"))
        .bearer_auth(&tokens.alpha)
        .send()
        .await
        .unwrap();
    let mut stream = reader.bytes_stream();
    let mut buffer = String::new();
    read_until(&mut stream, &mut buffer, Duration::from_secs(10), |e| {
        e.iter().any(|e| e.event.as_deref() == Some("status"))
    })
    .await;

    // More than the kernel's socket buffers hold (loopback send buffers grow to 4 MiB), so the
    // stalled client's connection really stops taking bytes.
    const ROWS: usize = 500;
    let text = "x".repeat(32 * 1024);
    let writer = tokio::task::spawn_blocking({
        let db = server.db("alpha");
        move || {
            for _ in 0..ROWS {
                agent_reply(&db, &text);
            }
        }
    });
    let started = Instant::now();
    let events = read_until(&mut stream, &mut buffer, Duration::from_secs(60), |e| {
        messages(e).len() == ROWS
    })
    .await;
    writer.await.unwrap();
    assert_eq!(messages(&events).len(), ROWS);
    println!(
        "the reading client got {ROWS} rows of 32 KiB in {:?}",
        started.elapsed()
    );

    // The stalled client's connection was ended: reading it now reaches its end well before
    // all rows (its buffer of 64 events filled, then its write timed out).
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), stalled.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the stalled connection is still open");
    let received = String::from_utf8_lossy(&got)
        .matches("event: message")
        .count();
    assert!(
        received < ROWS,
        "the stalled client got every row ({received})"
    );
    println!("the stalled client got {received} rows before it was dropped");
    assert_eq!(db.max_seq().unwrap() as usize, 2 * ROWS - 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_row_wakes_the_stream_without_a_poll() {
    let dir = tempfile::tempdir().unwrap();
    let (root, tokens) = make_root(&dir);
    // The stream looks at the DB by itself only this often: a row seen sooner was woken by the
    // DB's watcher.
    let limits = Limits {
        keep_alive_every: Duration::from_secs(60),
        ..Limits::default()
    };
    let server = TestServer::start(&root, limits).await;
    let db = server.db("alpha");
    let response = client()
        .get(server.at("/v1/sessions/alpha/events"))
        .bearer_auth(&tokens.alpha)
        .send()
        .await
        .unwrap();
    let mut stream = response.bytes_stream();
    let mut buffer = String::new();
    read_until(&mut stream, &mut buffer, Duration::from_secs(10), |e| {
        e.iter().any(|e| e.event.as_deref() == Some("status"))
    })
    .await;
    for n in 0..3 {
        let written = Instant::now();
        let seq = agent_reply(&db, &format!("row {n}"));
        let events = read_until(&mut stream, &mut buffer, Duration::from_secs(10), |e| {
            !messages(e).is_empty()
        })
        .await;
        assert_eq!(messages(&events)[0].id, Some(seq.to_string()));
        let latency = written.elapsed();
        println!("row {n} reached the client {latency:?} after its commit");
        assert!(latency < Duration::from_secs(3), "{latency:?}");
    }
    drop(stream);
    server.stop().await;
}
