//! The fake model over HTTP: each API's replies, the script, the log.

use super::reply::split_chunks;
use super::*;

/// The APIs that name the model and ask for a stream in the body (Gemini does both in the path:
/// its own tests below).
const BODY_MODEL_APIS: [Api; 3] = [Api::Anthropic, Api::Responses, Api::Chat];

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

async fn post(server: &FakeModel, path: &str, body: Value) -> reqwest::Response {
    client()
        .post(format!("{}{path}", server.url()))
        .header("content-type", "application/json")
        .header("X-Api-Key", "sk-test")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

/// (event name, data) pairs of an SSE body; `[DONE]` becomes `Value::String`.
fn parse_sse(body: &str) -> Vec<(Option<String>, Value)> {
    assert!(
        body.ends_with("\n\n"),
        "SSE body must end with a blank line: {body:?}"
    );
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let mut name = None;
            let mut data = Value::Null;
            for line in e.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = if d == "[DONE]" {
                        Value::from("[DONE]")
                    } else {
                        serde_json::from_str(d).unwrap()
                    };
                } else {
                    panic!("unexpected SSE line {line:?}");
                }
            }
            (name, data)
        })
        .collect()
}

/// A streamed request with tools to `api`, its SSE events parsed.
async fn sse_of(server: &FakeModel, api: Api, body: Value) -> Vec<(Option<String>, Value)> {
    parse_sse(&post(server, api.path(), body).await.text().await.unwrap())
}

fn names(events: &[(Option<String>, Value)]) -> Vec<&str> {
    events
        .iter()
        .map(|(n, _)| n.as_deref().unwrap_or("-"))
        .collect()
}

fn with_tools(api: Api, mut body: Value) -> Value {
    let tools = match api {
        Api::Anthropic => json!([{"name":"Bash","input_schema":{"type":"object"}}]),
        Api::Responses => json!([{"type":"function","name":"exec_command","parameters":{}},
                {"type":"namespace","name":"mcp__nanoclaw",
                 "tools":[{"type":"function","name":"send_message","parameters":{}}]}]),
        Api::Chat => json!([{"type":"function","function":{"name":"nanoclaw_send_message",
                "parameters":{}}}]),
        Api::Gemini => json!([{"functionDeclarations":[
                {"name":"run_shell_command","parameters":{}},
                {"name":"mcp_nanoclaw_send_message","parameters":{}}]}]),
    };
    body["tools"] = tools;
    if api != Api::Gemini {
        body["stream"] = json!(true);
    }
    body
}

fn user_body(api: Api, text: &str) -> Value {
    match api {
        Api::Anthropic => json!({"model":"m","messages":[{"role":"user","content":text}]}),
        Api::Responses => json!({"model":"m","input":[{"type":"message","role":"user",
                "content":[{"type":"input_text","text":text}]}]}),
        Api::Chat => json!({"model":"m","messages":[{"role":"user","content":text}]}),
        Api::Gemini => json!({"contents":[{"role":"user","parts":[{"text":text}]}]}),
    }
}

#[test]
fn split_chunks_on_char_boundaries() {
    assert_eq!(split_chunks("héllo", 2), vec!["hél", "lo"]);
    assert_eq!(split_chunks("ab", 5), vec!["a", "b"]);
    assert_eq!(split_chunks("", 3), vec![""]);
    assert_eq!(split_chunks("abc", 1), vec!["abc"]);
}

