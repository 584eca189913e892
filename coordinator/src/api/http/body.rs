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
    // The output constraint (super::constraint).
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
];
const COMPLETIONS_FIELDS: &[&str] = &["prompt"];
const CHAT_FIELDS: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    // Tool calling (super::tools).
    "tools",
    "tool_choice",
    "parallel_tool_calls",
];

/// OpenAI fields specd cannot honour, each with the values that ask for nothing (clients such
/// as LangChain send `"logit_bias": null` or `"echo": false` whatever the user set): those
/// pass, any other value is refused with the field's name. The tool fields are honoured on
/// chat (they are chat fields, looked at first) and ask for nothing only on completions; the
/// legacy `functions` and `function_call` are refused everywhere.
fn asks_for_nothing(field: &str, value: &Value) -> Option<bool> {
    let neutral = match field {
        "tools" | "functions" => value.as_array().is_some_and(Vec::is_empty),
        "tool_choice" | "function_call" => value == "none",
        "parallel_tool_calls" => value.is_boolean(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str, endpoint: Endpoint) -> Result<Body, ApiError> {
        Body::parse(json.as_bytes(), endpoint)
    }

    #[test]
    fn fields_that_change_the_output_are_refused_by_name_and_neutral_ones_pass() {
        let err = parse(r#"{"model":"m","prompt":"x","echo":true,"best_of":3}"#, Endpoint::Completions).unwrap_err();
        assert_eq!(err.message, "specd does not support echo, best_of; remove them");
        let err =
            parse(r#"{"model":"m","prompt":"x","tools":[{"type":"function"}]}"#, Endpoint::Completions).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("tools"));
        let legacy = parse(r#"{"model":"m","messages":[],"functions":[{"name":"f"}]}"#, Endpoint::Chat).unwrap_err();
        assert_eq!(legacy.param.as_deref(), Some("functions"));
        // Tools are honoured on chat (super::tools), so they pass here.
        assert!(parse(r#"{"model":"m","messages":[],"tools":[],"tool_choice":"auto"}"#, Endpoint::Chat).is_ok());
        // Constraints are honoured (super::constraint), so they pass here.
        assert!(
            parse(r#"{"model":"m","messages":[],"response_format":{"type":"json_object"}}"#, Endpoint::Chat).is_ok()
        );
        let neutral = r#"{"model":"m","prompt":"x","echo":false,"best_of":1,"logit_bias":null,"suffix":null,"tools":[],
            "store":false,"metadata":{"user":"u"},"service_tier":"auto"}"#;
        assert!(parse(neutral, Endpoint::Completions).is_ok());
        let stored = parse(r#"{"model":"m","prompt":"x","store":true}"#, Endpoint::Completions).unwrap_err();
        assert_eq!(stored.param.as_deref(), Some("store"));
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
    fn prompts() {
        let body = parse(r#"{"model":"m","prompt":[[1,2,3]]}"#, Endpoint::Completions).unwrap();
        assert!(
            matches!(body.get::<PromptField>("prompt").unwrap(), Some(PromptField::TokenLists(l)) if l == [[1, 2, 3]])
        );
    }
}
