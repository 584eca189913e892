//! A turn that ran without the draft, filed in the draft's prefix cache after its last
//! reply. Where the adaptive policy decodes a generation target-only it opens no draft
//! session, and the draft would not see that turn: the conversation's next turn, drafted,
//! would then reuse only what came before it there, and prefill the rest on its critical
//! path. Filing the turn costs the draft what that prefill would, after the reply and off the
//! path.

use specd_proto::v1::OpenSessionRequest;
use specd_telemetry::DraftFilings;
use tracing::Instrument;

use crate::nodes::DraftChoice;

/// What filing a generation's committed sequence on its draft needs.
#[derive(Debug)]
pub struct DraftFiling {
    /// The replica the generation's prompt routed to.
    choice: DraftChoice,
    /// The draft session the generation would have opened: its id, salt and prompt.
    template: OpenSessionRequest,
    /// Where the outcome is counted, when the coordinator keeps metrics.
    counted: Option<DraftFilings>,
}

impl DraftFiling {
    pub fn new(choice: &DraftChoice, template: OpenSessionRequest, counted: Option<DraftFilings>) -> Self {
        Self { choice: choice.clone(), template, counted }
    }

    /// Opens a session holding `committed` on the draft and releases it at once with the
    /// whole sequence committed: a draft with a prefix cache runs the tokens its cache lacks
    /// and files them (`specd_node::node_model::Retiring`). The release returns once the
    /// node has queued that, before the pass, and the next turn's open queues after it. An
    /// open that failed is released all the same (the node may have opened it as the call
    /// failed). A draft that refuses or fails only costs the next turn its prefill, so that
    /// is only logged at debug level, and counted.
    pub async fn file(self, committed: Vec<u32>) {
        // Counted on its replica while it files, and recorded there as holding the prompt, so
        // that the conversation's next turn drafts where this one is filed.
        let (client, _lease) = (&self.choice.client, self.choice.engage());
        let len = committed.len();
        let request = filing_request(&self.template, committed);
        let session_id = request.session_id.clone();
        let filed = async {
            let opened = client.open_session(request).await;
            let last = opened.is_ok().then_some((len, &[][..]));
            let released = client.release(session_id.clone(), last).await;
            opened.and(released)
        };
        let outcome = filed.instrument(tracing::debug_span!("file_on_draft", tokens = len)).await;
        if let Some(counted) = &self.counted {
            counted.record(outcome.is_ok());
        }
        if let Err(err) = outcome {
            tracing::debug!(session = %session_id, %err, "filing the turn on the draft failed");
        }
    }
}

/// The request that opens the filing session: `committed` (the prompt and the output) as its
/// history, room for exactly that, and no constraint (the cache's rows do not depend on one,
/// and compiling it would cost the draft for nothing).
fn filing_request(template: &OpenSessionRequest, committed: Vec<u32>) -> OpenSessionRequest {
    OpenSessionRequest {
        session_id: format!("{}.filed", template.session_id),
        prompt_len: template.prompt_token_ids.len() as u32,
        max_tokens: u32::try_from(committed.len()).unwrap_or(u32::MAX),
        prompt_token_ids: committed,
        constraint: None,
        ..template.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use specd_proto::v1::OutputConstraint;

    #[test]
    fn the_filing_session_holds_the_whole_sequence_with_the_prompt_s_length_and_no_constraint() {
        let template = OpenSessionRequest {
            session_id: "s1".into(),
            prompt_token_ids: vec![1, 2, 3],
            max_tokens: 64,
            cache_salt: "tenant".into(),
            constraint: Some(OutputConstraint::default()),
            ..OpenSessionRequest::default()
        };
        let request = filing_request(&template, vec![1, 2, 3, 9, 8]);
        assert_eq!(request.session_id, "s1.filed");
        assert_eq!(request.prompt_token_ids, [1, 2, 3, 9, 8]);
        assert_eq!((request.prompt_len, request.max_tokens), (3, 5));
        assert_eq!(request.cache_salt, "tenant");
        assert!(request.constraint.is_none());
    }
}
