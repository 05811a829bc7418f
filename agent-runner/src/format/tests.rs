use super::*;
use expect_test::{expect, Expect};
use serde_json::json;

/// One row of a test batch; `check` turns it into a `MessageIn` and a `PromptRow`.
struct Input {
    seq: i64,
    kind: &'static str,
    timestamp: &'static str,
    content: String,
    routing: Routing,
    process_after: Option<&'static str>,
    attachments: Vec<AttachmentNote>,
    script_output: Option<Value>,
}

fn input(seq: i64, kind: &'static str, timestamp: &'static str, content: Value) -> Input {
    raw_input(seq, kind, timestamp, &content.to_string())
}

fn raw_input(seq: i64, kind: &'static str, timestamp: &'static str, content: &str) -> Input {
    Input {
        seq,
        kind,
        timestamp,
        content: content.to_owned(),
        routing: Routing::default(),
        process_after: None,
        attachments: Vec::new(),
        script_output: None,
    }
}

fn chat(seq: i64, timestamp: &'static str, sender: &str, text: &str) -> Input {
    input(
        seq,
        "chat",
        timestamp,
        json!({"sender": sender, "senderId": "U1", "text": text}),
    )
}

impl Input {
    fn routed(mut self, channel_type: &str, platform_id: &str) -> Self {
        self.routing = Routing {
            channel_type: Some(channel_type.to_owned()),
            platform_id: Some(platform_id.to_owned()),
            thread_id: Some("t1".to_owned()),
        };
        self
    }
    fn with_attachments(mut self, notes: Vec<AttachmentNote>) -> Self {
        self.attachments = notes;
        self
    }
}

fn destinations() -> Vec<Destination> {
    vec![
        Destination {
            name: "slack-main".to_owned(),
            display_name: Some("Slack #main".to_owned()),
            kind: "channel".to_owned(),
            channel_type: Some("slack".to_owned()),
            platform_id: Some("C123".to_owned()),
            agent_group_id: None,
        },
        Destination {
            name: "researcher".to_owned(),
            display_name: None,
            kind: "agent".to_owned(),
            channel_type: None,
            platform_id: None,
            agent_group_id: Some("grp-research".to_owned()),
        },
    ]
}

/// The stored row an input stands for.
fn message(i: &Input) -> MessageIn {
    MessageIn {
        id: format!("msg-{}", i.seq),
        seq: Some(i.seq),
        kind: i.kind.to_owned(),
        timestamp: i.timestamp.to_owned(),
        status: "processing".to_owned(),
        status_changed: None,
        process_after: i.process_after.map(str::to_owned),
        recurrence: None,
        series_id: None,
        tries: 1,
        trigger: true,
        routing: i.routing.clone(),
        content: i.content.clone(),
        source_session_id: None,
        on_wake: false,
    }
}

/// Formats `inputs` as one batch in `tz` with the test destinations.
fn check_in(tz: Tz, inputs: Vec<Input>, expect: Expect) {
    let rows: Vec<MessageIn> = inputs.iter().map(message).collect();
    let prompt_rows: Vec<PromptRow<'_>> = rows
        .iter()
        .zip(inputs)
        .map(|(row, i)| PromptRow {
            row,
            content: InboundContent::parse(&row.kind(), &row.content),
            attachments: i.attachments,
            script_output: i.script_output,
        })
        .collect();
    let destinations = destinations();
    let ctx = FormatContext {
        timezone: tz,
        destinations: &destinations,
    };
    expect.assert_eq(&format_prompt(&prompt_rows, &ctx));
}

/// One row formatted alone, in UTC, with no destinations (for assertions on size).
fn format_alone(message: &MessageIn) -> String {
    let prompt_row = PromptRow {
        row: message,
        content: InboundContent::parse(&message.kind(), &message.content),
        attachments: Vec::new(),
        script_output: None,
    };
    let ctx = FormatContext {
        timezone: Tz::UTC,
        destinations: &[],
    };
    format_prompt(&[prompt_row], &ctx)
}

fn check(inputs: Vec<Input>, expect: Expect) {
    check_in(Tz::America__Los_Angeles, inputs, expect);
}

