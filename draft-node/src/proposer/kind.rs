//! Which proposer a draft node runs, as `--proposer` names it, and its settings.

use std::fmt;
use std::str::FromStr;

use crate::proposer::ngram::MatchSpan;

/// `--proposer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProposerKind {
    /// The draft model samples every candidate.
    #[default]
    Model,
    /// Prompt lookup alone; no model.
    Ngram,
    /// The suffix index of recent sessions and the current one; no model.
    Suffix,
    /// A match of at least the minimum length proposes; otherwise the draft model does.
    ModelNgram,
}

impl ProposerKind {
    /// Whether the node loads a draft model.
    pub fn needs_model(self) -> bool {
        matches!(self, Self::Model | Self::ModelNgram)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Model => "model",
            Self::Ngram => "ngram",
            Self::Suffix => "suffix",
            Self::ModelNgram => "model+ngram",
        }
    }
}

impl fmt::Display for ProposerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ProposerKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Self::Model, Self::Ngram, Self::Suffix, Self::ModelNgram]
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("{s:?} is not a proposer: model, ngram, suffix or model+ngram"))
    }
}

/// A draft node's proposer and its settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProposerConfig {
    pub kind: ProposerKind,
    /// The match lengths the n-gram and suffix proposers try, longest first.
    pub span: MatchSpan,
    /// Tokens of finished sessions the suffix index holds at most.
    pub suffix_budget_tokens: usize,
}

impl Default for ProposerConfig {
    fn default() -> Self {
        Self { kind: ProposerKind::Model, span: MatchSpan::default(), suffix_budget_tokens: 1 << 18 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for kind in [ProposerKind::Model, ProposerKind::Ngram, ProposerKind::Suffix, ProposerKind::ModelNgram] {
            assert_eq!(kind.to_string().parse::<ProposerKind>(), Ok(kind));
        }
        assert!("lookup".parse::<ProposerKind>().is_err());
        assert!(ProposerKind::ModelNgram.needs_model() && !ProposerKind::Suffix.needs_model());
    }
}
