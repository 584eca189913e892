//! The `messages` of a chat body as the chat template's [`ChatMessage`]s: text contents,
//! assistant turns that called tools (`tool_calls`, their arguments read from OpenAI's JSON
//! string into the mapping templates expect) and tools' results (`role: tool` with its
//! `tool_call_id`). Each error names the message and field at fault.

use serde::Deserialize;
use serde_json::Value;
use specd_text::{ChatMessage, FunctionCall, ToolCall, ToolKind};

use super::error::ApiError;

/// One message of `messages`. The fields an assistant message replayed from another server
/// carries pass when they hold nothing (`"refusal": null`, `"annotations": []`); with
/// something in them they are refused, as is the legacy `function_call`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageField {
    pub role: String,
    #[serde(default)]
    pub content: Option<ContentField>,
    /// The author's name: a function's on a tool's result, a participant's elsewhere.
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallField>>,
    #[serde(default)]
    tool_call_id: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
    #[serde(default)]
    audio: Option<Value>,
    #[serde(default)]
    annotations: Option<Vec<Value>>,
    #[serde(default)]
    function_call: Option<Value>,
}

/// A call of an assistant message, as OpenAI sends it back.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolCallField {
    id: String,
    #[serde(rename = "type")]
    kind: ToolKind,
    function: FunctionCallField,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FunctionCallField {
    name: String,
    /// The arguments as JSON text.
    arguments: String,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ContentField {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

impl ContentField {
    /// The text of a message; parts other than text are refused.
    pub fn into_text(self) -> Result<String, ApiError> {
        match self {
            Self::Text(text) => Ok(text),
            Self::Parts(parts) => parts
                .into_iter()
                .map(|part| match (part.kind.as_str(), part.text) {
                    ("text", Some(text)) => Ok(text),
                    (kind, _) => Err(ApiError::invalid(
                        format!("message content of type {kind:?} is not supported: specd serves text models"),
                        Some("messages"),
                    )),
                })
                .collect(),
        }
    }
}

impl MessageField {
    /// The fields of a message that ask for something specd does not do.
    fn unsupported(&self) -> Vec<String> {
        let mut fields = Vec::new();
        if self.refusal.is_some() {
            fields.push("messages[].refusal".to_owned());
        }
        if self.audio.as_ref().is_some_and(|a| !a.is_null()) {
            fields.push("messages[].audio".to_owned());
        }
        if self.annotations.as_ref().is_some_and(|a| !a.is_empty()) {
            fields.push("messages[].annotations".to_owned());
        }
        if self.function_call.as_ref().is_some_and(|f| !f.is_null()) {
            fields.push("messages[].function_call".to_owned());
        }
        fields
    }

    /// The message as the template sees it; `index` is its place in `messages`, for errors.
    fn into_chat(self, index: usize) -> Result<ChatMessage, ApiError> {
        let invalid = |what: String| ApiError::invalid(format!("messages[{index}]{what}"), Some("messages"));
        let calls = self.tool_calls.unwrap_or_default();
        if !calls.is_empty() && self.role != "assistant" {
            return Err(invalid(format!(".tool_calls: only an assistant message calls tools, not a {}", self.role)));
        }
        match (self.role.as_str(), &self.tool_call_id) {
            ("tool", None) => {
                return Err(invalid(": a tool message needs the tool_call_id of the call it answers".into()));
            }
            ("tool", Some(_)) | (_, None) => {}
            (role, Some(_)) => {
                return Err(invalid(format!(".tool_call_id: only a tool message answers a call, not a {role}")));
            }
        }
        let tool_calls = calls
            .into_iter()
            .enumerate()
            .map(|(j, call)| {
                let ToolCallField { id, kind, function } = call;
                let arguments = arguments(&function.arguments)
                    .map_err(|why| invalid(format!(".tool_calls[{j}].function.arguments {why}")))?;
                Ok(ToolCall { id, kind, function: FunctionCall { name: function.name, arguments } })
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        // An assistant turn that only calls tools has no text, and its template sees `none`;
        // every other turn's missing text is empty, which templates can `trim` and concatenate.
        let content = match self.content.map(ContentField::into_text).transpose()? {
            None if !tool_calls.is_empty() => None,
            text => Some(text.unwrap_or_default()),
        };
        Ok(ChatMessage { role: self.role, content, tool_calls, tool_call_id: self.tool_call_id, name: self.name })
    }
}

/// A call's arguments: JSON text of an object (an empty text, which some clients send for a
/// call without arguments, is `{}`).
fn arguments(text: &str) -> Result<serde_json::Map<String, Value>, String> {
    if text.trim().is_empty() {
        return Ok(serde_json::Map::new());
    }
    match serde_json::from_str(text) {
        Ok(Value::Object(arguments)) => Ok(arguments),
        Ok(other) => Err(format!("must be a JSON object, not {other}")),
        Err(e) => Err(format!("is not JSON: {e}")),
    }
}

/// The chat's messages, each checked.
pub fn chat_messages(messages: Vec<MessageField>) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages is empty", Some("messages")));
    }
    let unsupported: Vec<String> = messages.iter().flat_map(MessageField::unsupported).collect();
    if !unsupported.is_empty() {
        return Err(ApiError::unsupported(&unsupported));
    }
    messages.into_iter().enumerate().map(|(i, m)| m.into_chat(i)).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn chat(json: Value) -> Result<Vec<ChatMessage>, ApiError> {
        chat_messages(serde_json::from_value(json).map_err(|e| ApiError::invalid(e.to_string(), None))?)
    }

    #[test]
    fn calls_and_results_become_the_templates_messages() {
        let messages = chat(json!([
            {"role": "user", "content": "weather?", "name": "ann"},
            {"role": "assistant", "content": null, "refusal": null, "annotations": [], "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}},
                {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": ""}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "21"}]},
            {"role": "assistant", "content": null}
        ]))
        .unwrap();
        assert_eq!(messages[0].name.as_deref(), Some("ann"));
        let calls = &messages[1].tool_calls;
        assert_eq!((messages[1].content.as_deref(), calls.len()), (None, 2));
        assert_eq!(Value::Object(calls[0].function.arguments.clone()), json!({"city": "Paris"}));
        assert!(calls[1].function.arguments.is_empty());
        let result = &messages[2];
        assert_eq!((result.tool_call_id.as_deref(), result.content.as_deref()), (Some("call_1"), Some("21")));
        assert_eq!(messages[3].content.as_deref(), Some(""), "no text and no calls: empty text");
        // What the template is given, key by key.
        let rendered = serde_json::to_value(&messages[1]).unwrap();
        assert_eq!(
            rendered,
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}},
                {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": {}}}
            ]})
        );
    }

    #[test]
    fn malformed_calls_and_results_are_refused_naming_the_message() {
        let refused = [
            (json!([{"role": "tool", "content": "21"}]), "messages[0]: a tool message needs the tool_call_id"),
            (json!([{"role": "user", "content": "a", "tool_call_id": "c"}]), "messages[0].tool_call_id"),
            (
                json!([{"role": "user", "content": "a", "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]),
                "messages[0].tool_calls: only an assistant",
            ),
            (
                json!([{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"a\": "}}]}]),
                "messages[1].tool_calls[0].function.arguments is not JSON",
            ),
            (
                json!([{"role": "assistant", "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]),
                "must be a JSON object, not [1]",
            ),
        ];
        for (messages, message) in refused {
            let err = chat(messages.clone()).unwrap_err();
            assert!(err.message.contains(message), "{messages}: {}", err.message);
            assert_eq!(err.param.as_deref(), Some("messages"));
        }
        let refusal = chat(json!([{"role": "assistant", "content": "a", "refusal": "no"}])).unwrap_err();
        assert_eq!(refusal.param.as_deref(), Some("messages[].refusal"));
        let legacy = chat(json!([{"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}}]));
        assert_eq!(legacy.unwrap_err().param.as_deref(), Some("messages[].function_call"));
        // A call that is not a function's does not parse.
        let other: Result<Vec<MessageField>, _> = serde_json::from_value(json!([{"role": "assistant", "tool_calls": [
            {"id": "c", "type": "custom", "function": {"name": "f", "arguments": "{}"}}]}]));
        assert!(other.is_err());
    }

    #[test]
    fn contents_are_text() {
        let parts: ContentField =
            serde_json::from_str(r#"[{"type":"text","text":"a"},{"type":"text","text":"b"}]"#).unwrap();
        assert_eq!(parts.into_text().unwrap(), "ab");
        let image: ContentField = serde_json::from_str(r#"[{"type":"image_url","image_url":{"url":"x"}}]"#).unwrap();
        assert!(image.into_text().is_err());
    }
}
