//! What the credential proxy adds to a model stream: first-byte latency and whole-stream time
//! of an SSE response through the proxy vs straight from the same loopback upstream, in the
//! same run, interleaved. Prints medians, p95 and the ratios.
//!
//! Run: `cargo bench -p credproxy --bench proxy_latency` (`NANOCLAW_PROXY_BENCH_STREAMS`,
//! default 300 streams per path; `NANOCLAW_PROXY_BENCH_EVENTS`, default 200 events a stream).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::response::Response;
use axum::Router;
use credproxy::{Api, CredProxy, Upstream};
use futures::StreamExt;

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A loopback upstream answering every request with `events` SSE events, one chunk each
/// (an Anthropic-like `content_block_delta` of ~150 bytes).
async fn upstream(events: usize) -> String {
    let app = Router::new().fallback(move || async move {
        let chunks = (0..events).map(|i| {
            Ok::<_, std::io::Error>(Bytes::from(format!(
                "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"token {i}\"}}}}\n\n"
            )))
        });
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::from_stream(futures::stream::iter(chunks)))
            .unwrap()
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // A gateway that sends each event at once, so the baseline has no Nagle delays of its own.
    let nodelay = setting("NANOCLAW_PROXY_BENCH_UPSTREAM_NODELAY", 1) == 1;
    let listener = axum::serve::ListenerExt::tap_io(listener, move |tcp| {
        let _ = tcp.set_nodelay(nodelay);
    });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// One stream: (time to the first body byte, time to the end), and the bytes read.
async fn one(client: &reqwest::Client, url: &str, token: &str) -> (Duration, Duration, usize) {
    let started = Instant::now();
    let response = client
        .post(url)
        .header("x-api-key", token)
        .header("content-type", "application/json")
        .body(r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#)
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    let mut stream = response.bytes_stream();
    let mut first = None;
    let mut bytes = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.unwrap();
        if first.is_none() && !chunk.is_empty() {
            first = Some(started.elapsed());
        }
        bytes += chunk.len();
    }
    (first.unwrap_or_default(), started.elapsed(), bytes)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

struct Figures {
    median: Duration,
    p95: Duration,
}

fn figures(mut samples: Vec<Duration>) -> Figures {
    samples.sort();
    Figures {
        median: percentile(&samples, 0.5),
        p95: percentile(&samples, 0.95),
    }
}

fn ms(d: Duration) -> String {
    format!("{:8.3} ms", d.as_secs_f64() * 1000.0)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let streams = setting("NANOCLAW_PROXY_BENCH_STREAMS", 300).max(1);
    let events = setting("NANOCLAW_PROXY_BENCH_EVENTS", 200).max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let base = upstream(events).await;
        let proxy = CredProxy::start(vec![Upstream::new(Api::Anthropic, Some(&base), "sk-bench")])
            .await
            .unwrap();
        let direct_url = format!("{base}/v1/messages");
        let proxy_url = format!("{}/v1/messages", proxy.base_url(Api::Anthropic));
        let client = reqwest::Client::new();
        // Warm-up: connections in both pools, code paths paged in.
        for _ in 0..10 {
            one(&client, &direct_url, "sk-bench").await;
            one(&client, &proxy_url, proxy.token()).await;
        }
        let (mut direct_first, mut direct_total) = (Vec::new(), Vec::new());
        let (mut proxy_first, mut proxy_total) = (Vec::new(), Vec::new());
        for i in 0..streams {
            // Alternate the order so neither path always runs on a warmer cache.
            let order = if i % 2 == 0 { [false, true] } else { [true, false] };
            for through_proxy in order {
                if through_proxy {
                    let (first, total, bytes) = one(&client, &proxy_url, proxy.token()).await;
                    assert!(bytes > 0);
                    proxy_first.push(first);
                    proxy_total.push(total);
                } else {
                    let (first, total, _) = one(&client, &direct_url, "sk-bench").await;
                    direct_first.push(first);
                    direct_total.push(total);
                }
            }
        }
        let rows = [
            ("first byte, direct", figures(direct_first)),
            ("first byte, proxy", figures(proxy_first)),
            ("whole stream, direct", figures(direct_total)),
            ("whole stream, proxy", figures(proxy_total)),
        ];
        println!("credential proxy: {streams} streams per path, {events} SSE events each, loopback upstream");
        println!("{:<22} {:>11} {:>11}", "", "median", "p95");
        for (name, f) in &rows {
            println!("{name:<22} {} {}", ms(f.median), ms(f.p95));
        }
        let ratio = |a: &Figures, b: &Figures| b.median.as_secs_f64() / a.median.as_secs_f64().max(1e-9);
        let added = |a: &Figures, b: &Figures| b.median.saturating_sub(a.median);
        println!(
            "added by the proxy (median): first byte +{} (x{:.2}), whole stream +{} (x{:.2}), {:.2} us per event",
            ms(added(&rows[0].1, &rows[1].1)).trim(),
            ratio(&rows[0].1, &rows[1].1),
            ms(added(&rows[2].1, &rows[3].1)).trim(),
            ratio(&rows[2].1, &rows[3].1),
            added(&rows[2].1, &rows[3].1).as_secs_f64() * 1e6 / events as f64,
        );
    });
}
