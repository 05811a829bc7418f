//! The `nanoclaw serve` binary: it logs where it listens and one audit line per mutating
//! request (never a token), and SIGTERM ends it cleanly.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;

use crate::serve::support::{client, make_root};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_audits_writes_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let (root, tokens) = make_root(&dir);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_nanoclaw"))
        .args(["serve", "--root"])
        .arg(&root)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env_remove("RUST_LOG")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let listening = lines.recv_timeout(Duration::from_secs(20)).unwrap();
    assert!(listening.contains("serve: listening"), "{listening}");
    let http = client();
    let base = format!("http://127.0.0.1:{port}");
    let sent: serde_json::Value = http
        .post(format!("{base}/v1/sessions/alpha/messages"))
        .bearer_auth(&tokens.alpha)
        .json(&json!({"text": "audited"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let refused = http
        .post(format!("{base}/v1/sessions/alpha/interrupt"))
        .bearer_auth(&tokens.reader)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    // No token: refused, and audited too.
    let anonymous = http
        .post(format!("{base}/v1/sessions/alpha/sweep"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    // A read is not audited.
    let read = http
        .get(format!("{base}/v1/sessions/alpha"))
        .bearer_auth(&tokens.alpha)
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), 200);

    // SAFETY: a signal to the child this test started, by its pid.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let log: Vec<String> = lines.try_iter().collect();
    let audit: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("nanoclaw::audit"))
        .collect();
    assert_eq!(audit.len(), 3, "{log:#?}");
    assert!(
        audit[0].ends_with(&format!(
            "token=alpha-rw session=alpha action=send status=201 id={}",
            sent["id"].as_str().unwrap()
        )),
        "{}",
        audit[0]
    );
    assert!(
        audit[1].ends_with("token=alpha-ro session=alpha action=interrupt status=403 id=-"),
        "{}",
        audit[1]
    );
    assert!(
        audit[2].ends_with("token=- session=alpha action=sweep status=401 id=-"),
        "{}",
        audit[2]
    );
    for line in &log {
        for token in [&tokens.admin, &tokens.alpha, &tokens.reader] {
            assert!(!line.contains(token.as_str()), "a token in the log: {line}");
        }
    }
    assert!(log.iter().any(|l| l.contains("shutting down")), "{log:#?}");
}
