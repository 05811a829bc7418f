use std::time::Instant;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use super::*;

const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0";

fn limits() -> MediaLimits {
    MediaLimits {
        max_bytes: 1000,
        timeout: Duration::from_millis(500),
        max_redirects: 3,
    }
}

fn data(name: &str, body: &[u8]) -> Attachment {
    Attachment {
        name: Some(name.to_owned()),
        data: Some(base64::engine::general_purpose::STANDARD.encode(body)),
        ..Attachment::default()
    }
}

fn url(url: String) -> Attachment {
    Attachment {
        url: Some(url),
        ..Attachment::default()
    }
}

fn local(path: &str) -> Attachment {
    Attachment {
        local_path: Some(path.to_owned()),
        ..Attachment::default()
    }
}

/// A workspace folder inside a scratch root, so tests can put files just outside it.
fn workspace() -> (tempfile::TempDir, PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let workspace = root.path().join("workspace");
    std::fs::create_dir(&workspace).unwrap();
    let workspace = std::fs::canonicalize(workspace).unwrap();
    (root, workspace)
}

async fn run(workspace: &Path, attachments: &[Attachment]) -> ResolvedAttachments {
    resolve("msg-1", attachments, workspace, &limits(), false).await
}

fn available(note: &AttachmentNote) -> PathBuf {
    match note {
        AttachmentNote::Available { path } => PathBuf::from(path),
        other => panic!("expected an available note, got {other:?}"),
    }
}

fn unavailable(note: &AttachmentNote) -> (&str, &str) {
    match note {
        AttachmentNote::Unavailable { name, reason } => (name, reason),
        other => panic!("expected an unavailable note, got {other:?}"),
    }
}

/// A loopback HTTP/1.1 server with fixed routes; it lives as long as the test's runtime.
async fn serve() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(handle(socket));
        }
    });
    format!("http://{addr}")
}

