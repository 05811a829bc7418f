use std::path::{Path, PathBuf};
use std::time::Duration;

use procs::EnvPolicy;
use provider::{Decision, ElicitationMode, ProviderKind, ToolPolicy, ToolRule};
use serde_json::Value;

use super::fields::{check_range, parse_text, range_text, Field, Kind, FIELDS, MAX_TIMER_SECS};
use super::load::misspelled_variables;
use super::*;
use crate::budget::BudgetLimits;

fn inputs(dir: &Path, flags: &[(&str, &str)], env: &[(&str, &str)]) -> Inputs {
    Inputs {
        workspace: dir.to_path_buf(),
        config_file: None,
        flags: flags
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect(),
        env: env
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect(),
    }
}

/// `n` moved into the field's range.
fn in_range(field: &Field, n: u64) -> u64 {
    let (min, max) = field.range.unwrap_or((0, u64::MAX));
    min.saturating_add(n).min(max)
}

#[test]
fn precedence_flag_env_file_default_for_every_field() {
    let dir = tempfile::tempdir().unwrap();
    for field in FIELDS {
        let sample = |n: u64| -> (String, Value) {
            match field.kind {
                Kind::Text | Kind::Path => match field.key {
                    "provider" => {
                        let p = ["codex", "opencode", "mock"][n as usize % 3];
                        (p.into(), Value::from(p))
                    }
                    "progress" => {
                        let mode = ["tools", "text", "off"][n as usize % 3];
                        (mode.into(), Value::from(mode))
                    }
                    "elicitation" => {
                        let mode = ["ask", "decline"][n as usize % 2];
                        (mode.into(), Value::from(mode))
                    }
                    "timezone" => {
                        let z = ["Europe/Paris", "Asia/Tokyo", "America/Denver"][n as usize % 3];
                        (z.into(), Value::from(z))
                    }
                    key if key.ends_with("BaseUrl") => {
                        let url = format!("http://127.0.0.1:{}/v1", 9000 + n);
                        (url.clone(), Value::from(url))
                    }
                    // Absolute: a relative one from a flag or variable is made absolute.
                    _ if field.kind == Kind::Path => {
                        (format!("/p/v{n}"), Value::from(format!("/p/v{n}")))
                    }
                    _ => (format!("v{n}"), Value::from(format!("v{n}"))),
                },
                Kind::Number => {
                    let number = in_range(field, n + 1);
                    (number.to_string(), Value::from(number))
                }
                Kind::Decimal => {
                    let amount = n as f64 + 0.25;
                    (amount.to_string(), Value::from(amount))
                }
                Kind::Bool => (
                    n.is_multiple_of(2).to_string(),
                    Value::from(n.is_multiple_of(2)),
                ),
                Kind::List if field.key == "approvalStopTools" => (
                    format!("mcp__s{n}__a,mcp__s{n}__b"),
                    serde_json::json!([format!("mcp__s{n}__a"), format!("mcp__s{n}__b")]),
                ),
                Kind::List => (
                    format!("a{n},b{n}"),
                    serde_json::json!([format!("a{n}"), format!("b{n}")]),
                ),
                Kind::Object if field.key == "toolPolicy" => {
                    let v = serde_json::json!({ "deny": [format!("Bash(rm {n}*)")] });
                    (v.to_string(), v)
                }
                Kind::Object => {
                    let v = serde_json::json!({ format!("s{n}"): { "command": "x" } });
                    (v.to_string(), v)
                }
                Kind::Json if field.key == "acpCommand" => {
                    let v = serde_json::json!([format!("agent{n}"), "--acp"]);
                    (v.to_string(), v)
                }
                Kind::Json => {
                    let v = serde_json::json!([{ "step": "echo", "delayMs": n }]);
                    (v.to_string(), v)
                }
            }
        };
        let (_, file_value) = sample(0);
        let (env_text, env_value) = sample(1);
        let (flag_text, flag_value) = sample(2);
        std::fs::write(
            dir.path().join("config.json"),
            serde_json::json!({ field.key: file_value }).to_string(),
        )
        .unwrap();
        let from_file = Config::load(&inputs(dir.path(), &[], &[])).unwrap();
        assert_eq!(
            from_file.values.get(field.key),
            Some(&(file_value.clone(), Source::File)),
            "{}",
            field.key
        );
        let from_env = Config::load(&inputs(dir.path(), &[], &[(field.env, &env_text)])).unwrap();
        assert_eq!(
            from_env.values.get(field.key),
            Some(&(env_value, Source::Env)),
            "{}",
            field.key
        );
        let from_flag = Config::load(&inputs(
            dir.path(),
            &[(field.key, &flag_text)],
            &[(field.env, &env_text)],
        ))
        .unwrap();
        assert_eq!(
            from_flag.values.get(field.key),
            Some(&(flag_value, Source::Flag)),
            "{}",
            field.key
        );
    }
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    let defaults = Config::load(&inputs(dir.path(), &[], &[])).unwrap();
    assert_eq!(defaults.values.number("maxMessagesPerPrompt"), 10);
    assert_eq!(
        defaults.values.get("provider").map(|v| v.1),
        Some(Source::Default)
    );
}

