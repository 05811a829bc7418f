//! Connection bounds: a client sending its headers one byte at a time is dropped by the header
//! timeout, idle connections neither stop normal clients nor stay forever.

use std::time::{Duration, Instant};

use host::serve::Limits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::serve::support::{client, make_root, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_dripping_its_headers_is_dropped_by_the_header_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (root, tokens) = make_root(&dir);
    let limits = Limits {
        header_timeout: Duration::from_millis(800),
        ..Limits::default()
    };
    let server = TestServer::start(&root, limits).await;
    let mut slow = TcpStream::connect(server.addr).await.unwrap();
    let request = format!(
        "GET /v1/sessions/alpha HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\r\n",
        tokens.admin
    );
    let started = Instant::now();
    let mut sent = 0;
    let mut closed_after = None;
    for byte in request.bytes() {
        if slow.write_all(&[byte]).await.is_err() {
            closed_after = Some(started.elapsed());
            break;
        }
        sent += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
        // The server closing shows as EOF (or a reset) on a read.
        let mut probe = [0u8; 256];
        if let Ok(read) =
            tokio::time::timeout(Duration::from_millis(1), slow.read(&mut probe)).await
        {
            let text = String::from_utf8_lossy(&probe[..read.unwrap_or(0)]).into_owned();
            assert!(
                !text.contains("200 OK"),
                "answered a request that took {:?}",
                started.elapsed()
            );
            closed_after = Some(started.elapsed());
            break;
        }
    }
    let closed_after = closed_after.expect("the server never closed the dripping connection");
    assert!(sent < request.len(), "the whole request went through");
    assert!(
        closed_after >= Duration::from_millis(700) && closed_after < Duration::from_secs(5),
        "closed after {closed_after:?}"
    );
    // Others are served meanwhile and after.
    let ok = client().get(server.at("/v1/health")).send().await.unwrap();
    assert_eq!(ok.status(), 200);
    server.stop().await;
}