#[test]
fn steps_roundtrip_as_json() {
    let steps = vec![
        Step::text("hi").chunks(3).delay_ms(5),
        Step::tool_call("send_message", json!({"text":"x"})),
        Step::raw_tool_call("exec_command", json!({"cmd":"env"})).namespace("ns"),
        Step::error(500, "boom")
            .retry_after_ms(50)
            .retry_after_secs(1),
        Step::hang().timeout_ms(10),
        Step::text("late").stalled(100),
        Step::drop_connection(),
        Step::reply([Step::text("a"), Step::tool_call("t", json!({}))]),
        Step::text("counted").usage(SAMPLE_USAGE).stalled(5),
        Step::tool_call("t", json!({})).usage(StepUsage::default()),
    ];
    let s = serde_json::to_string(&steps).unwrap();
    let back: Vec<Step> = serde_json::from_str(&s).unwrap();
    assert_eq!(back, steps);
    let parsed: Step = serde_json::from_str(r#"{"kind":"text","text":"x"}"#).unwrap();
    assert_eq!(parsed, Step::text("x"));
    // Usage figures left out are 0; a step without usage serializes without the key.
    let parsed: Step = serde_json::from_str(
            r#"{"kind":"raw_tool_call","name":"Bash","arguments":{},"usage":{"input":7,"reasoning":2}}"#,
        )
        .unwrap();
    let want = StepUsage {
        input: 7,
        reasoning: 2,
        ..StepUsage::default()
    };
    assert_eq!(parsed, Step::raw_tool_call("Bash", json!({})).usage(want));
    assert!(!serde_json::to_string(&Step::text("x"))
        .unwrap()
        .contains("usage"));
    // Usage only sticks to content steps.
    assert_eq!(
        Step::error(500, "x").usage(SAMPLE_USAGE),
        Step::error(500, "x")
    );
}

#[tokio::test]
async fn a_log_limit_keeps_the_last_requests_and_seq_keeps_counting() {
    let server = FakeModel::start().unwrap();
    server.set_log_limit(Some(2));
    for text in ["one", "two", "three", "four"] {
        post(
            &server,
            Api::Anthropic.path(),
            user_body(Api::Anthropic, text),
        )
        .await;
    }
    let log = server.requests();
    assert_eq!(
        log.iter().map(|r| r.seq).collect::<Vec<_>>(),
        [2, 3],
        "the last two requests"
    );
    assert!(log[1].raw_body.contains("four"), "{}", log[1].raw_body);
    server.set_log_limit(Some(1));
    assert_eq!(server.requests().len(), 1, "a lower limit trims at once");
    server.set_log_limit(None);
    post(
        &server,
        Api::Anthropic.path(),
        user_body(Api::Anthropic, "five"),
    )
    .await;
    assert_eq!(
        server.requests().len(),
        2,
        "no limit: every request from now on"
    );
}

#[tokio::test]
async fn scripted_usage_in_each_api_streaming_shape() {
    let server = FakeModel::start().unwrap();
    server.push(Step::text("hi").usage(SAMPLE_USAGE));
    let ev = sse_of(
        &server,
        Api::Anthropic,
        with_tools(Api::Anthropic, user_body(Api::Anthropic, "x")),
    )
    .await;
    assert_eq!(
        ev[0].1["message"]["usage"],
        json!({"input_tokens":1200,"cache_creation_input_tokens":50,
                   "cache_read_input_tokens":300,"output_tokens":1})
    );
    let delta = ev
        .iter()
        .find(|(n, _)| n.as_deref() == Some("message_delta"))
        .unwrap();
    assert_eq!(delta.1["usage"], json!({"output_tokens":80}));

    // A stalled tool call reports its scripted usage too.
    server.push(
        Step::tool_call("send_message", json!({}))
            .usage(SAMPLE_USAGE)
            .stalled(1),
    );
    let ev = sse_of(
        &server,
        Api::Responses,
        with_tools(Api::Responses, user_body(Api::Responses, "x")),
    )
    .await;
    let completed = ev.last().unwrap();
    assert_eq!(completed.0.as_deref(), Some("response.completed"));
    assert_eq!(
        completed.1["response"]["usage"],
        json!({"input_tokens":1500,"input_tokens_details":{"cached_tokens":300},
                   "output_tokens":80,"output_tokens_details":{"reasoning_tokens":20},
                   "total_tokens":1580})
    );

    server.push(Step::reply([Step::text("a"), Step::text("b")]).usage(SAMPLE_USAGE));
    let mut body = with_tools(Api::Chat, user_body(Api::Chat, "x"));
    body["stream_options"] = json!({"include_usage": true});
    let ev = sse_of(&server, Api::Chat, body).await;
    let usage_chunk = &ev[ev.len() - 2].1;
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(
        usage_chunk["usage"],
        json!({"prompt_tokens":1500,"completion_tokens":80,"total_tokens":1580,
                   "prompt_tokens_details":{"cached_tokens":300},
                   "completion_tokens_details":{"reasoning_tokens":20}})
    );
    assert_eq!(ev[ev.len() - 1].1, "[DONE]");
}

#[tokio::test]
async fn default_usage_is_settable_and_reaches_non_streaming_bodies() {
    let server = FakeModel::start().unwrap();
    // Unscripted: the historical defaults.
    let ev = sse_of(
        &server,
        Api::Responses,
        with_tools(Api::Responses, user_body(Api::Responses, "x")),
    )
    .await;
    assert_eq!(
        ev.last().unwrap().1["response"]["usage"]["input_tokens"],
        10
    );
    assert_eq!(
        ev.last().unwrap().1["response"]["usage"]["output_tokens"],
        5
    );

    server.set_default_usage(SAMPLE_USAGE);
    let mut bodies = Vec::new();
    for api in BODY_MODEL_APIS {
        let mut body = with_tools(api, user_body(api, "x"));
        body["stream"] = json!(false);
        let text = post(&server, api.path(), body).await.text().await.unwrap();
        bodies.push(serde_json::from_str::<Value>(&text).unwrap());
    }
    assert_eq!(
        bodies[0]["usage"],
        json!({"input_tokens":1200,"cache_creation_input_tokens":50,
                   "cache_read_input_tokens":300,"output_tokens":80})
    );
    assert_eq!(
        bodies[1]["usage"]["input_tokens_details"]["cached_tokens"],
        300
    );
    assert_eq!(
        bodies[1]["usage"]["output_tokens_details"]["reasoning_tokens"],
        20
    );
    assert_eq!(bodies[2]["usage"]["prompt_tokens"], 1500);
    assert_eq!(
        bodies[2]["usage"]["completion_tokens_details"]["reasoning_tokens"],
        20
    );
    // A scripted step still wins over the default.
    server.push(Step::text("x").usage(StepUsage::default()));
    let ev = sse_of(
        &server,
        Api::Anthropic,
        with_tools(Api::Anthropic, user_body(Api::Anthropic, "x")),
    )
    .await;
    assert_eq!(ev[0].1["message"]["usage"]["input_tokens"], 0);
    assert_eq!(ev[0].1["message"]["usage"]["output_tokens"], 0);
}

#[tokio::test]
async fn unknown_models_get_a_404_in_the_api_shape_and_consume_no_step() {
    let server = FakeModel::start_with_script([Step::text("served")]).unwrap();
    server.set_known_models(Some(["m", "other-known"]));
    let mut statuses = Vec::new();
    for api in BODY_MODEL_APIS {
        let mut body = with_tools(api, user_body(api, "x"));
        body["model"] = json!("nope-1");
        let resp = post(&server, api.path(), body).await;
        statuses.push(resp.status().as_u16());
        let body: Value = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
        match api {
            Api::Anthropic => assert_eq!(
                body,
                json!({"type":"error","error":{"type":"not_found_error",
                           "message":"model: nope-1"}})
            ),
            _ => assert_eq!(
                body,
                json!({"error":{"message":"The model `nope-1` does not exist",
                           "type":"invalid_request_error","param":null,
                           "code":"model_not_found"}})
            ),
        }
    }
    assert_eq!(statuses, [404, 404, 404]);
    assert_eq!(server.remaining_steps(), 1);
    let log = server.requests();
    assert!(log.iter().all(|r| r.reply == ReplyKind::UnknownModel));
    assert_eq!(log[0].model(), Some("nope-1"));
    assert!(server.model_requests().is_empty());

    // A known model is served; None accepts any again.
    let text = post(
        &server,
        "/v1/messages",
        with_tools(Api::Anthropic, user_body(Api::Anthropic, "x")),
    )
    .await
    .text()
    .await
    .unwrap();
    assert!(text.contains(r#""text":"served""#), "{text}");
    server.set_known_models(None::<[&str; 0]>);
    let mut body = with_tools(Api::Chat, user_body(Api::Chat, "x"));
    body["model"] = json!("anything");
    assert_eq!(
        post(&server, "/v1/chat/completions", body).await.status(),
        200
    );
    assert_eq!(
        server.model_requests().last().unwrap().model(),
        Some("anything")
    );
}

#[tokio::test]
async fn anthropic_text_sse_exact_bytes() {
    let server = FakeModel::start_with_script([Step::text("hello").chunks(2)]).unwrap();
    let resp = post(
        &server,
        "/v1/messages?beta=true",
        with_tools(Api::Anthropic, user_body(Api::Anthropic, "hi")),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let body = resp.text().await.unwrap();
    let expected = concat!(
        "event: message_start\n",
        r#"data: {"message":{"content":[],"id":"msg_fake1","model":"m","role":"assistant","stop_reason":null,"stop_sequence":null,"type":"message","usage":{"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"input_tokens":10,"output_tokens":1}},"type":"message_start"}"#,
        "\n\n",
        "event: content_block_start\n",
        r#"data: {"content_block":{"text":"","type":"text"},"index":0,"type":"content_block_start"}"#,
        "\n\n",
        "event: content_block_delta\n",
        r#"data: {"delta":{"text":"hel","type":"text_delta"},"index":0,"type":"content_block_delta"}"#,
        "\n\n",
        "event: content_block_delta\n",
        r#"data: {"delta":{"text":"lo","type":"text_delta"},"index":0,"type":"content_block_delta"}"#,
        "\n\n",
        "event: content_block_stop\n",
        r#"data: {"index":0,"type":"content_block_stop"}"#,
        "\n\n",
        "event: message_delta\n",
        r#"data: {"delta":{"stop_reason":"end_turn","stop_sequence":null},"type":"message_delta","usage":{"output_tokens":5}}"#,
        "\n\n",
        "event: message_stop\n",
        r#"data: {"type":"message_stop"}"#,
        "\n\n",
    );
    assert_eq!(body, expected);
    let log = server.requests();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].api, Some(Api::Anthropic));
    assert_eq!(log[0].path, "/v1/messages");
    assert_eq!(log[0].query.as_deref(), Some("beta=true"));
    assert_eq!(log[0].header("x-api-key"), Some("sk-test"));
    assert_eq!(
        log[0].headers.get("x-api-key").map(String::as_str),
        Some("sk-test")
    );
    assert_eq!(log[0].reply, ReplyKind::Step(0));
    assert_eq!(server.remaining_steps(), 0);
}

#[tokio::test]
async fn anthropic_tool_use_maps_mcp_name() {
    let server = FakeModel::start_with_script([
        Step::reply([
            Step::text("calling"),
            Step::tool_call("send_message", json!({"text":"hi"})),
        ]),
        Step::raw_tool_call("Bash", json!({"command":"env"})),
    ])
    .unwrap();
    let body = with_tools(Api::Anthropic, user_body(Api::Anthropic, "hi"));
    let ev = parse_sse(
        &post(&server, "/v1/messages", body.clone())
            .await
            .text()
            .await
            .unwrap(),
    );
    assert_eq!(
        names(&ev),
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(ev[4].1["index"], 1);
    assert_eq!(ev[4].1["content_block"]["type"], "tool_use");
    assert_eq!(
        ev[4].1["content_block"]["name"],
        "mcp__nanoclaw__send_message"
    );
    assert!(ev[4].1["content_block"]["id"]
        .as_str()
        .unwrap()
        .starts_with("toolu_"));
    assert_eq!(ev[5].1["delta"]["type"], "input_json_delta");
    assert_eq!(ev[5].1["delta"]["partial_json"], r#"{"text":"hi"}"#);
    assert_eq!(ev[7].1["delta"]["stop_reason"], "tool_use");

    let ev = parse_sse(
        &post(&server, "/v1/messages", body)
            .await
            .text()
            .await
            .unwrap(),
    );
    assert_eq!(ev[1].1["content_block"]["name"], "Bash");
    assert_eq!(ev[2].1["delta"]["partial_json"], r#"{"command":"env"}"#);
}

#[tokio::test]
async fn responses_function_call_has_namespace_and_completed() {
    let server = FakeModel::start_with_script([
        Step::tool_call("send_message", json!({"text":"hi"})),
        Step::raw_tool_call("exec_command", json!({"cmd":"env"})),
        Step::text("done").chunks(2),
    ])
    .unwrap();
    let body = with_tools(Api::Responses, user_body(Api::Responses, "hi"));
    let ev = parse_sse(
        &post(&server, "/v1/responses", body.clone())
            .await
            .text()
            .await
            .unwrap(),
    );
    assert_eq!(
        names(&ev),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    for (i, (name, data)) in ev.iter().enumerate() {
        assert_eq!(data["type"].as_str(), name.as_deref());
        assert_eq!(data["sequence_number"], i);
    }
    let item = &ev[5].1["item"];
    assert_eq!(item["type"], "function_call");
    assert_eq!(item["name"], "send_message");
    assert_eq!(item["namespace"], "mcp__nanoclaw");
    assert_eq!(item["arguments"], r#"{"text":"hi"}"#);
    assert_eq!(item["status"], "completed");
    assert_eq!(ev[6].1["response"]["status"], "completed");
    assert_eq!(ev[6].1["response"]["output"][0], *item);
    assert_eq!(ev[6].1["response"]["usage"]["total_tokens"], 15);

    let ev = parse_sse(
        &post(&server, "/v1/responses", body.clone())
            .await
            .text()
            .await
            .unwrap(),
    );
    let item = &ev[5].1["item"];
    assert_eq!(item["name"], "exec_command");
    assert!(item.get("namespace").is_none());

    let ev = parse_sse(
        &post(&server, "/v1/responses", body)
            .await
            .text()
            .await
            .unwrap(),
    );
    assert_eq!(
        names(&ev),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    assert_eq!(ev[4].1["delta"], "do");
    assert_eq!(ev[5].1["delta"], "ne");
    assert_eq!(ev[8].1["item"]["content"][0]["text"], "done");
    assert_eq!(ev[9].1["response"]["output"][0]["role"], "assistant");
}

#[tokio::test]
async fn chat_tool_calls_and_text_with_finish_reason() {
    let server =
        FakeModel::start_with_script([Step::tool_call("send_message", json!({"text":"hi"}))])
            .unwrap();
    let mut body = with_tools(Api::Chat, user_body(Api::Chat, "hi"));
    body["stream_options"] = json!({"include_usage": true});
    let text = post(&server, "/v1/chat/completions", body.clone())
        .await
        .text()
        .await
        .unwrap();
    let ev = parse_sse(&text);
    assert!(ev.iter().all(|(n, _)| n.is_none()));
    assert_eq!(ev.len(), 6, "{text}");
    assert_eq!(ev[0].1["choices"][0]["delta"]["role"], "assistant");
    let call = &ev[1].1["choices"][0]["delta"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "nanoclaw_send_message");
    assert_eq!(call["index"], 0);
    assert_eq!(call["type"], "function");
    assert_eq!(
        ev[2].1["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"],
        r#"{"text":"hi"}"#
    );
    assert_eq!(ev[3].1["choices"][0]["finish_reason"], "tool_calls");
    for (_, e) in &ev[..4] {
        assert_eq!(e["object"], "chat.completion.chunk");
        assert!(
            e["choices"][0].get("finish_reason").is_some(),
            "finish_reason always present"
        );
    }
    assert_eq!(ev[4].1["usage"]["total_tokens"], 15);
    assert_eq!(ev[5].1, "[DONE]");

    // Script empty: default text, no usage chunk without include_usage.
    server.set_default_text("fin");
    body.as_object_mut().unwrap().remove("stream_options");
    let ev = parse_sse(
        &post(&server, "/v1/chat/completions", body)
            .await
            .text()
            .await
            .unwrap(),
    );
    assert_eq!(ev.len(), 4);
    assert_eq!(ev[1].1["choices"][0]["delta"]["content"], "fin");
    assert_eq!(ev[2].1["choices"][0]["finish_reason"], "stop");
    assert_eq!(ev[3].1, "[DONE]");
    assert_eq!(server.requests()[1].reply, ReplyKind::Default);
}

#[tokio::test]
async fn title_requests_consume_no_step_but_toolless_requests_do() {
    let server = FakeModel::start_with_script([Step::text("first"), Step::text("second")]).unwrap();
    let title = json!({"model":"m","stream":true,"messages":[
            {"role":"system","content":"You are a title generator. You output ONLY a thread title."},
            {"role":"user","content":"hello"}]});
    let ev = parse_sse(
        &post(&server, "/v1/chat/completions", title)
            .await
            .text()
            .await
            .unwrap(),
    );
    assert_eq!(ev[1].1["choices"][0]["delta"]["content"], TITLE_TEXT);
    assert_eq!(server.remaining_steps(), 2);
    // No tools and no title prompt (e.g. claude --tools ""): consumes a step.
    let mut plain = user_body(Api::Anthropic, "hi");
    plain["stream"] = json!(true);
    let ev = parse_sse(
        &post(&server, "/v1/messages", plain)
            .await
            .text()
            .await
            .unwrap(),
    );
    assert_eq!(ev[2].1["delta"]["text"], "first");
    assert_eq!(server.remaining_steps(), 1);
    let log = server.requests();
    assert_eq!(log[0].reply, ReplyKind::Title);
    assert!(log[0].is_title_request());
    assert_eq!(log[1].reply, ReplyKind::Step(0));
    assert_eq!(server.model_requests().len(), 1);
    assert_eq!(server.requests_for(Api::Chat).len(), 1);
    let log = server
        .wait_for_model_requests(1, Duration::from_secs(1))
        .unwrap();
    assert_eq!(log.len(), 2);
    assert!(server
        .wait_for_model_requests(2, Duration::from_millis(30))
        .is_err());
}

#[tokio::test]
async fn errors_have_status_headers_and_api_shapes() {
    let server = FakeModel::start().unwrap();
    for api in BODY_MODEL_APIS {
        server.push(
            Step::error(429, "slow down")
                .retry_after_secs(3)
                .retry_after_ms(50),
        );
        let resp = post(&server, api.path(), with_tools(api, user_body(api, "x"))).await;
        assert_eq!(resp.status(), 429);
        assert_eq!(resp.headers()["retry-after"], "3");
        assert_eq!(resp.headers()["retry-after-ms"], "50");
        assert_eq!(resp.headers()["content-type"], "application/json");
        let body: Value = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
        assert_eq!(body["error"]["message"], "slow down");
        match api {
            Api::Anthropic => {
                assert_eq!(body["type"], "error");
                assert_eq!(body["error"]["type"], "rate_limit_error");
            }
            _ => assert_eq!(body["error"]["code"], "rate_limit_exceeded"),
        }
    }
    server.push(Step::error(529, "busy"));
    let resp = post(
        &server,
        "/v1/messages",
        with_tools(Api::Anthropic, user_body(Api::Anthropic, "x")),
    )
    .await;
    assert_eq!(resp.status().as_u16(), 529);
    assert!(resp.headers().get("retry-after").is_none());
    let body: Value = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
    assert_eq!(body["error"]["type"], "overloaded_error");
    server.push(Step::error(400, "x").body(json!({"custom":true})));
    let resp = post(
        &server,
        "/v1/responses",
        with_tools(Api::Responses, user_body(Api::Responses, "x")),
    )
    .await;
    assert_eq!(resp.status(), 400);
    assert_eq!(resp.text().await.unwrap(), r#"{"custom":true}"#);
    assert_eq!(server.completed_replies(), 0, "errors are not replies");
}

#[tokio::test]
async fn hang_after_first_event_until_released() {
    let server = FakeModel::start_with_script([Step::hang()]).unwrap();
    server.set_default_text("after release");
    let mut resp = post(
        &server,
        "/v1/messages",
        with_tools(Api::Anthropic, user_body(Api::Anthropic, "x")),
    )
    .await;
    let first = resp.chunk().await.unwrap().unwrap();
    let first = String::from_utf8_lossy(&first).into_owned();
    assert!(first.starts_with("event: message_start\n"), "{first}");
    let more = tokio::time::timeout(Duration::from_millis(300), resp.chunk()).await;
    assert!(more.is_err(), "stream must hang after the first event");
    assert_eq!(
        server.completed_replies(),
        0,
        "a hanging reply is not complete"
    );
    let t = Instant::now();
    server.release_hangs();
    let mut rest = String::new();
    while let Some(c) = resp.chunk().await.unwrap() {
        rest.push_str(&String::from_utf8_lossy(&c));
    }
    assert!(t.elapsed() < Duration::from_secs(2));
    assert!(rest.contains(r#""text":"after release""#), "{rest}");
    assert!(rest.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"));
    assert_eq!(server.completed_replies(), 1);
}

#[tokio::test]
async fn hang_before_response_and_timeout() {
    let server =
        FakeModel::start_with_script([Step::hang_before_response(), Step::hang().timeout_ms(200)])
            .unwrap();
    let body = with_tools(Api::Chat, user_body(Api::Chat, "x"));
    let pending = tokio::spawn(post_owned(server.url(), body.clone()));
    server
        .wait_for_requests_async(1, Duration::from_secs(5))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!pending.is_finished(), "no response headers before release");
    server.release_hangs();
    let text = pending.await.unwrap();
    assert!(text.contains(r#""content":"ok""#), "{text}");
    // Timeout: completes by itself.
    let t = Instant::now();
    let text = post(&server, "/v1/chat/completions", body)
        .await
        .text()
        .await
        .unwrap();
    assert!(t.elapsed() >= Duration::from_millis(190));
    assert!(text.ends_with("data: [DONE]\n\n"));
}

async fn post_owned(url: String, body: Value) -> String {
    client()
        .post(format!("{url}/v1/chat/completions"))
        .body(body.to_string())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test]
async fn stall_delays_content_and_text_delay_between_chunks() {
    let server = FakeModel::start_with_script([
        Step::text("abcd").chunks(4).delay_ms(50).stalled(300),
        Step::error(503, "later").stalled(200),
    ])
    .unwrap();
    let body = with_tools(Api::Responses, user_body(Api::Responses, "x"));
    let t = Instant::now();
    let mut resp = post(&server, "/v1/responses", body.clone()).await;
    let first = resp.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("response.created"));
    assert!(
        t.elapsed() < Duration::from_millis(250),
        "headers and first event come at once"
    );
    let mut rest = String::new();
    while let Some(c) = resp.chunk().await.unwrap() {
        rest.push_str(&String::from_utf8_lossy(&c));
    }
    assert!(t.elapsed() >= Duration::from_millis(300 + 150));
    assert_eq!(rest.matches("response.output_text.delta\n").count(), 4);
    let t = Instant::now();
    let resp = post(&server, "/v1/responses", body).await;
    assert_eq!(resp.status(), 503);
    assert!(t.elapsed() >= Duration::from_millis(200));
}

#[tokio::test]
async fn drop_closes_mid_stream() {
    let server = FakeModel::start_with_script([
        Step::drop_connection(),
        Step::drop_before_first_event(),
        Step::text("after"),
    ])
    .unwrap();
    let body = with_tools(Api::Anthropic, user_body(Api::Anthropic, "x"));
    let mut resp = post(&server, "/v1/messages", body.clone()).await;
    let first = resp.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).starts_with("event: message_start"));
    assert!(
        resp.chunk().await.is_err(),
        "the body must end with an error"
    );

    let res = client()
        .post(format!("{}/v1/messages", server.url()))
        .body(body.to_string())
        .send()
        .await;
    // Either the body fails, or the request fails before the response head: both are drops.
    if let Ok(resp) = res {
        assert!(resp.text().await.is_err());
    }
    // The server keeps working.
    let text = post(&server, "/v1/messages", body)
        .await
        .text()
        .await
        .unwrap();
    assert!(text.contains(r#""text":"after""#));
    let whole: Vec<bool> = server.requests().iter().map(|r| r.sent_whole).collect();
    assert_eq!(whole, [false, false, true], "drops are not whole replies");
    assert_eq!(server.completed_replies(), 1);
}

#[tokio::test]
async fn non_stream_requests_get_json() {
    let server = FakeModel::start_with_script([
        Step::tool_call("send_message", json!({"text":"hi"})),
        Step::tool_call("send_message", json!({"text":"hi"})),
        Step::tool_call("send_message", json!({"text":"hi"})),
    ])
    .unwrap();
    let mut results = Vec::new();
    for api in BODY_MODEL_APIS {
        let mut body = with_tools(api, user_body(api, "x"));
        body["stream"] = json!(false);
        let resp = post(&server, api.path(), body).await;
        assert_eq!(resp.headers()["content-type"], "application/json");
        results.push(serde_json::from_str::<Value>(&resp.text().await.unwrap()).unwrap());
    }
    assert_eq!(
        results[0]["content"][0]["name"],
        "mcp__nanoclaw__send_message"
    );
    assert_eq!(results[0]["content"][0]["input"]["text"], "hi");
    assert_eq!(results[0]["stop_reason"], "tool_use");
    assert_eq!(results[1]["output"][0]["namespace"], "mcp__nanoclaw");
    assert_eq!(results[1]["status"], "completed");
    assert_eq!(
        results[2]["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "nanoclaw_send_message"
    );
    assert_eq!(results[2]["choices"][0]["finish_reason"], "tool_calls");
}

#[tokio::test]
async fn unknown_routes_are_404_and_logged() {
    let server = FakeModel::start().unwrap();
    let resp = client()
        .get(format!("{}/v1/models?x=1", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let resp = client()
        .get(format!("{}/v1/messages", server.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let log = server.unknown_requests();
    assert_eq!(log.len(), 2);
    assert_eq!(log[0].path, "/v1/models");
    assert_eq!(log[0].query.as_deref(), Some("x=1"));
    assert_eq!(log[0].method, "GET");
    assert_eq!(log[0].api, None);
    assert!(server.model_requests().is_empty());
}

#[tokio::test]
async fn log_helpers_read_each_api_shape() {
    let server = FakeModel::start().unwrap();
    let anthropic = json!({"model":"claude","stream":true,
            "system":[{"type":"text","text":"base prompt"},{"type":"text","text":"MARKER-SYS"}],
            "tools":[{"name":"mcp__nanoclaw__send_message","input_schema":{}}],
            "messages":[
                {"role":"user","content":[{"type":"text","text":"first"}]},
                {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"x","input":{}}]},
                {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1",
                    "content":[{"type":"text","text":"message sent"}]}]},
                {"role":"system","content":"The user sent a new message while you were working:\nfollow"}]});
    let responses = json!({"model":"gpt","stream":true,"instructions":"INSTR",
            "tools":[{"type":"namespace","name":"mcp__nanoclaw",
                      "tools":[{"type":"function","name":"send_message"}]}],
            "input":[
                {"type":"message","role":"developer","content":[{"type":"input_text","text":"DEV"}]},
                {"type":"message","role":"user","content":[{"type":"input_text","text":"<environment_context/>"}]},
                {"type":"message","role":"user","content":[{"type":"input_text","text":"hello codex"}]},
                {"type":"function_call","name":"send_message","namespace":"mcp__nanoclaw","call_id":"c","arguments":"{}"},
                {"type":"function_call_output","call_id":"c","output":[
                    {"type":"input_text","text":"Wall time: 0.1 seconds\nOutput:"},
                    {"type":"input_text","text":"message sent"}]}]});
    let chat = json!({"model":"oc","stream":true,
            "tools":[{"type":"function","function":{"name":"nanoclaw_send_message"}}],
            "messages":[
                {"role":"system","content":"OC SYSTEM"},
                {"role":"user","content":[{"type":"text","text":"hello oc"}]},
                {"role":"assistant","content":"","tool_calls":[{"id":"c","type":"function",
                    "function":{"name":"nanoclaw_send_message","arguments":"{}"}}]},
                {"role":"tool","tool_call_id":"c","content":"message sent"}]});
    post(&server, "/v1/messages?beta=true", anthropic)
        .await
        .text()
        .await
        .unwrap();
    post(&server, "/v1/responses", responses)
        .await
        .text()
        .await
        .unwrap();
    post(&server, "/v1/chat/completions", chat)
        .await
        .text()
        .await
        .unwrap();
    let log = server.wait_for_requests(3, Duration::from_secs(5)).unwrap();

    let a = &log[0];
    assert_eq!(
        a.system_text(),
        "base prompt\nMARKER-SYS\nThe user sent a new message while you were working:\nfollow"
    );
    assert_eq!(a.user_texts(), ["first"]);
    assert_eq!(a.last_user_text().as_deref(), Some("first"));
    assert_eq!(a.tool_results(), ["message sent"]);
    assert!(a.tail_is_tool_result());
    assert!(a.offers_mcp_tool("send_message"));
    assert_eq!(a.model(), Some("claude"));

    let r = &log[1];
    assert_eq!(r.system_text(), "INSTR\nDEV");
    assert_eq!(r.user_texts(), ["<environment_context/>", "hello codex"]);
    assert_eq!(r.last_user_text().as_deref(), Some("hello codex"));
    assert_eq!(
        r.tool_results(),
        ["Wall time: 0.1 seconds\nOutput:\nmessage sent"]
    );
    assert!(r.tail_is_tool_result());
    assert_eq!(r.tool_names(), ["mcp__nanoclaw__send_message"]);
    assert!(r.offers_mcp_tool("send_message"));

    let c = &log[2];
    assert_eq!(c.system_text(), "OC SYSTEM");
    assert_eq!(c.last_user_text().as_deref(), Some("hello oc"));
    assert_eq!(c.tool_results(), ["message sent"]);
    assert!(c.tail_is_tool_result());
    assert!(c.offers_mcp_tool("send_message"));
    assert!(!c.offers_mcp_tool("other"));
    assert!(c.is_stream());
    assert!(c.summary().contains("/v1/chat/completions"));
}

#[test]
fn wait_times_out_with_the_log() {
    let server = FakeModel::start().unwrap();
    let err = server
        .wait_for_requests(1, Duration::from_millis(50))
        .unwrap_err();
    assert!(err.got.is_empty());
    assert!(err.to_string().contains("timed out"));
}

#[tokio::test]
async fn shutdown_cuts_hung_streams_and_closes_the_port() {
    let server = FakeModel::start_with_script([Step::hang()]).unwrap();
    let url = server.url();
    let mut resp = post(
        &server,
        "/v1/messages",
        with_tools(Api::Anthropic, user_body(Api::Anthropic, "x")),
    )
    .await;
    resp.chunk().await.unwrap().unwrap();
    let t = Instant::now();
    tokio::task::spawn_blocking(move || server.shutdown())
        .await
        .unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "shutdown took {:?}",
        t.elapsed()
    );
    // The hung stream ends (completed or cut), and new connections are refused.
    tokio::time::timeout(Duration::from_secs(3), async {
        while let Ok(Some(_)) = resp.chunk().await {}
    })
    .await
    .unwrap();
    assert!(client()
        .post(format!("{url}/v1/messages"))
        .body("{}")
        .send()
        .await
        .is_err());
}

// ---- Gemini API -----------------------------------------------------------------------------

/// The streaming Gemini path for model `m`.
fn gemini_stream(model: &str) -> String {
    format!("{}?alt=sse", Api::Gemini.request_path(model, true))
}

/// The `data:` objects of a Gemini SSE body (events end with `\r\n\r\n`, as Google sends them).
fn gemini_chunks(body: &str) -> Vec<Value> {
    assert!(body.ends_with("\r\n\r\n"), "{body:?}");
    body.split("\r\n\r\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let data = e.strip_prefix("data: ").unwrap_or_else(|| panic!("{e:?}"));
            serde_json::from_str(data).unwrap()
        })
        .collect()
}

#[test]
fn gemini_paths_name_the_model_and_the_method() {
    assert_eq!(
        Api::from_path("/v1beta/models/gemini-x:streamGenerateContent"),
        Some(Api::Gemini)
    );
    assert_eq!(
        Api::from_path("/v1beta/models/m:generateContent"),
        Some(Api::Gemini)
    );
    for other in [
        "/v1beta/models/m:countTokens",
        "/v1beta/models/:generateContent",
        "/v1beta/models/a/b:generateContent",
        "/v1beta/models",
    ] {
        assert_eq!(Api::from_path(other), None, "{other}");
    }
    assert_eq!(Api::from_path("/v1/chat/completions"), Some(Api::Chat));
    assert_eq!(
        Api::Gemini.request_path("m", false),
        "/v1beta/models/m:generateContent"
    );
    assert_eq!(
        Api::Gemini.mcp_tool_name("send_message"),
        ("mcp_nanoclaw_send_message".to_owned(), None)
    );
}

#[tokio::test]
async fn gemini_text_and_calls_stream_as_generate_content_chunks() {
    let server = FakeModel::start_with_script([
        Step::text("hello gemini").chunks(2).usage(SAMPLE_USAGE),
        Step::reply([
            Step::text("calling"),
            Step::tool_call("send_message", json!({"text":"hi"})),
            Step::raw_tool_call("run_shell_command", json!({"command":"ls"})),
        ]),
    ])
    .unwrap();
    let body = with_tools(Api::Gemini, user_body(Api::Gemini, "x"));
    let text = post(&server, &gemini_stream("gm"), body.clone())
        .await
        .text()
        .await
        .unwrap();
    let chunks = gemini_chunks(&text);
    // The first event: an empty model content (what a hang sends before hanging).
    assert_eq!(
        chunks[0]["candidates"],
        json!([{"content":{"role":"model","parts":[]},"index":0}])
    );
    assert_eq!(chunks[0]["modelVersion"], "gm");
    let texts: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c.pointer("/candidates/0/content/parts/0/text")?.as_str())
        .collect();
    assert_eq!(texts, ["hello ", "gemini"]);
    let last = chunks.last().unwrap();
    assert_eq!(last["candidates"][0]["finishReason"], "STOP");
    assert_eq!(
        last["usageMetadata"],
        json!({"promptTokenCount":1500,"cachedContentTokenCount":300,
               "candidatesTokenCount":60,"thoughtsTokenCount":20,"totalTokenCount":1580})
    );
    assert!(chunks[..chunks.len() - 1]
        .iter()
        .all(|c| c.get("usageMetadata").is_none()
            && c["candidates"][0].get("finishReason").is_none()));

    let text = post(&server, &gemini_stream("gm"), body)
        .await
        .text()
        .await
        .unwrap();
    let parts: Vec<Value> = gemini_chunks(&text)
        .iter()
        .flat_map(|c| {
            c["candidates"][0]["content"]["parts"]
                .as_array()
                .cloned()
                .unwrap()
        })
        .collect();
    assert_eq!(
        parts,
        [
            json!({"text":"calling"}),
            json!({"functionCall":{"name":"mcp_nanoclaw_send_message","args":{"text":"hi"}}}),
            json!({"functionCall":{"name":"run_shell_command","args":{"command":"ls"}}}),
        ]
    );
    let log = server.requests();
    assert_eq!(log[0].api, Some(Api::Gemini));
    assert_eq!(log[0].model(), Some("gm"));
    assert!(log[0].is_stream());
    assert_eq!(log[0].query.as_deref(), Some("alt=sse"));
    assert_eq!(log[1].reply, ReplyKind::Step(1));
}

#[tokio::test]
async fn gemini_generate_content_errors_and_unknown_models() {
    let server = FakeModel::start_with_script([
        Step::tool_call("send_message", json!({"text":"hi"})),
        Step::error(429, "slow down").retry_after_secs(2),
    ])
    .unwrap();
    let body = with_tools(Api::Gemini, user_body(Api::Gemini, "x"));
    let resp = post(&server, &Api::Gemini.request_path("m", false), body.clone()).await;
    assert_eq!(resp.headers()["content-type"], "application/json");
    let json: Value = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
    assert_eq!(
        json["candidates"][0]["content"],
        json!({"role":"model","parts":[
            {"functionCall":{"name":"mcp_nanoclaw_send_message","args":{"text":"hi"}}}]})
    );
    assert_eq!(json["candidates"][0]["finishReason"], "STOP");
    assert_eq!(json["usageMetadata"]["promptTokenCount"], 10);
    assert!(!server.requests()[0].is_stream());

    let resp = post(&server, &gemini_stream("m"), body.clone()).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "2");
    let json: Value = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
    assert_eq!(
        json,
        json!({"error":{"code":429,"message":"slow down","status":"RESOURCE_EXHAUSTED"}})
    );

    server.set_known_models(Some(["m"]));
    server.push(Step::text("kept"));
    let resp = post(&server, &gemini_stream("nope-1"), body).await;
    assert_eq!(resp.status(), 404);
    let json: Value = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
    assert_eq!(json["error"]["status"], "NOT_FOUND");
    assert!(json["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("models/nope-1 is not found"));
    assert_eq!(server.remaining_steps(), 1);
}

/// Gemini CLI's side requests (no tools, JSON asked for with a schema) and an OpenAI-style one
/// get schema-shaped JSON and consume no step.
#[tokio::test]
async fn structured_requests_get_schema_shaped_json_and_consume_no_step() {
    let server = FakeModel::start_with_script([Step::text("scripted")]).unwrap();
    let next_speaker = json!({"type":"object","properties":{
        "reasoning":{"type":"string"},
        "next_speaker":{"type":"string","enum":["user","model"]}},
        "required":["reasoning","next_speaker"]});
    let body = json!({"contents":[{"role":"user","parts":[{"text":"who next?"}]}],
        "generationConfig":{"responseMimeType":"application/json",
                            "responseJsonSchema": next_speaker}});
    let resp = post(&server, &Api::Gemini.request_path("m", false), body).await;
    let json: Value = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
    let text = json["candidates"][0]["content"]["parts"][0]["text"]
        .as_str()
        .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(text).unwrap(),
        json!({"next_speaker":"user","reasoning":"fake"})
    );
    // Google's upper-case `responseSchema` types.
    let body = json!({"contents":[{"role":"user","parts":[{"text":"route"}]}],
        "generationConfig":{"responseMimeType":"application/json","responseSchema":{
            "type":"OBJECT","properties":{"choice":{"type":"STRING","enum":["flash","pro"]},
            "n":{"type":"INTEGER"},"tags":{"type":"ARRAY","minItems":1,
            "items":{"type":"STRING"}}}}}});
    let text = post(&server, &gemini_stream("m"), body)
        .await
        .text()
        .await
        .unwrap();
    let chunks = gemini_chunks(&text);
    let text = chunks
        .iter()
        .find_map(|c| c.pointer("/candidates/0/content/parts/0/text")?.as_str())
        .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(text).unwrap(),
        json!({"choice":"flash","n":0,"tags":["fake"]})
    );
    // Chat Completions with a json_schema response format.
    let body = json!({"model":"m","stream":false,
        "messages":[{"role":"user","content":"classify"}],
        "response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{
            "type":"object","properties":{"ok":{"type":"boolean"}}}}}});
    let json: Value = serde_json::from_str(
        &post(&server, "/v1/chat/completions", body)
            .await
            .text()
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        json["choices"][0]["message"]["content"],
        json!({"ok":false}).to_string()
    );
    // Qwen Code's side query: one tool to answer with, called with the JSON.
    let body = json!({"model":"m","stream":false,"tool_choice":"required",
        "messages":[{"role":"user","content":"allow?"}],
        "tools":[{"type":"function","function":{"name":"respond_in_schema","parameters":{
            "type":"object","properties":{"shouldBlock":{"type":"boolean"}},
            "required":["shouldBlock"]}}}]});
    let json: Value = serde_json::from_str(
        &post(&server, "/v1/chat/completions", body)
            .await
            .text()
            .await
            .unwrap(),
    )
    .unwrap();
    let call = &json["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "respond_in_schema");
    assert_eq!(call["arguments"], json!({"shouldBlock":false}).to_string());
    assert_eq!(server.remaining_steps(), 1, "no step consumed");
    let kinds: Vec<ReplyKind> = server.requests().into_iter().map(|r| r.reply).collect();
    assert_eq!(kinds, vec![ReplyKind::Structured; 4]);
    assert!(server.model_requests().is_empty());
}

#[tokio::test]
async fn gemini_log_helpers_read_contents_and_function_responses() {
    let server = FakeModel::start().unwrap();
    let body = json!({
        "systemInstruction":{"parts":[{"text":"You are Gemini CLI"}]},
        "tools":[{"functionDeclarations":[{"name":"run_shell_command"},
                                           {"name":"mcp_nanoclaw_send_message"}]}],
        "contents":[
            {"role":"user","parts":[{"text":"<session_context/>"},{"text":"hello gemini"}]},
            {"role":"model","parts":[{"functionCall":{"name":"run_shell_command","args":{}}}]},
            {"role":"user","parts":[{"functionResponse":{"name":"run_shell_command",
                "response":{"output":"fake-tool-42"}}}]}]});
    post(&server, &gemini_stream("gm"), body)
        .await
        .text()
        .await
        .unwrap();
    let r = &server.requests()[0];
    assert_eq!(r.system_text(), "You are Gemini CLI");
    assert_eq!(r.user_texts(), ["<session_context/>\nhello gemini"]);
    assert_eq!(
        r.tool_names(),
        ["run_shell_command", "mcp_nanoclaw_send_message"]
    );
    assert!(r.offers_mcp_tool("send_message"));
    assert_eq!(r.tool_results(), [r#"{"output":"fake-tool-42"}"#]);
    assert!(r.tail_is_tool_result());
    assert_eq!(r.reply, ReplyKind::Default);
}

#[test]
fn qwen_mcp_calls_go_through_its_tool_call_tool() {
    assert_eq!(
        Step::qwen_mcp_call("send_message", json!({"text":"hi"})),
        Step::raw_tool_call(
            "tool_call",
            json!({"name":"mcp__nanoclaw__send_message","arguments":{"text":"hi"}})
        )
    );
}
