//! A model's output read as text and tool calls, incrementally, so that a stream can send
//! text as soon as it cannot be part of a call.
//!
//! An output is text, then (where the format allows text first) the calls. Text is given out
//! as it comes, except a tail that may be the start of the format's marker, which is held
//! back until the next text shows whether it is. Llama 3.1 writes calls as the whole turn,
//! and Mistral's `[TOOL_CALLS]` is a special token that decoding drops from the text, so for
//! those two a turn that *begins* with `{` (Llama) or `[` (Mistral) is read as calls too.
//!
//! Once the calls begin, each call is given out when it is complete; whitespace between calls
//! is dropped. Text that breaks the format's syntax (a call that is not JSON, a JSON object
//! that is not `{"name": ..., "arguments": {...}}`, words after the calls) makes the rest of
//! the output, from where the unread text began, text again: nothing the model wrote is lost,
//! and the calls given out before it stand. The same holds at the end of the output for a call
//! left incomplete. So a whole output and the same output pushed in any pieces read the same.

use serde_json::{Map, Value};

use super::{ParsedCall, ToolCallFormat};

/// What a push gives out, in the output's order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    Call(ParsedCall),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Before the calls. `at_start`: nothing but whitespace has been seen, so a bare call
    /// (Llama's `{`, Mistral's `[`) may still begin.
    Text { at_start: bool },
    /// Inside the calls; `first`: no call has been read yet.
    Calls { first: bool },
    /// The syntax broke: everything from here on is text.
    Plain,
}

/// One output's reader.
#[derive(Debug)]
pub struct ToolCallParser {
    format: ToolCallFormat,
    /// Text pushed and not given out yet.
    pending: String,
    state: State,
}

impl ToolCallParser {
    pub fn new(format: ToolCallFormat) -> Self {
        Self { format, pending: String::new(), state: State::Text { at_start: true } }
    }

    /// Adds output text; returns what is known now.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        self.advance(&mut out, false);
        out
    }

    /// The end of the output: what was held back is given out, a call left incomplete as text.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        self.advance(&mut out, true);
        out
    }

    /// A whole output as its text (what is not calls) and its calls.
    pub fn parse(format: ToolCallFormat, output: &str) -> (String, Vec<ParsedCall>) {
        let mut parser = Self::new(format);
        let mut pieces = parser.push(output);
        pieces.extend(parser.finish());
        Self::gather(pieces)
    }

    /// Pieces as the text they hold (what is not calls) and the calls.
    pub fn gather(pieces: Vec<Piece>) -> (String, Vec<ParsedCall>) {
        let (mut text, mut calls) = (String::new(), Vec::new());
        for piece in pieces {
            match piece {
                Piece::Text(t) => text.push_str(&t),
                Piece::Call(c) => calls.push(c),
            }
        }
        (text, calls)
    }

    fn advance(&mut self, out: &mut Vec<Piece>, end: bool) {
        loop {
            match self.state {
                State::Plain => {
                    emit_text(out, std::mem::take(&mut self.pending));
                    return;
                }
                State::Text { at_start } => {
                    if !self.text_step(out, at_start, end) {
                        return;
                    }
                }
                // Whitespace after a call belongs to no call and is no text.
                State::Calls { .. } if self.pending.trim().is_empty() => {
                    if end {
                        self.pending.clear();
                    }
                    return;
                }
                State::Calls { first } => match item(self.format, &self.pending, first, end) {
                    Step::More => return,
                    Step::Invalid => self.state = State::Plain,
                    Step::Done((calls, read)) => {
                        self.pending.drain(..read);
                        out.extend(calls.into_iter().map(Piece::Call));
                        self.state = State::Calls { first: false };
                    }
                },
            }
        }
    }

    /// Gives out the text that cannot begin a call; true when the state changed (go on).
    fn text_step(&mut self, out: &mut Vec<Piece>, at_start: bool, end: bool) -> bool {
        let marker = self.format.marker();
        if at_start {
            let lead = self.pending.trim_start();
            let bare = match self.format {
                ToolCallFormat::Llama3 => Some('{'),
                ToolCallFormat::Mistral => Some('['),
                ToolCallFormat::Hermes => None,
            };
            if lead.starts_with(marker) || bare.is_some_and(|c| lead.starts_with(c)) {
                self.state = State::Calls { first: true };
                return true;
            }
            if !end && (lead.is_empty() || marker.starts_with(lead)) {
                return false;
            }
            // Llama writes calls only as the whole turn: text first means no calls.
            self.state =
                if self.format == ToolCallFormat::Llama3 { State::Plain } else { State::Text { at_start: false } };
            return true;
        }
        if let Some(at) = self.pending.find(marker) {
            emit_text(out, self.pending.drain(..at).collect());
            self.state = State::Calls { first: true };
            return true;
        }
        let held = if end { 0 } else { held_tail(&self.pending, marker) };
        emit_text(out, self.pending.drain(..self.pending.len() - held).collect());
        false
    }
}

