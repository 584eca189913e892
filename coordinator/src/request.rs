//! Validation of a client's GenerateRequest into a [`GenerationSpec`], with messages that
//! say what is wrong.

use specd_grammar::{ConstraintSpec, ConstraintState};
use specd_proto::v1::{
    GenerateRequest, NextTokenLawRequest, OutputConstraint, SamplingParams as WireSampling, SamplingSettings,
    Speculation, StoppingCriteria, TargetLawRequest,
};
use specd_sampling::logprobs::MAX_TOP_LOGPROBS;
use specd_sampling::{MAX_GAMMA, SamplingError, SamplingParams, TreeShape, Truncation, Verification};

use crate::error::CoordinatorError;
use crate::nodes::ModelFacts;

/// How the draft and the coordinator exchange q.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Wire {
    Sparse(Truncation),
    Dense,
}

/// Which acceptance rule the coordinator applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RuleVariant {
    /// The exact rule of Leviathan et al. and Chen et al.
    #[default]
    Exact,
    /// Resample from p on rejection (on either wire format): wrong. For tests that must
    /// prove they detect a broken coordinator; it exists only with the `testing` feature.
    #[cfg(feature = "testing")]
    NaiveResampleFromTarget,
    /// Block verification with its draws keyed by the block position alone, so that every
    /// round of a generation reuses the same acceptance and residual draws: wrong, the
    /// keying docs/randomness.md rules out. With the `testing` feature only.
    #[cfg(feature = "testing")]
    BlockKeyedByBlockPosition,
}

/// How a generation's draft length is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GammaChoice {
    /// The same γ every round (0: target-only).
    Fixed(u32),
    /// Per round by [`crate::policy::AdaptiveGamma`], in 0..=max.
    Adaptive { max: u32 },
}

impl GammaChoice {
    /// The largest γ a round may use.
    pub fn max(self) -> u32 {
        match self {
            Self::Fixed(g) => g,
            Self::Adaptive { max } => max,
        }
    }
}

/// Whether rounds draft trees (`--tree`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TreeSetting {
    /// Chains.
    #[default]
    Off,
    /// Trees of this shape.
    Shape(TreeShape),
    /// Each session measures a tree against the chain and drafts the better
    /// ([`crate::policy::trees`]).
    Auto,
}

/// The coordinator's defaults for what a request leaves unset, and its rule.
#[derive(Debug, Clone)]
pub struct Defaults {
    /// The policy when a request leaves γ unset.
    pub gamma: GammaChoice,
    pub max_new_tokens: u32,
    pub truncation: Truncation,
    pub rule: RuleVariant,
    /// Token or block verification (`--verify`).
    pub verification: Verification,
    /// Ask the draft to draft each next block ahead (optimistic drafting).
    pub optimistic: bool,
    /// Trees or chains (`--tree`).
    pub tree: TreeSetting,
    /// The model's generation_config.json values are the defaults of what a request leaves
    /// unset (temperature, top_p, top_k, repetition_penalty).
    pub generation_config: bool,
}

/// A validated generation.
#[derive(Debug, Clone)]
pub struct GenerationSpec {
    pub request_id: String,
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    pub seed: u64,
    pub max_new_tokens: usize,
    pub stop_token_ids: Vec<u32>,
    pub stop_strings: Vec<String>,
    pub eos_token_ids: Vec<u32>,
    pub gamma: GammaChoice,
    pub wire: Wire,
    pub rule: RuleVariant,
    pub verification: Verification,
    /// Ask the draft to draft each next block ahead (optimistic drafting, docs/architecture.md).
    /// Never with a tree: a tree is not drafted ahead.
    pub optimistic: bool,
    /// Trees or chains (docs/rule.md#trees-of-drafts). A tree's depth is capped by each
    /// round's γ, and trees are drafted only where the draft draws them and no
    /// log-probabilities are asked for.
    pub tree: TreeSetting,
    /// Decode the output to text (the target has a tokenizer).
    pub detokenize: bool,
    /// Log-probabilities asked for, with this many alternatives per token.
    pub logprobs: Option<u32>,
    /// The nodes' prefix caches share entries only between requests with the same salt.
    pub cache_salt: String,
    /// The language the output must belong to (docs/rule.md#constrained-decoding); `None`:
    /// unconstrained.
    pub constraint: Option<GenerationConstraint>,
}