#[test]
fn relative_paths_are_made_absolute_once_against_the_cwd_or_the_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = std::env::current_dir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"homeDir": "./h", "codexPath": "bin/codex", "claudePath": "claude"}"#,
    )
    .unwrap();
    let mut relative = inputs(
        Path::new("ws"),
        &[
            ("sessionDb", "db/s.db"),
            ("mcpToolsPath", "./bin/mcp-tools"),
        ],
        &[("NANOCLAW_AGENT_DIR", "a"), ("OPENCODE_PATH", "opencode")],
    );
    relative.config_file = Some(dir.path().join("config.json"));
    let config = Config::load(&relative).unwrap();
    let settings = config.settings().unwrap();
    let ws = cwd.join("ws");
    assert_eq!(config.workspace, ws);
    // Flags and variables: against the current directory.
    assert_eq!(settings.session_db, cwd.join("db/s.db"));
    assert_eq!(settings.dirs.agent, cwd.join("a"));
    assert_eq!(settings.mcp_tools_path, Some(cwd.join("bin/mcp-tools")));
    // config.json and defaults: against the workspace.
    assert_eq!(settings.dirs.home, ws.join("h"));
    assert_eq!(settings.cli_paths.codex, Some(ws.join("bin/codex")));
    assert_eq!(settings.dirs.downloads, ws.join("downloads"));
    // A bare program name is looked up in PATH, from every source.
    assert_eq!(settings.cli_paths.claude, Some(PathBuf::from("claude")));
    assert_eq!(settings.cli_paths.opencode, Some(PathBuf::from("opencode")));
    // A relative --config, and a secret file, against the current directory too.
    let mut named = inputs(dir.path(), &[], &[]);
    named.config_file = Some(PathBuf::from("no/such.json"));
    let err = format!("{:#}", Config::load(&named).unwrap_err());
    assert!(
        err.contains(&cwd.join("no/such.json").display().to_string()),
        "{err}"
    );
    let env = [("ANTHROPIC_API_KEY_FILE", "no/such.key")];
    let err = format!(
        "{:#}",
        Config::load(&inputs(dir.path(), &[], &env)).unwrap_err()
    );
    assert!(
        err.contains(&cwd.join("no/such.key").display().to_string()),
        "{err}"
    );
}

