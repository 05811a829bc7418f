//! A Bash command line as the shell would run it: every command it can run, each as its program
//! (by name, whatever path runs it) and its arguments after quote and escape removal, with the
//! commands that wrappers, shells given code and command substitutions run inside it
//! ([`analyse`]). Lines whose commands the text cannot tell are marked undecidable, with why.
//!
//! The line is parsed by tree-sitter-bash (docs/decisions/policy.md#D-POL-03). Bounds come
//! first, so no input can hang the parser or overflow the stack: a line longer than
//! [`MAX_LINE_BYTES`] or nested deeper than [`MAX_NESTING`] brackets is not parsed,
//! a parse stops after [`TIME_BUDGET`], shell code inside shell code (`sh -c`, `eval`, here
//! documents) goes at most [`MAX_LEVELS`] deep, the parser's work is counted ([`MAX_PARSE_STEPS`]),
//! and the syntax tree is walked with a stack of its own, not by recursion. Each limit makes the
//! line undecidable.

use std::cell::RefCell;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use tree_sitter::{Node, ParseOptions, ParseState, Parser, Tree};

use super::word::Word;
use super::wrappers::{self, Inner};

/// The longest line (and the most shell code in all, counting code inside code) analysed:
/// tree-sitter-bash parses about 2 MB/s, so 8 KiB take about 4 ms (the bench, release build).
pub(super) const MAX_LINE_BYTES: usize = 8 * 1024;
/// The deepest nesting of brackets (`(`, `{`, `[`) a line may have.
pub(super) const MAX_NESTING: usize = 128;
/// How deep shell code may sit inside shell code or wrappers (`sh -c "nice sh -c '…'"`).
pub(super) const MAX_LEVELS: usize = 16;
/// The most parse work one line may take, in tree-sitter's progress calls (one per 100
/// operations).
const MAX_PARSE_STEPS: usize = 500;
/// The most commands one line may run.
const MAX_COMMANDS: usize = 10_000;
/// The time one line may take to analyse, all parses together.
pub(super) const TIME_BUDGET: Duration = Duration::from_millis(50);

/// The commands a line runs, and whether that is all it can run.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Analysis {
    /// Each command the line can run: its program's name and its arguments, joined by single
    /// spaces (`rm -rf x` for `/bin/rm -rf 'x'`); a wrapper and the command it runs are both
    /// here (`nice rm x`, `rm x`).
    pub(super) commands: Vec<String>,
    /// The commands above whose program was named by a path, as written (`/usr/bin/rm -rf x`):
    /// a deny or ask pattern written with the path meets them too.
    pub(super) written: Vec<String>,
    /// Why the commands above may not be all the line runs (the first reason found).
    pub(super) undecidable: Option<String>,
}

/// Every command `line` can run.
pub(super) fn analyse(line: &str) -> Analysis {
    let parser = PARSER
        .with(|cell| cell.borrow_mut().take())
        .or_else(new_parser);
    let Some(parser) = parser else {
        return Analysis {
            undecidable: Some("the shell parser could not start".to_owned()),
            ..Analysis::default()
        };
    };
    let mut walker = Walker {
        parser,
        out: Analysis::default(),
        deadline: Instant::now() + TIME_BUDGET,
        code_bytes: 0,
        parse_steps: 0,
    };
    walker.code(line, 0, &Stdin::Inherited);
    #[cfg(test)]
    STEPS.with(|steps| steps.set(walker.parse_steps));
    let Walker { parser, out, .. } = walker;
    PARSER.with(|cell| *cell.borrow_mut() = Some(parser));
    out
}

thread_local! {
    /// One parser per thread, reused: making one allocates.
    static PARSER: RefCell<Option<Parser>> = const { RefCell::new(None) };
}

