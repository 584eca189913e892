//! Responses in OpenAI's shapes: a whole completion, the chunks of a stream, the usage chunk;
//! the speculation stats ride along under a `specd` key.

use std::sync::Arc;

use serde_json::{Value, json};
use specd_proto::v1::{FinishReason, GenerateResponse, OutputLogprob, SpeculationStats, Usage};
use specd_text::ModelText;

use super::body::Endpoint;
use super::calls::{self, CallReader, Read};

/// What every response of one request shares.
#[derive(Debug, Clone)]
pub struct Shape {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl Shape {
    pub fn new(endpoint: Endpoint, request_id: &str, created: u64, model: String) -> Self {
        let prefix = match endpoint {
            Endpoint::Completions => "cmpl",
            Endpoint::Chat => "chatcmpl",
        };
        Self { endpoint, id: format!("{prefix}-{request_id}"), created, model }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        let mut envelope = json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
        });
        envelope["choices"] = choices;
        envelope
    }

    /// The whole generation, `all` holding every token and the text; `calls` reads the text
    /// for tool calls where the request offered tools.
    pub fn whole(&self, all: &GenerateResponse, logprobs: Option<Value>, calls: Option<CallReader>) -> Value {
        let mut finish = finish_reason(all.finish_reason);
        let mut choice = match (self.endpoint, calls) {
            (Endpoint::Completions, _) => json!({"index": 0, "text": all.text, "finish_reason": finish}),
            (Endpoint::Chat, None) => json!({
                "index": 0,
                "message": {"role": "assistant", "content": all.text},
                "finish_reason": finish,
            }),
            (Endpoint::Chat, Some(mut reader)) => {
                let mut text = reader.push(&all.text).text;
                text.push_str(&reader.finish().text);
                finish = with_calls(finish, !reader.calls().is_empty());
                json!({"index": 0, "message": calls::message(text, reader.calls()), "finish_reason": finish})
            }
        };
        choice["logprobs"] = logprobs.unwrap_or_default();
        let mut body = self.envelope(false, json!([choice]));
        body["usage"] = usage(all.usage.as_ref());
        body["specd"] = stats(all.stats.as_ref());
        body["specd"]["token_ids"] = json!(all.token_ids);
        body
    }

    /// The chat stream's first chunk: the assistant's role, no text yet.
    pub fn role_chunk(&self) -> Value {
        let choice =
            json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null});
        self.envelope(true, json!([choice]))
    }

    /// One streamed message: its text, and on the last one the finish reason and stats.
    pub fn chunk(&self, message: &GenerateResponse, logprobs: Option<Value>) -> Value {
        let finish = finish_reason(message.finish_reason);
        match self.endpoint {
            Endpoint::Completions => {
                let choice = json!({"index": 0, "text": message.text, "finish_reason": finish});
                self.with_end(choice, logprobs, finish.and(Some(message)))
            }
            Endpoint::Chat => {
                let delta = if message.text.is_empty() { json!({}) } else { json!({"content": message.text}) };
                self.delta_chunk(delta, finish, logprobs, finish.and(Some(message)))
            }
        }
    }

    /// The chunks of one streamed chat message whose text was read for tool calls (`read`):
    /// the text that is sure not to be a call, then each new call's two deltas (the first
    /// numbered `first_index`); the message's log-probabilities ride on the first chunk, and
    /// on its last message the finish reason (`tool_calls` where `called`) and stats on the
    /// last. `None` of them when there is nothing to send.
    pub fn call_chunks(
        &self,
        message: &GenerateResponse,
        read: &Read,
        first_index: usize,
        called: bool,
        mut logprobs: Option<Value>,
    ) -> Vec<Value> {
        let finish = with_calls(finish_reason(message.finish_reason), called);
        let mut deltas = Vec::new();
        if !read.text.is_empty() {
            deltas.push(json!({"content": read.text}));
        }
        for (k, call) in read.calls.iter().enumerate() {
            deltas.extend(calls::deltas(first_index + k, call));
        }
        if deltas.is_empty() && (finish.is_some() || logprobs.is_some()) {
            deltas.push(json!({}));
        }
        let n = deltas.len();
        deltas
            .into_iter()
            .enumerate()
            .map(|(k, delta)| {
                let end = if k + 1 == n { finish } else { None };
                self.delta_chunk(delta, end, logprobs.take(), end.and(Some(message)))
            })
            .collect()
    }

    fn delta_chunk(
        &self,
        delta: Value,
        finish: Option<&str>,
        logprobs: Option<Value>,
        last: Option<&GenerateResponse>,
    ) -> Value {
        let mut choice = json!({"index": 0, "finish_reason": finish});
        choice["delta"] = delta;
        self.with_end(choice, logprobs, last)
    }

    /// A chunk of one choice; `last`: the generation's last message, whose stats the last
    /// chunk carries.
    fn with_end(&self, mut choice: Value, logprobs: Option<Value>, last: Option<&GenerateResponse>) -> Value {
        choice["logprobs"] = logprobs.unwrap_or_default();
        let mut chunk = self.envelope(true, json!([choice]));
        if let Some(last) = last {
            chunk["specd"] = stats(last.stats.as_ref());
        }
        chunk
    }

    /// `stream_options.include_usage`: a last chunk with no choices and the usage.
    pub fn usage_chunk(&self, last_usage: Option<&Usage>) -> Value {
        let mut chunk = self.envelope(true, json!([]));
        chunk["usage"] = usage(last_usage);
        chunk
    }
}

