//! Reading a Dockerfile the way the tests that check the image need it. Shared by
//! `agent-runner/tests/container.rs` and `tests/tests/image.rs` (included with `#[path]`).

/// The instructions of a Dockerfile: continuation lines joined, comments and parser directives
/// dropped, as (KEYWORD, arguments).
pub(crate) fn instructions(dockerfile: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in dockerfile.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (current.is_empty() && trimmed.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                let (keyword, args) = current
                    .split_once(char::is_whitespace)
                    .unwrap_or((&current, ""));
                out.push((
                    keyword.to_ascii_uppercase(),
                    args.split_whitespace().collect::<Vec<_>>().join(" "),
                ));
                current.clear();
            }
        }
    }
    out
}
