//! Reply dispatch (docs/contract/prompt.md#replies): what a turn's result text becomes in
//! `messages_out`, and which blocks a piece of text written during the turn delivers at once
//! ([`parse_blocks`]).
//!
//! - `<internal>…</internal>` is the agent's private note and is never sent, wherever it is
//!   (also inside a message block). An unclosed `<internal>` runs to the end of its scope (the
//!   text, or the message block it opened in): leaking a thought is worse than losing a tail.
//! - If the text holds `<message to="name">…</message>` blocks, each block is one reply to that
//!   destination, and text outside the blocks is dropped: an agent that addressed its replies
//!   explicitly meant exactly those, and stray narration between them is not for anyone.
//! - Otherwise the whole text (internal parts removed) goes to the batch's routing.
//! - Text is trimmed; an empty text writes nothing.
//!
//! Tags match ASCII-case-insensitively. `to` may be single-, double- or un-quoted and is
//! XML-unescaped; the block's text is sent as written (the agent writes plain text, so `&amp;`
//! in it is meant literally). A `<message>` without `to`, or without a closing `</message>`, is
//! not a block: it stays as plain text. Blocks do not nest: a block ends at the first
//! `</message>`.
//!
//! The tag and attribute reading is `provider::prompt_xml`'s, the module that also writes the
//! prompt's XML.

use provider::prompt_xml::{attribute, Scanner};

/// One reply to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// Destination name; `None` means the batch's routing. Unknown names are the caller's to log.
    pub to: Option<String>,
    /// Text to send, trimmed, never empty.
    pub text: String,
}

/// Splits a turn's result text into the replies it asks for (possibly none).
pub fn parse_reply(result_text: &str) -> Vec<Outgoing> {
    let scan = scan(result_text);
    if scan.blocks.is_empty() {
        let text = scan.outside.trim();
        if text.is_empty() {
            return Vec::new();
        }
        return vec![Outgoing {
            to: None,
            text: text.to_owned(),
        }];
    }
    if !scan.outside.trim().is_empty() {
        tracing::debug!(
            dropped = scan.outside.trim(),
            "result text outside <message to> blocks is not sent"
        );
    }
    parse_blocks(result_text)
}

/// The `<message to>` blocks of a piece of text the agent wrote during a turn (issue 15: each
/// block is delivered when its closing tag is seen, before the turn's result). Text outside
/// blocks is not returned: it is for the turn's final text only ([`parse_reply`]).
pub fn parse_blocks(piece: &str) -> Vec<Outgoing> {
    scan(piece)
        .blocks
        .into_iter()
        .filter_map(|(to, inner)| {
            let text = strip_internal(inner);
            (!text.is_empty()).then_some(Outgoing { to: Some(to), text })
        })
        .collect()
}

/// The text with every `<internal>…</internal>` removed (an unclosed one runs to the end), trimmed:
/// the text as it would be sent.
pub fn strip_internal(text: &str) -> String {
    let scanner = Scanner::new(text);
    let mut out = String::with_capacity(text.len());
    let mut pos = 0;
    while let Some(open) = scanner.find_start(pos, "internal") {
        out.push_str(&text[pos..open.start]);
        pos = scanner.element(open, "internal").end;
    }
    out.push_str(&text[pos..]);
    out.trim().to_owned()
}

/// Whether two texts say the same once trimmed and with whitespace runs collapsed, so a result
/// that repeats a `send_message` of the same turn is not written twice.
pub fn same_text(a: &str, b: &str) -> bool {
    a.split_whitespace().eq(b.split_whitespace())
}

/// A result text split into message blocks (destination, raw inner text) and everything else
/// with internal parts already removed.
struct Scan<'a> {
    outside: String,
    blocks: Vec<(String, &'a str)>,
}

