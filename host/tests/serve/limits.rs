//! Connection bounds: a client sending its headers one byte at a time is dropped by the header
//! timeout, idle connections neither stop normal clients nor stay forever.

use std::time::{Duration, Instant};

use host::serve::Limits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{client, make_root, TestServer};

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
    let limits = Limits {
        header_timeout: Duration::from_secs(2),
        ..Limits::default()
    };
    let server = TestServer::start(&root, limits).await;
    let mut idle = Vec::new();
    for _ in 0..2000 {
        idle.push(TcpStream::connect(server.addr).await.unwrap());
    }
    // A normal client is answered: within the header timeout that frees the idle ones' slots
    // (512 at most are open; the rest wait in the backlog).
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
    println!(
        "answered after {:?} with 2,000 idle connections open",
        started.elapsed()
    );
    // The idle connections were closed by the server.
    let mut closed = 0;
    for mut conn in idle.drain(..).take(50) {
        let mut byte = [0u8; 1];
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_secs(10), conn.read(&mut byte)).await
        {
            closed += 1;
        }
    }
    assert_eq!(closed, 50, "idle connections stayed open");
    server.stop().await;
}
