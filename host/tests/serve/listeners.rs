//! Listeners: TLS with a self-signed certificate, a unix socket of mode 0600 (no token asked),
//! and the refusals at start (plain HTTP off loopback, a token file in a session folder).

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use host::serve::{Limits, Listen, ServeConfig, Served, Server};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::serve::support::make_root;

fn config(root: &std::path::Path, listen: Listen) -> ServeConfig {
    ServeConfig {
        served: Served::Root(root.to_path_buf()),
        listen,
        tokens: None,
        tls: None,
        plain_http: false,
        limits: Limits::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_self_signed_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let (root, tokens) = make_root(&dir);
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    let mut config = config(&root, Listen::Tcp("127.0.0.1:0".parse().unwrap()));
    config.tls = Some((cert.clone(), key));
    config.limits.header_timeout = Duration::from_millis(600);
    let server = Server::bind(config).await.unwrap();
    let addr = server.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    let http = reqwest::Client::builder()
        .no_proxy()
        .tls_certs_only([reqwest::Certificate::from_pem(certified.cert.pem().as_bytes()).unwrap()])
        .resolve("localhost", addr)
        .build()
        .unwrap();
    let sent = http
        .post(format!(
            "https://localhost:{}/v1/sessions/alpha/messages",
            addr.port()
        ))
        .bearer_auth(&tokens.alpha)
        .json(&json!({"text": "over TLS"}))
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 201);
    let sent: Value = sent.json().await.unwrap();
    assert_eq!(sent["seq"], 2);
    // Plain HTTP on the TLS port gets no answer.
    let mut plain = tokio::net::TcpStream::connect(addr).await.unwrap();
    plain
        .write_all(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut answer)).await;
    assert!(!String::from_utf8_lossy(&answer).contains("healthy"));
    // A client that never starts its handshake is closed by the header timeout.
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let started = std::time::Instant::now();
    let mut byte = [0u8; 1];
    let ended = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut byte)).await;
    assert!(matches!(ended, Ok(Ok(0)) | Ok(Err(_))), "{ended:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    // A client that does not trust the certificate is refused by its own TLS.
    let untrusting = reqwest::Client::builder()
        .no_proxy()
        .resolve("localhost", addr)
        .build()
        .unwrap();
    let refused = untrusting
        .get(format!("https://localhost:{}/v1/health", addr.port()))
        .send()
        .await;
    assert!(refused.is_err());
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unix_socket_is_0600_and_asks_no_token() {
    let dir = tempfile::tempdir().unwrap();
    let (root, _tokens) = make_root(&dir);
    let socket = dir.path().join("api.sock");
    let server = Server::bind(config(&root, Listen::Unix(socket.clone())))
        .await
        .unwrap();
    let mode = std::fs::symlink_metadata(&socket)
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    // A second server on the same socket is refused while the first answers.
    let second = Server::bind(config(&root, Listen::Unix(socket.clone()))).await;
    let err = format!("{:#}", second.err().unwrap());
    assert!(err.contains("another server answers"), "{err}");

    let mut conn = tokio::net::UnixStream::connect(&socket).await.unwrap();
    let body = r#"{"text":"over the socket"}"#;
    let request = format!(
        "POST /v1/sessions/beta/messages HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    let db = schema::SessionDb::open(root.join("beta/session.db")).unwrap();
    assert_eq!(db.max_seq().unwrap(), 2);
    let _ = stop.send(());
    task.await.unwrap().unwrap();
    assert!(!socket.exists(), "the socket file is removed at shutdown");

    // A stale socket file (nothing answers) is replaced.
    let stale = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    drop(stale);
    let again = Server::bind(config(&root, Listen::Unix(socket.clone()))).await;
    assert!(again.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsafe_configurations_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let (root, _tokens) = make_root(&dir);
    let refuse = |config: ServeConfig| async move {
        match Server::bind(config).await {
            Ok(_) => panic!("bound"),
            Err(err) => format!("{err:#}"),
        }
    };
    let err = refuse(config(&root, Listen::Tcp("0.0.0.0:0".parse().unwrap()))).await;
    assert!(
        err.contains("refusing plain HTTP") && err.contains("--plain-http"),
        "{err}"
    );

    let mut inside = config(&root, Listen::Tcp("127.0.0.1:0".parse().unwrap()));
    std::fs::copy(root.join("tokens.json"), root.join("alpha/tokens.json")).unwrap();
    inside.tokens = Some(root.join("alpha/tokens.json"));
    let err = refuse(inside).await;
    assert!(err.contains("inside a served session folder"), "{err}");

    let workspace = ServeConfig {
        served: Served::Workspace {
            name: "alpha".into(),
            dir: root.join("alpha"),
        },
        ..config(&root, Listen::Tcp("127.0.0.1:0".parse().unwrap()))
    };
    let err = refuse(workspace).await;
    assert!(err.contains("needs --tokens"), "{err}");

    let mut link = config(&root, Listen::Tcp("127.0.0.1:0".parse().unwrap()));
    std::os::unix::fs::symlink(root.join("tokens.json"), dir.path().join("link.json")).unwrap();
    link.tokens = Some(dir.path().join("link.json"));
    let err = refuse(link).await;
    assert!(err.contains("symlink"), "{err}");

    let mut missing = config(&root, Listen::Tcp("127.0.0.1:0".parse().unwrap()));
    missing.tokens = Some(dir.path().join("none.json"));
    let err = refuse(missing).await;
    assert!(err.contains("nanoclaw token add"), "{err}");
}
