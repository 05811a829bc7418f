//! End-to-end acceptance of issue 6 (media, system prompt, extra directories) for each CLI: the
//! real `agent-runner` binary drives the real pinned CLI against the fake model server, inside a
//! loopback-only network namespace when the machine allows it.
//!
//! Three scenarios, each a function taking the provider name, with one `#[test]` per provider:
//! - [`media_attachments`]: a chat message with a real tiny PNG and a real tiny PDF (base64
//!   `data`) → both saved under `downloads/<messageId>/`, the prompt names them
//!   (`[file available at: …]`), Claude gets native `image` + `document` blocks, Codex a local
//!   image input (`input_image`), OpenCode the path lines only;
//! - [`system_prompt_survives_resume_and_tracks_destinations`]: global + group `CLAUDE.md`, an
//!   `@import`ed file and the runner addendum are in the first request, again in the first
//!   request after a runner restart (resumed session), and a destination the host adds mid-session
//!   shows up in the next turn's request;
//! - [`extra_dir_file_is_readable`]: a file under `extra/notes/` (an additional directory given to
//!   the CLI) read with the CLI's own tool; its text comes back in the next request.
//!
//! Adding a provider: one arm in each `match provider` below ([`read_file_step`],
//! [`assert_native_media`]) and one `#[test]` per scenario (the CLI lookup is shared:
//! `e2e::harness::CLI_ENV_VARS`).
//!
//! Needs `cargo build --workspace --bins` and the CLIs (`scripts/install-clis.sh`); a missing CLI
//! fails the tests unless `NANOCLAW_SKIP_CLI_TESTS=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use e2e::fake_model::{FakeModel, LoggedRequest, Step};
use e2e::harness::{start_cli_test as start, test_routing, text_of, Session};
use schema::{Destination, NewMessageIn};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Per-provider knowledge
// ---------------------------------------------------------------------------------------------

/// A model step that makes the CLI read `path` with its own builtin tool.
fn read_file_step(provider: &str, path: &Path) -> Step {
    match provider {
        "claude" => Step::raw_tool_call("Read", json!({"file_path": path.display().to_string()})),
        // No namespace: exec_command is a builtin (see e2e_codex.rs).
        "codex" => Step::raw_tool_call(
            "exec_command",
            json!({"cmd": format!("cat '{}'", path.display())}),
        ),
        // OpenCode's builtin file reader (its tools carry no prefix; MCP tools are
        // `nanoclaw_<tool>`).
        "opencode" => Step::raw_tool_call("read", json!({"filePath": path.display().to_string()})),
        other => panic!("no read tool known for provider {other}: add it to read_file_step"),
    }
}

