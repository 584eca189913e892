//! `json.dumps` as Python writes it, for the chat templates' `tojson` filter.
//!
//! transformers replaces Jinja's `tojson` (which escapes HTML characters) with
//! `json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)`.
//! Python's separators differ from serde_json's (`", "` and `": "` without an indent, `","` and
//! `": "` with one), so tools and arguments rendered into a prompt need this writer to match.

use std::fmt::Write;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

/// How `json.dumps` was asked to write.
struct Style {
    ensure_ascii: bool,
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
}

/// The `tojson` filter: `value | tojson(indent=4)` and the other keywords of `json.dumps` that
/// transformers passes through.
// minijinja hands keyword arguments to filters by value.
#[allow(clippy::needless_pass_by_value)]
pub fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<String, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")?.or(indent) {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match (v.as_i64(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(usize::try_from(n).unwrap_or(0))),
            (None, Some(s)) => Some(s.to_owned()),
            _ => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: indent must be an integer or a string")),
        },
    };
    let (item_separator, key_separator) = match kwargs.get::<Option<Value>>("separators")? {
        Some(v) if !v.is_none() => {
            let parts: Vec<String> =
                v.try_iter()?.map(|p| p.as_str().map(str::to_owned)).collect::<Option<_>>().unwrap_or_default();
            match <[String; 2]>::try_from(parts) {
                Ok([item, key]) => (item, key),
                Err(_) => {
                    return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be two strings"));
                }
            }
        }
        _ if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        _ => (", ".to_owned(), ": ".to_owned()),
    };
    let style = Style {
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        indent,
        item_separator,
        key_separator,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_value(&mut out, value, &style, 0)?;
    Ok(out)
}

fn write_value(out: &mut String, value: &Value, style: &Style, depth: usize) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value)?,
        ValueKind::String => write_string(out, value.as_str().unwrap_or_default(), style.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, ('[', ']'), items.len(), style, depth, |out, i| {
                write_value(out, &items[i], style, depth + 1)
            })?;
        }
        ValueKind::Map => {
            let mut entries: Vec<(String, Value)> = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((key_string(&key)?, item));
            }
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(out, ('{', '}'), entries.len(), style, depth, |out, i| {
                write_string(out, &entries[i].0, style.ensure_ascii);
                out.push_str(&style.key_separator);
                write_value(out, &entries[i].1, style, depth + 1)
            })?;
        }
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a value of kind {kind} is not JSON serializable"),
            ));
        }
    }
    Ok(())
}

fn write_container(
    out: &mut String,
    (open, close): (char, char),
    len: usize,
    style: &Style,
    depth: usize,
    mut item: impl FnMut(&mut String, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if len == 0 {
        out.push(close);
        return Ok(());
    }
    for i in 0..len {
        if i > 0 {
            out.push_str(&style.item_separator);
        }
        if let Some(indent) = &style.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth + 1));
        }
        item(out, i)?;
    }
    if let Some(indent) = &style.indent {
        out.push('\n');
        out.push_str(&indent.repeat(depth));
    }
    out.push(close);
    Ok(())
}

/// Python turns non-string keys into strings: `1` -> `"1"`, `True` -> `"true"`, `None` -> `"null"`.
fn key_string(key: &Value) -> Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_owned(),
        ValueKind::None => "null".to_owned(),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_owned(),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, key)?;
            s
        }
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: keys must be str, int, float, bool or None, not {kind}"),
            ));
        }
    })
}

fn write_number(out: &mut String, value: &Value) -> Result<(), Error> {
    if value.is_integer() {
        let _ = write!(out, "{value}");
        return Ok(());
    }
    let x = f64::try_from(value.clone())?;
    if x.is_nan() {
        out.push_str("NaN");
    } else if x.is_infinite() {
        out.push_str(if x > 0.0 { "Infinity" } else { "-Infinity" });
    } else {
        out.push_str(&python_float_repr(x));
    }
    Ok(())
}

/// Python's `repr(float)`: the shortest round-trip digits, with `.0` on integral values and an
/// exponent (`1e+16`) outside [1e-4, 1e16).
fn python_float_repr(x: f64) -> String {
    // Rust's `{:e}` gives the shortest round-trip digits: "1.5e-7", "1e16".
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let plain = format!("{x}");
        if plain.contains('.') { plain } else { format!("{plain}.0") }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

/// A JSON string as Python writes it: `"` `\` and control characters escaped (with `\n`-style
/// short forms where JSON has them), everything else kept unless `ensure_ascii`.
fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    // The expected strings are what CPython 3.11's json.dumps writes for the same values.
    fn dumps(template: &str) -> String {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson);
        env.render_str(template, minijinja::context! {}).unwrap()
    }

    #[test]
    fn writes_as_python_json_dumps() {
        assert_eq!(
            dumps(r#"{{ {"a": 1, "b": [1, 2.5, none, true], "c": "é\n\"x\""} | tojson }}"#),
            r#"{"a": 1, "b": [1, 2.5, null, true], "c": "é\n\"x\""}"#
        );
        assert_eq!(
            dumps(r#"{{ {"a": [1, {}], "b": []} | tojson(indent=2) }}"#),
            "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}"
        );
        assert_eq!(
            dumps(r#"{{ {"b": 1, "a": 2} | tojson(sort_keys=true, separators=[",", ":"]) }}"#),
            r#"{"a":2,"b":1}"#
        );
        assert_eq!(dumps(r#"{{ "é<>&'" | tojson }}"#), r#""é<>&'""#, "no HTML escaping, no ASCII escaping");
        assert_eq!(dumps(r#"{{ "é😀" | tojson(ensure_ascii=true) }}"#), r#""\u00e9\ud83d\ude00""#);
        assert_eq!(dumps(r#"{{ [1.0, 0.0001, 1e16, 1.5e-7, -2.0] | tojson }}"#), "[1.0, 0.0001, 1e+16, 1.5e-07, -2.0]");
    }
}