/// A request's output constraint: what the nodes are sent, and the coordinator's own engine,
/// which follows the committed output so that the generation ends once the output is complete
/// in the language.
#[derive(Debug, Clone)]
pub struct GenerationConstraint {
    pub wire: OutputConstraint,
    /// `json_schema`, `regex`, ... for logs and spans.
    pub kind: &'static str,
    pub state: ConstraintState,
}

/// The longest `cache_salt` a request may carry.
pub const MAX_CACHE_SALT_BYTES: usize = 256;

/// The most stop strings a request may carry (OpenAI allows 4), and the longest one.
pub const MAX_STOP_STRINGS: usize = 16;
pub const MAX_STOP_STRING_BYTES: usize = 256;

fn invalid(message: impl Into<String>) -> CoordinatorError {
    CoordinatorError::InvalidRequest(message.into())
}

/// A NextTokenLaw request checked against the model: the prefix and the sampling settings.
pub fn validate_law_request(
    request: &NextTokenLawRequest,
    facts: &ModelFacts,
) -> Result<TargetLawRequest, CoordinatorError> {
    if request.prompt_token_ids.is_empty() {
        return Err(invalid("the prompt is empty"));
    }
    let prefix = request.prompt_token_ids.iter().chain(&request.generated_token_ids);
    if let Some(bad) = prefix.clone().find(|&&t| t as usize >= facts.vocab_size) {
        return Err(invalid(format!("token {bad} is outside the vocabulary of {}", facts.vocab_size)));
    }
    let len = prefix.count();
    if len > facts.context_length {
        return Err(invalid(format!("{len} tokens exceed the context length {}", facts.context_length)));
    }
    let params = sampling_params(&request.sampling.unwrap_or_default())?;
    Ok(TargetLawRequest {
        prompt_token_ids: request.prompt_token_ids.clone(),
        generated_token_ids: request.generated_token_ids.clone(),
        sampling: Some(SamplingSettings::from(&params)),
    })
}

/// Validates everything but the prompt's text, which the caller has already tokenised.
pub fn validate(
    request: &GenerateRequest,
    prompt: Vec<u32>,
    facts: &ModelFacts,
    defaults: &Defaults,
    random_seed: impl FnOnce() -> u64,
) -> Result<GenerationSpec, CoordinatorError> {
    if prompt.is_empty() {
        return Err(invalid("the prompt is empty"));
    }
    if let Some(bad) = prompt.iter().find(|&&t| t as usize >= facts.vocab_size) {
        return Err(invalid(format!("prompt token {bad} is outside the vocabulary of {}", facts.vocab_size)));
    }
    let sampling = request.sampling.unwrap_or_default();
    let params = sampling_params(&sampling)?;
    let stopping = request.stopping.clone().unwrap_or_default();
    let max_new_tokens = max_new_tokens(&stopping, prompt.len(), facts, defaults)?;
    if let Some(bad) = stopping.stop_token_ids.iter().find(|&&t| t as usize >= facts.vocab_size) {
        return Err(invalid(format!("stop token {bad} is outside the vocabulary of {}", facts.vocab_size)));
    }
    if stopping.stop_strings.iter().any(String::is_empty) {
        return Err(invalid("stop_strings may not contain an empty string"));
    }
    // Every token is matched against every stop string: both are bounded so that a request
    // cannot make matching cost what generating does.
    if stopping.stop_strings.len() > MAX_STOP_STRINGS {
        return Err(invalid(format!("{} stop strings: at most {MAX_STOP_STRINGS}", stopping.stop_strings.len())));
    }
    if let Some(long) = stopping.stop_strings.iter().find(|s| s.len() > MAX_STOP_STRING_BYTES) {
        return Err(invalid(format!("a stop string of {} bytes: at most {MAX_STOP_STRING_BYTES}", long.len())));
    }
    if !stopping.stop_strings.is_empty() && !facts.has_tokenizer {
        return Err(invalid("stop_strings need text, but the target model has no tokenizer"));
    }
    let constraint = match &request.constraint {
        Some(wire) => compile_constraint(wire, facts)?,
        None => None,
    };
    let speculation = request.speculation.unwrap_or(Speculation { gamma: None, dense: false });
    let gamma = match speculation.gamma {
        Some(gamma) if gamma > MAX_GAMMA => {
            return Err(invalid(format!("gamma {gamma} is above the maximum {MAX_GAMMA}")));
        }
        Some(gamma) => GammaChoice::Fixed(gamma),
        None => defaults.gamma,
    };
    Ok(GenerationSpec {
        request_id: request.request_id.clone(),
        prompt,
        params,
        seed: sampling.seed.unwrap_or_else(random_seed),
        max_new_tokens,
        stop_token_ids: stopping.stop_token_ids,
        stop_strings: stopping.stop_strings,
        eos_token_ids: if stopping.ignore_eos { Vec::new() } else { facts.eos_token_ids.clone() },
        gamma,
        wire: if speculation.dense { Wire::Dense } else { Wire::Sparse(defaults.truncation) },
        rule: defaults.rule,
        verification: defaults.verification,
        // A constrained generation drafts chains, one block at a time: its nodes mask chains
        // (docs/rule.md#constrained-decoding).
        optimistic: defaults.optimistic && defaults.tree == TreeSetting::Off && constraint.is_none(),
        tree: if constraint.is_some() { TreeSetting::Off } else { defaults.tree.clone() },
        detokenize: facts.has_tokenizer,
        logprobs: match request.logprobs {
            Some(n) if n > MAX_TOP_LOGPROBS => {
                return Err(invalid(format!("logprobs {n}: at most {MAX_TOP_LOGPROBS} alternatives per token")));
            }
            n => n,
        },
        cache_salt: match &request.cache_salt {
            salt if salt.len() > MAX_CACHE_SALT_BYTES => {
                return Err(invalid(format!(
                    "cache_salt is {} bytes long: at most {MAX_CACHE_SALT_BYTES}",
                    salt.len()
                )));
            }
            salt => salt.clone(),
        },
        constraint,
    })
}