fn emit_text(out: &mut Vec<Piece>, text: String) {
    if text.is_empty() {
        return;
    }
    if let Some(Piece::Text(last)) = out.last_mut() {
        last.push_str(&text);
    } else {
        out.push(Piece::Text(text));
    }
}

/// The length of the longest end of `text` that is a proper start of `marker`.
fn held_tail(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

/// Whether the text read so far decides a step.
enum Step<T> {
    Done(T),
    /// The text ends before it decides: wait for more.
    More,
    /// The text breaks the syntax.
    Invalid,
}

/// Propagates `More` and `Invalid` out of an item reader.
macro_rules! done {
    ($step:expr) => {
        match $step {
            Step::Done(value) => value,
            Step::More => return Step::More,
            Step::Invalid => return Step::Invalid,
        }
    };
}

/// Reads one call item at the start of `text`: its calls, and how many bytes it took.
/// `end`: no more text will come, so a text that merely ends early is invalid.
fn item(format: ToolCallFormat, text: &str, first: bool, end: bool) -> Step<(Vec<ParsedCall>, usize)> {
    let mut cursor = Cursor { text, at: 0 };
    let step = match format {
        ToolCallFormat::Hermes => hermes(&mut cursor),
        ToolCallFormat::Llama3 => llama3(&mut cursor, first),
        ToolCallFormat::Mistral => mistral(&mut cursor, first),
    };
    match step {
        Step::Done(calls) => Step::Done((calls, cursor.at)),
        Step::More if !end => Step::More,
        Step::More | Step::Invalid => Step::Invalid,
    }
}

/// `<tool_call>` JSON `</tool_call>`, with whitespace around the JSON.
fn hermes(c: &mut Cursor<'_>) -> Step<Vec<ParsedCall>> {
    c.whitespace();
    done!(c.literal("<tool_call>"));
    c.whitespace();
    let value = done!(c.json());
    let call = done!(call_of(&value, ToolCallFormat::Hermes));
    c.whitespace();
    done!(c.literal("</tool_call>"));
    Step::Done(vec![call])
}

/// The first call, optionally after `<|python_tag|>`; later ones after `;`.
fn llama3(c: &mut Cursor<'_>, first: bool) -> Step<Vec<ParsedCall>> {
    c.whitespace();
    if first {
        done!(c.optional("<|python_tag|>"));
        c.whitespace();
    } else {
        done!(c.literal(";"));
        c.whitespace();
    }
    let value = done!(c.json());
    Step::Done(vec![done!(call_of(&value, ToolCallFormat::Llama3))])
}

/// `[TOOL_CALLS]` and an array of calls (or one call); the first marker may be missing, as
/// decoding drops it where it is a special token.
fn mistral(c: &mut Cursor<'_>, first: bool) -> Step<Vec<ParsedCall>> {
    c.whitespace();
    if first {
        done!(c.optional("[TOOL_CALLS]"));
    } else {
        done!(c.literal("[TOOL_CALLS]"));
    }
    c.whitespace();
    let calls = match done!(c.json()) {
        Value::Array(items) if !items.is_empty() => {
            let mut calls = Vec::with_capacity(items.len());
            for item in &items {
                calls.push(done!(call_of(item, ToolCallFormat::Mistral)));
            }
            calls
        }
        object @ Value::Object(_) => vec![done!(call_of(&object, ToolCallFormat::Mistral))],
        _ => return Step::Invalid,
    };
    Step::Done(calls)
}

/// A call object: `name`, a non-empty string, and the arguments, an object (or the JSON text
/// of one, as some models write them), under the format's key or the other usual one;
/// missing arguments are none. Other keys (Mistral's `id`) are let be.
fn call_of(value: &Value, format: ToolCallFormat) -> Step<ParsedCall> {
    let Value::Object(object) = value else { return Step::Invalid };
    let Some(name) = object.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()) else {
        return Step::Invalid;
    };
    let other = if format.arguments_key() == "arguments" { "parameters" } else { "arguments" };
    let arguments = match object.get(format.arguments_key()).or_else(|| object.get(other)) {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(arguments)) => arguments.clone(),
        Some(Value::String(text)) => match serde_json::from_str(text) {
            Ok(Value::Object(arguments)) => arguments,
            _ => return Step::Invalid,
        },
        Some(_) => return Step::Invalid,
    };
    Step::Done(ParsedCall { name: name.to_owned(), arguments })
}

