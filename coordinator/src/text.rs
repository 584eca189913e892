//! The coordinator's text side: the target model's tokenizer, chat template and generation
//! defaults (`specd-text`), fetched from a target when the coordinator connects (or read from
//! `--tokenizer DIR`). Prompts are tokenised and output decoded here, incrementally (a round's
//! text costs O(its tokens)), so the target's model thread does no text work.

use std::path::Path;
use std::sync::Arc;

use specd_grammar::GrammarVocabulary;
use specd_proto::v1::SamplingParams as WireSampling;
use specd_text::{GenerationDefaults, ModelText, TextAssets};

use crate::error::CoordinatorError;
use crate::nodes::NodePool;

/// The model's text side, and the grammar engine's view of its vocabulary.
#[derive(Debug)]
pub struct LoadedText {
    pub text: Arc<ModelText>,
    /// Why output constraints cannot be had, where the engine cannot read the tokenizer.
    pub constraints: Result<Arc<GrammarVocabulary>, String>,
}

/// The model's text side: from `dir` when given, else from the pool's first target when it
/// has a tokenizer, else none (requests must then send token ids).
pub async fn load(pool: &NodePool, dir: Option<&Path>) -> Result<Option<LoadedText>, CoordinatorError> {
    let assets = match dir {
        Some(dir) => {
            let dir = dir.to_owned();
            blocking(move || TextAssets::from_dir(&dir).map_err(CoordinatorError::from)).await?
        }
        None if pool.facts.has_tokenizer => {
            let target = pool.targets().current().first().cloned().ok_or(CoordinatorError::NoNode("target"))?;
            let files = target.text_assets().await?;
            TextAssets {
                tokenizer_json: files.tokenizer_json,
                tokenizer_config_json: files.tokenizer_config_json,
                chat_template_jinja: files.chat_template_jinja,
                generation_config_json: files.generation_config_json,
            }
        }
        None => return Ok(None),
    };
    // Parsing a large tokenizer takes a while: off the async threads.
    let (vocab_size, eos) = (pool.facts.vocab_size, pool.facts.eos_token_ids.clone());
    let (text, constraints) = blocking(move || {
        let text = ModelText::from_assets(&assets).map_err(CoordinatorError::from)?;
        let constraints =
            GrammarVocabulary::new(&assets.tokenizer_json, vocab_size, &eos).map_err(|err| err.to_string());
        Ok((text, constraints))
    })
    .await?;
    if let Err(why) = &constraints {
        tracing::warn!(
            why,
            "output constraints (response_format, tools) are refused: the grammar engine cannot read the tokenizer"
        );
    }
    let (tokens, vocab) = (text.tokenizer().get_vocab_size(true), pool.facts.vocab_size);
    if tokens > vocab {
        return Err(CoordinatorError::Incompatible(format!(
            "the tokenizer has {tokens} tokens but the target's vocabulary only {vocab}: not this model's tokenizer"
        )));
    }
    Ok(Some(LoadedText { text: Arc::new(text), constraints }))
}

async fn blocking<T: Send + 'static>(
    job: impl FnOnce() -> Result<T, CoordinatorError> + Send + 'static,
) -> Result<T, CoordinatorError> {
    tokio::task::spawn_blocking(job)
        .await
        .map_err(|e| CoordinatorError::InvalidConfig(format!("loading the tokenizer failed: {e}")))?
}

/// The model's `generation_config.json` values as defaults for what a request leaves unset,
/// as transformers and vLLM use them. `do_sample: false` makes the default greedy.
pub fn apply_defaults(sampling: &mut WireSampling, defaults: &GenerationDefaults) {
    if sampling.temperature.is_none() {
        sampling.temperature = if defaults.is_greedy() { Some(0.0) } else { defaults.temperature.map(f64::from) };
    }
    if sampling.top_p.is_none() {
        sampling.top_p = defaults.top_p.map(f64::from);
    }
    if sampling.top_k.is_none() {
        sampling.top_k = defaults.top_k_limit().and_then(|k| i32::try_from(k).ok());
    }
    if sampling.repetition_penalty.is_none() {
        sampling.repetition_penalty = defaults.repetition_penalty.map(f64::from);
    }
}