#[cfg(test)]
thread_local! {
    /// The parse steps of the thread's last [`analyse`].
    pub(super) static STEPS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn new_parser() -> Option<Parser> {
    let mut parser = Parser::new();
    parser
        .set_language(&tree_sitter_bash::LANGUAGE.into())
        .ok()?;
    Some(parser)
}

/// The deepest bracket nesting of `code`, counted on the text (quotes ignored, so never less
/// than the shell's).
pub(super) fn nesting(code: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    for byte in code.bytes() {
        match byte {
            b'(' | b'{' | b'[' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b')' | b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Where a command's standard input comes from, as far as it decides what a shell reading it
/// runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Stdin {
    /// Whatever the line's own input is.
    Inherited,
    /// Another command's output (`… | sh`).
    Pipe,
    /// A file (`sh < x`).
    File,
    /// A here-document or here-string: its text when literal.
    Text(Option<String>),
}

struct Walker {
    parser: Parser,
    out: Analysis,
    deadline: Instant,
    /// Shell code parsed so far, all levels.
    code_bytes: usize,
    /// Progress calls of the parser so far (one per 100 operations), all parses.
    parse_steps: usize,
}

impl Walker {
    fn undecidable(&mut self, reason: impl Into<String>) {
        if self.out.undecidable.is_none() {
            self.out.undecidable = Some(reason.into());
        }
    }

    fn over_budget(&mut self) -> bool {
        if self.out.commands.len() >= MAX_COMMANDS {
            self.undecidable(format!(
                "the line runs more than {MAX_COMMANDS} commands: split it"
            ));
            return true;
        }
        if Instant::now() > self.deadline {
            self.undecidable("the line took too long to analyse: write it shorter");
            return true;
        }
        false
    }

    /// Shell code `code`, run `level` wrappers or shells deep with `stdin`.
    fn code(&mut self, code: &str, level: usize, stdin: &Stdin) {
        if level > MAX_LEVELS {
            self.undecidable(format!(
                "shell code is nested more than {MAX_LEVELS} levels deep: write the command \
                 literally"
            ));
            return;
        }
        self.code_bytes = self.code_bytes.saturating_add(code.len());
        if self.code_bytes > MAX_LINE_BYTES {
            self.undecidable(format!(
                "the line is longer than {} KiB of shell code: write it shorter",
                MAX_LINE_BYTES / 1024
            ));
            return;
        }
        if nesting(code) > MAX_NESTING {
            self.undecidable(format!(
                "the line nests brackets more than {MAX_NESTING} deep: write it flatter"
            ));
            return;
        }
        let Some(tree) = self.parse(code) else {
            self.undecidable("the line took too long to parse: write it shorter");
            return;
        };
        let root = tree.root_node();
        if root.has_error() {
            self.undecidable("the shell would not parse the line as written: write it plainly");
        }
        self.walk(root, code.as_bytes(), level, stdin);
    }

    fn parse(&mut self, code: &str) -> Option<Tree> {
        let deadline = self.deadline;
        let mut steps = self.parse_steps;
        // tree-sitter calls back every 100 parse operations: counting the calls bounds the
        // work whatever the machine's load, the clock bounds the time.
        let mut progress = |_: &ParseState| {
            steps += 1;
            if steps > MAX_PARSE_STEPS || Instant::now() > deadline {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        };
        let bytes = code.as_bytes();
        let tree = self.parser.parse_with_options(
            &mut |at, _| bytes.get(at..).unwrap_or_default(),
            None,
            Some(ParseOptions::new().progress_callback(&mut progress)),
        );
        self.parse_steps = steps;
        if tree.is_none() {
            // A stopped parse would otherwise resume on the next call.
            self.parser.reset();
        }
        tree
    }

    /// Every command under `root`, with a stack of its own (a tree may be deeper than the
    /// line's brackets: `a && b && …` nests to the left).
    fn walk(&mut self, root: Node<'_>, src: &[u8], level: usize, stdin: &Stdin) {
        let mut stack = vec![(root, stdin.clone())];
        while let Some((node, stdin)) = stack.pop() {
            if self.over_budget() {
                return;
            }
            let mut cursor = node.walk();
            let children: Vec<Node<'_>> = node.named_children(&mut cursor).collect();
            if node.kind() == "command" {
                self.command(node, src, level, &stdin, Vec::new());
            }
            match node.kind() {
                "pipeline" => {
                    // Every command after the first reads the one before it.
                    for (index, child) in children.into_iter().enumerate().rev() {
                        let input = if index == 0 {
                            stdin.clone()
                        } else {
                            Stdin::Pipe
                        };
                        stack.push((child, input));
                    }
                    continue;
                }
                "redirected_statement" => {
                    let input = redirected_input(node, src).unwrap_or_else(|| stdin.clone());
                    // Words after a redirection are the command's (`nice > out rm x`); the
                    // grammar files them under the redirection.
                    let extra = extra_arguments(node, src);
                    let body = node.child_by_field_name("body");
                    for child in children.into_iter().rev() {
                        if body.is_some_and(|body| body.id() == child.id()) {
                            if child.kind() == "command" {
                                self.command(child, src, level, &input, extra.clone());
                                let mut inner = child.walk();
                                for part in child.named_children(&mut inner) {
                                    stack.push((part, stdin.clone()));
                                }
                                continue;
                            }
                            if !extra.is_empty() {
                                self.undecidable(
                                    "words follow a redirection of a compound command: write \
                                     the command plainly",
                                );
                            }
                            stack.push((child, input.clone()));
                        } else {
                            stack.push((child, stdin.clone()));
                        }
                    }
                    continue;
                }
                "command" => {}
                "variable_assignment" => {
                    let name = node.child_by_field_name("name").map(|n| text(n, src));
                    if let Some(name) = name.filter(|n| wrappers::LOADER_VARIABLES.contains(n)) {
                        self.undecidable(format!(
                            "the line sets {name}, which decides which program runs: write the \
                             command literally"
                        ));
                    }
                }
                "word" if has_bare_newline(text(node, src)) => {
                    // The shell ends a word at a newline; a word holding one means the grammar
                    // read the line otherwise (seen after a here-document's first line).
                    self.undecidable(
                        "the parser and the shell could read the line differently: write it \
                         plainly",
                    );
                }
                _ => {}
            }
            // Everything else runs what it holds: lists, subshells, groups, function bodies
            // (judged as if called), loops, conditions, and the command and process
            // substitutions inside words, redirections and here-documents.
            for child in children.into_iter().rev() {
                stack.push((child, stdin.clone()));
            }
        }
    }

    /// A simple command: its words evaluated, then what it runs.
    fn command(
        &mut self,
        node: Node<'_>,
        src: &[u8],
        level: usize,
        stdin: &Stdin,
        extra: Vec<Word>,
    ) {
        let mut words = Vec::new();
        if let Some(name) = node.child_by_field_name("name") {
            words.push(word(name, src, 0));
        }
        let mut cursor = node.walk();
        for argument in node.children_by_field_name("argument", &mut cursor) {
            words.push(word(argument, src, 0));
        }
        words.extend(extra);
        // A here-string is the command's own redirection.
        let input = redirected_input(node, src);
        self.run(words, level, input.as_ref().unwrap_or(stdin));
    }

    /// The command `argv` and what it runs in turn.
    fn run(&mut self, argv: Vec<Word>, level: usize, stdin: &Stdin) {
        let Some((program, args)) = argv.split_first() else {
            return;
        };
        if self.over_budget() {
            return;
        }
        if level > MAX_LEVELS {
            self.undecidable(format!(
                "commands are nested more than {MAX_LEVELS} levels deep: write the command \
                 literally"
            ));
            return;
        }
        if !program.literal || program.pattern {
            self.undecidable(format!(
                "the program name is not a literal ({}): write the command literally",
                program.value
            ));
            return;
        }
        let name = basename(&program.value);
        if name.is_empty() {
            return;
        }
        if program.value != name {
            self.out.written.push(command_text(&program.value, args));
        }
        match wrappers::normalise(name, args) {
            Ok(words) => self.out.commands.push(words.join(" ")),
            Err(reason) => {
                self.out.commands.push(command_text(name, args));
                self.undecidable(reason);
            }
        }
        if program.value.contains('/') && !wrappers::is_system_program(&program.value) {
            self.undecidable(format!(
                "the program is a file the rules cannot read ({}): write the commands it runs \
                 literally",
                program.value
            ));
        }
        for inner in wrappers::inner(name, args) {
            match inner {
                Inner::Command(words) => self.run(words, level + 1, stdin),
                Inner::Code(code) if code.literal => self.code(&code.value, level + 1, stdin),
                Inner::Code(code) => self.undecidable(format!(
                    "{name} runs shell code that is not a literal ({}): write the command \
                     literally",
                    code.value
                )),
                Inner::Stdin => match stdin {
                    Stdin::Text(Some(text)) => {
                        let text = text.clone();
                        self.code(&text, level + 1, &Stdin::Inherited);
                    }
                    Stdin::Text(None) => self.undecidable(format!(
                        "{name} runs a here-document that is not a literal: write the command \
                         literally"
                    )),
                    Stdin::Pipe => self.undecidable(format!(
                        "{name} runs shell code from its input (… | {name}): write the command \
                         literally"
                    )),
                    Stdin::File | Stdin::Inherited => self.undecidable(format!(
                        "{name} runs shell code from a file or its input: write the command \
                         literally"
                    )),
                },
                Inner::Unknown(reason) => self.undecidable(reason),
            }
        }
    }
}

/// The program's name whatever path runs it (`/bin/rm`, `./rm` → `rm`).
pub(super) fn basename(program: &str) -> &str {
    program.rsplit('/').next().unwrap_or(program)
}

/// `name args…` as written.
fn command_text(name: &str, args: &[Word]) -> String {
    std::iter::once(name)
        .chain(args.iter().map(|w| w.value.as_str()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The input a redirection gives the statement: a here-document or here-string (its text when
/// literal) or a file.
fn redirected_input(node: Node<'_>, src: &[u8]) -> Option<Stdin> {
    let mut input = None;
    let mut cursor = node.walk();
    for redirect in node.children_by_field_name("redirect", &mut cursor) {
        match redirect.kind() {
            "heredoc_redirect" => input = Some(Stdin::Text(heredoc_text(redirect, src))),
            "herestring_redirect" => {
                let mut inner = redirect.walk();
                let value = redirect
                    .named_children(&mut inner)
                    .last()
                    .map(|child| word(child, src, 0));
                input = Some(Stdin::Text(value.filter(|w| w.literal).map(|w| w.value)));
            }
            "file_redirect" => {
                // `< file` (or `0< file`, `<> file`): a shell would read the file.
                let mut inner = redirect.walk();
                let reads = redirect
                    .children(&mut inner)
                    .any(|child| !child.is_named() && matches!(child.kind(), "<" | "<>" | "<&"));
                if reads {
                    input = Some(Stdin::File);
                }
            }
            _ => {}
        }
    }
    input
}

/// The words the grammar put under a statement's redirections that are the command's
/// arguments: a file redirection's destinations after the first, a here-document's arguments.
fn extra_arguments(node: Node<'_>, src: &[u8]) -> Vec<Word> {
    let mut extra = Vec::new();
    let mut cursor = node.walk();
    for redirect in node.children_by_field_name("redirect", &mut cursor) {
        let mut inner = redirect.walk();
        let field = match redirect.kind() {
            "file_redirect" => "destination",
            "heredoc_redirect" => "argument",
            _ => continue,
        };
        let skip = usize::from(field == "destination");
        for argument in redirect
            .children_by_field_name(field, &mut inner)
            .skip(skip)
        {
            extra.push(word(argument, src, 0));
        }
    }
    extra
}

/// A newline neither escaped nor quoted.
fn has_bare_newline(raw: &str) -> bool {
    let mut escaped = false;
    for c in raw.chars() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '\n' => return true,
            _ => {}
        }
    }
    false
}

/// A here-document's text when it is literal: a quoted delimiter, or no expansion in it.
fn heredoc_text(redirect: Node<'_>, src: &[u8]) -> Option<String> {
    let mut cursor = redirect.walk();
    let children: Vec<Node<'_>> = redirect.named_children(&mut cursor).collect();
    let quoted = children
        .iter()
        .find(|c| c.kind() == "heredoc_start")
        .is_some_and(|start| text(*start, src).contains(['\'', '"', '\\']));
    let body = children.iter().find(|c| c.kind() == "heredoc_body")?;
    let raw = text(*body, src);
    if quoted {
        return Some(raw.to_owned());
    }
    let mut inner = body.walk();
    let expands = body
        .named_children(&mut inner)
        .any(|c| c.kind() != "heredoc_content");
    if expands {
        return None;
    }
    Some(unescape(raw, |c| matches!(c, '$' | '`' | '\\')))
}

fn text<'a>(node: Node<'_>, src: &'a [u8]) -> &'a str {
    src.get(node.start_byte()..node.end_byte())
        .and_then(|bytes| std::str::from_utf8(bytes).ok())
        .unwrap_or("")
}

/// How deep word structure may nest (`${a:-${b:-…}}`); deeper is not a literal.
const MAX_WORD_DEPTH: usize = 64;

/// The value of one word node after quote and escape removal.
fn word(node: Node<'_>, src: &[u8], depth: usize) -> Word {
    let raw = text(node, src);
    let opaque = || Word {
        value: raw.to_owned(),
        literal: false,
        pattern: false,
    };
    if depth > MAX_WORD_DEPTH {
        return opaque();
    }
    match node.kind() {
        "word" => Word {
            value: unescape(raw, |_| true),
            literal: true,
            pattern: has_unquoted_pattern(raw),
        },
        "raw_string" => Word::literal(
            raw.strip_prefix('\'')
                .and_then(|r| r.strip_suffix('\''))
                .unwrap_or(raw),
        ),
        "ansi_c_string" => match ansi_c(raw) {
            Some(value) => Word::literal(value),
            None => opaque(),
        },
        "number" if node.named_child_count() == 0 => Word::literal(raw),
        "string_content" => Word::literal(unescape(raw, |c| matches!(c, '$' | '`' | '"' | '\\'))),
        "string" | "translated_string" | "concatenation" | "command_name" => {
            let quoted = matches!(node.kind(), "string" | "translated_string");
            let (start, end) = if quoted {
                let open = if node.kind() == "translated_string" {
                    2
                } else {
                    1
                };
                (
                    node.start_byte() + open,
                    node.end_byte()
                        .saturating_sub(1)
                        .max(node.start_byte() + open),
                )
            } else {
                (node.start_byte(), node.end_byte())
            };
            let mut out = Word::literal(String::new());
            let mut at = start;
            let mut cursor = node.walk();
            for child in node.named_children(&mut cursor) {
                let gap = src
                    .get(at..child.start_byte().max(at))
                    .and_then(|b| std::str::from_utf8(b).ok())
                    .unwrap_or("");
                push_gap(&mut out, gap, quoted);
                let piece = word(child, src, depth + 1);
                out.value.push_str(&piece.value);
                out.literal &= piece.literal;
                out.pattern |= piece.pattern && !quoted;
                at = child.end_byte();
            }
            let gap = src
                .get(at..end.max(at))
                .and_then(|b| std::str::from_utf8(b).ok())
                .unwrap_or("");
            push_gap(&mut out, gap, quoted);
            out
        }
        _ => opaque(),
    }
}

/// Text between a word's parts: unquoted, or inside double quotes.
fn push_gap(out: &mut Word, gap: &str, quoted: bool) {
    if gap.is_empty() {
        return;
    }
    if quoted {
        out.value
            .push_str(&unescape(gap, |c| matches!(c, '$' | '`' | '"' | '\\')));
        // A lone `$` and the like are literal; anything else would be a child node.
    } else {
        out.value.push_str(&unescape(gap, |_| true));
        out.pattern |= has_unquoted_pattern(gap);
        if gap.contains('$') || gap.contains('`') {
            out.literal = false;
        }
    }
}

/// `text` with `\c` made `c` for every `c` that `escapes` (others keep their backslash) and
/// `\` newline removed.
fn unescape(text: &str, escapes: impl Fn(char) -> bool) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('\n') => {}
            Some(next) if escapes(next) => out.push(next),
            Some(next) => {
                out.push('\\');
                out.push(next);
            }
            None => out.push('\\'),
        }
    }
    out
}

/// Unescaped `*`, `?`, `[` or `{`: the shell may expand the word into others.
fn has_unquoted_pattern(raw: &str) -> bool {
    let mut escaped = false;
    for c in raw.chars() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            '*' | '?' | '[' | '{' => return true,
            _ => {}
        }
    }
    false
}

/// The value of `$'…'`; `None` for an escape not decoded here.
fn ansi_c(raw: &str) -> Option<String> {
    let inner = raw.strip_prefix("$'")?.strip_suffix('\'')?;
    let mut out = String::new();
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let Some(next) = chars.next() else {
            out.push('\\');
            break;
        };
        let simple = match next {
            'a' => Some('\x07'),
            'b' => Some('\x08'),
            'e' | 'E' => Some('\x1b'),
            'f' => Some('\x0c'),
            'n' => Some('\n'),
            'r' => Some('\r'),
            't' => Some('\t'),
            'v' => Some('\x0b'),
            '\\' | '\'' | '"' | '?' => Some(next),
            _ => None,
        };
        if let Some(decoded) = simple {
            out.push(decoded);
            continue;
        }
        let (radix, max_digits) = match next {
            'x' => (16, 2),
            'u' => (16, 4),
            'U' => (16, 8),
            '0'..='7' => (8, 3),
            _ => return None,
        };
        let mut digits = String::new();
        if radix == 8 {
            digits.push(next);
        }
        while digits.len() < max_digits {
            match chars.peek() {
                Some(d) if d.is_digit(radix) => {
                    digits.push(*d);
                    chars.next();
                }
                _ => break,
            }
        }
        let code = u32::from_str_radix(&digits, radix).ok()?;
        out.push(char::from_u32(code)?);
    }
    Some(out)
}