/// The request's constraint, compiled against the target's vocabulary: an invalid schema,
/// expression or grammar is refused here, before any node is asked.
fn compile_constraint(
    wire: &OutputConstraint,
    facts: &ModelFacts,
) -> Result<Option<GenerationConstraint>, CoordinatorError> {
    let Some(spec) = ConstraintSpec::from_proto(wire)? else { return Ok(None) };
    let vocabulary = facts
        .constraints
        .as_ref()
        .map_err(|why| invalid(format!("output constraints are not available for this model: {why}")))?;
    let state = vocabulary.compile(&spec)?;
    Ok(Some(GenerationConstraint { wire: spec.to_proto(), kind: spec.describe(), state }))
}

pub fn sampling_params(s: &WireSampling) -> Result<SamplingParams, CoordinatorError> {
    let defaults = SamplingParams::default();
    let top_k = s.top_k.unwrap_or(0);
    if top_k < 0 {
        return Err(invalid(format!("top_k {top_k} is negative; 0 disables it")));
    }
    let params = SamplingParams {
        temperature: s.temperature.unwrap_or(defaults.temperature),
        top_k: top_k as u32,
        top_p: s.top_p.unwrap_or(defaults.top_p),
        min_p: s.min_p.unwrap_or(defaults.min_p),
        repetition_penalty: s.repetition_penalty.unwrap_or(defaults.repetition_penalty),
        presence_penalty: s.presence_penalty.unwrap_or(defaults.presence_penalty),
        frequency_penalty: s.frequency_penalty.unwrap_or(defaults.frequency_penalty),
    };
    params.validate().map_err(|err| match err {
        SamplingError::InvalidParameter { name, value, expected } => invalid(format!("{name} {value}: {expected}")),
        other => invalid(other.to_string()),
    })?;
    Ok(params)
}

