//! Token verification's loop, shared by both wire formats ([`crate::dense_rule`],
//! [`crate::sparse_rule`]): accept candidates one by one with min(1, p/q) and stop at the
//! first rejection, whose token the caller's `on_reject` draws.

use crate::block_weights;
use crate::error::Result;
use crate::excess::PositionView;
use crate::rng::{Purpose, RoundKey};
use crate::rule::{BlockOutcome, EmittedFrom};

/// Runs the loop over checked `positions`; `on_reject(i, position)` draws the token at the
/// first rejected block position i (1-based), `bonus()` the token after an accepted block.
/// The acceptance uniform of position i is `(Accept, i)`.
pub(crate) fn verify_tokens<V: PositionView>(
    positions: &[V],
    key: RoundKey,
    on_reject: impl Fn(usize, &V) -> Result<(u32, EmittedFrom)>,
    bonus: impl FnOnce() -> u32,
) -> Result<BlockOutcome> {
    let gamma = positions.len();
    let in_expectation = block_weights::in_expectation(positions);
    let mut tokens = Vec::with_capacity(gamma + 1);
    let mut acceptance = Vec::with_capacity(gamma);
    let mut expected_acceptance = Vec::with_capacity(gamma);
    for (i, position) in positions.iter().enumerate() {
        let index = i + 1;
        let a = position.ratio().min(1.0);
        acceptance.push(a);
        expected_acceptance.push(position.overlap());
        if key.stream(index, Purpose::Accept).uniform() < a {
            tokens.push(position.token());
            continue;
        }
        let (token, emitted_from) = on_reject(index, position)?;
        tokens.push(token);
        return Ok(BlockOutcome { accepted: i, tokens, acceptance, expected_acceptance, emitted_from, in_expectation });
    }
    tokens.push(bonus());
    Ok(BlockOutcome {
        accepted: gamma,
        tokens,
        acceptance,
        expected_acceptance,
        emitted_from: EmittedFrom::Bonus,
        in_expectation,
    })
}
