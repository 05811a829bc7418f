//! Run the scripted fake model server standalone (for manual experiments).
//!
//! ```text
//! cargo run -p e2e --bin fake-model -- [--port N] [--script steps.json] [--default-text TEXT]
//!                                      [--default-usage JSON] [--known-models A,B] [--bodies]
//! ```
//! Prints `http://127.0.0.1:PORT` on the first stdout line, then one summary line per request
//! (with the model it named), each followed by the tool results the request carries (with
//! `--bodies` also the JSON body). `steps.json` is a JSON array of steps tagged by `kind`, e.g.
//! `[{"kind":"tool_call","name":"send_message","arguments":{"text":"hi"}},
//! {"kind":"text","text":"done","chunks":2,"delay_ms":100,
//! "usage":{"input":1200,"output":80,"cache_read":300,"cache_write":50,"reasoning":20}}]`.
//! `--default-usage` takes the same usage object for replies that script none; `--known-models`
//! refuses every other model with a 404 in the API's shape. Stop with Ctrl-C (or SIGTERM).

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::process::ExitCode;
use std::time::Duration;

use e2e::fake_model::{FakeModel, Step, StepUsage};

struct Args {
    port: u16,
    script: Vec<Step>,
    default_text: Option<String>,
    default_usage: Option<StepUsage>,
    known_models: Option<Vec<String>>,
    bodies: bool,
}

fn usage() -> &'static str {
    "usage: fake-model [--port N] [--script steps.json] [--default-text TEXT] \
     [--default-usage JSON] [--known-models A,B] [--bodies]"
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        port: 0,
        script: Vec::new(),
        default_text: None,
        default_usage: None,
        known_models: None,
        bodies: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--port" => {
                let v = it.next().ok_or("--port needs a value")?;
                args.port = v.parse().map_err(|e| format!("bad --port {v:?}: {e}"))?;
            }
            "--script" => {
                let path = it.next().ok_or("--script needs a file")?;
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("cannot read {path}: {e}"))?;
                args.script =
                    serde_json::from_str(&text).map_err(|e| format!("bad script {path}: {e}"))?;
            }
            "--default-text" => {
                args.default_text = Some(it.next().ok_or("--default-text needs a value")?);
            }
            "--default-usage" => {
                let v = it.next().ok_or("--default-usage needs a JSON object")?;
                args.default_usage = Some(
                    serde_json::from_str(&v)
                        .map_err(|e| format!("bad --default-usage {v:?}: {e}"))?,
                );
            }
            "--known-models" => {
                let v = it
                    .next()
                    .ok_or("--known-models needs a comma-separated list")?;
                args.known_models = Some(
                    v.split(',')
                        .map(str::trim)
                        .filter(|m| !m.is_empty())
                        .map(str::to_string)
                        .collect(),
                );
            }
            "--bodies" => args.bodies = true,
            other => return Err(format!("unknown argument {other:?}\n{}", usage())),
        }
    }
    Ok(args)
}

/// `text` on one line, cut to `max` characters.
fn one_line(text: &str, max: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match flat.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &flat[..cut]),
        None => flat,
    }
}

fn main() -> ExitCode {
    if std::env::args().skip(1).any(|a| a == "-h" || a == "--help") {
        println!("{}", usage());
        return ExitCode::SUCCESS;
    }
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, args.port));
    let server = match FakeModel::start_on(addr) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("fake-model: cannot start on {addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    server.push_all(args.script);
    if let Some(t) = args.default_text {
        server.set_default_text(t);
    }
    if let Some(u) = args.default_usage {
        server.set_default_usage(u);
    }
    server.set_known_models(args.known_models);
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{}", server.url());
    let _ = out.flush();
    eprintln!(
        "fake-model: Claude ANTHROPIC_BASE_URL={}  Codex/OpenCode base_url={}",
        server.url(),
        server.openai_base_url()
    );
    let mut printed = 0usize;
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let log = server.requests();
        for r in log.iter().skip(printed) {
            let _ = writeln!(out, "{}", r.summary());
            // What the tools returned to the model: the demo shows the agent's tool call by it.
            for result in r.tool_results() {
                let _ = writeln!(out, "    tool result: {}", one_line(&result, 200));
            }
            if args.bodies {
                let body = serde_json::to_string_pretty(&r.body).unwrap_or_default();
                let _ = writeln!(out, "{body}");
            }
        }
        printed = log.len();
        let _ = out.flush();
    }
}
