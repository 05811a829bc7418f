//! 8 mcp-tools processes × 200 concurrent send_message calls, while a simulated runner claims
//! and completes inbound rows and a simulated host inserts them: no errors, every row, unique
//! odd seqs.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use schema::NewMessageIn;
use serde_json::json;

use crate::support::{outcome, Env, TIMEOUT};

const PROCESSES: usize = 8;
const CALLS: usize = 200;

#[test]
fn eight_processes_two_hundred_calls_each() {
    let env = Env::new();
    env.session_routing("slack", "C1");
    let stop = Arc::new(AtomicBool::new(false));
    let inserted = Arc::new(AtomicUsize::new(0));
    let completed = Arc::new(AtomicUsize::new(0));

    let host = {
        let db = env.db.clone();
        let (stop, inserted) = (stop.clone(), inserted.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                db.insert_in(&NewMessageIn::new(
                    "chat",
                    r#"{"text":"ping","sender":"host"}"#,
                ))
                .unwrap();
                inserted.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let runner = {
        let db = env.db.clone();
        let (stop, completed) = (stop.clone(), completed.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let batch = db.eligible(Utc::now(), false, 10).unwrap();
                let ids: Vec<String> = batch.rows.iter().map(|r| r.id.clone()).collect();
                let claimed = db.claim(&ids).unwrap();
                let ids: Vec<String> = claimed.iter().map(|r| r.id.clone()).collect();
                db.complete(&ids, &[]).unwrap();
                completed.fetch_add(ids.len(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };

    let mut servers: Vec<_> = (0..PROCESSES).map(|_| env.spawn().ready()).collect();
    // Every process gets all its calls at once, before any response is read.
    let mut ids = Vec::new();
    for (p, server) in servers.iter_mut().enumerate() {
        let mut mine = Vec::new();
        for c in 0..CALLS {
            let id = json!(format!("p{p}-c{c}"));
            server.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "send_message", "arguments": {"text": format!("p{p} c{c}")}}}));
            mine.push(id);
        }
        ids.push(mine);
    }
    let mut errors = Vec::new();
    for (server, mine) in servers.iter_mut().zip(&ids) {
        for id in mine {
            match server.response(id, TIMEOUT * 3) {
                Some(response) if response.get("result").is_some() => {
                    let result = outcome(&response);
                    if result.is_error {
                        errors.push(result.text);
                    }
                }
                other => errors.push(format!("{id}: {other:?}")),
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    host.join().unwrap();
    runner.join().unwrap();

    assert!(
        errors.is_empty(),
        "{} errors, first: {:?}",
        errors.len(),
        errors.first()
    );
    let rows = env.db.all_messages_out().unwrap();
    assert_eq!(rows.len(), PROCESSES * CALLS);
    let seqs: HashSet<i64> = rows.iter().map(|r| r.seq.unwrap()).collect();
    assert_eq!(seqs.len(), rows.len(), "seqs are unique");
    assert!(seqs.iter().all(|s| s % 2 == 1), "messages_out seqs are odd");
    let texts: HashSet<&str> = rows.iter().map(|r| r.content.as_str()).collect();
    assert_eq!(texts.len(), rows.len(), "every call wrote its own row");
    let inbound = env.db.all_messages_in().unwrap();
    assert_eq!(inbound.len(), inserted.load(Ordering::Relaxed));
    assert!(inbound.iter().all(|r| r.seq.unwrap() % 2 == 0));
    assert!(inserted.load(Ordering::Relaxed) > 0 && completed.load(Ordering::Relaxed) > 0);
}
