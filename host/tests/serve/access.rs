//! Tokens: absent, unknown, scoped, read-only and revoked ones are refused, and the DB is left
//! as it was by each refused request.

use host::serve::tokens::TokenFile;
use host::serve::Limits;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::serve::support::{client, db_state, make_root, TestServer};

async fn code(response: reqwest::Response) -> (StatusCode, String) {
    let status = response.status();
    let body: Value = response.json().await.unwrap();
    (
        status,
        body["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_scoped_read_only_and_revocable_without_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (root, tokens) = make_root(&dir);
    let server = TestServer::start(&root, Limits::default()).await;
    let http = client();
    let alpha = server.db("alpha");
    let beta = server.db("beta");
    let before = (db_state(&alpha), db_state(&beta));
    let send = |session: &str| {
        http.post(server.at(&format!("/v1/sessions/{session}/messages")))
            .json(&json!({"text": "hi"}))
    };

    // No token, a wrong one, a malformed header.
    let absent = send("alpha").send().await.unwrap();
    assert_eq!(absent.headers().get("www-authenticate").unwrap(), "Bearer");
    assert_eq!(
        code(absent).await,
        (StatusCode::UNAUTHORIZED, "unauthorized".into())
    );
    let unknown = send("alpha")
        .bearer_auth("ncl_not-a-token")
        .send()
        .await
        .unwrap();
    assert_eq!(
        code(unknown).await,
        (StatusCode::UNAUTHORIZED, "unauthorized".into())
    );
    let basic = send("alpha")
        .basic_auth("u", Some("p"))
        .send()
        .await
        .unwrap();
    assert_eq!(code(basic).await.0, StatusCode::UNAUTHORIZED);
    // The list needs a token too; health does not.
    let list = http.get(server.at("/v1/sessions")).send().await.unwrap();
    assert_eq!(list.status(), StatusCode::UNAUTHORIZED);

    // Scoped to alpha: beta does not exist for it, exactly as a missing session.
    let other = send("beta")
        .bearer_auth(&tokens.alpha)
        .send()
        .await
        .unwrap();
    let other_status = other.status();
    let other_body: Value = other.json().await.unwrap();
    let missing = send("nosuch")
        .bearer_auth(&tokens.alpha)
        .send()
        .await
        .unwrap();
    assert_eq!(other_status, StatusCode::NOT_FOUND);
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    let missing_body: Value = missing.json().await.unwrap();
    assert_eq!(other_body["error"]["code"], missing_body["error"]["code"]);
    let status = http
        .get(server.at("/v1/sessions/beta"))
        .bearer_auth(&tokens.alpha)
        .send()
        .await
        .unwrap();
    assert_eq!(status.status(), StatusCode::NOT_FOUND);
    let list: Value = http
        .get(server.at("/v1/sessions"))
        .bearer_auth(&tokens.alpha)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let names: Vec<&str> = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["alpha"]);
    // A scoped token may not create sessions.
    let init = http
        .post(server.at("/v1/sessions"))
        .bearer_auth(&tokens.alpha)
        .json(&json!({"name": "delta"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        code(init).await,
        (StatusCode::FORBIDDEN, "forbidden".into())
    );
    assert!(!root.join("delta").exists());

    // Read-only: reads work, every write is 403.
    let read = http
        .get(server.at("/v1/sessions/alpha"))
        .bearer_auth(&tokens.reader)
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), StatusCode::OK);
    let refused = send("alpha")
        .bearer_auth(&tokens.reader)
        .send()
        .await
        .unwrap();
    assert_eq!(
        code(refused).await,
        (StatusCode::FORBIDDEN, "forbidden".into())
    );
    for path in ["interrupt", "sweep"] {
        let refused = http
            .post(server.at(&format!("/v1/sessions/alpha/{path}")))
            .bearer_auth(&tokens.reader)
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(code(refused).await.0, StatusCode::FORBIDDEN, "{path}");
    }
    let answer = http
        .post(server.at("/v1/sessions/alpha/answers"))
        .bearer_auth(&tokens.reader)
        .json(&json!({"questionId": "q", "option": "a", "force": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(code(answer).await.0, StatusCode::FORBIDDEN);

    assert_eq!(
        (db_state(&alpha), db_state(&beta)),
        before,
        "a refused request wrote"
    );

    // The scoped token works on its session; then it is revoked and refused at the next
    // request, without a restart.
    let sent = send("alpha")
        .bearer_auth(&tokens.alpha)
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), StatusCode::CREATED);
    let after_send = db_state(&alpha);
    let path = root.join("tokens.json");
    let mut file = TokenFile::load(&path).unwrap();
    file.tokens.retain(|t| t.name != "alpha-rw");
    file.save(&path).unwrap();
    let revoked = send("alpha")
        .bearer_auth(&tokens.alpha)
        .send()
        .await
        .unwrap();
    assert_eq!(
        code(revoked).await,
        (StatusCode::UNAUTHORIZED, "unauthorized".into())
    );
    assert_eq!(db_state(&alpha), after_send);
    // The others still work.
    let admin = send("alpha")
        .bearer_auth(&tokens.admin)
        .send()
        .await
        .unwrap();
    assert_eq!(admin.status(), StatusCode::CREATED);

    // A token file made group-writable lets nobody in until fixed.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o664)).unwrap();
    let refused = send("alpha")
        .bearer_auth(&tokens.admin)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let back = send("alpha")
        .bearer_auth(&tokens.admin)
        .send()
        .await
        .unwrap();
    assert_eq!(back.status(), StatusCode::CREATED);

    server.stop().await;
}

#[test]
fn the_token_cli_adds_lists_and_revokes_storing_only_hashes() {
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_nanoclaw");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(bin)
            .args(args)
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let root = dir.path().to_str().unwrap();
    let (ok, token, err) = run(&["token", "add", "ci", "--sessions", "a,b", "--root", root]);
    assert!(ok, "{err}");
    let token = token.trim();
    assert!(token.starts_with("ncl_") && token.len() == 47, "{token}");
    let file = std::fs::read_to_string(dir.path().join("tokens.json")).unwrap();
    assert!(!file.contains(token));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.path().join("tokens.json"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let (ok, _, err) = run(&["token", "add", "ci", "--sessions", "*", "--root", root]);
    assert!(!ok);
    assert!(err.contains("exists"), "{err}");
    let (ok, _, err) = run(&["token", "add", "x", "--sessions", "../etc", "--root", root]);
    assert!(!ok);
    assert!(err.contains("not a session name"), "{err}");
    let (ok, _, _) = run(&[
        "token",
        "add",
        "viewer",
        "--sessions",
        "*",
        "--read-only",
        "--root",
        root,
    ]);
    assert!(ok);
    let (ok, list, _) = run(&["token", "list", "--root", root]);
    assert!(ok);
    let list: String = list
        .lines()
        .map(|line| line.split(" created=").next().unwrap().to_owned() + "\n")
        .collect();
    expect_test::expect![[r#"
        ci sessions=a,b read-write
        viewer sessions=* read-only
    "#]]
    .assert_eq(&list);
    let (ok, out, _) = run(&["token", "revoke", "ci", "--root", root]);
    assert!(ok);
    assert_eq!(out, "revoked ci\n");
    let (ok, list, _) = run(&["token", "list", "--root", root]);
    assert!(ok);
    assert!(!list.contains("ci "), "{list}");
    let (ok, _, err) = run(&["token", "revoke", "ci", "--root", root]);
    assert!(!ok);
    assert!(err.contains("no token named"), "{err}");
}
