//! Issue 6 acceptance for inbound attachments: a URL served from loopback is saved; a 404, an
//! oversized body, a slow body past the timeout, a `../../etc/passwd` path and invalid base64
//! each give the `[attachment unavailable: …]` line in the prompt AND a log entry.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_runner::format::{format_prompt, AttachmentNote, FormatContext, PromptRow};
use agent_runner::media::{resolve_attachments, MediaLimits};
use schema::{Attachment, InboundContent, MessageIn, NewMessageIn, SessionDb};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Captures log lines.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A loopback server: `/ok.txt` (small), `/missing` (404), `/big` (2 MB), `/slow` (stalls).
async fn serve() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = socket.read(&mut buf).await.unwrap_or(0);
                let request = String::from_utf8_lossy(&buf[..n]).to_string();
                let path = request.split_whitespace().nth(1).unwrap_or("/").to_owned();
                let reply: Vec<u8> = match path.as_str() {
                    "/ok.txt" => b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello".to_vec(),
                    "/big" => {
                        let mut r = b"HTTP/1.1 200 OK\r\nContent-Length: 2000000\r\n\r\n".to_vec();
                        r.extend(std::iter::repeat_n(b'x', 2_000_000));
                        r
                    }
                    "/slow" => {
                        let _ = socket
                            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nab")
                            .await;
                        tokio::time::sleep(Duration::from_secs(30)).await;
                        return;
                    }
                    _ => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec(),
                };
                let _ = socket.write_all(&reply).await;
            });
        }
    });
    format!("http://{addr}")
}

fn url(name: &str, url: String) -> Attachment {
    Attachment {
        name: Some(name.into()),
        url: Some(url),
        ..Default::default()
    }
}

#[tokio::test]
async fn failures_give_the_unavailable_line_and_a_log_entry() {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path();
    let base = serve().await;
    let attachments = vec![
        url("ok.txt", format!("{base}/ok.txt")),
        url("missing.txt", format!("{base}/missing")),
        url("big.bin", format!("{base}/big")),
        url("slow.bin", format!("{base}/slow")),
        Attachment {
            name: Some("passwd".into()),
            local_path: Some("../../etc/passwd".into()),
            ..Default::default()
        },
        Attachment {
            name: Some("bad.png".into()),
            data: Some("***not base64***".into()),
            ..Default::default()
        },
    ];
    let limits = MediaLimits {
        max_bytes: 1_000_000,
        timeout: Duration::from_millis(700),
        ..Default::default()
    };
    let resolved = resolve_attachments("msg-1", &attachments, workspace, &limits).await;

    // The good one is saved under downloads/<messageId>/.
    let saved = workspace.join("downloads/msg-1/ok.txt");
    assert_eq!(std::fs::read_to_string(&saved).unwrap(), "hello");
    assert!(
        matches!(&resolved.notes[0], AttachmentNote::Available { path } if path.ends_with("downloads/msg-1/ok.txt"))
    );

    // The prompt shows one line per attachment.
    let db = SessionDb::open(workspace.join("session.db")).unwrap();
    let mut row = NewMessageIn::new(
        "chat",
        serde_json::json!({"sender": "Ann", "text": "files"}).to_string(),
    );
    row.id = Some("msg-1".into());
    db.insert_in(&row).unwrap();
    let stored: MessageIn = db.message_in("msg-1").unwrap().unwrap();
    let content = InboundContent::parse(&stored.kind(), &stored.content);
    let prompt = format_prompt(
        &[PromptRow {
            row: &stored,
            content,
            attachments: resolved.notes.clone(),
            script_output: None,
        }],
        &FormatContext {
            timezone: chrono_tz::UTC,
            destinations: &[],
        },
    );
    assert!(
        prompt.contains(&format!("[file available at: {}]", saved.display())),
        "{prompt}"
    );
    let logged = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    for name in ["missing.txt", "big.bin", "slow.bin", "passwd", "bad.png"] {
        assert!(
            prompt.contains(&format!("[attachment unavailable: {name} — ")),
            "no line for {name}:\n{prompt}"
        );
        assert!(
            logged
                .lines()
                .any(|l| l.contains("attachment unavailable") && l.contains(name)),
            "no log entry for {name}:\n{logged}"
        );
    }
    assert!(
        !workspace.join("downloads/msg-1/big.bin").exists(),
        "a partial oversized file was kept"
    );
}
