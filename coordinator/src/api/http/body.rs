//! The JSON bodies of `/v1/completions` and `/v1/chat/completions`: which fields specd honours,
//! which it refuses by name (never ignoring one that would change the output), and their
//! types, each error naming its field.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::error::ApiError;

/// Which of the two generation endpoints a body was sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}

/// Fields both endpoints take. `user` is the client's label for its end user: accepted and
/// not used.
const COMMON_FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "n",
    "stream",
    "stream_options",
    "presence_penalty",
    "frequency_penalty",
    "top_k",
    "min_p",
    "repetition_penalty",
    "ignore_eos",
    "speculation",
    "user",
    "logprobs",
    "cache_salt",
];
const COMPLETIONS_FIELDS: &[&str] = &["prompt"];
const CHAT_FIELDS: &[&str] = &["messages", "max_completion_tokens", "top_logprobs"];

/// OpenAI fields specd cannot honour, each with the values that ask for nothing (clients such
/// as LangChain send `"logit_bias": null` or `"echo": false` whatever the user set): those
/// pass, any other value is refused with the field's name.
fn asks_for_nothing(field: &str, value: &Value) -> Option<bool> {
    let neutral = match field {
        "tools" | "functions" => value.as_array().is_some_and(Vec::is_empty),
        "tool_choice" | "function_call" => value == "none",
        "parallel_tool_calls" => value.is_boolean(),
        "response_format" => value.get("type").is_some_and(|t| t == "text"),
        "suffix" => value == "",
        "echo" => value == false,
        "best_of" => value == 1,
        "logit_bias" => value.as_object().is_some_and(Map::is_empty),
        "store" => value == false,
        // Labels for the client's own records, and the tier of a service that has one.
        "metadata" => value.is_object(),
        "service_tier" => value.is_string(),
        _ => return None,
    };
    Some(neutral || value.is_null())
}

/// A body, checked to be a JSON object holding only fields specd honours.
#[derive(Debug)]
pub struct Body {
    fields: Map<String, Value>,
}

impl Body {
    pub fn parse(bytes: &[u8], endpoint: Endpoint) -> Result<Self, ApiError> {
        let value: Value = serde_json::from_slice(bytes)
            .map_err(|e| ApiError::invalid(format!("the request body is not valid JSON: {e}"), None))?;
        let Value::Object(fields) = value else {
            return Err(ApiError::invalid("the request body must be a JSON object", None));
        };
        let own = match endpoint {
            Endpoint::Completions => COMPLETIONS_FIELDS,
            Endpoint::Chat => CHAT_FIELDS,
        };
        let (mut unsupported, mut unknown) = (Vec::new(), Vec::new());
        for (name, value) in &fields {
            if COMMON_FIELDS.contains(&name.as_str()) || own.contains(&name.as_str()) {
                continue;
            }
            match asks_for_nothing(name, value) {
                Some(true) => {}
                Some(false) => unsupported.push(name.clone()),
                None => unknown.push(name.clone()),
            }
        }
        if !unsupported.is_empty() {
            return Err(ApiError::unsupported(&unsupported));
        }
        if !unknown.is_empty() {
            return Err(ApiError::invalid(
                format!("unrecognized request argument(s): {}", unknown.join(", ")),
                unknown.first().map(String::as_str),
            ));
        }
        Ok(Self { fields })
    }

    /// The field `name` as a `T`; absent and `null` are `None`.
    pub fn get<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>, ApiError> {
        match self.fields.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => {
                T::deserialize(value).map(Some).map_err(|e| ApiError::invalid(format!("`{name}`: {e}"), Some(name)))
            }
        }
    }

    /// A field that must be there.
    pub fn require<T: DeserializeOwned>(&self, name: &str) -> Result<T, ApiError> {
        self.get(name)?.ok_or_else(|| ApiError::invalid(format!("`{name}` is required"), Some(name)))
    }
}

/// `stop`: one string or a list of them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

impl StopField {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s],
            Self::Many(v) => v,
        }
    }
}

/// `prompt` of /v1/completions: text or token ids, or a list holding one of them (a list of
/// several is a batch, which specd does not take in one request).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<u32>>),
}

/// `stream_options`. `include_obfuscation` pads events against length side channels;
/// specd sends none, which changes no text.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
    #[serde(default, rename = "include_obfuscation")]
    _include_obfuscation: Option<bool>,
}

/// `speculation`, as the gRPC API's `Speculation`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeculationField {
    pub gamma: Option<u32>,
}