async fn handle(mut socket: TcpStream) {
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 16 * 1024 {
        match socket.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    let request = String::from_utf8_lossy(&request);
    let path = request.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let head = |status: &str, extra: &str| {
        format!("HTTP/1.1 {status}\r\nConnection: close\r\n{extra}\r\n").into_bytes()
    };
    // Write errors are expected: the client hangs up on purpose in several tests.
    let _ = match path.as_str() {
        "/hello.txt" => {
            let mut out = head("200 OK", "Content-Length: 11\r\n");
            out.extend_from_slice(b"hello world");
            socket.write_all(&out).await
        }
        "/image" => {
            let mut out = head(
                "200 OK",
                &format!(
                    "Content-Type: application/octet-stream\r\nContent-Length: {}\r\n",
                    PNG.len()
                ),
            );
            out.extend_from_slice(PNG);
            socket.write_all(&out).await
        }
        "/missing" => {
            let mut out = head("404 Not Found", "Content-Length: 9\r\n");
            out.extend_from_slice(b"not found");
            socket.write_all(&out).await
        }
        "/big" => {
            let mut out = head("200 OK", "Content-Length: 5000\r\n");
            out.extend_from_slice(&[b'x'; 5000]);
            socket.write_all(&out).await
        }
        "/big-unannounced" => {
            // No Content-Length: the body ends when the connection closes.
            let mut out = head("200 OK", "");
            out.extend_from_slice(&[b'x'; 5000]);
            socket.write_all(&out).await
        }
        "/slow" => {
            let mut out = head("200 OK", "Content-Length: 100\r\n");
            out.extend_from_slice(b"0123456789");
            let _ = socket.write_all(&out).await;
            tokio::time::sleep(Duration::from_secs(10)).await;
            Ok(())
        }
        "/redirect" => {
            socket
                .write_all(&head(
                    "302 Found",
                    "Location: /hello.txt\r\nContent-Length: 0\r\n",
                ))
                .await
        }
        loop_path if loop_path.starts_with("/loop/") => {
            let n: u32 = loop_path["/loop/".len()..].parse().unwrap_or(0);
            let location = format!("Location: /loop/{}\r\nContent-Length: 0\r\n", n + 1);
            socket.write_all(&head("302 Found", &location)).await
        }
        _ => {
            socket
                .write_all(&head("500 Oops", "Content-Length: 0\r\n"))
                .await
        }
    };
    let _ = socket.shutdown().await;
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test]
async fn url_attachment_is_saved_after_a_redirect() {
    let base = serve().await;
    let (_root, ws) = workspace();
    let resolved = run(
        &ws,
        &[
            url(format!("{base}/hello.txt")),
            url(format!("{base}/redirect")),
        ],
    )
    .await;
    let first = available(&resolved.notes[0]);
    assert_eq!(first, ws.join("downloads/msg-1/hello.txt"));
    assert_eq!(std::fs::read(&first).unwrap(), b"hello world");
    // The second is named after the URL it was asked for, and does not overwrite the first.
    let second = available(&resolved.notes[1]);
    assert_eq!(second, ws.join("downloads/msg-1/redirect"));
    assert_eq!(std::fs::read(&second).unwrap(), b"hello world");
    assert!(resolved.media.is_empty());
}

#[tokio::test]
async fn http_error_is_unavailable() {
    let base = serve().await;
    let (_root, ws) = workspace();
    let resolved = run(&ws, &[url(format!("{base}/missing"))]).await;
    let (name, reason) = unavailable(&resolved.notes[0]);
    assert_eq!(name, "missing");
    assert_eq!(reason, "download failed: HTTP 404 Not Found");
    assert!(files_in(&ws.join("downloads/msg-1")).is_empty());
}

#[tokio::test]
async fn oversized_bodies_are_refused_and_not_kept() {
    let base = serve().await;
    let (_root, ws) = workspace();
    let resolved = run(
        &ws,
        &[
            url(format!("{base}/big")),
            url(format!("{base}/big-unannounced")),
        ],
    )
    .await;
    let (_, announced) = unavailable(&resolved.notes[0]);
    assert_eq!(announced, "too large: 5000 bytes, the limit is 1000 bytes");
    let (_, streamed) = unavailable(&resolved.notes[1]);
    assert!(
        streamed.starts_with("too large: more than 1000 bytes received"),
        "{streamed}"
    );
    assert!(files_in(&ws.join("downloads/msg-1")).is_empty());
}

#[tokio::test]
async fn slow_body_times_out() {
    let base = serve().await;
    let (_root, ws) = workspace();
    let started = Instant::now();
    let resolved = run(&ws, &[url(format!("{base}/slow"))]).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    let (_, reason) = unavailable(&resolved.notes[0]);
    assert_eq!(reason, "download timed out after 500 ms");
    assert!(files_in(&ws.join("downloads/msg-1")).is_empty());
}

#[tokio::test]
async fn too_many_redirects() {
    let base = serve().await;
    let (_root, ws) = workspace();
    let resolved = run(&ws, &[url(format!("{base}/loop/0"))]).await;
    let (_, reason) = unavailable(&resolved.notes[0]);
    assert!(
        reason.contains("too many redirects (more than 3)"),
        "{reason}"
    );
    assert!(
        !reason.contains("127.0.0.1"),
        "the URL is left out: {reason}"
    );
}

#[tokio::test]
async fn other_schemes_and_bad_urls_are_refused() {
    let (_root, ws) = workspace();
    let resolved = run(
        &ws,
        &[
            url("ftp://127.0.0.1/file.txt".to_owned()),
            url("file:///etc/passwd".to_owned()),
            url("not a url".to_owned()),
        ],
    )
    .await;
    let (name, reason) = unavailable(&resolved.notes[0]);
    assert_eq!(name, "file.txt");
    assert!(reason.contains("only http and https"), "{reason}");
    let (name, reason) = unavailable(&resolved.notes[1]);
    assert_eq!(name, "passwd");
    assert!(reason.contains("only http and https"), "{reason}");
    let (_, reason) = unavailable(&resolved.notes[2]);
    assert!(reason.starts_with("invalid URL"), "{reason}");
}

#[tokio::test]
async fn path_tricks_in_names_and_message_ids_stay_in_downloads() {
    let (_root, ws) = workspace();
    let resolved = resolve(
        "../../escape",
        &[data("../../etc/passwd", b"root:x:0:0")],
        &ws,
        &limits(),
        false,
    )
    .await;
    let path = available(&resolved.notes[0]);
    assert_eq!(path, ws.join("downloads/escape/passwd"));
    assert_eq!(std::fs::read(path).unwrap(), b"root:x:0:0");
}

#[tokio::test]
async fn base64_forms_and_invalid_base64() {
    let (_root, ws) = workspace();
    let resolved = run(
        &ws,
        &[
            Attachment {
                name: Some("bad.bin".to_owned()),
                data: Some("this is not base64!".to_owned()),
                ..Attachment::default()
            },
            Attachment {
                name: Some("url.txt".to_owned()),
                data: Some("data:text/plain;base64,aGVs\nbG8".to_owned()),
                ..Attachment::default()
            },
            data("exact.bin", &[7u8; 1000]),
            Attachment {
                name: Some("big.bin".to_owned()),
                data: Some("A".repeat(4000)),
                ..Attachment::default()
            },
        ],
    )
    .await;
    let (name, reason) = unavailable(&resolved.notes[0]);
    assert_eq!(name, "bad.bin");
    assert!(reason.starts_with("invalid base64 data"), "{reason}");
    let path = available(&resolved.notes[1]);
    assert_eq!(std::fs::read(path).unwrap(), b"hello");
    let path = available(&resolved.notes[2]);
    assert_eq!(
        std::fs::read(path).unwrap().len(),
        1000,
        "the limit itself is allowed"
    );
    let (_, reason) = unavailable(&resolved.notes[3]);
    assert!(reason.starts_with("too large"), "{reason}");
}

#[tokio::test]
async fn local_paths_must_stay_in_the_workspace() {
    let (root, ws) = workspace();
    let secret = root.path().join("secret");
    std::fs::write(&secret, "top secret").unwrap();
    std::fs::create_dir(ws.join("agent")).unwrap();
    std::fs::write(ws.join("agent/notes.txt"), "fine").unwrap();
    std::os::unix::fs::symlink(&secret, ws.join("agent/link")).unwrap();
    let absolute_outside = secret.to_string_lossy().into_owned();
    let absolute_inside = ws.join("agent/notes.txt").to_string_lossy().into_owned();
    let resolved = run(
        &ws,
        &[
            local("agent/notes.txt"),
            local(&absolute_inside),
            local("../secret"),
            local(&absolute_outside),
            local("agent/link"),
            local("agent/missing.txt"),
            local("agent"),
        ],
    )
    .await;
    // Referenced in place, not copied.
    assert_eq!(available(&resolved.notes[0]), ws.join("agent/notes.txt"));
    assert_eq!(available(&resolved.notes[1]), ws.join("agent/notes.txt"));
    for (i, name) in [(2, "secret"), (3, "secret"), (4, "link")] {
        let (shown, reason) = unavailable(&resolved.notes[i]);
        assert_eq!(shown, name);
        assert!(reason.ends_with("is outside the workspace"), "{reason}");
    }
    let (_, reason) = unavailable(&resolved.notes[5]);
    assert!(reason.ends_with("does not exist"), "{reason}");
    let (_, reason) = unavailable(&resolved.notes[6]);
    assert!(reason.ends_with("is not a regular file"), "{reason}");
    assert!(!ws.join("downloads").exists(), "nothing is copied");
}

#[tokio::test]
async fn duplicate_names_do_not_overwrite() {
    let (_root, ws) = workspace();
    let resolved = run(
        &ws,
        &[
            data("name.txt", b"one"),
            data("name.txt", b"two"),
            data("dir/name.txt", b"three"),
        ],
    )
    .await;
    let dir = ws.join("downloads/msg-1");
    let paths: Vec<PathBuf> = resolved.notes.iter().map(available).collect();
    assert_eq!(
        paths,
        vec![
            dir.join("name.txt"),
            dir.join("name-1.txt"),
            dir.join("name-2.txt")
        ]
    );
    assert_eq!(std::fs::read(&paths[0]).unwrap(), b"one");
    assert_eq!(std::fs::read(&paths[2]).unwrap(), b"three");
}

#[tokio::test]
async fn images_are_detected_by_content() {
    let base = serve().await;
    let (_root, ws) = workspace();
    let resolved = run(
        &ws,
        &[
            // No name, no extension, a generic declared type: sniffed, named by type.
            Attachment {
                data: Some(base64::engine::general_purpose::STANDARD.encode(PNG)),
                mime_type: Some("application/octet-stream".to_owned()),
                ..Attachment::default()
            },
            url(format!("{base}/image")),
            // Claims to be an image but is text: available by path, no native block.
            Attachment {
                name: Some("fake.png".to_owned()),
                data: Some(base64::engine::general_purpose::STANDARD.encode(b"hello")),
                mime_type: Some("image/png".to_owned()),
                ..Attachment::default()
            },
            Attachment {
                name: Some("doc".to_owned()),
                data: Some(base64::engine::general_purpose::STANDARD.encode(b"%PDF-1.7\n")),
                mime_type: Some("application/pdf".to_owned()),
                ..Attachment::default()
            },
        ],
    )
    .await;
    let paths: Vec<PathBuf> = resolved.notes.iter().map(available).collect();
    assert_eq!(paths[0], ws.join("downloads/msg-1/attachment.png"));
    assert_eq!(paths[1], ws.join("downloads/msg-1/image.png"));
    assert_eq!(paths[3], ws.join("downloads/msg-1/doc.pdf"));
    assert_eq!(
        resolved.media,
        vec![
            MediaFile {
                path: paths[0].clone(),
                mime_type: "image/png".to_owned()
            },
            MediaFile {
                path: paths[1].clone(),
                mime_type: "image/png".to_owned()
            },
            MediaFile {
                path: paths[3].clone(),
                mime_type: "application/pdf".to_owned()
            },
        ]
    );
}

/// A nameless attachment is named by its MIME type (parameters and case ignored), else by
/// its `type` (any case), else by its magic bytes; a name's own extension always wins.
#[tokio::test]
async fn nameless_attachments_get_an_extension() {
    let base = serve().await;
    let (_root, ws) = workspace();
    let nameless = |mime_type: Option<&str>, kind: Option<&str>, body: &[u8]| Attachment {
        kind: kind.map(str::to_owned),
        mime_type: mime_type.map(str::to_owned),
        data: Some(base64::engine::general_purpose::STANDARD.encode(body)),
        ..Attachment::default()
    };
    let jpeg = b"\xFF\xD8\xFF\xE0\0\x10JFIF\0";
    let resolved = run(
        &ws,
        &[
            nameless(Some("text/plain; charset=utf-8"), None, b"hello"),
            nameless(Some("audio/ogg"), Some("file"), b"OggS\0\x02"),
            nameless(None, Some("VOICE"), b"OggS\0\x02"),
            nameless(None, Some("photo"), jpeg),
            nameless(None, Some("Sticker"), b"RIFF\0\0\0\0WEBPVP8 "),
            nameless(None, Some("animation"), b"\0\0\0\x18ftypmp42"),
            // An unknown declared type and kind: the magic bytes decide.
            nameless(Some("application/octet-stream"), Some("file"), PNG),
            // The MIME type comes before the kind, and the kind before the content.
            nameless(Some("Audio/OGG"), Some("photo"), PNG),
            nameless(None, Some("photo"), PNG),
            // Nothing to go by: no extension.
            nameless(None, None, b"just bytes"),
            Attachment {
                name: Some("notes".to_owned()),
                ..nameless(Some("text/plain"), None, b"hi")
            },
            Attachment {
                name: Some("clip.oga".to_owned()),
                ..nameless(Some("audio/ogg"), Some("voice"), b"OggS\0\x02")
            },
            // A download is named by its bytes too.
            url(format!("{base}/image")),
        ],
    )
    .await;
    let names: Vec<String> = resolved
        .notes
        .iter()
        .map(|note| {
            let path = available(note);
            assert_eq!(path.parent(), Some(ws.join("downloads/msg-1").as_path()));
            path.file_name().unwrap().to_string_lossy().into_owned()
        })
        .collect();
    assert_eq!(
        names,
        [
            "attachment.txt",
            "attachment.ogg",
            "attachment-1.ogg",
            "attachment.jpg",
            "attachment.webp",
            "attachment.mp4",
            "attachment.png",
            "attachment-2.ogg",
            "attachment-1.jpg",
            "attachment",
            "notes.txt",
            "clip.oga",
            "image.png",
        ]
    );
}

#[tokio::test]
async fn an_attachment_without_a_source_is_reported() {
    let (_root, ws) = workspace();
    let resolved = run(
        &ws,
        &[Attachment {
            name: Some("ghost.txt".to_owned()),
            data: Some(String::new()),
            ..Attachment::default()
        }],
    )
    .await;
    let (name, reason) = unavailable(&resolved.notes[0]);
    assert_eq!(name, "ghost.txt");
    assert_eq!(reason, "the attachment has no localPath, url or data");
}

#[test]
fn safe_file_names() {
    assert_eq!(safe_file_name("../../etc/passwd"), "passwd");
    assert_eq!(safe_file_name("..\\..\\boot.ini"), "boot.ini");
    assert_eq!(safe_file_name("dir/"), "dir");
    assert_eq!(safe_file_name(".."), "attachment");
    assert_eq!(safe_file_name(""), "attachment");
    assert_eq!(safe_file_name("  ...hidden  "), "hidden");
    assert_eq!(safe_file_name("a\u{0}b\nc\u{7f}.txt"), "abc.txt");
    assert_eq!(safe_file_name("photo\u{202E}gpj.exe"), "photogpj.exe");
    assert_eq!(safe_file_name("Résumé 2026.pdf"), "Résumé 2026.pdf");
    let long = format!("{}.tar.gz", "é".repeat(100));
    let short = safe_file_name(&long);
    assert!(short.len() <= MAX_NAME_BYTES, "{}", short.len());
    assert!(short.ends_with("é.gz"), "{short}");
    let no_extension = "x".repeat(300);
    assert_eq!(safe_file_name(&no_extension), "x".repeat(MAX_NAME_BYTES));
}

#[test]
fn percent_decoding_of_url_names() {
    assert_eq!(percent_decode("my%20file.pdf"), "my file.pdf");
    assert_eq!(percent_decode("100%"), "100%");
    assert_eq!(percent_decode("%zz%4"), "%zz%4");
}
