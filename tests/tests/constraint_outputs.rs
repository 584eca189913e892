//! Constrained outputs on a random-weight Hugging Face checkpoint whose byte-level tokenizer
//! can write any text (`llama_bytes` and its one-layer draft, `scripts/make_fixtures.py`):
//! only the constraint can make such a model write JSON.
//!
//! - Greedy identity under a JSON schema: speculative output equals target-only output, token
//!   for token, with a drafting model (which masks its q) and with an n-gram proposer (which
//!   cannot), and it is valid JSON of the schema wherever it ended with `stop`.
//! - At temperature 1, every output that ended with `stop` is valid against its schema, and
//!   some did end so; a generation that cannot finish in `max_new_tokens` ends with `length`.

use serde_json::Value;
use specd_draft_node::proposer::{MatchSpan, ProposerConfig, ProposerKind};
use specd_e2e::{Cluster, ClusterOptions, hf_fixture};
use specd_model::DType;
use specd_proto::v1::generate_request::Prompt;
use specd_proto::v1::output_constraint::Kind;
use specd_proto::v1::{FinishReason, GenerateRequest, OutputConstraint, SamplingParams, Speculation, StoppingCriteria};

/// Bounded so that a random model finishes it within the tokens asked for: every string and
/// number is short, the array has at most three items.
const SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 6},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "member": {"type": "boolean"},
    "color": {"enum": ["red", "green", "blue"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 3}
  },
  "required": ["name", "age", "member", "color"],
  "additionalProperties": false
}"#;

const PROMPTS: [&str; 8] = [
    "a person as JSON:",
    "the quick brown fox",
    "{\"name\":",
    "0123456789",
    "model with a draft",
    "speculative decoding",
    "[{\"id\": 1}]",
    "Paris",
];

fn request(prompt: &str, gamma: u32, temperature: f64, seed: u64, max_new_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        prompt: Some(Prompt::Text(prompt.into())),
        sampling: Some(SamplingParams { temperature: Some(temperature), seed: Some(seed), ..Default::default() }),
        stopping: Some(StoppingCriteria { max_new_tokens: Some(max_new_tokens), ..Default::default() }),
        speculation: Some(Speculation { gamma: Some(gamma), dense: false }),
        constraint: Some(OutputConstraint { kind: Some(Kind::JsonSchema(SCHEMA.into())) }),
        ..Default::default()
    }
}

/// The schema's every rule, checked by hand on a parsed output.
fn satisfies_schema(text: &str) -> Result<(), String> {
    let value: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let object = value.as_object().ok_or("not an object")?;
    for key in object.keys() {
        if !["name", "age", "member", "color", "tags"].contains(&key.as_str()) {
            return Err(format!("unknown key {key}"));
        }
    }
    let name = object.get("name").and_then(Value::as_str).ok_or("name")?;
    let age = object.get("age").and_then(Value::as_i64).ok_or("age")?;
    object.get("member").and_then(Value::as_bool).ok_or("member")?;
    let color = object.get("color").and_then(Value::as_str).ok_or("color")?;
    if name.chars().count() > 6 || !(0..=120).contains(&age) || !["red", "green", "blue"].contains(&color) {
        return Err(format!("a value out of its bounds: {object:?}"));
    }
    if let Some(tags) = object.get("tags") {
        let tags = tags.as_array().ok_or("tags")?;
        if tags.len() > 3 || tags.iter().any(|t| t.as_str().is_none_or(|t| t.chars().count() > 3)) {
            return Err(format!("tags out of bounds: {tags:?}"));
        }
    }
    Ok(())
}

async fn greedy_identity_under_a_schema(options: ClusterOptions) {
    let options = ClusterOptions { dtype: DType::F64, ..options };
    let (target, draft) = (hf_fixture("llama_bytes"), hf_fixture("llama_bytes_draft"));
    let cluster = Cluster::start(&target, &draft, &options).await.unwrap();
    let mut client = cluster.client().await.unwrap();
    let (mut drafted, mut stops) = (0, 0);
    for prompt in PROMPTS {
        let plain = client.generate(request(prompt, 0, 0.0, 1, 96)).await.unwrap().into_inner();
        let spec = client.generate(request(prompt, 4, 0.0, 1, 96)).await.unwrap().into_inner();
        assert_eq!(spec.token_ids, plain.token_ids, "prompt {prompt:?}");
        assert_eq!(spec.finish_reason, plain.finish_reason, "prompt {prompt:?}");
        drafted += spec.stats.unwrap().draft_tokens;
        if plain.finish_reason == FinishReason::Stop as i32 {
            stops += 1;
            satisfies_schema(&plain.text).unwrap_or_else(|e| panic!("prompt {prompt:?}: {e}: {}", plain.text));
        }
    }
    eprintln!(
        "greedy under a schema, proposer {}: {stops} of {} outputs complete, {drafted} candidates",
        options.proposer.kind,
        PROMPTS.len()
    );
    assert!(drafted > 0, "the draft took part");
    assert!(stops > 0, "no output completed its schema");
    cluster.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn greedy_speculation_under_a_schema_equals_target_only_with_a_drafting_model() {
    greedy_identity_under_a_schema(ClusterOptions::default()).await;
}

#[tokio::test(flavor = "current_thread")]
async fn greedy_speculation_under_a_schema_equals_target_only_with_an_ngram_draft() {
    let proposer =
        ProposerConfig { kind: ProposerKind::Ngram, span: MatchSpan::new(1, 3).unwrap(), ..ProposerConfig::default() };
    greedy_identity_under_a_schema(ClusterOptions { proposer, ..ClusterOptions::default() }).await;
}

/// At temperature 1 only the constraint keeps a random model's output in the schema: every
/// output that ends with `stop` must satisfy it. One that runs out of tokens first ends with
/// `length`.
#[tokio::test(flavor = "current_thread")]
async fn every_output_that_ends_with_stop_satisfies_its_schema_at_temperature_one() {
    let (target, draft) = (hf_fixture("llama_bytes"), hf_fixture("llama_bytes_draft"));
    let cluster = Cluster::start(&target, &draft, &ClusterOptions::default()).await.unwrap();
    let mut client = cluster.client().await.unwrap();
    let (mut stops, mut lengths, runs) = (0, 0, 40);
    for seed in 0..runs {
        let prompt = PROMPTS[seed as usize % PROMPTS.len()];
        let reply = client.generate(request(prompt, 4, 1.0, seed, 120)).await.unwrap().into_inner();
        match FinishReason::try_from(reply.finish_reason).unwrap() {
            FinishReason::Stop => {
                stops += 1;
                satisfies_schema(&reply.text).unwrap_or_else(|e| panic!("seed {seed}: {e}: {}", reply.text));
            }
            FinishReason::Length => {
                lengths += 1;
                assert_eq!(reply.token_ids.len(), 120);
            }
            other => panic!("seed {seed}: finished with {other:?}: {}", reply.text),
        }
    }
    eprintln!("temperature 1 under a schema: {stops} of {runs} complete and valid, {lengths} cut by the length");
    assert!(stops >= runs / 2, "only {stops} of {runs} outputs completed their schema");
    // Too few tokens to close the object: the generation ends by its length, unfinished.
    let short = client.generate(request(PROMPTS[0], 4, 1.0, 7, 3)).await.unwrap().into_inner();
    assert_eq!(short.finish_reason, FinishReason::Length as i32);
    assert!(short.text.starts_with('{') && serde_json::from_str::<Value>(&short.text).is_err(), "{}", short.text);
    cluster.shutdown().await;
}
