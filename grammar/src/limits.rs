//! The bounds on the work and memory one request's matcher may spend
//! ([`llguidance::api::ParserLimits`]). A constraint that needs more is refused with
//! [`crate::GrammarError::Budget`], at compile time or at the position where it runs out; the
//! speeds quoted are llguidance's own measurements.

use llguidance::api::ParserLimits;

/// The limits every matcher of a [`crate::GrammarVocabulary`] runs under.
pub(crate) fn request_limits() -> ParserLimits {
    ParserLimits {
        // Earley items in one row of the parse: the grammar's branching at one position. A
        // right-recursive grammar grows a row per repetition; 2 000 is llguidance's default and
        // passes JSON schemas with hundreds of alternatives.
        max_items_in_row: 2_000,
        // Work building the lexer's regular expressions at compile time, at about 50 000 units a
        // millisecond: at most ~20 ms of a model thread per compiled constraint.
        initial_lexer_fuel: 1_000_000,
        // Lexer work for one token mask, at about 14 000 units a millisecond: ~15 ms at worst
        // per position, on the thread that also runs the model.
        step_lexer_fuel: 200_000,
        // Earley items created for one token mask, at about 20 000 a millisecond: ~2.5 ms.
        step_max_items: 50_000,
        // Lexer automaton states cached over the whole request, at 1-2 kB each: at most about
        // 100 MB per request. llguidance's default (250 000) would allow ~0.5 GB per request,
        // too much with many concurrent sessions on one node.
        max_lexer_states: 50_000,
        // Symbols in the compiled grammar: a few megabytes of JSON schema.
        max_grammar_size: 500_000,
        // Runs very large lexemes against the whole vocabulary at compile time (within
        // `initial_lexer_fuel`), so the per-token masks need less.
        precompute_large_lexemes: true,
        // Verbose errors append the parser's state (the tokens so far) and the whole grammar:
        // the messages go back to clients and into logs, where one line naming the problem
        // is what is wanted.
        verbose_errors: false,
    }
}
