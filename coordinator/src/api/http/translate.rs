//! An OpenAI request body turned into the gRPC API's [`GenerateRequest`]: the HTTP API is a
//! second face of the same service, so every check and default of the gRPC API applies.

use specd_proto::v1::generate_request::Prompt;
use specd_proto::v1::{GenerateRequest, SamplingParams, Speculation, StoppingCriteria, TokenIds};
use specd_text::ChatMessage;

use super::body::{Body, Endpoint, PromptField, SpeculationField, StopField, StreamOptions};
use super::constraint::constraint;
use super::error::ApiError;
use super::messages::chat_messages;
use super::tools::{Tools, tools};

/// OpenAI's default `max_tokens` for /v1/completions; chat requests default to the
/// coordinator's own limit, as OpenAI's chat endpoint has none of its own.
pub const COMPLETIONS_DEFAULT_MAX_TOKENS: u32 = 16;
use specd_sampling::logprobs::MAX_TOP_LOGPROBS;

/// What the prompt is before the coordinator turns it into tokens.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptSource {
    Completion(Prompt),
    Chat(Vec<ChatMessage>),
}

/// A request to either endpoint, checked and translated.
#[derive(Debug, Clone)]
pub struct HttpRequest {
    pub model: String,
    pub prompt: PromptSource,
    /// Everything but the prompt, which [`PromptSource`] becomes once tokenised.
    pub generate: GenerateRequest,
    pub stream: bool,
    pub include_usage: bool,
    /// Asked for log-probabilities (`generate.logprobs` holds how many alternatives).
    pub logprobs: bool,
    /// The tools a chat offers and how it lets the model call them.
    pub tools: Option<Tools>,
    /// The field whose output constraint `generate` carries, for the errors of compiling it.
    pub constraint_field: Option<&'static str>,
}

pub fn translate(body: &Body, endpoint: Endpoint) -> Result<HttpRequest, ApiError> {
    let model: String = body.require("model")?;
    let prompt = match endpoint {
        Endpoint::Completions => PromptSource::Completion(completion_prompt(body.require("prompt")?)?),
        Endpoint::Chat => PromptSource::Chat(chat_messages(body.require("messages")?)?),
    };
    if let Some(n) = body.get::<u32>("n")?
        && n != 1
    {
        return Err(ApiError::invalid(
            format!("n = {n}: specd generates one choice per request; send {n} requests"),
            Some("n"),
        ));
    }
    let stream = body.get::<bool>("stream")?.unwrap_or(false);
    let include_usage = match body.get::<StreamOptions>("stream_options")? {
        Some(_) if !stream => {
            return Err(ApiError::invalid("stream_options is only allowed with stream: true", Some("stream_options")));
        }
        Some(options) => options.include_usage,
        None => false,
    };
    let max_new_tokens = max_tokens(body, endpoint)?;
    let stop_strings = body.get::<StopField>("stop")?.map(StopField::into_vec).unwrap_or_default();
    let logprobs = logprobs(body, endpoint)?;
    let wants_logprobs = logprobs.is_some();
    let sampling = SamplingParams {
        temperature: body.get("temperature")?,
        top_k: body.get::<i32>("top_k")?.map(|k| if k == -1 { 0 } else { k }),
        top_p: body.get("top_p")?,
        min_p: body.get("min_p")?,
        repetition_penalty: body.get("repetition_penalty")?,
        presence_penalty: body.get("presence_penalty")?,
        frequency_penalty: body.get("frequency_penalty")?,
        seed: body.get::<i64>("seed")?.map(|s| s as u64),
    };
    let speculation =
        body.get::<SpeculationField>("speculation")?.map(|s| Speculation { gamma: s.gamma, dense: false });
    let constraint = constraint(body)?;
    let constraint_field = constraint.as_ref().map(|(field, _)| *field);
    let tools = match endpoint {
        Endpoint::Chat => tools(body, constraint_field)?,
        Endpoint::Completions => None,
    };
    let generate = GenerateRequest {
        request_id: String::new(),
        prompt: None,
        sampling: Some(sampling),
        stopping: Some(StoppingCriteria {
            max_new_tokens,
            stop_strings,
            stop_token_ids: Vec::new(),
            ignore_eos: body.get("ignore_eos")?.unwrap_or(false),
        }),
        speculation,
        logprobs,
        cache_salt: body.get("cache_salt")?.unwrap_or_default(),
        constraint: constraint.map(|(_, constraint)| constraint),
    };
    Ok(HttpRequest {
        model,
        prompt,
        generate,
        stream,
        include_usage,
        logprobs: wants_logprobs,
        tools,
        constraint_field,
    })
}

fn completion_prompt(field: PromptField) -> Result<Prompt, ApiError> {
    let batch = |n: usize| {
        ApiError::invalid(format!("a list of {n} prompts is a batch: send one prompt per request"), Some("prompt"))
    };
    match field {
        PromptField::Text(text) => Ok(Prompt::Text(text)),
        PromptField::Tokens(ids) => Ok(Prompt::TokenIds(TokenIds { ids })),
        PromptField::Texts(mut texts) if texts.len() == 1 => Ok(Prompt::Text(texts.remove(0))),
        PromptField::TokenLists(mut lists) if lists.len() == 1 => {
            Ok(Prompt::TokenIds(TokenIds { ids: lists.remove(0) }))
        }
        PromptField::Texts(texts) => Err(batch(texts.len())),
        PromptField::TokenLists(lists) => Err(batch(lists.len())),
    }
}