/// Checks how the model received the PNG and the PDF natively (beside the path lines, which
/// every provider has).
fn assert_native_media(provider: &str, request: &LoggedRequest, png: &[u8], pdf: &[u8]) {
    match provider {
        "claude" => {
            let blocks = last_user_blocks(request, "messages");
            let has = |ty: &str, mime: &str, bytes: &[u8]| {
                blocks.iter().any(|b| {
                    b["type"] == ty
                        && b["source"]["type"] == "base64"
                        && b["source"]["media_type"] == mime
                        && b["source"]["data"] == base64(bytes)
                })
            };
            assert!(
                has("image", "image/png", png),
                "no PNG image block: {blocks:#?}"
            );
            assert!(
                has("document", "application/pdf", pdf),
                "no PDF document block: {blocks:#?}"
            );
        }
        "codex" => {
            // The runner passes images as `localImage` inputs; Codex reads the file and sends
            // it as an `input_image` data URL. PDFs are referenced by path only.
            let blocks = last_user_blocks(request, "input");
            let images: Vec<&str> = blocks
                .iter()
                .filter(|b| b["type"] == "input_image")
                .filter_map(|b| b["image_url"].as_str())
                .collect();
            assert_eq!(
                images,
                [format!("data:image/png;base64,{}", base64(png))],
                "one local image input, the PNG's bytes: {blocks:#?}"
            );
        }
        "opencode" => {
            // The provider posts text parts only: OpenCode gets the path lines (checked by the
            // caller) and reads the files with its own tools when it needs them. Should image
            // parts ever be sent, they must carry the PNG's bytes.
            let blocks = last_user_blocks(request, "messages");
            let images: Vec<&str> = blocks
                .iter()
                .filter(|b| b["type"] == "image_url")
                .filter_map(|b| b["image_url"]["url"].as_str())
                .collect();
            let png_url = format!("data:image/png;base64,{}", base64(png));
            assert!(
                images.iter().all(|url| *url == png_url),
                "image parts other than the PNG: {blocks:#?}"
            );
            let _ = pdf;
        }
        other => panic!("no media expectations for provider {other}: add them here"),
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// The content blocks of the last user message (`messages` for Anthropic/Chat, `input` items
/// for Responses) that is not a tool result.
fn last_user_blocks(request: &LoggedRequest, key: &str) -> Vec<Value> {
    request.body[key]
        .as_array()
        .into_iter()
        .flatten()
        .rev()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_array())
        .find(|blocks| !blocks.iter().any(|b| b["type"] == "tool_result"))
        .cloned()
        .unwrap_or_default()
}

/// Standard base64 with padding.
fn base64(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn adler32(bytes: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for &byte in bytes {
        a = (a + u32::from(byte)) % 65_521;
        b = (b + a) % 65_521;
    }
    (b << 16) | a
}

/// A valid 2×2 RGB PNG (red, green / blue, white): signature, IHDR, one IDAT holding a zlib
/// stream with a single stored block, IEND.
fn tiny_png() -> Vec<u8> {
    fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
        out.extend_from_slice(&u32::try_from(data.len()).unwrap().to_be_bytes());
        let mut body = kind.to_vec();
        body.extend_from_slice(data);
        out.extend_from_slice(&body);
        out.extend_from_slice(&crc32(&body).to_be_bytes());
    }
    let (width, height) = (2u32, 2u32);
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&width.to_be_bytes());
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8-bit RGB, deflate, no filter, no interlace
    let raw: Vec<u8> = [
        [0u8, 255, 0, 0, 0, 255, 0],     // filter 0, red, green
        [0u8, 0, 0, 255, 255, 255, 255], // filter 0, blue, white
    ]
    .concat();
    let len = u16::try_from(raw.len()).unwrap();
    let mut zlib = vec![0x78, 0x01, 0x01]; // zlib header; final stored block
    zlib.extend_from_slice(&len.to_le_bytes());
    zlib.extend_from_slice(&(!len).to_le_bytes());
    zlib.extend_from_slice(&raw);
    zlib.extend_from_slice(&adler32(&raw).to_be_bytes());
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    chunk(&mut png, b"IHDR", &ihdr);
    chunk(&mut png, b"IDAT", &zlib);
    chunk(&mut png, b"IEND", &[]);
    png
}

/// A valid one-page PDF showing `text`, with a correct cross-reference table.
fn tiny_pdf(text: &str) -> Vec<u8> {
    let stream = format!("BT /F1 12 Tf 20 50 Td ({text}) Tj ET");
    let objects = [
        "<< /Type /Catalog /Pages 2 0 R >>".to_owned(),
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>".to_owned(),
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 100] /Contents 4 0 R \
         /Resources << /Font << /F1 5 0 R >> >> >>"
            .to_owned(),
        format!(
            "<< /Length {} >>\nstream\n{stream}\nendstream",
            stream.len()
        ),
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>".to_owned(),
    ];
    let mut pdf = b"%PDF-1.4\n".to_vec();
    let mut offsets = Vec::new();
    for (i, object) in objects.iter().enumerate() {
        offsets.push(pdf.len());
        pdf.extend_from_slice(format!("{} 0 obj\n{object}\nendobj\n", i + 1).as_bytes());
    }
    let xref = pdf.len();
    let mut table = format!("xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1);
    for offset in offsets {
        table.push_str(&format!("{offset:010} 00000 n \n"));
    }
    table.push_str(&format!(
        "trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n",
        objects.len() + 1
    ));
    pdf.extend_from_slice(table.as_bytes());
    pdf
}

