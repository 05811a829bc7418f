//! A Server-Sent Events parser (the WHATWG event-stream format): bytes in, events out. Lines
//! end in LF, CRLF or CR; `data` lines join with LF; comments (`:`) are skipped; an event is
//! dispatched at a blank line. A line longer than [`MAX_LINE`] is an error, so a server that
//! never ends a line cannot grow the buffer without bound.

/// The longest line accepted (a `data:` line carries one `watch --json` object).
pub const MAX_LINE: usize = 16 * 1024 * 1024;

/// One dispatched event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// `event:` (`message` when absent).
    pub event: String,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    /// `id:` of this event, when it had one.
    pub id: Option<String>,
}

/// Incremental parser state.
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    /// The previous chunk ended in CR: a LF starting the next one ends no line.
    after_cr: bool,
    event: Option<String>,
    data: Option<String>,
    id: Option<String>,
}

/// A line over [`MAX_LINE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an event-stream line longer than {MAX_LINE} bytes")]
pub struct LineTooLong;

impl SseParser {
    /// Feeds a chunk; returns the events it completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Vec<SseEvent>, LineTooLong> {
        let mut events = Vec::new();
        for &byte in chunk {
            if self.after_cr {
                self.after_cr = false;
                if byte == b'\n' {
                    continue;
                }
            }
            match byte {
                b'\n' | b'\r' => {
                    self.after_cr = byte == b'\r';
                    let line = std::mem::take(&mut self.line);
                    if let Some(event) = self.line_done(&String::from_utf8_lossy(&line)) {
                        events.push(event);
                    }
                }
                _ => {
                    if self.line.len() >= MAX_LINE {
                        return Err(LineTooLong);
                    }
                    self.line.push(byte);
                }
            }
        }
        Ok(events)
    }

    fn line_done(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            let data = self.data.take();
            let event = self.event.take();
            let id = self.id.take();
            // An event without data is not dispatched (the spec), but its fields are reset.
            return data.map(|data| SseEvent {
                event: event.unwrap_or_else(|| "message".to_owned()),
                data,
                id,
            });
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = Some(value.to_owned()),
            "data" => match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            },
            "id" if !value.contains('\0') => self.id = Some(value.to_owned()),
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn parse_in_pieces(input: &[u8], piece: usize) -> Vec<SseEvent> {
        let mut parser = SseParser::default();
        input
            .chunks(piece)
            .flat_map(|chunk| parser.feed(chunk).unwrap())
            .collect()
    }

    #[test]
    fn events_split_anywhere_parse_the_same() {
        let input = b": keep-alive\n\nevent: status\ndata: {\"a\":1}\n\nid: 7\r\nevent: message\r\ndata: one\r\ndata: two\r\n\r\nid: 9\rdata: x\r\r";
        let whole = parse_in_pieces(input, input.len());
        assert_eq!(
            whole,
            vec![
                SseEvent {
                    event: "status".into(),
                    data: "{\"a\":1}".into(),
                    id: None
                },
                SseEvent {
                    event: "message".into(),
                    data: "one\ntwo".into(),
                    id: Some("7".into())
                },
                SseEvent {
                    event: "message".into(),
                    data: "x".into(),
                    id: Some("9".into())
                },
            ]
        );
        for piece in 1..input.len() {
            assert_eq!(parse_in_pieces(input, piece), whole, "pieces of {piece}");
        }
    }

    #[test]
    fn an_event_without_data_is_dropped_and_its_fields_reset() {
        let events = parse_in_pieces(b"event: caught-up\nid: 3\n\ndata: y\n\n", 4);
        assert_eq!(
            events,
            vec![SseEvent {
                event: "message".into(),
                data: "y".into(),
                id: None
            }]
        );
    }
}