#[test]
fn malformed_file_names_the_field_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, r#"{"maxMessagesPerPrompt": "ten"}"#).unwrap();
    let err = format!(
        "{:#}",
        Config::load(&inputs(dir.path(), &[], &[])).unwrap_err()
    );
    assert!(
        err.contains("maxMessagesPerPrompt") && err.contains("config.json"),
        "{err}"
    );
    std::fs::write(&path, r#"{"maxMesagesPerPrompt": 3}"#).unwrap();
    let err = format!(
        "{:#}",
        Config::load(&inputs(dir.path(), &[], &[])).unwrap_err()
    );
    assert!(
        err.contains("unknown field \"maxMesagesPerPrompt\""),
        "{err}"
    );
    std::fs::write(&path, r#"{"mcpServers": {"x": {"args": []}}}"#).unwrap();
    let err = format!(
        "{:#}",
        Config::load(&inputs(dir.path(), &[], &[])).unwrap_err()
    );
    assert!(
        err.contains("mcpServers") && err.contains("command"),
        "{err}"
    );
    std::fs::write(&path, "{not json").unwrap();
    let err = format!(
        "{:#}",
        Config::load(&inputs(dir.path(), &[], &[])).unwrap_err()
    );
    assert!(err.contains("not valid JSON"), "{err}");
    std::fs::write(&path, "{}").unwrap();
    let err = Config::load(&inputs(
        dir.path(),
        &[],
        &[("ANTHROPIC_BASE_URL", "gateway.example:8080")],
    ))
    .unwrap_err();
    expect_test::expect![[r#"anthropicBaseUrl (from ANTHROPIC_BASE_URL) = "gateway.example:8080" is not an http(s) URL: write it whole, like https://gateway.example/v1"#]]
    .assert_eq(&format!("{err:#}"));
    std::fs::write(&path, r#"{"timezone": "Mars/Olympus"}"#).unwrap();
    let err = format!(
        "{:#}",
        Config::load(&inputs(dir.path(), &[], &[])).unwrap_err()
    );
    assert!(
        err.contains("timezone") && err.contains("config.json"),
        "{err}"
    );
}

#[test]
fn a_named_config_file_must_exist() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.json");
    let mut named = inputs(dir.path(), &[], &[]);
    named.config_file = Some(missing.clone());
    let err = format!("{:#}", Config::load(&named).unwrap_err());
    assert!(
        err.contains(&missing.display().to_string())
            && err.contains("named by --config")
            && err.contains("does not exist")
            && err.contains("drop --config"),
        "{err}"
    );
    let missing_text = missing.display().to_string();
    let by_env = inputs(dir.path(), &[], &[("NANOCLAW_CONFIG", &missing_text)]);
    let err = format!("{:#}", Config::load(&by_env).unwrap_err());
    assert!(err.contains("named by NANOCLAW_CONFIG"), "{err}");
    // The default file may be absent; an empty variable names nothing.
    Config::load(&inputs(dir.path(), &[], &[("NANOCLAW_CONFIG", "")])).unwrap();
    // A named file that exists is read, from the flag before the variable.
    std::fs::write(&missing, r#"{"assistantName": "Named"}"#).unwrap();
    let config = Config::load(&by_env).unwrap();
    assert_eq!(
        config.values.text("assistantName").as_deref(),
        Some("Named")
    );
    assert_eq!(config.config_file.as_deref(), Some(missing.as_path()));
}

#[test]
fn out_of_range_values_are_refused_from_every_source_with_the_range() {
    let dir = tempfile::tempdir().unwrap();
    let config_file = dir.path().join("config.json");
    let ranged: Vec<&Field> = FIELDS.iter().filter(|f| f.range.is_some()).collect();
    assert!(
        ranged.len() >= 16,
        "every timer, poll and retry setting is ranged"
    );
    for field in ranged {
        let (min, max) = field.range.unwrap();
        let range = range_text(field).unwrap();
        assert!(
            parse_text(field, field.default)
                .and_then(|v| check_range(field, &v))
                .is_ok(),
            "{}: the default {} is outside {range}",
            field.key,
            field.default
        );
        let mut outside = vec![max.saturating_add(1)];
        if min > 0 {
            outside.push(min - 1);
        }
        for bad in outside.into_iter().filter(|&n| n > max || n < min) {
            let text = bad.to_string();
            std::fs::write(
                &config_file,
                serde_json::json!({ field.key: bad }).to_string(),
            )
            .unwrap();
            let from_file = Config::load(&inputs(dir.path(), &[], &[])).unwrap_err();
            std::fs::remove_file(&config_file).unwrap();
            let from_env =
                Config::load(&inputs(dir.path(), &[], &[(field.env, &text)])).unwrap_err();
            let from_flag =
                Config::load(&inputs(dir.path(), &[(field.key, &text)], &[])).unwrap_err();
            for (err, source) in [
                (from_file, format!("config.json: field \"{}\"", field.key)),
                (from_env, format!("environment variable {}", field.env)),
                (from_flag, format!("flag --set {}", field.key)),
            ] {
                let err = format!("{err:#}");
                assert!(
                    err.contains(&source)
                        && err.contains(&format!("{} = {bad} is out of range", field.key))
                        && err.contains(&format!("allowed {range}"))
                        && err.contains("set a value in that range"),
                    "{err}"
                );
            }
        }
        // The bounds themselves are allowed.
        for ok in [min, max] {
            let ok = ok.to_string();
            Config::load(&inputs(dir.path(), &[(field.key, &ok)], &[])).unwrap();
        }
    }
    let err = Config::load(&inputs(dir.path(), &[("idlePollMs", "5000")], &[])).unwrap_err();
    expect_test::expect![[r#"flag --set idlePollMs: idlePollMs = 5000 is out of range: allowed 10 to 1000 ms; set a value in that range"#]]
    .assert_eq(&format!("{err:#}"));
}

#[test]
fn describe_masks_every_secret_in_text_and_json() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        r#"{
            "mcpServers": {"github": {"command": "npx", "args": ["server-github", "--token", "ghp_secretvalue0123456789"],
                                      "env": {"GITHUB_TOKEN": "ghp_secretvalue0123456789", "LOG_LEVEL": "debug"}}},
            "cliEnv": {"API_TIMEOUT_MS": "1000", "SEARCH_API_KEY": "search-key-0123456789"},
            "openaiBaseUrl": "https://bot:gateway-password@gateway.example/v1"
        }"#,
    )
    .unwrap();
    let config = Config::load(&inputs(
        dir.path(),
        &[],
        &[("ANTHROPIC_API_KEY", "sk-ant-very-secret-key")],
    ))
    .unwrap();
    let text = config.describe();
    let json = config.describe_json().to_string();
    for shown in [&text, &json] {
        for secret in [
            "very-secret",
            "secretvalue",
            "search-key-0",
            "gateway-password",
        ] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
    }
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| {
            ["anthropicApiKey", "openaiBaseUrl", "mcpServers", "cliEnv"]
                .iter()
                .any(|k| l.starts_with(&format!("{k} =")))
        })
        .collect();
    expect_test::expect![[r#"
        anthropicApiKey = sk-a…**** (22 chars)  [env ANTHROPIC_API_KEY]
        openaiBaseUrl = https://bot:****@gateway.example/v1  [config.json]
        mcpServers = {"github":{"args":["server-github","--token","ghp_…**** (25 chars)"],"command":"npx","env":{"GITHUB_TOKEN":"ghp_…**** (25 chars)","LOG_LEVEL":"debug"}}}  [config.json]
        cliEnv = {"API_TIMEOUT_MS":"1000","SEARCH_API_KEY":"sear…**** (21 chars)"}  [config.json]"#]]
    .assert_eq(&lines.join("\n"));
    let json = config.describe_json();
    expect_test::expect![[
        r#"{"source":"env","value":"sk-a…**** (22 chars)","variable":"ANTHROPIC_API_KEY"}"#
    ]]
    .assert_eq(&json["settings"]["anthropicApiKey"].to_string());
    expect_test::expect![[r#"{"source":"configFile","value":{"API_TIMEOUT_MS":"1000","SEARCH_API_KEY":"sear…**** (21 chars)"},"variable":"NANOCLAW_CLI_ENV"}"#]]
        .assert_eq(&json["settings"]["cliEnv"].to_string());
    // The typed settings' Debug (what a log line would print) masks them too.
    let typed = format!("{:?}", config.settings().unwrap());
    for secret in ["very-secret", "secretvalue", "search-key-0"] {
        assert!(!typed.contains(secret), "{secret} in {typed}");
    }
}

#[test]
fn a_cli_without_its_key_is_warned_about_naming_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let settings = |env: &[(&str, &str)]| {
        Config::load(&inputs(dir.path(), &[], env))
            .unwrap()
            .settings()
            .unwrap()
    };
    let claude = settings(&[]);
    let warning = claude.missing_key_warning(Vec::new()).unwrap();
    expect_test::expect![[r#"no API key for the claude CLI (anthropicApiKey is unset): every message will fail with "Not logged in". To give it one, set ANTHROPIC_API_KEY, or ANTHROPIC_API_KEY_FILE naming a file that holds the key (or anthropicApiKey in a config.json outside the workspace), and restart the runner"#]]
    .assert_eq(&warning);
    let hint = claude.auth_hint().unwrap();
    assert!(
        hint.contains("set ANTHROPIC_API_KEY, or ANTHROPIC_API_KEY_FILE"),
        "{hint}"
    );
    // A token in the runner's environment that the default scrub keeps from the CLI.
    let token = [("CLAUDE_CODE_OAUTH_TOKEN".to_owned(), "t".to_owned())];
    let warning = claude.missing_key_warning(token.clone()).unwrap();
    assert!(
        warning.contains("CLAUDE_CODE_OAUTH_TOKEN is set but never reaches the CLI"),
        "{warning}"
    );
    // The same token passed on deliberately: Claude logs in with it.
    let passed = settings(&[
        ("NANOCLAW_ENV_PASSTHROUGH", "CLAUDE_CODE_OAUTH_TOKEN"),
        ("NANOCLAW_ENV_SCRUB", "*_SECRET"),
    ]);
    assert_eq!(passed.missing_key_warning(token), None);
    for provider in ["codex", "opencode"] {
        let cli = settings(&[("AGENT_PROVIDER", provider)]);
        let warning = cli.missing_key_warning(Vec::new()).unwrap();
        assert!(
            warning.contains(&format!(
                "no API key for the {provider} CLI (openaiApiKey is unset)"
            )) && warning.contains("set OPENAI_API_KEY, or OPENAI_API_KEY_FILE")
                && warning.contains("(401)"),
            "{warning}"
        );
        let keyed = settings(&[("AGENT_PROVIDER", provider), ("OPENAI_API_KEY", "sk-x")]);
        assert_eq!(keyed.missing_key_warning(Vec::new()), None);
        let hint = keyed.auth_hint().unwrap();
        assert!(
            hint.contains("refused the key of openaiApiKey (from OPENAI_API_KEY)"),
            "{hint}"
        );
    }
    let mock = settings(&[("AGENT_PROVIDER", "mock")]);
    assert_eq!(mock.missing_key_warning(Vec::new()), None);
    assert_eq!(mock.auth_hint(), None);
}

#[test]
fn secrets_come_from_var_file_never_from_both() {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("anthropic.key");
    std::fs::write(&key_file, "sk-ant-from-a-file-123\n").unwrap();
    let key_path = key_file.display().to_string();
    for field in FIELDS.iter().filter(|f| f.secret) {
        let var = format!("{}_FILE", field.env);
        let config = Config::load(&inputs(dir.path(), &[], &[(var.as_str(), &key_path)])).unwrap();
        assert_eq!(
            config.values.text(field.key).as_deref(),
            Some("sk-ant-from-a-file-123"),
            "{var}: the file's content, its newline trimmed"
        );
        assert_eq!(config.values.map[field.key].1, Source::EnvFile);
        assert!(
            config
                .describe()
                .contains(&format!("[file from {}_FILE]", field.env)),
            "{}",
            config.describe()
        );
        let both = Config::load(&inputs(
            dir.path(),
            &[],
            &[(var.as_str(), &key_path), (field.env, "sk-direct")],
        ))
        .unwrap_err();
        let both = format!("{both:#}");
        assert!(
            both.contains(field.env) && both.contains(&var) && both.contains("never both"),
            "{both}"
        );
        // An empty variable is unset (`docker run -e X=` to mask an inherited one).
        let empty = Config::load(&inputs(
            dir.path(),
            &[],
            &[(var.as_str(), &key_path), (field.env, "")],
        ))
        .unwrap();
        assert_eq!(
            empty.values.text(field.key).as_deref(),
            Some("sk-ant-from-a-file-123")
        );
        // A flag still wins (flags > env > config.json), without reading the file.
        let flag = Config::load(&inputs(
            dir.path(),
            &[(field.key, "sk-flag")],
            &[(var.as_str(), "/nonexistent/key")],
        ))
        .unwrap();
        assert_eq!(flag.values.text(field.key).as_deref(), Some("sk-flag"));
        let missing = format!(
            "{:#}",
            Config::load(&inputs(
                dir.path(),
                &[],
                &[(var.as_str(), "/nonexistent/nanoclaw.key")]
            ))
            .unwrap_err()
        );
        assert!(
            missing.contains(&var) && missing.contains("/nonexistent/nanoclaw.key"),
            "the error names the variable and the file: {missing}"
        );
    }
    std::fs::write(&key_file, " \n").unwrap();
    let empty = format!(
        "{:#}",
        Config::load(&inputs(
            dir.path(),
            &[],
            &[("ANTHROPIC_API_KEY_FILE", &key_path)]
        ))
        .unwrap_err()
    );
    assert!(empty.contains("is empty"), "{empty}");
    // Not a secret: no *_FILE variant.
    let tz = Config::load(&inputs(dir.path(), &[], &[("TZ_FILE", &key_path)])).unwrap();
    assert_eq!(tz.values.timezone_name(), "UTC");
}

#[test]
fn a_key_in_a_config_json_inside_the_workspace_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"openaiApiKey": "sk-in-the-workspace-000"}"#,
    )
    .unwrap();
    let warnings = Config::load(&inputs(dir.path(), &[], &[]))
        .unwrap()
        .exposed_secrets();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("openaiApiKey") && warnings[0].contains("OPENAI_API_KEY_FILE"),
        "{warnings:?}"
    );
    // The same file outside the workspace, or the key from the environment: no warning.
    let outside = tempfile::tempdir().unwrap();
    let mut elsewhere = inputs(outside.path(), &[], &[]);
    elsewhere.config_file = Some(dir.path().join("config.json"));
    assert!(Config::load(&elsewhere)
        .unwrap()
        .exposed_secrets()
        .is_empty());
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"assistantName": "Andy"}"#,
    )
    .unwrap();
    let env = Config::load(&inputs(
        dir.path(),
        &[],
        &[("OPENAI_API_KEY", "sk-env-0000")],
    ))
    .unwrap();
    assert!(env.exposed_secrets().is_empty());
}

/// A key added to the table but not to [`Settings`] would be read by nothing: set alone to a
/// value that is not its default, every key must change the typed settings.
#[test]
fn every_field_reaches_the_typed_settings() {
    let dir = tempfile::tempdir().unwrap();
    let typed = |env: &[(&str, &str)]| {
        let config = Config::load(&inputs(dir.path(), &[], env)).unwrap();
        format!("{:?}", config.settings().unwrap())
    };
    let defaults = typed(&[]);
    for field in FIELDS {
        let sample = match (field.key, field.kind) {
            ("provider", _) => "codex".to_owned(),
            ("logFormat", _) => "json".to_owned(),
            ("progress", _) => "tools".to_owned(),
            ("timezone", _) => "Asia/Tokyo".to_owned(),
            ("cliEnv", _) => r#"{"SAMPLE": "1"}"#.to_owned(),
            ("mockUsage", _) => r#"{"inputTokens": 3}"#.to_owned(),
            ("toolPolicy", _) => r#"{"ask": ["Bash"], "askTimeoutSeconds": 5}"#.to_owned(),
            ("approvalStopTools", _) => "mcp__nanoclaw__send_message".to_owned(),
            ("elicitation", _) => "ask".to_owned(),
            ("acpCommand", _) => r#"["opencode", "acp"]"#.to_owned(),
            (key, _) if key.ends_with("BaseUrl") => "http://127.0.0.1:9/v1".to_owned(),
            (_, Kind::Text) => "sample-text".to_owned(),
            (_, Kind::Path) => "/sample/path".to_owned(),
            (_, Kind::Number) => (7..)
                .map(|n| in_range(field, n))
                .find(|n| n.to_string() != field.default)
                .unwrap_or_default()
                .to_string(),
            (_, Kind::Decimal) => "0.5".to_owned(),
            (_, Kind::Bool) => (field.default != "true").to_string(),
            (_, Kind::List) => "SAMPLE_A,SAMPLE_B".to_owned(),
            (_, Kind::Object) => r#"{"sample": {"command": "x"}}"#.to_owned(),
            (_, Kind::Json) => r#"[{"step": "reply", "text": "sample"}]"#.to_owned(),
        };
        assert_ne!(
            typed(&[(field.env, &sample)]),
            defaults,
            "{} ({}={sample}) does not reach Settings",
            field.key,
            field.env
        );
    }
}

#[test]
fn typed_settings_keep_the_defaults_and_the_shape_errors() {
    let dir = tempfile::tempdir().unwrap();
    let settings = Config::load(&inputs(dir.path(), &[], &[]))
        .unwrap()
        .settings()
        .unwrap();
    assert_eq!(settings.provider, ProviderKind::Claude);
    assert_eq!(settings.session_db, dir.path().join("session.db"));
    assert_eq!(settings.dirs.agent, dir.path().join("agent"));
    assert_eq!(settings.max_messages_per_prompt, 10);
    assert_eq!(settings.heartbeat, Duration::from_secs(5));
    assert_eq!(settings.env_policy, EnvPolicy::default());
    assert_eq!(
        settings.model_api().map(|m| m.endpoint()).as_deref(),
        Some("https://api.anthropic.com")
    );
    let secret = Config::load(&inputs(
        dir.path(),
        &[],
        &[("ANTHROPIC_API_KEY", "sk-ant-very-secret-key")],
    ))
    .unwrap()
    .settings()
    .unwrap();
    assert!(!format!("{secret:?}").contains("very-secret"));
    for (key, value, expected) in [
        ("cliEnv", r#"{"A": 1}"#, "cliEnv: expected an object"),
        (
            "mcpServers",
            r#"{"s": {"command": "x", "args": "no"}}"#,
            "mcpServers: expected",
        ),
        (
            "mockScript",
            r#"[{"step": "dance"}]"#,
            "mockScript: expected",
        ),
    ] {
        let err = Config::load(&inputs(dir.path(), &[(key, value)], &[]))
            .unwrap()
            .settings()
            .unwrap_err();
        assert!(format!("{err:#}").contains(expected), "{err:#}");
    }
}

#[test]
fn budget_limits_are_read_again_from_the_file_and_flags_still_win() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.json");
    std::fs::write(
        &file,
        r#"{"maxCostUsdPerDay": 0.5, "maxTokensPerDay": 100}"#,
    )
    .unwrap();
    let config =
        Config::load(&inputs(dir.path(), &[("maxCostUsdPerSession", "2.5")], &[])).unwrap();
    assert_eq!(
        config.budget_limits(),
        BudgetLimits {
            max_cost_usd_per_session: Some(2.5),
            max_cost_usd_per_day: Some(0.5),
            max_tokens_per_day: Some(100),
        }
    );
    std::fs::write(
        &file,
        r#"{"maxCostUsdPerDay": 3, "maxCostUsdPerSession": 9, "maxTokensPerDay": 0}"#,
    )
    .unwrap();
    let reload = config.budget_reload();
    assert_eq!(reload.file, file);
    assert_eq!(
        (reload.load)().unwrap(),
        BudgetLimits {
            max_cost_usd_per_session: Some(2.5),
            max_cost_usd_per_day: Some(3.0),
            max_tokens_per_day: None,
        },
        "the flag wins over the file; 0 is no limit"
    );
    std::fs::write(&file, r#"{"maxCostUsdPerDay": -1}"#).unwrap();
    let err = format!("{:#}", (reload.load)().unwrap_err());
    assert!(
        err.contains("maxCostUsdPerDay") && err.contains("a number at least 0"),
        "{err}"
    );
    let err = Config::load(&inputs(
        dir.path(),
        &[("maxCostUsdPerSession", "lots")],
        &[],
    ))
    .unwrap_err();
    assert!(format!("{err:#}").contains("expected a number"), "{err:#}");
}

#[test]
fn the_provider_help_and_default_are_provider_kinds() {
    let provider = FIELDS.iter().find(|f| f.key == "provider").unwrap();
    assert_eq!(provider.help, ProviderKind::names(" | "));
    assert!(provider.default.parse::<ProviderKind>().is_ok());
}

#[test]
fn the_tool_settings_are_typed_from_every_source() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"toolPolicy": {"allow": ["Read"], "deny": ["Bash(rm *)"], "ask": ["Bash",
            "mcp__github__*"], "default": "deny", "askTimeoutSeconds": 30},
            "approvalStopTools": ["mcp__nanoclaw__send_message"]}"#,
    )
    .unwrap();
    let settings = Config::load(&inputs(dir.path(), &[], &[("NANOCLAW_ELICITATION", "ask")]))
        .unwrap()
        .settings()
        .unwrap();
    let rule = |text: &str| ToolRule::parse(text).unwrap();
    assert_eq!(
        settings.tool_policy,
        ToolPolicy {
            allow: vec![rule("Read")],
            deny: vec![rule("Bash(rm *)")],
            ask: vec![rule("Bash"), rule("mcp__github__*")],
            default: Decision::Deny,
            ask_timeout: Duration::from_secs(30),
            workspace: None,
        }
    );
    assert_eq!(
        settings.approval_stop_tools,
        vec!["mcp__nanoclaw__send_message".to_owned()]
    );
    assert_eq!(settings.elicitation, ElicitationMode::Ask);
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    let defaults = Config::load(&inputs(dir.path(), &[], &[]))
        .unwrap()
        .settings()
        .unwrap();
    assert!(defaults.tool_policy.allows_everything());
    assert!(defaults.approval_stop_tools.is_empty());
    assert_eq!(defaults.elicitation, ElicitationMode::Decline);
}