fn scan(text: &str) -> Scan<'_> {
    let scanner = Scanner::new(text);
    let mut outside = String::new();
    let mut blocks = Vec::new();
    let mut pos = 0;
    loop {
        let internal = scanner.find_start(pos, "internal");
        let message = scanner.find_start(pos, "message");
        let (open, is_internal) = match (internal, message) {
            (Some(i), Some(m)) if i.start < m.start => (i, true),
            (_, Some(m)) => (m, false),
            (Some(i), None) => (i, true),
            (None, None) => break,
        };
        if is_internal {
            // A message block inside an internal note is part of the note: not sent.
            outside.push_str(&text[pos..open.start]);
            pos = scanner.element(open, "internal").end;
            continue;
        }
        let to = attribute(scanner.tag_text(&open), "to").map(|to| to.trim().to_owned());
        let block = scanner.element(open, "message");
        match to {
            Some(to) if !open.self_closing && block.closed => {
                outside.push_str(&text[pos..open.start]);
                blocks.push((to, &text[block.content]));
                pos = block.end;
            }
            // Not a block: the tag stays as text, and what follows is scanned as usual.
            _ => {
                outside.push_str(&text[pos..open.end]);
                pos = open.end;
            }
        }
    }
    outside.push_str(&text[pos..]);
    Scan { outside, blocks }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    /// Shows the replies one per paragraph, headed by their destination.
    fn check(result_text: &str, expect: Expect) {
        let replies = parse_reply(result_text);
        let shown = if replies.is_empty() {
            "(nothing)".to_owned()
        } else {
            replies
                .iter()
                .map(|r| format!("-> {}\n{}", r.to.as_deref().unwrap_or("(batch)"), r.text))
                .collect::<Vec<_>>()
                .join("\n")
        };
        expect.assert_eq(&shown);
    }

    #[test]
    fn plain_text_goes_to_the_batch() {
        check(
            "  Done: the PR is merged.\n\nAnything else?\n",
            expect![[r#"
                -> (batch)
                Done: the PR is merged.

                Anything else?"#]],
        );
    }

    #[test]
    fn internal_is_removed() {
        check(
            "<internal>check the CI first</internal>All green. <INTERNAL note=\"x\">\nmulti\nline\n</Internal >Merging.",
            expect![[r#"
                -> (batch)
                All green. Merging."#]],
        );
    }

    #[test]
    fn internal_only_is_nothing() {
        check(
            "\n<internal>nothing to say</internal>\n  ",
            expect!["(nothing)"],
        );
    }

    #[test]
    fn empty_and_whitespace_only() {
        check("", expect!["(nothing)"]);
        check(" \n\t \n", expect!["(nothing)"]);
    }

    #[test]
    fn two_message_blocks_drop_outside_text() {
        check(
            "Sending both now.\n<message to=\"slack-main\">\nPR merged.\n</message>\nand\n<message to='researcher'>Please update\nthe notes.</message>\nDone.",
            expect![[r#"
                -> slack-main
                PR merged.
                -> researcher
                Please update
                the notes."#]],
        );
    }

    #[test]
    fn internal_inside_a_block_and_blocks_inside_internal() {
        check(
            "<message to=\"a\">Hi <internal>they seem upset</internal>there</message>\
             <internal>draft: <message to=\"b\">never sent</message></internal>\
             <message to=\"c\"><internal>only a note</internal></message>",
            expect![[r#"
                -> a
                Hi there"#]],
        );
    }

    #[test]
    fn unclosed_tags() {
        // An unclosed internal runs to the end.
        check(
            "Answer first.<internal>and then a thought that never ends",
            expect![[r#"
                -> (batch)
                Answer first."#]],
        );
        // An unclosed message is plain text (its internal part still removed).
        check(
            "<message to=\"a\">hello <internal>x</internal>world",
            expect![[r#"
                -> (batch)
                <message to="a">hello world"#]],
        );
        // An unclosed internal inside a block ends with the block.
        check(
            "<message to=\"a\">Hi<internal>oops</message>",
            expect![[r#"
                -> a
                Hi"#]],
        );
        // A `<message` that never reaches `>` is text.
        check(
            "a <message to=\"x\" b",
            expect![[r#"
                -> (batch)
                a <message to="x" b"#]],
        );
    }

    #[test]
    fn message_without_to_is_text() {
        check(
            "<message>hi</message><messages>x</messages>",
            expect![[r#"
                -> (batch)
                <message>hi</message><messages>x</messages>"#]],
        );
    }

    #[test]
    fn names_are_unescaped_and_quotes_handled() {
        check(
            "<message id=\"3\" to=\"R&amp;D &#x1F680;\">one</message>\
             <message to = 'a\"b'>two</message>\
             <Message TO=plain>three</MESSAGE>\
             <message to=\"x>y\">four</message>",
            expect![[r#"
                -> R&D 🚀
                one
                -> a"b
                two
                -> plain
                three
                -> x>y
                four"#]],
        );
    }

    #[test]
    fn never_panics_on_any_prefix() {
        // Cutting a tricky text at every char boundary exercises every half-open tag.
        let text = "é<message to='ü&amp;&#9999999;'>ß<internal>ñ</internal ></message>\
                    <internal/><message to=\"x\"/>&#x;<message\t TO =y>z</message >";
        for (cut, _) in text.char_indices() {
            let _ = parse_reply(&text[..cut]);
            let _ = strip_internal(&text[..cut]);
        }
        check(
            text,
            expect![[r#"
                -> ü&&#9999999;
                ß
                -> y
                z"#]],
        );
    }

    #[test]
    fn blocks_of_a_piece_leave_the_outside_text() {
        let piece =
            "Let me check.\n<message to=\"ops\">Deploy <internal>x</internal>started</message>\n\
                     <message to=\"ops\">unclosed";
        assert_eq!(
            parse_blocks(piece),
            vec![Outgoing {
                to: Some("ops".into()),
                text: "Deploy started".into()
            }]
        );
        assert_eq!(parse_blocks("just narration"), Vec::new());
    }

    #[test]
    fn strip_internal_trims() {
        assert_eq!(strip_internal("  a <internal>b</internal> c  "), "a  c");
        assert_eq!(strip_internal("<internal/>x"), "x");
        assert_eq!(strip_internal("x<internalize>y"), "x<internalize>y");
        assert_eq!(strip_internal("é<internal>ü"), "é");
    }

    #[test]
    fn same_text_normalises_whitespace() {
        assert!(same_text("  Hello   world\n", "Hello world"));
        assert!(same_text("a\n\nb", "a b"));
        assert!(!same_text("Hello world", "Hello, world"));
        assert!(same_text("", "  \n"));
    }
}

#[cfg(test)]
mod hostile_sizes {
    use std::time::{Duration, Instant};

    use super::*;

    /// A result text is the agent's to write, so it can hold any number of tags. Each of
    /// these made every tag search the rest of the text again (a quadratic scan: minutes for a
    /// few hundred KB). The bound is generous: a linear scan takes milliseconds.
    #[test]
    fn results_with_many_tags_are_read_in_linear_time() {
        let tags = 40_000;
        let texts = [
            // Tags that are no block: the other name was searched to the end at each one.
            "<message>x".repeat(tags),
            // Blocks that never close: their end tag was searched to the end at each one.
            "<message to=a>x".repeat(tags),
            // A start tag that never ends, after many tags: its end was looked for at each.
            format!(
                "{}<internal {}",
                "<message>x".repeat(tags),
                "x".repeat(400_000)
            ),
        ];
        for text in &texts {
            let started = Instant::now();
            let replies = parse_reply(text);
            let took = started.elapsed();
            assert!(
                took < Duration::from_secs(10),
                "{} bytes with {tags} tags took {took:?}",
                text.len()
            );
            assert_eq!(replies.len(), 1, "not blocks: the text goes to the batch");
        }
    }
}