#[test]
fn single_chat_is_bare() {
    check(
        vec![chat(2, "2026-02-04T18:00:00.000Z", "John", "Check this PR")],
        expect![[r#"
            <context timezone="America/Los_Angeles" />
            <message id="2" sender="John" time="Feb 4, 2026, 10:00 AM">Check this PR</message>"#]],
    );
}

#[test]
fn spec_example() {
    let reply = input(
        4,
        "chat",
        "2026-02-04T18:01:00.000Z",
        json!({
            "sender": "Jane", "senderId": "U2", "text": "Already on it",
            "replyTo": {"id": "2", "sender": "John", "text": "Check this PR"},
        }),
    )
    .with_attachments(vec![AttachmentNote::Available {
        path: "/workspace/downloads/msg-4/data.xlsx".to_owned(),
    }]);
    check(
        vec![
            chat(2, "2026-02-04T18:00:00.000Z", "John", "Check this PR").routed("slack", "C123"),
            reply,
        ],
        expect![[r#"
            <context timezone="America/Los_Angeles" />
            <messages>
            <message id="2" from="slack-main" sender="John" time="Feb 4, 2026, 10:00 AM">Check this PR</message>
            <message id="4" sender="Jane" time="Feb 4, 2026, 10:01 AM" reply_to="2">
              <quoted_message from="John">Check this PR</quoted_message>
            Already on it
            [file available at: /workspace/downloads/msg-4/data.xlsx]</message>
            </messages>"#]],
    );
}

#[test]
fn batch_of_three_with_multiline_text() {
    check(
        vec![
            chat(2, "2026-02-04T18:00:00.000Z", "John", "one"),
            chat(4, "2026-02-04T18:00:30.000Z", "Jane", "two\nlines"),
            chat(6, "2026-02-04T21:30:00.000Z", "John", "three"),
        ],
        expect![[r#"
            <context timezone="America/Los_Angeles" />
            <messages>
            <message id="2" sender="John" time="Feb 4, 2026, 10:00 AM">one</message>
            <message id="4" sender="Jane" time="Feb 4, 2026, 10:00 AM">two
            lines</message>
            <message id="6" sender="John" time="Feb 4, 2026, 1:30 PM">three</message>
            </messages>"#]],
    );
}

#[test]
fn a_quote_without_text_is_left_out_and_reply_to_kept() {
    check(
        vec![
            input(
                4,
                "chat",
                "2026-02-04T18:00:00Z",
                json!({"sender": "Jane", "text": "agreed", "replyTo": {"id": "2", "sender": "Otto"}}),
            ),
            input(
                6,
                "chat",
                "2026-02-04T18:01:00Z",
                json!({"sender": "Jane", "text": "same", "replyTo": {"id": "3", "sender": "Otto", "text": "  "}}),
            ),
        ],
        expect![[r#"
            <context timezone="America/Los_Angeles" />
            <messages>
            <message id="4" sender="Jane" time="Feb 4, 2026, 10:00 AM" reply_to="2">agreed</message>
            <message id="6" sender="Jane" time="Feb 4, 2026, 10:01 AM" reply_to="3">same</message>
            </messages>"#]],
    );
}

#[test]
fn reply_to_without_id_or_sender() {
    check(
        vec![input(
            2,
            "chat",
            "2026-02-04T18:00:00Z",
            json!({"sender": "Jane", "text": "yes", "replyTo": {"text": "ok?"}}),
        )],
        expect![[r#"
            <context timezone="America/Los_Angeles" />
            <message id="2" sender="Jane" time="Feb 4, 2026, 10:00 AM">
              <quoted_message>ok?</quoted_message>
            yes</message>"#]],
    );
}

#[test]
fn attachments_available_and_unavailable() {
    check(
        vec![
            chat(2, "2026-02-04T18:00:00Z", "John", "see files").with_attachments(vec![
                AttachmentNote::Available {
                    path: "/workspace/downloads/msg-2/a.png".to_owned(),
                },
                AttachmentNote::Unavailable {
                    name: "big.zip".to_owned(),
                    reason: "larger than 20 MB".to_owned(),
                },
            ]),
            // An attachment with no text: the note is the whole body.
            chat(4, "2026-02-04T18:00:00Z", "John", "").with_attachments(vec![
                AttachmentNote::Unavailable {
                    name: "x.pdf".to_owned(),
                    reason: "not downloaded".to_owned(),
                },
            ]),
        ],
        expect![[r#"
            <context timezone="America/Los_Angeles" />
            <messages>
            <message id="2" sender="John" time="Feb 4, 2026, 10:00 AM">see files
            [file available at: /workspace/downloads/msg-2/a.png]
            [attachment unavailable: big.zip — larger than 20 MB]</message>
            <message id="4" sender="John" time="Feb 4, 2026, 10:00 AM">[attachment unavailable: x.pdf — not downloaded]</message>
            </messages>"#]],
    );
}

#[test]
fn escaping() {
    let row = input(
        2,
        "chat",
        "2026-02-04T18:00:00Z",
        json!({
            "sender": "Tom \"T\" & <co>",
            "text": "if a < b && c > d then \"yes\" isn't </message><message id=\"9\">",
            "replyTo": {"id": "1\"", "sender": "<bot>", "text": "a & b"},
        }),
    )
    .with_attachments(vec![AttachmentNote::Unavailable {
        name: "<evil>&\".txt".to_owned(),
        reason: "x".to_owned(),
    }]);
    check(
        vec![row],
        expect![[r#"
            <context timezone="America/Los_Angeles" />
            <message id="2" sender="Tom &quot;T&quot; &amp; &lt;co&gt;" time="Feb 4, 2026, 10:00 AM" reply_to="1&quot;">
              <quoted_message from="&lt;bot&gt;">a &amp; b</quoted_message>
            if a &lt; b &amp;&amp; c &gt; d then &quot;yes&quot; isn't &lt;/message&gt;&lt;message id=&quot;9&quot;&gt;
            [attachment unavailable: &lt;evil&gt;&amp;&quot;.txt — x]</message>"#]],
    );
}

#[test]
fn chat_sdk_message() {
    let full = input(
        2,
        "chat-sdk",
        "2026-02-04T18:00:00Z",
        json!({
            "_type": "chat:Message", "id": "m1", "threadId": "t1", "text": "hello from sdk",
            "author": {"userId": "U9", "userName": "jdoe", "fullName": "Jane Doe",
                       "isBot": false, "isMe": false},
            "metadata": {"dateSent": "2026-02-04T18:00:00Z", "edited": false},
            "attachments": [], "isMention": true,
        }),
    )
    .with_attachments(vec![AttachmentNote::Available {
        path: "/workspace/downloads/msg-2/pic.jpg".to_owned(),
    }]);
    let handle_only = input(
        4,
        "chat-sdk",
        "2026-02-04T18:05:00Z",
        json!({"text": "only a handle", "author": {"userName": "bob", "fullName": ""}}),
    );
    check(
        vec![full, handle_only],
        expect![[r#"
            <context timezone="America/Los_Angeles" />
            <messages>
            <message id="2" sender="Jane Doe" time="Feb 4, 2026, 10:00 AM">hello from sdk
            [file available at: /workspace/downloads/msg-2/pic.jpg]</message>
            <message id="4" sender="bob" time="Feb 4, 2026, 10:05 AM">only a handle</message>
            </messages>"#]],
    );
}

#[test]
fn task_without_script_output() {
    let mut task = input(
        2,
        "task",
        "2026-02-01T00:00:00Z",
        json!({"prompt": "Summarise the inbox & reply"}),
    );
    task.process_after = Some("2026-02-04T17:00:00.000Z");
    check(
        vec![task],
        expect![[r#"
            <context timezone="America/Los_Angeles" />
            <task time="Feb 4, 2026, 9:00 AM">Summarise the inbox &amp; reply</task>"#]],
    );
}

#[test]
fn task_with_script_output() {
    let mut task = input(
        2,
        "task",
        "2026-02-04T17:00:00Z",
        json!({"prompt": "Comment on new PRs", "script": "gh pr list --json number"}),
    );
    task.script_output = Some(json!({"prs": [{"number": 7, "title": "a < b"}]}));
    check(
        vec![task],
        expect![[r#"
            <context timezone="America/Los_Angeles" />
            <task time="Feb 4, 2026, 9:00 AM">Script output:
            {
              "prs": [
                {
                  "number": 7,
                  "title": "a &lt; b"
                }
              ]
            }

            Instructions:
            Comment on new PRs</task>"#]],
    );
}

#[test]
fn webhook() {
    check(
        vec![input(
            2,
            "webhook",
            "2026-02-04T18:00:00Z",
            json!({"source": "github", "event": "pull_request",
                   "payload": {"action": "opened", "number": 12}}),
        )],
        expect![[r#"
            <context timezone="America/Los_Angeles" />
            <webhook source="github" event="pull_request">{
              "action": "opened",
              "number": 12
            }</webhook>"#]],
    );
}

#[test]
fn system_action_result_and_question_answers() {
    check(
        vec![
            input(
                2,
                "system",
                "2026-02-04T18:00:00Z",
                json!({"action": "register_agent_group", "status": "success",
                       "result": {"folder": "research"}}),
            ),
            input(
                4,
                "system",
                "2026-02-04T18:00:00Z",
                json!({"type": "question_response", "questionId": "q-1",
                       "selectedOption": "ship", "userId": "U1"}),
            ),
            input(
                6,
                "system",
                "2026-02-04T18:00:00Z",
                json!({"action": "query_error", "message": "no result field"}),
            ),
            // A chat row that answers a question with no text shows the chosen option.
            input(
                8,
                "chat",
                "2026-02-04T18:00:00Z",
                json!({"sender": "Jane", "senderId": "U2", "text": "",
                       "questionId": "q-2", "selectedOption": "later"}),
            ),
        ],
        expect![[r#"
            <context timezone="America/Los_Angeles" />
            <message id="8" sender="Jane" time="Feb 4, 2026, 10:00 AM">later</message>
            <system_response action="register_agent_group" status="success">{
              "folder": "research"
            }</system_response>
            <system_response action="question_response" question_id="q-1" user_id="U1">Selected option: ship</system_response>
            <system_response action="query_error">{
              "message": "no result field"
            }</system_response>"#]],
    );
}

#[test]
fn mixed_batch_puts_chats_first() {
    check(
        vec![
            input(
                2,
                "webhook",
                "2026-02-04T18:00:00Z",
                json!({"source": "github", "event": "push", "payload": {"ref": "main"}}),
            ),
            chat(4, "2026-02-04T18:01:00Z", "John", "first"),
            input(6, "task", "2026-02-04T18:02:00Z", json!({"prompt": "tidy"})),
            chat(8, "2026-02-04T18:03:00Z", "Jane", "second"),
        ],
        expect![[r#"
            <context timezone="America/Los_Angeles" />
            <messages>
            <message id="4" sender="John" time="Feb 4, 2026, 10:01 AM">first</message>
            <message id="8" sender="Jane" time="Feb 4, 2026, 10:03 AM">second</message>
            </messages>
            <webhook source="github" event="push">{
              "ref": "main"
            }</webhook>
            <task time="Feb 4, 2026, 10:02 AM">tidy</task>"#]],
    );
}

#[test]
fn one_chat_among_others_is_bare() {
    check(
        vec![
            input(2, "task", "2026-02-04T18:02:00Z", json!({"prompt": "tidy"})),
            chat(4, "2026-02-04T18:03:00Z", "Jane", "hi"),
        ],
        expect![[r#"
            <context timezone="America/Los_Angeles" />
            <message id="4" sender="Jane" time="Feb 4, 2026, 10:03 AM">hi</message>
            <task time="Feb 4, 2026, 10:02 AM">tidy</task>"#]],
    );
}

#[test]
fn new_york_header_and_dst() {
    check_in(
        Tz::America__New_York,
        vec![
            // 2026-03-08: 2:00 AM EST jumps to 3:00 AM EDT.
            chat(2, "2026-03-08T06:59:00Z", "a", "before spring"),
            chat(4, "2026-03-08T07:00:00Z", "a", "after spring"),
            // 2026-11-01: 2:00 AM EDT falls back to 1:00 AM EST; 1:30 happens twice.
            chat(6, "2026-11-01T05:30:00Z", "a", "first 1:30"),
            chat(8, "2026-11-01T06:30:00Z", "a", "second 1:30"),
        ],
        expect![[r#"
            <context timezone="America/New_York" />
            <messages>
            <message id="2" sender="a" time="Mar 8, 2026, 1:59 AM">before spring</message>
            <message id="4" sender="a" time="Mar 8, 2026, 3:00 AM">after spring</message>
            <message id="6" sender="a" time="Nov 1, 2026, 1:30 AM">first 1:30</message>
            <message id="8" sender="a" time="Nov 1, 2026, 1:30 AM">second 1:30</message>
            </messages>"#]],
    );
}

#[test]
fn los_angeles_dst_and_other_timestamp_forms() {
    check(
        vec![
            chat(2, "2026-03-08T09:59:00.000Z", "a", "PST"),
            chat(4, "2026-03-08T10:00:00.000Z", "a", "PDT"),
            // SQLite's form is UTC (1:00 AM PDT); an offset is honoured (1:30 AM PST, after
            // the clocks fell back at 09:00 UTC).
            chat(6, "2026-11-01 08:00:00", "a", "sqlite form"),
            chat(8, "2026-11-01T12:30:00+03:00", "a", "offset"),
            chat(10, "2026-11-01T10:00:00Z", "a", "after fall back"),
        ],
        expect![[r#"
            <context timezone="America/Los_Angeles" />
            <messages>
            <message id="2" sender="a" time="Mar 8, 2026, 1:59 AM">PST</message>
            <message id="4" sender="a" time="Mar 8, 2026, 3:00 AM">PDT</message>
            <message id="6" sender="a" time="Nov 1, 2026, 1:00 AM">sqlite form</message>
            <message id="8" sender="a" time="Nov 1, 2026, 1:30 AM">offset</message>
            <message id="10" sender="a" time="Nov 1, 2026, 2:00 AM">after fall back</message>
            </messages>"#]],
    );
}

#[test]
fn unparsable_content_reads_as_text() {
    check(
        vec![
            raw_input(2, "chat", "2026-02-04T18:00:00Z", "{not json <b>"),
            // JSON but not an object, and a kind that is not a chat: labelled.
            raw_input(4, "task", "2026-02-04T18:00:00Z", r#"["prompt", 5]"#),
        ],
        expect![[r#"
            <context timezone="America/Los_Angeles" />
            <messages>
            <message id="2" time="Feb 4, 2026, 10:00 AM">{not json &lt;b&gt;</message>
            <message id="4" kind="task" time="Feb 4, 2026, 10:00 AM">[&quot;prompt&quot;, 5]</message>
            </messages>"#]],
    );
}

#[test]
fn unparsable_content_shows_no_base64() {
    let blob = "iVBORw0KGgo+".repeat(50);
    check(
        vec![
            // Cut off inside the data: not JSON.
            raw_input(
                2,
                "chat",
                "2026-02-04T18:00:00Z",
                &format!(r#"{{"sender":"Ann","attachments":[{{"name":"a.png","data":"{blob}"#),
            ),
            // JSON, but not an object.
            input(
                4,
                "chat",
                "2026-02-04T18:00:00Z",
                json!([{"text": "hi", "data": blob}]),
            ),
            raw_input(
                6,
                "chat",
                "2026-02-04T18:00:00Z",
                &format!("data:image/png;base64,{blob} and then words"),
            ),
        ],
        expect![[r#"
            <context timezone="America/Los_Angeles" />
            <messages>
            <message id="2" time="Feb 4, 2026, 10:00 AM">{&quot;sender&quot;:&quot;Ann&quot;,&quot;attachments&quot;:[{&quot;name&quot;:&quot;a.png&quot;,&quot;data&quot;:&quot;[base64 data left out: 600 characters]</message>
            <message id="4" time="Feb 4, 2026, 10:00 AM">[{&quot;data&quot;:&quot;[base64 data left out: 600 characters]&quot;,&quot;text&quot;:&quot;hi&quot;}]</message>
            <message id="6" time="Feb 4, 2026, 10:00 AM">data:image/png;base64,[base64 data left out: 600 characters] and then words</message>
            </messages>"#]],
    );
}

#[test]
fn long_unparsable_content_is_capped() {
    let raw = "word ".repeat(2000);
    let message = message(&raw_input(2, "chat", "2026-02-04T18:00:00Z", &raw));
    let prompt = format_alone(&message);
    assert!(prompt.len() < 4096 + 200, "{} bytes", prompt.len());
    expect!["rd word word word w… [5904 more bytes not shown]</message>"]
        .assert_eq(&prompt[prompt.len() - 60..]);
}

#[test]
fn base64_runs_are_left_out() {
    let line = "QUJD".repeat(19);
    let wrapped = format!("before {line}\n{line}\r\n{line}\nQUJD= after");
    let escaped = format!(r#"{{"data":"{line}\n{line}"}}"#);
    expect![[r#"
        [
            "before [base64 data left out: 237 characters] after",
            "{\"data\":\"[base64 data left out: 154 characters]\"}",
        ]
    "#]]
    .assert_debug_eq(&[omit_base64(&wrapped), omit_base64(&escaped)]);
    // Text stays: a list of words one per line, a hash, a URL.
    let words = "apple\nbanana\n".repeat(20);
    let hash = "0123456789abcdef".repeat(4);
    let url = "https://example.com/a/b/c?sig=0123456789abcdef0123456789abcdef";
    for text in [words.as_str(), &hash, url] {
        assert!(matches!(omit_base64(text), Cow::Borrowed(_)), "{text}");
    }
}

/// A field of an unexpected type is coerced or dropped; the rest of the row stands.
#[test]
fn fields_of_unexpected_types_keep_the_message() {
    check(
        vec![
            input(
                2,
                "chat",
                "2026-02-04T18:00:00Z",
                json!({"sender": "Ann", "text": "see file", "attachments": [
                    {"name": 5, "mimeType": 7, "size": "12", "data": "aGk="}]}),
            )
            .with_attachments(vec![AttachmentNote::Available {
                path: "/workspace/downloads/msg-2/5".to_owned(),
            }]),
            input(
                4,
                "chat",
                "2026-02-04T18:00:00Z",
                json!({"sender": 42, "text": {"rich": true},
                       "replyTo": {"id": 3, "sender": "Bob", "text": 9}}),
            ),
            raw_input(6, "task", "2026-02-04T18:00:00Z", r#"{"prompt": 5}"#),
        ],
        expect![[r#"
            <context timezone="America/Los_Angeles" />
            <messages>
            <message id="2" sender="Ann" time="Feb 4, 2026, 10:00 AM">see file
            [file available at: /workspace/downloads/msg-2/5]</message>
            <message id="4" sender="42" time="Feb 4, 2026, 10:00 AM" reply_to="3">
              <quoted_message from="Bob">9</quoted_message>
            </message>
            </messages>
            <task time="Feb 4, 2026, 10:00 AM">5</task>"#]],
    );
}

#[test]
fn unknown_kind_is_labelled() {
    check(
        vec![input(
            2,
            "reaction",
            "2026-02-04T18:00:00Z",
            json!({"emoji": "👍", "messageId": 3}),
        )
        .routed("slack", "C123")],
        expect![[r#"
            <context timezone="America/Los_Angeles" />
            <message id="2" kind="reaction" from="slack-main" time="Feb 4, 2026, 10:00 AM">{
              "emoji": "👍",
              "messageId": 3
            }</message>"#]],
    );
}

#[test]
fn bad_timestamp_drops_time() {
    check(
        vec![
            chat(2, "next tuesday", "John", "when?"),
            input(4, "task", "", json!({"prompt": "no time"})),
        ],
        expect![[r#"
            <context timezone="America/Los_Angeles" />
            <message id="2" sender="John">when?</message>
            <task>no time</task>"#]],
    );
}

#[test]
fn from_names_matching_destination_only() {
    check(
        vec![
            chat(2, "2026-02-04T18:00:00Z", "John", "matches").routed("slack", "C123"),
            chat(4, "2026-02-04T18:00:00Z", "John", "other channel").routed("slack", "C999"),
            chat(6, "2026-02-04T18:00:00Z", "Bot", "from an agent").routed("agent", "grp-research"),
        ],
        expect![[r#"
            <context timezone="America/Los_Angeles" />
            <messages>
            <message id="2" from="slack-main" sender="John" time="Feb 4, 2026, 10:00 AM">matches</message>
            <message id="4" sender="John" time="Feb 4, 2026, 10:00 AM">other channel</message>
            <message id="6" from="researcher" sender="Bot" time="Feb 4, 2026, 10:00 AM">from an agent</message>
            </messages>"#]],
    );
}

#[test]
fn empty_batch_is_header_only() {
    check(
        vec![],
        expect![[r#"<context timezone="America/Los_Angeles" />"#]],
    );
}

#[test]
fn huge_text_is_kept_whole() {
    let text = "x".repeat(1_000_000);
    let message = message(&chat(2, "2026-02-04T18:00:00Z", "a", &text));
    let prompt = format_alone(&message);
    assert!(prompt.contains(&text));
}

#[test]
fn default_notes() {
    let atts = vec![
        Attachment {
            name: Some("data.xlsx".to_owned()),
            local_path: Some("downloads/msg-4/data.xlsx".to_owned()),
            ..Attachment::default()
        },
        Attachment {
            url: Some("https://files.example/a/report.pdf?sig=1".to_owned()),
            ..Attachment::default()
        },
        Attachment {
            name: Some("escape".to_owned()),
            local_path: Some("../etc/passwd".to_owned()),
            ..Attachment::default()
        },
        Attachment {
            local_path: Some("/workspace/downloads/m/b.txt".to_owned()),
            ..Attachment::default()
        },
        Attachment::default(),
    ];
    let notes = default_attachment_notes(&atts, Path::new("/workspace"));
    expect![[r#"
        [
            Available {
                path: "/workspace/downloads/msg-4/data.xlsx",
            },
            Unavailable {
                name: "report.pdf",
                reason: "not downloaded",
            },
            Unavailable {
                name: "escape",
                reason: "local path outside the workspace",
            },
            Available {
                path: "/workspace/downloads/m/b.txt",
            },
            Unavailable {
                name: "attachment",
                reason: "not downloaded",
            },
        ]
    "#]]
    .assert_debug_eq(&notes);
}

#[test]
fn format_time_shape() {
    let tz = Tz::America__Los_Angeles;
    assert_eq!(
        format_time("2026-02-04T21:30:00.000Z", tz).as_deref(),
        Some("Feb 4, 2026, 1:30 PM")
    );
    assert_eq!(
        format_time("2026-02-04T08:05:00Z", tz).as_deref(),
        Some("Feb 4, 2026, 12:05 AM")
    );
    assert_eq!(format_time("garbage", tz), None);
}

/// The hand-written format says what chrono's `%b %-d, %Y, %-I:%M %p` says: every hour
/// (midnight and noon), each month, a DST change, years that need padding.
#[test]
fn format_time_matches_chronos_format() {
    let zones = [Tz::UTC, Tz::America__Los_Angeles, Tz::Asia__Kolkata];
    let mut days: Vec<String> = ["0001-01-01", "0999-12-31", "2026-03-08", "2026-11-01"]
        .into_iter()
        .chain(["9999-12-30"])
        .map(String::from)
        .collect();
    days.extend((1..=12).map(|month| format!("2026-{month:02}-15")));
    for tz in zones {
        for day in &days {
            for hour in 0..24 {
                let ts = format!("{day}T{hour:02}:07:00.000Z");
                let expected = schema::time::parse_ts(&ts).ok().map(|at| {
                    at.with_timezone(&tz)
                        .format("%b %-d, %Y, %-I:%M %p")
                        .to_string()
                });
                assert_eq!(format_time(&ts, tz), expected, "{ts} in {tz}");
            }
        }
    }
}