#[test]
fn bad_tool_settings_are_refused_naming_the_key_the_value_and_the_form() {
    let dir = tempfile::tempdir().unwrap();
    for (key, value, expected) in [
        (
            "toolPolicy",
            r#"{"deny": ["Bash(rm *"]}"#,
            "toolPolicy (from flag): deny[0]: tool rule \"Bash(rm *\": the pattern must end \
             with `)` (expected Name or Name(pattern)",
        ),
        (
            "toolPolicy",
            r#"{"ask": ["Bash", "rm -rf"]}"#,
            "ask[1]: tool rule \"rm -rf\"",
        ),
        (
            "toolPolicy",
            r#"{"allow": "Bash"}"#,
            "allow must be a list of rules",
        ),
        (
            "toolPolicy",
            r#"{"default": "maybe"}"#,
            "default must be \"allow\", \"deny\" or \"ask\"",
        ),
        (
            "toolPolicy",
            r#"{"askTimeoutSeconds": 0}"#,
            "askTimeoutSeconds must be a whole number of seconds from 1",
        ),
        (
            "toolPolicy",
            r#"{"asks": ["Bash"]}"#,
            "unknown key \"asks\"",
        ),
        (
            "approvalStopTools",
            "send_message",
            "\"send_message\" is not an MCP tool name; expected mcp__<server>__<tool>",
        ),
        ("approvalStopTools", "mcp__nanoclaw__*", "(no wildcards)"),
        ("approvalStopTools", "mcp__nanoclaw", "not an MCP tool name"),
        ("elicitation", "accept", "expected decline or ask"),
    ] {
        let err = Config::load(&inputs(dir.path(), &[(key, value)], &[])).unwrap_err();
        assert!(
            format!("{err:#}").contains(expected),
            "{key}={value}: {err:#}"
        );
    }
    let err = Config::load(&inputs(
        dir.path(),
        &[],
        &[("NANOCLAW_APPROVAL_STOP_TOOLS", "mcp__a__b,Bash")],
    ))
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("approvalStopTools (from NANOCLAW_APPROVAL_STOP_TOOLS)"),
        "{err:#}"
    );
}

