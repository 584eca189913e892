//! The flags that give a child `specd target` or `specd draft` process the node options this
//! process parsed: `specd bench --netns` starts its nodes with them.

use super::draft_options::{DraftOptions, ProposerOptions};
use super::node_options::NodeOptions;

impl NodeOptions {
    /// The flags that give a `specd target` or `specd draft` process these options
    /// (`specd bench --netns`), with the forward delay replaced where given, and for the
    /// draft its own options over the shared ones, as [`DraftOptions::apply`] does.
    pub(crate) fn to_args(&self, forward_delay_ms: Option<f64>, draft: Option<&DraftOptions>) -> Vec<String> {
        let threads = draft.map(|d| d.draft_threads).or(self.threads);
        let dtype = draft.and_then(|d| d.draft_dtype).unwrap_or(self.dtype);
        let mut args = vec![
            format!("--device={}", self.device),
            format!("--dtype={dtype}"),
            format!("--max-sessions={}", self.max_sessions),
            format!("--forward-delay-ms={}", forward_delay_ms.unwrap_or(self.forward_delay_ms)),
            format!("--session-ttl-s={}", self.session_ttl_s),
        ];
        args.push(format!("--max-batch-sequences={}", self.max_batch_sequences));
        args.push(format!("--max-batch-tokens={}", self.max_batch_tokens));
        args.push(format!("--batch-window-us={}", self.batch_window_us));
        args.extend(self.kv_budget_mib.map(|m| format!("--kv-budget-mib={m}")));
        args.push(format!("--kv-memory-fraction={}", self.kv_memory_fraction));
        args.extend(threads.map(|t| format!("--threads={t}")));
        args.extend(self.sampling_threads.map(|t| format!("--sampling-threads={t}")));
        args.push(format!("--distributions={}", self.distributions));
        args.push(format!("--pin-threads={}", self.pin_threads));
        args
    }
}

impl ProposerOptions {
    /// The flags that give a `specd draft` process this proposer (`specd bench --netns`).
    pub(crate) fn to_args(&self) -> Vec<String> {
        vec![
            format!("--proposer={}", self.proposer),
            format!("--ngram-min={}", self.ngram_min),
            format!("--ngram-max={}", self.ngram_max),
            format!("--suffix-budget-tokens={}", self.suffix_budget_tokens),
        ]
    }
}
