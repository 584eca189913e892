//! [`GrammarError`], with whose fault each error is, and the sorting of llguidance's messages
//! (it reports every failure as text) into those kinds.

/// What went wrong with a constraint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// The client's constraint is malformed or uses a feature the engine lacks; the message
    /// names what is wrong.
    #[error("invalid constraint: {0}")]
    Invalid(String),
    /// The token does not keep the output in the constraint's language.
    #[error("token {token} is not allowed by the constraint here")]
    Rejected { token: u32 },
    /// The matcher exceeded its per-request limits (crate::limits): the constraint is too
    /// costly to follow, not necessarily wrong.
    #[error("constraint too costly: {0}")]
    Budget(String),
    /// The model's tokenizer.json cannot be turned into the engine's vocabulary.
    #[error("tokenizer unusable for constraints: {0}")]
    Vocabulary(String),
    /// A bug or an inconsistency between the caller and the engine.
    #[error("grammar engine: {0}")]
    Internal(String),
}

impl GrammarError {
    /// Whether the request that carried the constraint is to blame (INVALID_ARGUMENT), rather
    /// than the server. A constraint that exceeds the limits is the client's to simplify.
    pub fn is_client_fault(&self) -> bool {
        matches!(self, Self::Invalid(_) | Self::Budget(_))
    }

    /// A failure to compile a constraint: a limit hit is [`Self::Budget`], anything else the
    /// client's schema, expression or grammar, whose message llguidance wrote to name it.
    pub(crate) fn from_compile(message: &str) -> Self {
        let message = clean(message);
        if is_budget(&message) { Self::Budget(message) } else { Self::Invalid(message) }
    }

    /// A failure while following tokens: a limit hit is [`Self::Budget`]; anything else
    /// should not happen with a grammar that compiled, so it is ours.
    pub(crate) fn from_matcher(message: &str) -> Self {
        let message = clean(message);
        if is_budget(&message) {
            Self::Budget(message)
        } else if message.contains("NoExtensionBias") {
            // No token of the model continues the output there: the language asks for text the
            // tokenizer cannot write (a word-level vocabulary, a regex that needs a byte no token
            // spells). The constraint is the client's to change.
            Self::Invalid("no token of this model can continue the output in the constraint's language here".into())
        } else {
            Self::Internal(message)
        }
    }
}

/// llguidance's messages with the marker it appends when it leaves out the parser's state,
/// and without trailing blank lines, so they read as one line in a client's error.
fn clean(message: &str) -> String {
    message.trim_end().trim_end_matches("<non-verbose/>").trim_end().to_string()
}

/// The phrases llguidance uses when a [`llguidance::api::ParserLimits`] limit stops it (its
/// grammar builder, Earley parser and derivre's lexer); it has no error type to match on.
fn is_budget(message: &str) -> bool {
    const LIMIT_PHRASES: [&str; 7] = [
        "too big (limit for this grammar",
        "lexer precomputation failed",
        "Too many items (limit",
        "too many expressions constructed",
        "too many states",
        "items; max is",
        "max_tokens_total reached",
    ];
    LIMIT_PHRASES.iter().any(|phrase| message.contains(phrase))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_budget_and_the_rest_is_sorted_by_origin() {
        let grammar_too_big = "grammar size (number of symbols) too big (limit for this grammar: 10)";
        assert!(matches!(GrammarError::from_compile(grammar_too_big), GrammarError::Budget(_)));
        let lexer = "lexer error: too many states: 100 >= 100\n<non-verbose/>";
        assert_eq!(
            GrammarError::from_matcher(lexer),
            GrammarError::Budget("lexer error: too many states: 100 >= 100".into())
        );
        assert!(matches!(GrammarError::from_compile("Unimplemented keys: [\"not\"]"), GrammarError::Invalid(_)));
        assert!(matches!(GrammarError::from_matcher("parser stopped"), GrammarError::Internal(_)));
        assert!(GrammarError::from_matcher("NoExtensionBias").is_client_fault());
        assert!(GrammarError::Budget(String::new()).is_client_fault());
        assert!(!GrammarError::Rejected { token: 3 }.is_client_fault());
        assert!(!GrammarError::Vocabulary(String::new()).is_client_fault());
    }
}
