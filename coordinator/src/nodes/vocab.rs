//! Whether a node's vocabulary fits the cluster's: the startup check of every replica
//! against the first target.
//!
//! Targets must agree exactly. A draft must share the target's tokenizer (equal
//! fingerprints: the same ids denote the same strings) and may have fewer or more rows than
//! the target: real pairs pad their embedding tables differently (Qwen2.5-0.5B has 151 936
//! rows, Qwen2.5-72B 152 064, for one tokenizer of 151 665 tokens). The rule stays exact:
//! - fewer rows: the draft's q is 0 on the ids it lacks (its dense q is padded with zeros,
//!   `specd_proto::convert::parse_dense_proposal`; a sparse support names only its own ids),
//!   and those ids keep the target's p. A target that samples one of them (a padding row,
//!   probability ~0 in a trained model) hands the draft a token it cannot read: the draft
//!   fails that round and the session goes on target-only, which keeps the law.
//! - more rows: every session tells the draft the target's vocabulary size
//!   (`OpenSessionRequest.vocab_limit`), and the draft draws from those ids only, so its q,
//!   what it really draws from, is 0 on the ids the target lacks (where p would be 0). A
//!   draft that proposed one anyway fails the round's validation and is dropped.

use specd_proto::v1::NodeInfo;

use crate::error::CoordinatorError;

/// Checks `info` (a node of `role` at `address`) against the first target's `target`.
pub(crate) fn check_vocabulary(
    target_address: &str,
    target: &NodeInfo,
    role: &str,
    address: &str,
    info: &NodeInfo,
) -> Result<(), CoordinatorError> {
    // A draft with no model copies tokens of the sessions' own sequences: no vocabulary or
    // tokenizer of its own to disagree with (its candidates are still checked every round).
    if matches!(info.proposer.as_str(), "ngram" | "suffix") {
        return Ok(());
    }
    if info.tokenizer_fingerprint != target.tokenizer_fingerprint {
        return Err(CoordinatorError::Incompatible(format!(
            "tokenizers differ: the target at {target_address} ({}) has fingerprint {}, the {role} at {address} ({}) has {}",
            target.model_id, target.tokenizer_fingerprint, info.model_id, info.tokenizer_fingerprint
        )));
    }
    if role != "draft" && info.vocab_size != target.vocab_size {
        return Err(CoordinatorError::Incompatible(format!(
            "vocabularies differ: the target at {target_address} ({}) has {} rows, the {role} at {address} ({}) has {} (every target must have the same)",
            target.model_id, target.vocab_size, info.model_id, info.vocab_size
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(model: &str, vocab_size: u32, fingerprint: &str) -> NodeInfo {
        NodeInfo { model_id: model.into(), vocab_size, tokenizer_fingerprint: fingerprint.into(), ..Default::default() }
    }

    fn check(role: &str, info: &NodeInfo) -> Result<(), String> {
        let target = node("big", 152_064, "sha256:aa");
        check_vocabulary("http://t", &target, role, "http://n", info).map_err(|e| e.to_string())
    }

    #[test]
    fn a_draft_with_padding_rows_fewer_or_more_is_accepted_and_the_rest_refused_by_name() {
        assert!(check("draft", &node("small", 151_936, "sha256:aa")).is_ok());
        assert!(check("draft", &node("same", 152_064, "sha256:aa")).is_ok());
        let tokenizer = check("draft", &node("other", 151_936, "sha256:bb")).unwrap_err();
        assert!(tokenizer.contains("tokenizers differ") && tokenizer.contains("sha256:bb"), "{tokenizer}");
        assert!(check("draft", &node("larger", 160_000, "sha256:aa")).is_ok());
        let target = check("target", &node("replica", 151_936, "sha256:aa")).unwrap_err();
        assert!(target.contains("vocabularies differ") && target.contains("every target"), "{target}");
    }
}