/// Raises this process's open-file limit to at least `want` (up to the hard limit).
fn raise_fd_limit(want: u64) -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write and read the struct we own.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        if limit.rlim_cur < want {
            limit.rlim_cur = want.min(limit.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
    }
    limit.rlim_cur
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_idle_connections_leave_the_server_answering() {
    // Both ends of each connection live in this process: 4,000 descriptors and some.
    let limit = raise_fd_limit(8192);
    assert!(
        limit >= 4600,
        "the test needs 4,600 open files, the hard limit is {limit}"
    );
    let dir = tempfile::tempdir().unwrap();
    let (root, tokens) = make_root(&dir);
    // The real header timeout (10 s): room is made by closing silent connections, not by
    // waiting for their timeouts.
    let server = TestServer::start(&root, Limits::default()).await;
    let mut idle = Vec::new();
    let opening = Instant::now();
    for _ in 0..2000 {
        idle.push(TcpStream::connect(server.addr).await.unwrap());
    }
    println!("2,000 idle connections opened in {:?}", opening.elapsed());
    let started = Instant::now();
    let answer = tokio::time::timeout(
        Duration::from_secs(20),
        client()
            .get(server.at("/v1/sessions/alpha"))
            .bearer_auth(&tokens.admin)
            .send(),
    )
    .await
    .expect("no answer within 20 s")
    .unwrap();
    assert_eq!(answer.status(), 200);
    let waited = started.elapsed();
    println!("a normal client answered after {waited:?} with 2,000 idle connections opened");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    // The oldest silent ones were closed to make room, well before their header timeout.
    let mut closed = 0;
    for mut conn in idle.drain(..).take(100) {
        let mut byte = [0u8; 1];
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_millis(200), conn.read(&mut byte)).await
        {
            closed += 1;
        }
    }
    assert_eq!(closed, 100, "the oldest idle connections stayed open");
    assert!(
        opening.elapsed() < Duration::from_secs(10),
        "{:?}",
        opening.elapsed()
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_db_locked_by_another_process_is_503_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let (root, tokens) = make_root(&dir);
    let limits = Limits {
        db_lock_wait: Duration::from_millis(300),
        ..Limits::default()
    };
    let server = TestServer::start(&root, limits).await;
    let http = client();
    let send = || {
        http.post(server.at("/v1/sessions/alpha/messages"))
            .bearer_auth(&tokens.alpha)
            .json(&serde_json::json!({"text": "hi"}))
            .send()
    };
    // Opened (and migrated) once while the DB is free.
    assert_eq!(send().await.unwrap().status(), 201);
    let db = server.db("alpha");
    let before = crate::serve::support::db_state(&db);
    // Another process holds the write lock.
    let holder = rusqlite::Connection::open(root.join("alpha/session.db")).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let started = Instant::now();
    let busy = send().await.unwrap();
    assert_eq!(busy.status(), 503);
    assert_eq!(busy.headers()["retry-after"], "2");
    let body: serde_json::Value = busy.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unavailable");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    holder.execute_batch("ROLLBACK").unwrap();
    assert_eq!(crate::serve::support::db_state(&db), before);
    // Free again: the retry goes through.
    assert_eq!(send().await.unwrap().status(), 201);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_does_not_arrive_in_time_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (root, tokens) = make_root(&dir);
    let limits = Limits {
        body_timeout: Duration::from_millis(800),
        ..Limits::default()
    };
    let server = TestServer::start(&root, limits).await;
    let db = server.db("alpha");
    let before = crate::serve::support::db_state(&db);
    let mut slow = TcpStream::connect(server.addr).await.unwrap();
    let body = br#"{"text":"slow body"}"#;
    let head = format!(
        "POST /v1/sessions/alpha/messages HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        tokens.alpha,
        body.len()
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    // Half the body, then nothing.
    slow.write_all(&body[..8]).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        let mut chunk = [0u8; 1024];
        loop {
            match slow.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    answer.extend_from_slice(&chunk[..n]);
                    if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no answer to a stalled body");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(700) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    assert_eq!(crate::serve::support::db_state(&db), before);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_sessions_are_served_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (root, tokens) = make_root(&dir);
    let server = TestServer::start(&root, Limits::default()).await;
    let http = client();
    for n in 0..100 {
        let created = http
            .post(server.at("/v1/sessions"))
            .bearer_auth(&tokens.admin)
            .json(&serde_json::json!({ "name": format!("s{n:03}") }))
            .send()
            .await
            .unwrap();
        assert_eq!(created.status(), 201);
    }
    let sends = (0..100).map(|n| {
        http.post(server.at(&format!("/v1/sessions/s{n:03}/messages")))
            .bearer_auth(&tokens.admin)
            .json(&serde_json::json!({ "text": format!("to {n}") }))
            .send()
    });
    for answer in futures::future::join_all(sends).await {
        assert_eq!(answer.unwrap().status(), 201);
    }
    let list: serde_json::Value = http
        .get(server.at("/v1/sessions"))
        .bearer_auth(&tokens.admin)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["sessions"].as_array().unwrap().len(), 102);
    for n in [0, 57, 99] {
        let db = server.db(&format!("s{n:03}"));
        assert_eq!(db.max_seq().unwrap(), 2);
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let (root, _tokens) = make_root(&dir);
    let limits = Limits {
        idle_timeout: Duration::from_millis(400),
        ..Limits::default()
    };
    let server = TestServer::start(&root, limits).await;
    let mut conn = TcpStream::connect(server.addr).await.unwrap();
    conn.write_all(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = [0u8; 512];
    let n = conn.read(&mut answer).await.unwrap();
    assert!(String::from_utf8_lossy(&answer[..n]).contains("healthy"));
    // Kept alive, then closed once idle.
    let started = Instant::now();
    let rest = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut answer)).await;
    assert!(matches!(rest, Ok(Ok(0)) | Ok(Err(_))), "{rest:?}");
    let idle = started.elapsed();
    assert!(
        idle >= Duration::from_millis(300) && idle < Duration::from_secs(3),
        "{idle:?}"
    );
    server.stop().await;
}