/// The workspace as the runner sees it (symlinks resolved: paths in prompts are canonical).
fn canonical_workspace(session: &Session) -> PathBuf {
    session.workspace.canonicalize().unwrap()
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A request's whole text (system and user) for "is it anywhere" checks.
fn all_text(request: &LoggedRequest) -> String {
    format!(
        "{}\n{}",
        request.system_text(),
        request.user_texts().join("\n")
    )
}

// ---------------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------------

/// A PNG and a PDF attached as base64 `data` are saved under `downloads/<messageId>/`, named in
/// the prompt, and reach the model natively where the provider supports it.
fn media_attachments(provider: &str) {
    let started = Instant::now();
    let png = tiny_png();
    let pdf = tiny_pdf("PDF-MARKER-4417");
    let model = FakeModel::start_with_script([Step::text("Got a picture and a PDF.")]).unwrap();
    let mut session = Session::new();
    session.start_runner(provider, &model, &[]);
    let mut row = NewMessageIn::new(
        "chat",
        json!({
            "sender": "Ann", "senderId": "u-ann", "text": "what are these?",
            "attachments": [
                {"type": "image", "name": "pixel.png", "mimeType": "image/png", "data": base64(&png)},
                {"type": "file", "name": "report.pdf", "mimeType": "application/pdf", "data": base64(&pdf)},
            ]
        })
        .to_string(),
    );
    row.routing = test_routing();
    let id = session.insert(row).id;
    let reply = session.wait_reply(&id, WAIT);
    session.wait_completed(&id, WAIT);
    assert_eq!(text_of(&reply), "Got a picture and a PDF.");

    let dir = canonical_workspace(&session).join("downloads").join(&id);
    let png_path = dir.join("pixel.png");
    let pdf_path = dir.join("report.pdf");
    assert_eq!(std::fs::read(&png_path).unwrap(), png, "the PNG on disk");
    assert_eq!(std::fs::read(&pdf_path).unwrap(), pdf, "the PDF on disk");

    let requests = model.model_requests();
    assert_eq!(requests.len(), 1, "one model turn");
    let request = &requests[0];
    let prompt = request.user_texts().join("\n");
    for path in [&png_path, &pdf_path] {
        let line = format!("[file available at: {}]", path.display());
        assert!(prompt.contains(&line), "{line} missing from:\n{prompt}");
    }
    assert!(prompt.contains("what are these?"), "{prompt}");
    assert_native_media(provider, request, &png, &pdf);
    session.stop_runner();
    eprintln!("[{provider}] media_attachments: {:.1?}", started.elapsed());
}

/// Global + group CLAUDE.md, an `@import`ed file and the runner addendum reach the model on the
/// first request, again on the first request after a restart (a resumed session), and a
/// destination added by the host between two messages is in the next turn's request.
fn system_prompt_survives_resume_and_tracks_destinations(provider: &str) {
    let started = Instant::now();
    let model = FakeModel::start_with_script([
        Step::text("First."),
        Step::text("Second."),
        Step::text("Third."),
    ])
    .unwrap();
    let mut session = Session::new();
    let ws = session.workspace.clone();
    write(
        &ws.join("global/CLAUDE.md"),
        "# Global\nGLOBAL-MARKER-1187: be kind.\n",
    );
    write(
        &ws.join("agent/CLAUDE.md"),
        "# Group\nGROUP-MARKER-2291: this is the design team.\n@notes/style.md\n",
    );
    write(
        &ws.join("agent/notes/style.md"),
        "IMPORTED-STYLE-MARKER-3305: answer in haiku.\n",
    );
    let env = [("NANOCLAW_ASSISTANT_NAME", "Pixie-Bot")];
    let expected = [
        "GLOBAL-MARKER-1187",
        "GROUP-MARKER-2291",
        "IMPORTED-STYLE-MARKER-3305",
        "You are Pixie-Bot.",
        "- `send_message`: send a chat message now",
        "- `schedule_task`:",
    ];
    let check = |request: &LoggedRequest, when: &str| {
        let system = request.system_text();
        for marker in expected {
            assert!(
                system.contains(marker),
                "{when}: {marker:?} missing from the system text:\n{system}"
            );
        }
        assert!(
            !system.contains("@notes/style.md"),
            "{when}: the import line is replaced:\n{system}"
        );
    };

    session.start_runner(provider, &model, &env);
    let first = session.send_chat("hello FIRST-MESSAGE").id;
    session.wait_reply(&first, WAIT);
    session.wait_completed(&first, WAIT);
    let requests = model.model_requests();
    assert_eq!(requests.len(), 1);
    check(&requests[0], "first request");
    let body = requests[0].body.to_string();
    assert_eq!(
        body.matches("GROUP-MARKER-2291").count(),
        1,
        "the group CLAUDE.md reaches the model once (the CLI does not load it a second time)"
    );
    assert!(!requests[0].system_text().contains("ops-room"));

    // Restart: the first request of the new runner (a resumed session) carries it all again.
    session.stop_runner();
    session.start_runner(provider, &model, &env);
    let second = session.send_chat("hello SECOND-MESSAGE").id;
    session.wait_reply(&second, WAIT);
    session.wait_completed(&second, WAIT);
    let requests = model.model_requests();
    assert_eq!(requests.len(), 2);
    let resumed = &requests[1];
    check(resumed, "first request after the restart");
    let texts = resumed.user_texts().join("\n");
    assert!(
        texts.contains("FIRST-MESSAGE") && texts.contains("SECOND-MESSAGE"),
        "the session was resumed (history kept): {texts}"
    );

    // The host adds a destination mid-session: the next turn's request lists it.
    session
        .db
        .upsert_destination(&Destination {
            name: "ops-room".into(),
            display_name: Some("Ops Room".into()),
            kind: "channel".into(),
            channel_type: Some("slack".into()),
            platform_id: Some("C-ops".into()),
            agent_group_id: None,
        })
        .unwrap();
    let third = session.send_chat("hello THIRD-MESSAGE").id;
    session.wait_reply(&third, WAIT);
    session.wait_completed(&third, WAIT);
    let requests = model.model_requests();
    assert_eq!(requests.len(), 3);
    let system = requests[2].system_text();
    assert!(
        system.contains("| `ops-room` | Ops Room | channel |"),
        "the new destination is in the next turn's request:\n{system}"
    );
    check(&requests[2], "the turn after the destination was added");
    assert!(
        requests[2]
            .last_user_text()
            .unwrap()
            .contains("THIRD-MESSAGE"),
        "{:?}",
        requests[2].last_user_text()
    );
    session.stop_runner();
    eprintln!(
        "[{provider}] system_prompt_survives_resume_and_tracks_destinations: {:.1?}",
        started.elapsed()
    );
}

/// A file in `extra/notes/` (an additional directory, present before the runner starts) is read
/// through the CLI's own tool and its text comes back to the model.
fn extra_dir_file_is_readable(provider: &str) {
    let started = Instant::now();
    let mut session = Session::new();
    let secret = canonical_workspace(&session).join("extra/notes/secret-plan.txt");
    write(&secret, "EXTRA-NOTES-MARKER-5521: launch on Tuesday.\n");
    let model = FakeModel::start_with_script([
        read_file_step(provider, &secret),
        Step::text("The plan says Tuesday."),
    ])
    .unwrap();
    session.start_runner(provider, &model, &[]);
    let id = session.send_chat("what does the secret plan say?").id;
    model.wait_for_model_requests(1, WAIT).unwrap();
    let notes_dir = secret.parent().unwrap().display().to_string();
    let first = &model.model_requests()[0];
    assert!(
        all_text(first).contains(&notes_dir),
        "the CLI was given {notes_dir} as an additional directory (it tells the model):\n{}",
        all_text(first)
    );
    let reply = session.wait_reply(&id, WAIT);
    session.wait_completed(&id, WAIT);
    assert_eq!(text_of(&reply), "The plan says Tuesday.");
    let requests = model.model_requests();
    assert_eq!(requests.len(), 2, "the tool call, then the answer");
    let request = &requests[1];
    assert!(request.tail_is_tool_result(), "{}", request.summary());
    let results = request.tool_results().join("\n");
    assert!(
        results.contains("EXTRA-NOTES-MARKER-5521"),
        "the file's text came back: {results}\n--- all text ---\n{}",
        all_text(request)
    );
    session.stop_runner();
    eprintln!(
        "[{provider}] extra_dir_file_is_readable: {:.1?}",
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// Tests: one per provider and scenario
// ---------------------------------------------------------------------------------------------

#[test]
fn claude_media_attachments() {
    if start("claude", "claude_media_attachments") {
        media_attachments("claude");
    }
}

#[test]
fn codex_media_attachments() {
    if start("codex", "codex_media_attachments") {
        media_attachments("codex");
    }
}

#[test]
fn opencode_media_attachments() {
    if start("opencode", "opencode_media_attachments") {
        media_attachments("opencode");
    }
}

#[test]
fn claude_system_prompt_survives_resume_and_tracks_destinations() {
    if start(
        "claude",
        "claude_system_prompt_survives_resume_and_tracks_destinations",
    ) {
        system_prompt_survives_resume_and_tracks_destinations("claude");
    }
}

#[test]
fn codex_system_prompt_survives_resume_and_tracks_destinations() {
    if start(
        "codex",
        "codex_system_prompt_survives_resume_and_tracks_destinations",
    ) {
        system_prompt_survives_resume_and_tracks_destinations("codex");
    }
}

#[test]
fn opencode_system_prompt_survives_resume_and_tracks_destinations() {
    if start(
        "opencode",
        "opencode_system_prompt_survives_resume_and_tracks_destinations",
    ) {
        system_prompt_survives_resume_and_tracks_destinations("opencode");
    }
}

#[test]
fn claude_extra_dir_file_is_readable() {
    if start("claude", "claude_extra_dir_file_is_readable") {
        extra_dir_file_is_readable("claude");
    }
}

#[test]
fn codex_extra_dir_file_is_readable() {
    if start("codex", "codex_extra_dir_file_is_readable") {
        extra_dir_file_is_readable("codex");
    }
}

#[test]
fn opencode_extra_dir_file_is_readable() {
    if start("opencode", "opencode_extra_dir_file_is_readable") {
        extra_dir_file_is_readable("opencode");
    }
}