/// Log-probabilities in the endpoint's shape: completions' `{tokens, token_logprobs,
/// top_logprobs, text_offset}`, chat's `{content: [{token, logprob, bytes, top_logprobs}]}`.
/// A stream keeps one, so that text offsets run on across chunks.
#[derive(Debug)]
pub struct LogprobFormat {
    endpoint: Endpoint,
    text: Option<Arc<ModelText>>,
    offset: usize,
}

impl LogprobFormat {
    pub fn new(endpoint: Endpoint, text: Option<Arc<ModelText>>) -> Self {
        Self { endpoint, text, offset: 0 }
    }

    /// A token's text alone; `token_id:N` for a model without a tokenizer.
    fn name(&self, id: u32) -> String {
        self.text
            .as_ref()
            .and_then(|t| t.tokenizer().decode(&[id], false).ok())
            .unwrap_or_else(|| format!("token_id:{id}"))
    }

    pub fn format(&mut self, ids: &[u32], logprobs: &[OutputLogprob]) -> Value {
        let pairs = ids.iter().zip(logprobs);
        match self.endpoint {
            Endpoint::Completions => {
                let (mut tokens, mut values, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
                for (&id, lp) in pairs {
                    let name = self.name(id);
                    offsets.push(self.offset);
                    self.offset += name.chars().count();
                    tokens.push(name);
                    values.push(lp.logprob);
                    let top: serde_json::Map<String, Value> =
                        lp.top.iter().map(|a| (self.name(a.token_id), json!(a.logprob))).collect();
                    tops.push(top);
                }
                json!({"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets})
            }
            Endpoint::Chat => {
                let entry = |id: u32, logprob: f64| {
                    let token = self.name(id);
                    json!({"token": token, "logprob": logprob, "bytes": token.as_bytes()})
                };
                let content: Vec<Value> = pairs
                    .map(|(&id, lp)| {
                        let mut item = entry(id, lp.logprob);
                        item["top_logprobs"] = lp.top.iter().map(|a| entry(a.token_id, a.logprob)).collect();
                        item
                    })
                    .collect();
                json!({"content": content, "refusal": null})
            }
        }
    }
}

/// An output that ended where the model chose (`stop`) after calls ends with `tool_calls`, as
/// OpenAI's; one cut by the length keeps `length`.
fn with_calls(finish: Option<&'static str>, called: bool) -> Option<&'static str> {
    match finish {
        Some("stop") if called => Some("tool_calls"),
        other => other,
    }
}

/// OpenAI has "stop" for both an end-of-sequence token and a stop string.
pub fn finish_reason(reason: i32) -> Option<&'static str> {
    match FinishReason::try_from(reason).unwrap_or(FinishReason::Unspecified) {
        FinishReason::Length => Some("length"),
        FinishReason::Eos | FinishReason::Stop => Some("stop"),
        // Only a client that has left is cancelled: nothing reaches it, and OpenAI has no
        // such reason.
        FinishReason::Cancelled | FinishReason::Unspecified => None,
    }
}

fn usage(usage: Option<&Usage>) -> Value {
    let (prompt, completion, cached) =
        usage.map_or((0, 0, 0), |u| (u.prompt_tokens, u.completion_tokens, u.cached_prompt_tokens));
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

/// The speculation stats a user reads: rounds, how many candidates were proposed and
/// accepted (in all and by proposer), α, and whether the draft or a target was lost.
fn stats(stats: Option<&SpeculationStats>) -> Value {
    let Some(s) = stats else { return Value::Null };
    let acceptance = (s.evaluated_positions > 0).then(|| s.acceptance_sum / s.evaluated_positions as f64);
    let by_proposer: serde_json::Map<String, Value> = s
        .by_proposer
        .iter()
        .map(|(kind, t)| (kind.clone(), json!({"proposed": t.proposed, "accepted": t.accepted})))
        .collect();
    json!({
        "rounds": s.rounds,
        "draft_tokens": s.draft_tokens,
        "accepted_tokens": s.accepted_tokens,
        "acceptance": acceptance,
        "gamma": s.gamma,
        "by_proposer": by_proposer,
        "empty_proposals": s.empty_proposals,
        "draft_fallbacks": s.draft_fallbacks,
        "target_failovers": s.target_failovers,
        "draft_ns": s.draft_ns,
        "verify_ns": s.verify_ns,
        "round_wall_ns": s.round_wall_ns,
        "wire_bytes_sent": s.wire_bytes_sent,
        "wire_bytes_received": s.wire_bytes_received,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(text: &str, finish: FinishReason) -> GenerateResponse {
        GenerateResponse {
            request_id: "r".into(),
            text: text.into(),
            token_ids: vec![1, 2],
            logprobs: Vec::new(),
            finish_reason: finish as i32,
            usage: Some(Usage { prompt_tokens: 3, completion_tokens: 2, cached_prompt_tokens: 0 }),
            stats: Some(SpeculationStats {
                rounds: 1,
                evaluated_positions: 2,
                acceptance_sum: 1.0,
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_whole_chat_completion_in_openais_shape() {
        let shape = Shape::new(Endpoint::Chat, "r1", 7, "m".into());
        let body = shape.whole(&message("hi", FinishReason::Eos), None, None);
        assert_eq!(body["id"], "chatcmpl-r1");
        assert_eq!(body["object"], "chat.completion");
        assert_eq!(body["choices"][0]["message"]["content"], "hi");
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
        assert_eq!(body["usage"]["total_tokens"], 5);
        assert_eq!(body["specd"]["acceptance"], 0.5);
    }

    #[test]
    fn chunks_carry_deltas_and_the_finish_reason_only_at_the_end() {
        let shape = Shape::new(Endpoint::Completions, "r1", 7, "m".into());
        let middle = shape.chunk(&message("a", FinishReason::Unspecified), None);
        assert!(middle["choices"][0]["finish_reason"].is_null());
        assert!(middle.get("specd").is_none());
        let last = shape.chunk(&message("", FinishReason::Length), None);
        assert_eq!(last["choices"][0]["finish_reason"], "length");
        assert_eq!(last["specd"]["rounds"], 1);
        let usage = shape.usage_chunk(Some(&Usage { prompt_tokens: 4, completion_tokens: 6, cached_prompt_tokens: 3 }));
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["total_tokens"], 10);
        assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 3);
        let chat = Shape::new(Endpoint::Chat, "r1", 7, "m".into());
        assert_eq!(chat.role_chunk()["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(chat.chunk(&message("", FinishReason::Stop), None)["choices"][0]["delta"], json!({}));
    }

    #[test]
    fn calls_end_a_chat_with_tool_calls_unless_the_length_cut_it() {
        let shape = Shape::new(Endpoint::Chat, "r1", 7, "m".into());
        let output = "Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
        let reader = || Some(CallReader::new(specd_text::ToolCallFormat::Hermes, None));
        let body = shape.whole(&message(output, FinishReason::Stop), None, reader());
        let choice = &body["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert_eq!(choice["message"]["content"], "Sure.\n");
        assert_eq!(choice["message"]["tool_calls"][0]["function"], json!({"name": "f", "arguments": "{\"a\":1}"}));
        let cut = shape.whole(&message(output, FinishReason::Length), None, reader());
        assert_eq!(cut["choices"][0]["finish_reason"], "length");
        let plain = shape.whole(&message("no calls", FinishReason::Eos), None, reader());
        assert_eq!(plain["choices"][0]["finish_reason"], "stop");
        assert!(plain["choices"][0]["message"].get("tool_calls").is_none());

        // Streamed: the text, then the call's two deltas; the logprobs on the first chunk, the
        // finish reason and stats on the last.
        let mut reader = CallReader::new(specd_text::ToolCallFormat::Hermes, None);
        let read = reader.push(output);
        let chunks =
            shape.call_chunks(&message(output, FinishReason::Stop), &read, 0, true, Some(json!({"content": []})));
        let deltas: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]["delta"]).collect();
        assert_eq!(deltas[0], &json!({"content": "Sure.\n"}));
        assert_eq!(deltas[1]["tool_calls"][0]["function"], json!({"name": "f", "arguments": ""}));
        assert_eq!(deltas[2]["tool_calls"][0], json!({"index": 0, "function": {"arguments": "{\"a\":1}"}}));
        assert_eq!(chunks[0]["choices"][0]["logprobs"], json!({"content": []}));
        assert!(chunks[1]["choices"][0]["logprobs"].is_null());
        assert!(chunks[..2].iter().all(|c| c["choices"][0]["finish_reason"].is_null() && c.get("specd").is_none()));
        assert_eq!(chunks[2]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(chunks[2]["specd"]["rounds"], 1);
        // A round whose text is all held back sends nothing.
        let held = shape.call_chunks(&message("<tool", FinishReason::Unspecified), &Read::default(), 0, false, None);
        assert!(held.is_empty());
    }
}