/// A position in the text being read.
struct Cursor<'a> {
    text: &'a str,
    at: usize,
}

impl Cursor<'_> {
    fn rest(&self) -> &str {
        &self.text[self.at..]
    }

    fn whitespace(&mut self) {
        let rest = self.rest();
        self.at += rest.len() - rest.trim_start().len();
    }

    /// `literal`, which must be next.
    fn literal(&mut self, literal: &str) -> Step<()> {
        match self.optional(literal) {
            Step::Done(true) => Step::Done(()),
            Step::Done(false) | Step::Invalid => Step::Invalid,
            Step::More => Step::More,
        }
    }

    /// `literal` if it is next (read past it); `More` while the text ends inside it.
    fn optional(&mut self, literal: &str) -> Step<bool> {
        let rest = self.rest();
        if rest.starts_with(literal) {
            self.at += literal.len();
            Step::Done(true)
        } else if literal.starts_with(rest) {
            Step::More
        } else {
            Step::Done(false)
        }
    }

    /// A JSON object or array. Nothing else can be a call, and both end with a closing
    /// bracket, so a value that the text merely cuts short is never read as complete.
    fn json(&mut self) -> Step<Value> {
        let rest = self.rest();
        match rest.chars().next() {
            None => return Step::More,
            Some('{' | '[') => {}
            Some(_) => return Step::Invalid,
        }
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        match values.next() {
            Some(Ok(value)) => {
                self.at += values.byte_offset();
                Step::Done(value)
            }
            Some(Err(e)) if e.is_eof() => Step::More,
            None => Step::More,
            Some(Err(_)) => Step::Invalid,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn call(name: &str, arguments: Value) -> ParsedCall {
        let Value::Object(arguments) = arguments else { panic!("arguments must be an object") };
        ParsedCall { name: name.into(), arguments }
    }

    /// The output pushed whole, and pushed one character at a time, reads the same.
    fn read(format: ToolCallFormat, output: &str) -> (String, Vec<ParsedCall>) {
        let whole = ToolCallParser::parse(format, output);
        let mut parser = ToolCallParser::new(format);
        let mut pieces = Vec::new();
        for ch in output.chars() {
            pieces.extend(parser.push(&ch.to_string()));
        }
        pieces.extend(parser.finish());
        let (text, calls) = ToolCallParser::gather(pieces);
        assert_eq!((&text, &calls), (&whole.0, &whole.1), "{format}: pieces differ from the whole on {output:?}");
        whole
    }

    #[test]
    fn hermes_calls_after_text() {
        let output = "Let me look.\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"time\", \"arguments\": {}}\n</tool_call>";
        let (text, calls) = read(ToolCallFormat::Hermes, output);
        assert_eq!(text, "Let me look.\n");
        assert_eq!(calls, vec![call("weather", json!({"city": "Paris"})), call("time", json!({}))]);
        // A `<` that begins no marker is text, in order.
        assert_eq!(read(ToolCallFormat::Hermes, "a < b <tool"), ("a < b <tool".into(), vec![]));
    }

    #[test]
    fn a_broken_call_and_what_follows_it_are_text_and_earlier_calls_stand() {
        let good = "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>";
        let broken = "\n<tool_call>\n{\"name\": 3}\n</tool_call> and more";
        let (text, calls) = read(ToolCallFormat::Hermes, &format!("{good}{broken}"));
        assert_eq!(calls, vec![call("a", json!({}))]);
        assert_eq!(text, broken);
        // Cut short by the length: the incomplete call is text.
        let cut = "<tool_call>\n{\"name\": \"a\", \"argu";
        assert_eq!(read(ToolCallFormat::Hermes, cut), (cut.into(), vec![]));
        // Words after the calls.
        let (text, calls) = read(ToolCallFormat::Hermes, &format!("{good} done"));
        assert_eq!((text.as_str(), calls.len()), (" done", 1));
    }

    #[test]
    fn llama3_calls_are_the_whole_turn() {
        let one = "{\"name\": \"weather\", \"parameters\": {\"city\": \"Paris\"}}";
        assert_eq!(read(ToolCallFormat::Llama3, one), (String::new(), vec![call("weather", json!({"city": "Paris"}))]));
        let tagged = format!("<|python_tag|>{one}; {{\"name\": \"time\", \"arguments\": \"{{}}\"}}");
        let (text, calls) = read(ToolCallFormat::Llama3, &tagged);
        assert_eq!((text.as_str(), calls.len()), ("", 2));
        assert_eq!(calls[1], call("time", json!({})));
        // Text first: no calls, whatever follows.
        let prose = format!("Sure: {one}");
        assert_eq!(read(ToolCallFormat::Llama3, &prose), (prose.clone(), vec![]));
        // JSON that is not a call is text.
        let data = "{\"answer\": 4}";
        assert_eq!(read(ToolCallFormat::Llama3, data), (data.into(), vec![]));
    }

    #[test]
    fn mistral_calls_with_and_without_their_marker() {
        let array = "[{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abcdefghi\"}, {\"name\": \"time\", \"arguments\": {}}]";
        let expected = vec![call("weather", json!({"city": "Paris"})), call("time", json!({}))];
        let (text, calls) = read(ToolCallFormat::Mistral, &format!("On it. [TOOL_CALLS]{array}"));
        assert_eq!((text.as_str(), &calls), ("On it. ", &expected));
        // Decoding dropped the special token: a turn that begins with the array.
        assert_eq!(read(ToolCallFormat::Mistral, &format!(" {array}")), (String::new(), expected));
        let list = "[1, 2]";
        assert_eq!(read(ToolCallFormat::Mistral, list), (list.into(), vec![]));
        assert_eq!(read(ToolCallFormat::Mistral, "[TOOL"), ("[TOOL".into(), vec![]));
    }

    #[test]
    fn text_that_may_begin_a_marker_is_held_back_until_it_cannot() {
        let mut parser = ToolCallParser::new(ToolCallFormat::Hermes);
        assert_eq!(parser.push("Hi <tool"), vec![Piece::Text("Hi ".into())]);
        assert_eq!(parser.push("box>"), vec![Piece::Text("<toolbox>".into())]);
        let mut parser = ToolCallParser::new(ToolCallFormat::Llama3);
        assert_eq!(parser.push("  "), vec![]);
        assert_eq!(parser.push("{\"name\": \"f\""), vec![]);
        assert_eq!(parser.push(", \"parameters\": {}}"), vec![Piece::Call(call("f", json!({})))]);
        assert_eq!(parser.finish(), vec![]);
        let mut parser = ToolCallParser::new(ToolCallFormat::Mistral);
        assert_eq!(parser.push("é"), vec![Piece::Text("é".into())]);
        assert_eq!(held_tail("aé[TOOL", "[TOOL_CALLS]"), 5);
        assert_eq!(held_tail("é", "[TOOL_CALLS]"), 0);
    }
}