/// One message of `messages`: `content` is a string, or a list of text parts. The fields an
/// assistant message replayed from another server carries pass when they hold nothing
/// (`"tool_calls": null`, `"refusal": null`); with something in them they are refused, as is
/// `name`, which specd's templates are not given.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageField {
    pub role: String,
    #[serde(default)]
    pub content: Option<ContentField>,
    #[serde(default)]
    tool_calls: Option<Vec<Value>>,
    #[serde(default)]
    refusal: Option<String>,
    #[serde(default)]
    audio: Option<Value>,
    #[serde(default)]
    annotations: Option<Vec<Value>>,
    #[serde(default)]
    function_call: Option<Value>,
}

impl MessageField {
    /// The fields of an assistant message that ask for something specd does not do.
    pub fn unsupported(&self) -> Vec<String> {
        let mut fields = Vec::new();
        if self.tool_calls.as_ref().is_some_and(|c| !c.is_empty()) {
            fields.push("messages[].tool_calls".to_owned());
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str, endpoint: Endpoint) -> Result<Body, ApiError> {
        Body::parse(json.as_bytes(), endpoint)
    }

    #[test]
    fn fields_that_change_the_output_are_refused_by_name_and_neutral_ones_pass() {
        let err = parse(r#"{"model":"m","prompt":"x","echo":true,"best_of":3}"#, Endpoint::Completions).unwrap_err();
        assert_eq!(err.message, "specd does not support best_of, echo; remove them");
        let err = parse(r#"{"model":"m","messages":[],"tools":[{"type":"function"}]}"#, Endpoint::Chat).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("tools"));
        let err = parse(r#"{"model":"m","messages":[],"response_format":{"type":"json_object"}}"#, Endpoint::Chat)
            .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("response_format"));
        let neutral = r#"{"model":"m","prompt":"x","echo":false,"best_of":1,"logit_bias":null,"suffix":null,"tools":[],
            "store":false,"metadata":{"user":"u"},"service_tier":"auto"}"#;
        assert!(parse(neutral, Endpoint::Completions).is_ok());
        let stored = parse(r#"{"model":"m","prompt":"x","store":true}"#, Endpoint::Completions).unwrap_err();
        assert_eq!(stored.param.as_deref(), Some("store"));
        let replayed: MessageField = serde_json::from_str(
            r#"{"role":"assistant","content":"a","tool_calls":null,"refusal":null,"annotations":[]}"#,
        )
        .unwrap();
        assert!(replayed.unsupported().is_empty());
        let called: MessageField =
            serde_json::from_str(r#"{"role":"assistant","content":null,"tool_calls":[{"id":"c"}]}"#).unwrap();
        assert_eq!(called.unsupported(), vec!["messages[].tool_calls".to_owned()]);
    }

    #[test]
    fn unknown_fields_and_fields_of_the_other_endpoint_are_refused() {
        let err = parse(r#"{"model":"m","prompt":"x","frobnicate":1}"#, Endpoint::Completions).unwrap_err();
        assert_eq!(err.message, "unrecognized request argument(s): frobnicate");
        assert!(parse(r#"{"model":"m","prompt":"x"}"#, Endpoint::Chat).is_err(), "prompt is not a chat field");
        assert!(parse(r#"{"model":"m","messages":[]}"#, Endpoint::Completions).is_err());
    }

    #[test]
    fn type_errors_name_the_field() {
        let body = parse(r#"{"model":"m","prompt":"x","max_tokens":"ten"}"#, Endpoint::Completions).unwrap();
        let err = body.get::<u32>("max_tokens").unwrap_err();
        assert_eq!(err.param.as_deref(), Some("max_tokens"));
        assert!(err.message.starts_with("`max_tokens`: invalid type"), "{}", err.message);
        assert_eq!(body.get::<u32>("n").unwrap(), None);
        assert!(parse("[1]", Endpoint::Completions).is_err());
        assert!(parse("{", Endpoint::Completions).is_err());
    }

    #[test]
    fn prompts_and_contents() {
        let body = parse(r#"{"model":"m","prompt":[[1,2,3]]}"#, Endpoint::Completions).unwrap();
        assert!(
            matches!(body.get::<PromptField>("prompt").unwrap(), Some(PromptField::TokenLists(l)) if l == [[1, 2, 3]])
        );
        let parts: ContentField =
            serde_json::from_str(r#"[{"type":"text","text":"a"},{"type":"text","text":"b"}]"#).unwrap();
        assert_eq!(parts.into_text().unwrap(), "ab");
        let image: ContentField = serde_json::from_str(r#"[{"type":"image_url","image_url":{"url":"x"}}]"#).unwrap();
        assert!(image.into_text().is_err());
    }
}
