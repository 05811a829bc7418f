//! docs/contract/api.md's examples, run as written (the port replaced by a free one), and the
//! OpenAPI document checked against the routes the server really serves.

use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use host::serve::Limits;
use serde_json::Value;

use crate::serve::support::{agent_reply, client, make_root, TestServer};

/// The ```sh blocks of the `## Examples` section of api.md.
fn example_blocks() -> Vec<String> {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/contract/api.md"
    ))
    .unwrap();
    let section = doc
        .split("## Examples")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("api.md has an Examples section");
    section
        .split("```sh\n")
        .skip(1)
        .map(|block| block.split("```").next().unwrap().to_owned())
        .collect()
}

/// Commands of a block: lines joined at a trailing backslash.
fn commands(block: &str) -> Vec<String> {
    block
        .replace("\\\n", " ")
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(str::to_owned)
        .collect()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn the_documented_curl_examples_run_as_written() {
    let blocks = example_blocks();
    assert_eq!(blocks.len(), 2, "a setup block and an examples block");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let port = free_port();
    let here = |text: &str| text.replace("127.0.0.1:7450", &format!("127.0.0.1:{port}"));
    let ready = dir.path().join("rows-written");
    let examples = commands(&blocks[1]);
    assert!(examples.len() >= 13, "{examples:?}");
    let mut script = String::from("set -u\n");
    script.push_str(&here(&blocks[0]));
    script.push_str(&format!(
        "for i in $(seq 100); do curl -s http://127.0.0.1:{port}/v1/health >/dev/null && break; sleep 0.1; done\n\
         while [ ! -e '{}' ]; do sleep 0.05; done\n",
        ready.display()
    ));
    for command in &examples {
        script.push_str("echo '@@@'\n");
        script.push_str(&here(command));
        script.push_str("\necho\n");
    }
    script.push_str("kill $!\nwait\n");
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_nanoclaw"))
        .parent()
        .unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let child = std::process::Command::new("bash")
        .arg("-c")
        .arg(&script)
        .env("ROOT", &root)
        .env("PATH", path)
        .env_remove("RUST_LOG")
        .env("TZ", "UTC")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let pgid = child.id();
    // The agent's side: a reply (seq 1) and a question q1, once the session exists.
    let db_path = root.join("main/session.db");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !db_path.exists() {
        assert!(Instant::now() < deadline, "nanoclaw init did not run");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    let db = schema::SessionDb::open(&db_path).unwrap();
    assert_eq!(agent_reply(&db, "hi"), 1);
    db.insert_out(&schema::NewMessageOut::new(
        schema::OutKind::ChatSdk,
        schema::Routing::default(),
        &serde_json::json!({"operation": "ask_question", "questionId": "q1", "question": "Go?",
                            "options": [{"label": "Yes", "value": "yes"}]}),
    ))
    .unwrap();
    std::fs::write(&ready, "").unwrap();
    let output = child.wait_with_output();
    // The whole group, by its id, whatever the script left.
    // SAFETY: a plain kill(2) of the process group this test started.
    unsafe {
        libc::kill(-(pgid as i32), libc::SIGKILL);
    }
    let output = output.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let answers: Vec<&str> = stdout.split("@@@\n").skip(1).collect();
    assert_eq!(
        answers.len(),
        examples.len(),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    for (command, answer) in examples.iter().zip(&answers) {
        let answer = answer.trim();
        if command.contains("/events") {
            assert!(
                answer.contains("event: message\nid: 1\n"),
                "{command}: {answer}"
            );
            assert!(answer.contains("event: status"), "{command}: {answer}");
            continue;
        }
        let json: Value = serde_json::from_str(answer).unwrap_or_else(|err| {
            panic!("{command}: not JSON ({err}): {answer}\nstderr: {stderr}")
        });
        assert!(json.get("error").is_none(), "{command}: {answer}");
    }
    // What they wrote.
    assert!(root.join("team/session.db").is_file());
    let tokens = std::fs::read_to_string(root.join("tokens.json")).unwrap();
    assert!(tokens.contains("\"ops\""));
    let record = db
        .delivered(&db.message_out_by_seq(1).unwrap().unwrap().id)
        .unwrap()
        .unwrap();
    assert_eq!(record.platform_message_id.as_deref(), Some("1712.0042"));
    // Two sends, one answer, one interrupt.
    assert_eq!(db.max_seq().unwrap(), 10);
}

/// Every (method, path) the OpenAPI document names.
fn documented(doc: &Value) -> BTreeSet<(String, String)> {
    doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .map(move |method| (method.to_uppercase(), path.clone()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_and_the_routes_agree() {
    let dir = tempfile::tempdir().unwrap();
    let (root, tokens) = make_root(&dir);
    let server = TestServer::start(&root, Limits::default()).await;
    let http = client();
    let served: Value = http
        .get(server.at("/v1/openapi.json"))
        .bearer_auth(&tokens.admin)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(served, host::serve::openapi_json());
    assert!(served["openapi"].as_str().unwrap().starts_with("3.1"));
    let routes = documented(&served);
    let table: BTreeSet<(String, String)> = [
        ("GET", "/v1/health"),
        ("GET", "/v1/openapi.json"),
        ("GET", "/v1/sessions"),
        ("POST", "/v1/sessions"),
        ("GET", "/v1/sessions/{name}"),
        ("GET", "/v1/sessions/{name}/health"),
        ("POST", "/v1/sessions/{name}/messages"),
        ("GET", "/v1/sessions/{name}/events"),
        ("POST", "/v1/sessions/{name}/messages/{seq}/delivered"),
        ("POST", "/v1/sessions/{name}/answers"),
        ("POST", "/v1/sessions/{name}/interrupt"),
        ("GET", "/v1/sessions/{name}/usage"),
        ("POST", "/v1/sessions/{name}/sweep"),
    ]
    .iter()
    .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
    .collect();
    assert_eq!(routes, table, "the document is api.md's endpoint table");
    // Each documented path serves exactly its documented methods: any other method is 405,
    // a documented one is neither 404 (no route) nor 405.
    let paths: BTreeSet<&String> = routes.iter().map(|(_, p)| p).collect();
    for path in paths {
        let concrete = path.replace("{name}", "alpha").replace("{seq}", "1");
        for method in ["GET", "POST", "PUT", "PATCH", "DELETE"] {
            let request = http
                .request(method.parse().unwrap(), server.at(&concrete))
                .bearer_auth(&tokens.admin)
                .timeout(Duration::from_secs(2));
            let status = match request.send().await {
                Ok(response) => response.status().as_u16(),
                // The event stream answers and stays open: served.
                Err(err) if err.is_timeout() => 200,
                Err(err) => panic!("{method} {concrete}: {err}"),
            };
            let documented = routes.contains(&(method.to_owned(), path.clone()));
            if documented {
                assert!(
                    status != 404 && status != 405,
                    "{method} {concrete}: {status}"
                );
            } else {
                assert_eq!(
                    status, 405,
                    "{method} {concrete} is served but not documented"
                );
            }
        }
    }
    // A path the document does not name is no route.
    let none = http
        .get(server.at("/v1/sessions/alpha/secrets"))
        .bearer_auth(&tokens.admin)
        .send()
        .await
        .unwrap();
    assert_eq!(none.status(), 404);
    server.stop().await;
}
