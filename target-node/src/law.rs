//! The target's exact next-token law after a prefix, for audits: one forward pass in a model
//! session of its own, released whatever happens.

use specd_model::LanguageModel;
use specd_node::NodeError;
use specd_sampling::{DenseDist, SamplingParams, TokenHistory, effective_distribution};

/// What a TargetLaw asks for.
#[derive(Debug, Clone)]
pub struct LawJob {
    pub prompt: Vec<u32>,
    pub generated: Vec<u32>,
    pub params: SamplingParams,
}

/// Runs on the model thread.
pub fn next_token_law(model: &mut dyn LanguageModel, job: &LawJob) -> Result<DenseDist, NodeError> {
    if job.prompt.is_empty() {
        return Err(NodeError::InvalidRequest("the prompt is empty".into()));
    }
    let context = model.info().context_length;
    let len = job.prompt.len() + job.generated.len();
    if len > context {
        return Err(NodeError::InvalidRequest(format!("{len} tokens exceed the context length {context}")));
    }
    let session = model.open_session(Some(len))?;
    let tokens: Vec<u32> = job.prompt.iter().chain(&job.generated).copied().collect();
    let logits = model.forward_last(session, &tokens, 1).and_then(|logits| logits.into_host());
    let law = logits.map_err(NodeError::from).and_then(|logits| {
        let row = logits.row(logits.rows() - 1).expect("host logits have a row per token");
        let history = TokenHistory { prompt: &job.prompt, generated: &job.generated };
        Ok(effective_distribution(row, &job.params, history)?)
    });
    model.release(session)?;
    law
}