fn max_tokens(body: &Body, endpoint: Endpoint) -> Result<Option<u32>, ApiError> {
    let legacy = body.get::<u32>("max_tokens")?;
    let chosen = match endpoint {
        Endpoint::Completions => Some(legacy.unwrap_or(COMPLETIONS_DEFAULT_MAX_TOKENS)),
        Endpoint::Chat => match (body.get::<u32>("max_completion_tokens")?, legacy) {
            (Some(a), Some(b)) if a != b => {
                return Err(ApiError::invalid(
                    format!("max_completion_tokens {a} and max_tokens {b} disagree: send one"),
                    Some("max_completion_tokens"),
                ));
            }
            (a, b) => a.or(b),
        },
    };
    Ok(chosen)
}

/// Completions take `logprobs: <alternatives>`; chat takes `logprobs: true` and
/// `top_logprobs: <alternatives>`.
fn logprobs(body: &Body, endpoint: Endpoint) -> Result<Option<u32>, ApiError> {
    let top = match endpoint {
        Endpoint::Completions => body.get::<u32>("logprobs")?,
        Endpoint::Chat => {
            let asked = body.get::<bool>("logprobs")?.unwrap_or(false);
            let top = body.get::<u32>("top_logprobs")?;
            match (asked, top) {
                (false, Some(_)) => {
                    return Err(ApiError::invalid("top_logprobs needs logprobs: true", Some("top_logprobs")));
                }
                (false, None) => None,
                (true, top) => Some(top.unwrap_or(0)),
            }
        }
    };
    match top {
        Some(top) if top > MAX_TOP_LOGPROBS => Err(ApiError::invalid(
            format!("at most {MAX_TOP_LOGPROBS} alternatives per token, not {top}"),
            Some(if endpoint == Endpoint::Chat { "top_logprobs" } else { "logprobs" }),
        )),
        top => Ok(top),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(json: &str, endpoint: Endpoint) -> Result<HttpRequest, ApiError> {
        translate(&Body::parse(json.as_bytes(), endpoint)?, endpoint)
    }

    #[test]
    fn every_sampling_field_reaches_the_grpc_request() {
        let r = request(
            r#"{"model":"m","prompt":"hi","max_tokens":7,"temperature":0.5,"top_p":0.9,"top_k":-1,
                "min_p":0.1,"repetition_penalty":1.1,"presence_penalty":0.2,"frequency_penalty":0.3,
                "seed":-1,"stop":"\n","ignore_eos":true,"speculation":{"gamma":3},"stream":true,
                "stream_options":{"include_usage":true},"logprobs":2,"user":"u"}"#,
            Endpoint::Completions,
        )
        .unwrap();
        let s = r.generate.sampling.unwrap();
        assert_eq!(
            (s.temperature, s.top_p, s.top_k, s.min_p, s.repetition_penalty),
            (Some(0.5), Some(0.9), Some(0), Some(0.1), Some(1.1))
        );
        assert_eq!((s.presence_penalty, s.frequency_penalty, s.seed), (Some(0.2), Some(0.3), Some(u64::MAX)));
        let stop = r.generate.stopping.unwrap();
        assert_eq!((stop.max_new_tokens, stop.stop_strings, stop.ignore_eos), (Some(7), vec!["\n".to_owned()], true));
        assert_eq!(r.generate.speculation.unwrap().gamma, Some(3));
        assert!(r.stream && r.include_usage);
        assert!(r.logprobs);
        assert_eq!(r.generate.logprobs, Some(2));
        assert_eq!(r.prompt, PromptSource::Completion(Prompt::Text("hi".into())));
    }

    #[test]
    fn defaults_and_refusals() {
        let r = request(r#"{"model":"m","prompt":[5,6]}"#, Endpoint::Completions).unwrap();
        assert_eq!(r.generate.stopping.unwrap().max_new_tokens, Some(COMPLETIONS_DEFAULT_MAX_TOKENS));
        assert_eq!(r.generate.sampling.unwrap().temperature, None, "unset stays unset: the model's defaults apply");
        let chat = request(r#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#, Endpoint::Chat).unwrap();
        assert_eq!(chat.generate.stopping.unwrap().max_new_tokens, None);
        assert_eq!(chat.prompt, PromptSource::Chat(vec![ChatMessage::new("user", "x")]));
        assert_eq!(chat.tools, None);
        let refused = [
            (r#"{"model":"m","prompt":"x","n":2}"#, "n"),
            (r#"{"model":"m","prompt":["a","b"]}"#, "prompt"),
            (r#"{"model":"m","prompt":"x","stream_options":{"include_usage":true}}"#, "stream_options"),
            (r#"{"model":"m","prompt":"x","logprobs":21}"#, "logprobs"),
            (r#"{"prompt":"x"}"#, "model"),
        ];
        for (json, param) in refused {
            let err = request(json, Endpoint::Completions).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(param), "{json}: {}", err.message);
        }
        let chat_refused = [
            (r#"{"model":"m","messages":[]}"#, "messages"),
            (r#"{"model":"m","messages":[{"role":"user","content":"x"}],"top_logprobs":2}"#, "top_logprobs"),
            (
                r#"{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":3,"max_completion_tokens":4}"#,
                "max_completion_tokens",
            ),
        ];
        for (json, param) in chat_refused {
            let err = request(json, Endpoint::Chat).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(param), "{json}: {}", err.message);
        }
    }
}
