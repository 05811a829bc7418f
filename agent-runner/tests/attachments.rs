//! Issue 6 acceptance for inbound attachments: a URL served from loopback is saved; a 404, an
//! oversized body, a slow body past the timeout, a `../../etc/passwd` path and invalid base64
//! each give the `[attachment unavailable: …]` line in the prompt AND a log entry.
//!
//! Issue 9 point 6: an attachment field of an unexpected type (a numeric `name` or `mimeType`,
//! an object, `size` as text) leaves the rest of the message standing, and base64 data never
//! reaches the prompt, not even from content that cannot be read at all.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_runner::format::{format_prompt, AttachmentNote, FormatContext, PromptRow};
use agent_runner::media::{resolve_attachments, MediaLimits, ResolvedAttachments};
use base64::Engine as _;
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

/// Stores `content` as chat row `msg-1` in a fresh DB in `workspace`, then does what the runner
/// does with it: parses it, resolves its attachments and formats the prompt.
async fn through_the_runner(
    workspace: &Path,
    kind: &str,
    content: &str,
) -> (InboundContent, ResolvedAttachments, String) {
    let db = SessionDb::open(workspace.join("session.db")).unwrap();
    let mut row = NewMessageIn::new(kind, content);
    row.id = Some("msg-1".into());
    db.insert_in(&row).unwrap();
    let stored: MessageIn = db.message_in("msg-1").unwrap().unwrap();
    let content = InboundContent::parse(&stored.kind(), &stored.content);
    let attachments = match &content {
        InboundContent::Chat(chat) => chat.attachments.clone(),
        InboundContent::ChatSdk(sdk) => sdk.attachments.clone(),
        _ => Vec::new(),
    };
    let resolved =
        resolve_attachments("msg-1", &attachments, workspace, &MediaLimits::default()).await;
    let prompt = format_prompt(
        &[PromptRow {
            row: &stored,
            content: content.clone(),
            attachments: resolved.notes.clone(),
            script_output: None,
        }],
        &FormatContext {
            timezone: chrono_tz::UTC,
            destinations: &[],
        },
    );
    (content, resolved, prompt)
}

fn base64_of(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// One bad field per case; the message keeps its sender and text and the file is saved.
#[tokio::test]
async fn fields_of_unexpected_types_keep_the_message() {
    let cases = [
        ("numeric name", serde_json::json!({"name": 12345})),
        (
            "numeric mimeType",
            serde_json::json!({"name": "a.txt", "mimeType": 42}),
        ),
        (
            "object-valued field",
            serde_json::json!({"name": "a.txt", "url": {"href": "https://x.example/a"}}),
        ),
        (
            "size as a string",
            serde_json::json!({"name": "a.txt", "size": "5"}),
        ),
    ];
    for (case, mut attachment) in cases {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path();
        attachment["data"] = base64_of(b"hello").into();
        let content = serde_json::json!({
            "sender": "Ann", "senderId": "U1", "text": "see attached",
            "attachments": [attachment],
        });
        let (parsed, resolved, prompt) =
            through_the_runner(workspace, "chat", &content.to_string()).await;
        assert!(
            matches!(&parsed, InboundContent::Chat(chat) if chat.sender.as_deref() == Some("Ann")),
            "{case}: {parsed:?}"
        );
        let [AttachmentNote::Available { path }] = resolved.notes.as_slice() else {
            panic!("{case}: not saved: {:?}", resolved.notes);
        };
        assert_eq!(std::fs::read(path).unwrap(), b"hello", "{case}");
        assert!(path.contains("downloads/msg-1/"), "{case}: {path}");
        assert!(prompt.contains(r#"sender="Ann""#), "{case}: {prompt}");
        assert!(prompt.contains("see attached"), "{case}: {prompt}");
        assert!(
            prompt.contains(&format!("[file available at: {path}]")),
            "{case}: {prompt}"
        );
    }
}

/// 300 KB of base64 with a bad field is saved as a file, not pasted into the prompt; content that
/// cannot be read at all is shown capped and without its base64.
#[tokio::test]
async fn base64_never_reaches_the_prompt() {
    let payload: Vec<u8> = (0..225_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let data = base64_of(&payload);
    assert!(data.len() >= 300_000);
    let probe = &data[1000..1100];

    let dir = tempfile::tempdir().unwrap();
    let content = serde_json::json!({
        "sender": "Ann", "text": "big one",
        "attachments": [{"name": 7, "mimeType": "application/octet-stream", "data": data}],
    });
    let (_, resolved, prompt) = through_the_runner(dir.path(), "chat", &content.to_string()).await;
    let [AttachmentNote::Available { path }] = resolved.notes.as_slice() else {
        panic!("not saved: {:?}", resolved.notes);
    };
    assert_eq!(std::fs::read(path).unwrap(), payload);
    assert!(prompt.len() < 2048, "{} bytes", prompt.len());
    assert!(!prompt.contains(probe));

    let unreadable = [
        // Cut off mid-payload: not JSON.
        content.to_string()[..200_000].to_owned(),
        // JSON, but not an object.
        serde_json::json!([{"text": "big one", "data": data}]).to_string(),
        serde_json::Value::String(data.clone()).to_string(),
    ];
    for raw in unreadable {
        let dir = tempfile::tempdir().unwrap();
        let (parsed, _, prompt) = through_the_runner(dir.path(), "chat", &raw).await;
        assert!(
            matches!(parsed, InboundContent::Unparsable { .. }),
            "{parsed:?}"
        );
        assert!(prompt.len() < 8192, "{} bytes", prompt.len());
        assert!(!prompt.contains(probe), "{prompt}");
    }
}
