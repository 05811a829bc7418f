//! A request body far larger than the proxy's read buffer goes through without the proxy ever
//! making one allocation near the body's size: what a connection keeps between requests stays
//! bounded however long the conversation the CLI sends grows (issue 12, the runner's RSS with a
//! real CLI).
//!
//! This binary counts the largest single allocation of the whole process, so it holds one test,
//! and its upstream and client are plain sockets with fixed buffers: the proxy is the only HTTP
//! code that runs.
#![allow(clippy::unwrap_used, clippy::expect_used, unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use credproxy::{Api, CredProxy, Upstream, READ_BUFFER_MAX};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The system allocator, noting the largest allocation made while `COUNTING` is set.
struct Largest;

static COUNTING: AtomicBool = AtomicBool::new(false);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

impl Largest {
    fn note(size: usize) {
        if COUNTING.load(Ordering::Relaxed) {
            LARGEST.fetch_max(size, Ordering::Relaxed);
        }
    }
}

// SAFETY: every call goes to `System` unchanged; the counters are atomics and allocate nothing.
unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::note(layout.size());
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Self::note(layout.size());
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Self::note(new_size);
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Largest = Largest;

/// The body the client sends: 4 MiB, a conversation of a few thousand turns.
const BODY_BYTES: usize = 4 * 1024 * 1024;
/// The client's and the upstream's socket buffers.
const CHUNK: usize = 16 * 1024;

/// Reads one request with a `content-length` and answers `200 ok`, through a fixed buffer;
/// returns how many body bytes came.
async fn answer_one(listener: TcpListener) -> usize {
    let (mut socket, _) = listener.accept().await.unwrap();
    let mut buf = [0u8; CHUNK];
    let mut head = Vec::new();
    let body_start = loop {
        let n = socket.read(&mut buf).await.unwrap();
        assert!(n > 0, "the proxy closed before the request head ended");
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
    };
    let text = String::from_utf8_lossy(&head[..body_start]).to_ascii_lowercase();
    let length: usize = text
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .map(|value| value.trim().parse().unwrap())
        .expect("the proxy forwards the content-length");
    let mut got = head.len() - body_start;
    while got < length {
        let n = socket.read(&mut buf).await.unwrap();
        assert!(n > 0, "the proxy closed inside the body");
        got += n;
    }
    socket
        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        .await
        .unwrap();
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_body_streams_through_a_bounded_read_buffer() {
    let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", upstream.local_addr().unwrap());
    let upstream = tokio::spawn(answer_one(upstream));
    let proxy = CredProxy::start(vec![Upstream::new(Api::Anthropic, Some(&base), "sk-real")])
        .await
        .unwrap();

    let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
    let head = format!(
        "POST /anthropic/v1/messages HTTP/1.1\r\nhost: {}\r\nx-api-key: {}\r\ncontent-type: application/json\r\ncontent-length: {BODY_BYTES}\r\n\r\n",
        proxy.addr(),
        proxy.token()
    );
    let chunk = [b'x'; CHUNK];
    COUNTING.store(true, Ordering::SeqCst);
    client.write_all(head.as_bytes()).await.unwrap();
    for _ in 0..BODY_BYTES / CHUNK {
        client.write_all(&chunk).await.unwrap();
    }
    let mut answer = Vec::new();
    let mut buf = [0u8; CHUNK];
    // The answer comes chunked or with a length: its body holds `ok` either way.
    while !answer
        .split(|&b| b == b'\n')
        .any(|line| line.starts_with(b"ok"))
    {
        let n = client.read(&mut buf).await.unwrap();
        assert!(n > 0, "the proxy closed before answering");
        answer.extend_from_slice(&buf[..n]);
    }
    COUNTING.store(false, Ordering::SeqCst);

    assert_eq!(
        upstream.await.unwrap(),
        BODY_BYTES,
        "the whole body went up"
    );
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    // hyper reads at most `READ_BUFFER_MAX` ahead of what the body has taken and reserves room
    // for one more read: 64-112 KiB measured. Unbounded (hyper's default), it was 660 KiB.
    let largest = LARGEST.load(Ordering::SeqCst);
    assert!(
        largest <= 4 * READ_BUFFER_MAX,
        "the largest allocation while forwarding was {largest} bytes (read buffer max {READ_BUFFER_MAX})"
    );
}