#[test]
fn a_misspelled_setting_variable_is_named_with_the_setting_it_resembles() {
    let names = [
        "NANOCLAW_TOOL_POLICYY",
        "nanoclaw_model",
        "NANOCLAW_MAX_TURNS_PER_QUERRY",
        "ANTHROPIC_API_KEY_FIEL",
        // Settings, a secret file, other programs' variables: nothing to say.
        "NANOCLAW_TOOL_POLICY",
        "ANTHROPIC_API_KEY_FILE",
        "NANOCLAW_CONFIG",
        "NANOCLAW_SKIP_CLI_TESTS",
        "PATH",
    ];
    expect_test::expect![[r#"
        NANOCLAW_TOOL_POLICYY is set but no setting reads it, so it is ignored: did you mean NANOCLAW_TOOL_POLICY? (`agent-runner --help` lists every variable)
        nanoclaw_model is set but no setting reads it, so it is ignored: did you mean NANOCLAW_MODEL? (`agent-runner --help` lists every variable)
        NANOCLAW_MAX_TURNS_PER_QUERRY is set but no setting reads it, so it is ignored: did you mean NANOCLAW_MAX_TURNS_PER_QUERY? (`agent-runner --help` lists every variable)"#]]
    .assert_eq(&misspelled_variables(names).join("\n"));
}

/// Every `NANOCLAW_*` variable the project's own code, scripts and docs use (the tests',
/// mcp-tools', the install scripts') must not be taken for a misspelled setting.
#[test]
fn no_variable_the_project_uses_is_taken_for_a_misspelling() {
    fn scan(dir: &Path, names: &mut std::collections::BTreeSet<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if ![".git", "target", ".cli", "node_modules"].contains(&name.as_str()) {
                    scan(&path, names);
                }
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            for (at, _) in text.match_indices("NANOCLAW_") {
                let variable: String = text[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                names.insert(variable.trim_end_matches('_').to_owned());
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut names = std::collections::BTreeSet::new();
    scan(&root, &mut names);
    // The misspellings the tests make on purpose (here and in `tests/logs.rs`).
    for deliberate in [
        "NANOCLAW_TOOL_POLICYY",
        "NANOCLAW_MAX_TURNS_PER_QUERRY",
        "NANOCLAW_MAX_TURN_SEC",
    ] {
        assert!(names.remove(deliberate), "{deliberate} is no longer used");
    }
    assert!(
        names.contains("NANOCLAW_SKIP_CLI_TESTS"),
        "the scan found {names:?}"
    );
    assert_eq!(
        misspelled_variables(names.iter().map(String::as_str)),
        Vec::<String>::new()
    );
}

#[test]
fn the_policy_ask_timeout_has_the_timer_settings_bound() {
    // `askTimeoutSeconds` is read by the policy's own reader; its bound is the timers' bound
    // for the same reason (Node's timers, an overflow-free deadline).
    assert_eq!(provider::policy::MAX_ASK_TIMEOUT_SECS, MAX_TIMER_SECS);
}

/// `provider: acp` needs `acpCommand` (a JSON array of strings), and the errors name the fix;
/// the presets `gemini` and `qwen` pick their own model and path settings (issue 44).
#[test]
fn acp_command_and_the_acp_presets() {
    let dir = tempfile::tempdir().unwrap();
    let settings = |env: &[(&str, &str)]| {
        Config::load(&inputs(dir.path(), &[], env))
            .and_then(|config| config.settings())
            .map_err(|err| format!("{err:#}"))
    };
    let missing = settings(&[("AGENT_PROVIDER", "acp")]).unwrap_err();
    expect_test::expect![[r#"provider acp needs the agent's command (acpCommand is unset or empty): set ACP_COMMAND to the agent's command line as a JSON array of strings, e.g. ACP_COMMAND='["opencode", "acp"]' (or "acpCommand" in config.json)"#]]
    .assert_eq(&missing);
    let wrong =
        settings(&[("AGENT_PROVIDER", "acp"), ("ACP_COMMAND", r#"{"cmd": 1}"#)]).unwrap_err();
    assert!(
        wrong.contains("is not an array of strings") && wrong.contains("ACP_COMMAND='["),
        "{wrong}"
    );
    let acp = settings(&[
        ("AGENT_PROVIDER", "acp"),
        ("ACP_COMMAND", r#"["opencode", "acp"]"#),
    ])
    .unwrap();
    assert_eq!(acp.acp_command, ["opencode", "acp"]);
    assert_eq!(acp.model_api(), None, "a generic agent brings its own key");
    let gemini = settings(&[
        ("AGENT_PROVIDER", "gemini"),
        ("GEMINI_MODEL", "gemini-2.5-pro"),
        ("GEMINI_PATH", "/opt/gemini"),
        ("QWEN_MODEL", "qwen3-coder"),
    ])
    .unwrap();
    assert_eq!(gemini.model().as_deref(), Some("gemini-2.5-pro"));
    assert!(
        gemini
            .model_api()
            .is_some_and(|api| api.key_variable == "GEMINI_API_KEY"),
        "Gemini CLI speaks the Gemini API, through the credential proxy"
    );
    assert_eq!(gemini.cli_path(), Some(PathBuf::from("/opt/gemini")));
    let qwen = settings(&[
        ("AGENT_PROVIDER", "qwen"),
        ("QWEN_MODEL", "qwen3-coder"),
        ("GEMINI_MODEL", "gemini-2.5-pro"),
    ])
    .unwrap();
    assert_eq!(qwen.model().as_deref(), Some("qwen3-coder"));
    assert!(
        qwen.model_api()
            .is_some_and(|api| api.key_variable == "OPENAI_API_KEY"),
        "Qwen Code speaks the OpenAI-compatible API"
    );
}