fn max_new_tokens(
    stopping: &StoppingCriteria,
    prompt_len: usize,
    facts: &ModelFacts,
    defaults: &Defaults,
) -> Result<usize, CoordinatorError> {
    let room = facts.context_length.saturating_sub(prompt_len);
    if room == 0 {
        return Err(invalid(format!(
            "the prompt has {prompt_len} tokens, the whole context of {} tokens",
            facts.context_length
        )));
    }
    match stopping.max_new_tokens {
        Some(0) => Err(invalid("max_new_tokens is 0; ask for at least 1")),
        Some(n) if n as usize > room => Err(invalid(format!(
            "max_new_tokens {n} does not fit: the prompt has {prompt_len} tokens and the context {} (room for {room})",
            facts.context_length
        ))),
        Some(n) => Ok(n as usize),
        None => Ok((defaults.max_new_tokens.max(1) as usize).min(room)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> ModelFacts {
        ModelFacts {
            vocab_size: 10,
            context_length: 8,
            eos_token_ids: vec![9],
            tokenizer_fingerprint: "f".into(),
            target_model: "t".into(),
            draft_model: None,
            text: None,
            has_tokenizer: false,
            constraints: Err("no tokenizer".into()),
        }
    }

    fn defaults() -> Defaults {
        Defaults {
            gamma: GammaChoice::Fixed(4),
            max_new_tokens: 100,
            truncation: Truncation::new(0.0, 8).unwrap(),
            rule: RuleVariant::Exact,
            verification: Verification::Block,
            optimistic: true,
            tree: TreeSetting::Off,
            generation_config: true,
        }
    }

    fn check(request: &GenerateRequest, prompt: Vec<u32>) -> Result<GenerationSpec, String> {
        validate(request, prompt, &facts(), &defaults(), || 7).map_err(|e| e.to_string())
    }

    #[test]
    fn stop_strings_are_bounded_in_number_and_length() {
        let with_stops = |stops: Vec<String>| GenerateRequest {
            stopping: Some(StoppingCriteria { stop_strings: stops, ..Default::default() }),
            ..Default::default()
        };
        let facts = ModelFacts { has_tokenizer: true, ..facts() };
        let check = |r: &GenerateRequest| validate(r, vec![1], &facts, &defaults(), || 7).map_err(|e| e.to_string());
        assert!(check(&with_stops(vec!["x".repeat(MAX_STOP_STRING_BYTES)])).is_ok());
        let long = check(&with_stops(vec!["x".repeat(MAX_STOP_STRING_BYTES + 1)])).unwrap_err();
        assert!(long.contains("at most 256"), "{long}");
        assert!(check(&with_stops(vec!["s".into(); MAX_STOP_STRINGS])).is_ok());
        let many = check(&with_stops(vec!["s".into(); MAX_STOP_STRINGS + 1])).unwrap_err();
        assert!(many.contains("17 stop strings"), "{many}");
    }

    #[test]
    fn refuses_bad_requests_with_reasons() {
        let ok = GenerateRequest::default();
        assert_eq!(check(&ok, vec![]).unwrap_err(), "the prompt is empty");
        assert!(check(&ok, vec![10]).unwrap_err().contains("outside the vocabulary"));
        let with = |sampling: WireSampling| GenerateRequest { sampling: Some(sampling), ..ok.clone() };
        let bad_t = check(&with(WireSampling { temperature: Some(-1.0), ..Default::default() }), vec![1]);
        assert!(bad_t.unwrap_err().starts_with("temperature -1"));
        let nan_t = check(&with(WireSampling { temperature: Some(f64::NAN), ..Default::default() }), vec![1]);
        assert!(nan_t.unwrap_err().starts_with("temperature NaN"));
        let top_p = check(&with(WireSampling { top_p: Some(1.5), ..Default::default() }), vec![1]);
        assert!(top_p.unwrap_err().starts_with("top_p 1.5"));
        let top_k = check(&with(WireSampling { top_k: Some(-3), ..Default::default() }), vec![1]);
        assert!(top_k.unwrap_err().contains("top_k -3 is negative"));
        let stop = |n| GenerateRequest {
            stopping: Some(StoppingCriteria { max_new_tokens: Some(n), ..Default::default() }),
            ..ok.clone()
        };
        assert!(check(&stop(0), vec![1]).unwrap_err().contains("max_new_tokens is 0"));
        assert!(check(&stop(8), vec![1]).unwrap_err().contains("room for 7"));
        let gamma =
            GenerateRequest { speculation: Some(Speculation { gamma: Some(MAX_GAMMA + 1), dense: false }), ..ok };
        assert!(check(&gamma, vec![1]).unwrap_err().contains("above the maximum"));
    }

    #[test]
    fn fills_defaults() {
        let spec = check(&GenerateRequest::default(), vec![1, 2]).unwrap();
        assert_eq!((spec.gamma, spec.max_new_tokens, spec.seed), (GammaChoice::Fixed(4), 6, 7));
        assert_eq!(spec.eos_token_ids, vec![9]);
        assert_eq!(spec.params, SamplingParams::default());
        assert!(matches!(spec.wire, Wire::Sparse(_)));
    }
}
