//! The log-probability of every token a round emits, under the target's processed
//! distribution p at its position, whichever branch of the rule emitted it: an accepted
//! candidate or a residual draw from the draft's support (p on the support is in the reply),
//! the complement sample or the bonus (the target sends log p of what it drew). The
//! alternatives come from the target, which computes them only when a client asks.

use specd_proto::v1::{OutputLogprob, PositionLogprobs, TokenLogprob, VerifyResponse};
use specd_sampling::DenseDist;
use specd_sampling::logprobs::logprob;

use crate::error::CoordinatorError;
use crate::session::propose::Proposals;

fn protocol(message: String) -> CoordinatorError {
    CoordinatorError::Protocol(message)
}

/// `tokens[j]` was emitted at block position j (`dense`: the reply's rows, for the dense format).
pub fn emitted(
    tokens: &[u32],
    proposals: &Proposals,
    reply: &VerifyResponse,
    dense: Option<&[DenseDist]>,
) -> Result<Vec<OutputLogprob>, CoordinatorError> {
    tokens
        .iter()
        .enumerate()
        .map(|(j, &token)| {
            let position = reply.logprobs.get(j).ok_or_else(|| {
                protocol(format!(
                    "the target sent log-probabilities for {} positions, not {}",
                    reply.logprobs.len(),
                    j + 1
                ))
            })?;
            let logprob = match (proposals, dense) {
                (_, Some(rows)) => {
                    let row = rows.get(j).ok_or_else(|| protocol(format!("no dense row for position {}", j + 1)))?;
                    logprob(row.prob(token))
                }
                (Proposals::Sparse(block), None) => {
                    sparse_logprob(j, token, block.get(j).map(|(_, q)| q.tokens()), reply)
                        .or_else(|| drawn_logprob(j, token, reply, position))
                        .ok_or_else(|| {
                            protocol(format!("no log-probability for token {token} at position {}", j + 1))
                        })?
                }
                (Proposals::Dense(_), None) => return Err(protocol("dense proposals without dense rows".into())),
            };
            let top = position.top.iter().map(|a| TokenLogprob { token_id: a.token_id, logprob: a.logprob }).collect();
            Ok(OutputLogprob { logprob, top })
        })
        .collect()
}

/// log p of `token` at position `j` when it is in the draft's support there; `None` when it
/// is not (then it is the complement sample or the bonus, whose log p the target sent).
fn sparse_logprob(j: usize, token: u32, support: Option<&[u32]>, reply: &VerifyResponse) -> Option<f64> {
    let at = support?.iter().position(|&t| t == token)?;
    reply.positions.get(j)?.p_on_support.get(at).map(|&p| logprob(p))
}

/// log p of `token` when it is what the target drew at position `j`: the complement sample,
/// or the bonus past the last candidate.
fn drawn_logprob(j: usize, token: u32, reply: &VerifyResponse, position: &PositionLogprobs) -> Option<f64> {
    let drawn = match reply.positions.get(j) {
        Some(scored) => scored.complement_sample,
        None => Some(reply.bonus_token_id),
    };
    (drawn == Some(token)).then_some(position.drawn).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use specd_proto::v1::ScoredPosition;
    use specd_sampling::SparseDist;

    #[test]
    fn every_branch_finds_its_tokens_log_probability() {
        let q = SparseDist::new(10, vec![3, 5], vec![0.5, 0.5]).unwrap();
        let proposals = Proposals::Sparse(vec![(3, q.clone()), (5, q)]);
        let at = |drawn: Option<f64>| PositionLogprobs { top: Vec::new(), drawn };
        let reply = VerifyResponse {
            positions: vec![
                ScoredPosition { p_on_support: vec![0.25, 0.5], complement_mass: 0.25, complement_sample: Some(7) },
                ScoredPosition { p_on_support: vec![0.125, 0.125], complement_mass: 0.75, complement_sample: Some(9) },
            ],
            bonus_token_id: 1,
            logprobs: vec![at(Some(-3.0)), at(Some(-2.0)), at(Some(-1.0))],
            ..Default::default()
        };
        // Accepted candidate 3, then a residual draw of 5 from the support.
        let got = emitted(&[3, 5], &proposals, &reply, None).unwrap();
        assert_eq!(got.iter().map(|l| l.logprob).collect::<Vec<_>>(), vec![0.25f64.ln(), 0.125f64.ln()]);
        // The complement sample at position 2, and the bonus after two accepted candidates.
        assert_eq!(emitted(&[3, 9], &proposals, &reply, None).unwrap()[1].logprob, -2.0);
        assert_eq!(emitted(&[3, 5, 1], &proposals, &reply, None).unwrap()[2].logprob, -1.0);
        assert!(emitted(&[3, 8], &proposals, &reply, None).is_err(), "a token no branch could emit");
        let short = VerifyResponse { logprobs: Vec::new(), ..reply };
        assert!(emitted(&[3], &proposals, &short, None).is_err(), "a target that sent none");
    }
}