/// Below this many bytes of text a request's tokenising stays on the async runtime: it takes
/// microseconds, less than handing it to another thread.
const BLOCKING_FROM_BYTES: usize = 16 * 1024;

/// Runs a request's text work (tokenising a prompt of `bytes`, rendering and tokenising a
/// chat) on a blocking thread when it is large: a prompt of megabytes takes milliseconds to
/// tokenise, and on the async runtime it would hold up every other request's streams.
pub(crate) async fn off_the_runtime<T: Send + 'static>(
    text: &Arc<ModelText>,
    bytes: usize,
    job: impl FnOnce(&ModelText) -> Result<T, CoordinatorError> + Send + 'static,
) -> Result<T, CoordinatorError> {
    if bytes < BLOCKING_FROM_BYTES {
        return job(text);
    }
    let text = Arc::clone(text);
    tokio::task::spawn_blocking(move || job(&text))
        .await
        .map_err(|e| CoordinatorError::Internal(format!("tokenising the prompt failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_models_defaults_fill_only_what_the_request_left_unset() {
        let defaults = GenerationDefaults::from_json(
            r#"{"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.05, "do_sample": true}"#,
        )
        .unwrap();
        let mut unset = WireSampling::default();
        apply_defaults(&mut unset, &defaults);
        assert_eq!(unset.temperature, Some(f64::from(0.6f32)));
        assert_eq!((unset.top_p, unset.top_k), (Some(f64::from(0.9f32)), Some(20)));
        assert_eq!(unset.repetition_penalty, Some(f64::from(1.05f32)));
        let mut set = WireSampling { temperature: Some(1.0), top_k: Some(0), ..Default::default() };
        apply_defaults(&mut set, &defaults);
        assert_eq!((set.temperature, set.top_k), (Some(1.0), Some(0)), "the request's values stand");
        let greedy = GenerationDefaults::from_json(r#"{"temperature": 0.6, "do_sample": false}"#).unwrap();
        let mut unset = WireSampling::default();
        apply_defaults(&mut unset, &greedy);
        assert_eq!(unset.temperature, Some(0.0), "do_sample false is greedy, whatever the temperature");
        let none = GenerationDefaults::from_json(r#"{"bos_token_id": 1}"#).unwrap();
        let mut unset = WireSampling::default();
        apply_defaults(&mut unset, &none);
        assert_eq!(unset, WireSampling::default());
    }

    #[tokio::test]
    async fn large_text_is_tokenised_off_the_runtime_and_small_text_on_it() {
        let tokenizer = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
            "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": {"a": 0, "b": 1}, "unk_token": "a"},
        });
        let assets = TextAssets { tokenizer_json: tokenizer.to_string(), ..Default::default() };
        let text = Arc::new(ModelText::from_assets(&assets).unwrap());
        // Small text is tokenised right here, in the request's task; large text elsewhere.
        let caller = std::thread::current().id();
        let on_runtime = move || std::thread::current().id() == caller;
        let small = "a b ".repeat(10);
        let (ids, ran_on_runtime) =
            off_the_runtime(&text, small.len(), move |m| Ok((m.encode(&small, true)?, on_runtime()))).await.unwrap();
        assert!(ran_on_runtime && ids.len() == 20);
        let large = "b a ".repeat(BLOCKING_FROM_BYTES);
        let (ids, ran_on_runtime) =
            off_the_runtime(&text, large.len(), move |m| Ok((m.encode(&large, true)?, on_runtime()))).await.unwrap();
        assert!(!ran_on_runtime, "a large prompt was tokenised on an async worker");
        assert_eq!(ids.len(), 2 * BLOCKING_FROM_BYTES);
        assert_eq!(&ids[..2], &[1, 0]);
    }
}
