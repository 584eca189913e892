//! Exact output laws by enumeration, for tests and for `specd rule`.
//!
//! [`position_law`] is the law of the token emitted at one position, with every intermediate
//! quantity of docs/rule.md; [`round_law`] enumerates every path of a whole round over a
//! small vocabulary with prefix-dependent tables; [`speculative_sequence_law`] chains rounds
//! to get the joint law of the first L committed tokens, which must equal
//! [`target_sequence_law`]. [`speculative_sequence_law_with`] and [`round_law_with`] do the
//! same for either [`Verification`] rule; [`expected_accepted`] is the exact expected number
//! of accepted candidates of a round under each rule, by enumerating every drafted block.

use std::collections::BTreeMap;

use crate::block_weights::BlockWeights;
use crate::dist::{DenseDist, SparseDist, Truncation};
use crate::excess::DensePosition;
use crate::rule::acceptance_probability;
use crate::verification::Verification;

/// Every quantity of the rule at one position, for a target p and a dense draft q.
#[derive(Debug, Clone, PartialEq)]
pub struct PositionLaw {
    /// min(1, p/q) per token; `None` where q = 0 (never proposed).
    pub acceptance: Vec<Option<f64>>,
    /// q(x)·min(1, p(x)/q(x)) = min(p, q)(x): the mass with which x is proposed and accepted.
    pub accepted_mass: Vec<f64>,
    /// β = Σ min(p, q): the probability that the candidate is accepted.
    pub beta: f64,
    /// 1 - β = Σ max(0, q - p), the probability that the candidate is rejected.
    pub rejection: f64,
    /// r = max(0, p - q) / Σ max(0, p - q); `None` when that mass is zero (p = q).
    pub residual: Option<Vec<f64>>,
    /// accepted mass + rejection · residual: equals p.
    pub output: Vec<f64>,
    /// accepted mass + rejection · p: what resampling from p would give (wrong).
    pub naive_output: Vec<f64>,
    /// Σ p·q: the acceptance of "two independent draws must match" (wasteful, also wrong).
    pub independent_match_acceptance: f64,
}

/// The law of one position under the exact rule (dense wire format).
pub fn position_law(p: &DenseDist, q: &DenseDist) -> PositionLaw {
    let (p, q) = (p.probs(), q.probs());
    let acceptance = p.iter().zip(q).map(|(&p, &q)| (q > 0.0).then(|| acceptance_probability(p, q))).collect();
    let accepted_mass: Vec<f64> = p.iter().zip(q).map(|(p, q)| p.min(*q)).collect();
    let beta: f64 = accepted_mass.iter().sum();
    // Σ q·(1 - min(1, p/q)) = Σ max(0, q - p): exactly 0 when p = q, unlike 1 - β in floats.
    let rejection = p.iter().zip(q).map(|(p, q)| (q - p).max(0.0)).sum();
    let excess: Vec<f64> = p.iter().zip(q).map(|(p, q)| (p - q).max(0.0)).collect();
    let excess_mass: f64 = excess.iter().sum();
    let residual = (excess_mass > 0.0).then(|| excess.iter().map(|e| e / excess_mass).collect::<Vec<_>>());
    let output = match &residual {
        Some(r) => accepted_mass.iter().zip(r).map(|(a, r)| a + rejection * r).collect(),
        None => accepted_mass.clone(),
    };
    let naive_output = accepted_mass.iter().zip(p).map(|(a, p)| a + rejection * p).collect();
    let independent_match_acceptance = p.iter().zip(q).map(|(p, q)| p * q).sum();
    PositionLaw {
        acceptance,
        accepted_mass,
        beta,
        rejection,
        residual,
        output,
        naive_output,
        independent_match_acceptance,
    }
}

/// The law of the token emitted after a rejection under the sparse scheme: from the support
/// in proportion to max(0, p - q) with probability R_in / (R_in + P_out), else the complement
/// sample, itself distributed as p restricted to the complement.
pub fn sparse_rejection_law(p: &DenseDist, q: &SparseDist) -> Vec<f64> {
    let mut law = vec![0.0; p.vocab_size()];
    let mut in_support = vec![false; p.vocab_size()];
    let mut r_in = 0.0;
    for (&t, &q_t) in q.tokens().iter().zip(q.probs()) {
        in_support[t as usize] = true;
        let w = (p.prob(t) - q_t).max(0.0);
        law[t as usize] = w;
        r_in += w;
    }
    let p_out: f64 = (0..p.vocab_size()).filter(|&t| !in_support[t]).map(|t| p.probs()[t]).sum();
    let total = r_in + p_out;
    if total <= 0.0 {
        return p.probs().to_vec();
    }
    for (t, w) in law.iter_mut().enumerate() {
        // Outside: the complement branch (probability P_out / total) times p(x) / P_out.
        *w = if in_support[t] { *w / total } else { p.probs()[t] / total };
    }
    law
}

/// What crosses the wire between the draft and the coordinator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WireFormat {
    /// q in full; the reference path.
    Dense,
    /// q truncated by the draft and sent on its support; the target's pieces come back.
    Sparse(Truncation),
}

/// Next-token distributions of a target and a draft for any prefix: the test harness's
/// stand-in for two language models.
pub trait PrefixModel {
    fn target(&self, prefix: &[u32]) -> DenseDist;
    fn draft(&self, prefix: &[u32]) -> DenseDist;
}

/// The committed sequences of one round from `prefix`, with their probabilities. Each
/// sequence has 1..=γ+1 tokens; the probabilities sum to 1.
pub fn round_law(model: &dyn PrefixModel, prefix: &[u32], gamma: usize, wire: WireFormat) -> Vec<(Vec<u32>, f64)> {
    let mut out = Vec::new();
    let mut context = prefix.to_vec();
    explore_round(model, &mut context, prefix.len(), gamma, wire, 1.0, &mut out);
    out
}

/// [`round_law`] under `verification`.
pub fn round_law_with(
    model: &dyn PrefixModel,
    prefix: &[u32],
    gamma: usize,
    wire: WireFormat,
    verification: Verification,
) -> Vec<(Vec<u32>, f64)> {
    match verification {
        Verification::Token => round_law(model, prefix, gamma, wire),
        Verification::Block => {
            let mut out = Vec::new();
            for block in drafted_blocks(model, prefix, gamma, wire) {
                let weights = BlockWeights::of(&block.positions());
                for (stop, w) in weights.stop_law().into_iter().enumerate() {
                    if w <= 0.0 {
                        continue;
                    }
                    let emitted = if stop == gamma {
                        block.p[gamma].probs().to_vec()
                    } else {
                        excess_law(&block.p[stop], &block.q[stop], weights.kept[stop])
                    };
                    for (y, &py) in emitted.iter().enumerate() {
                        if py > 0.0 {
                            out.push((with(&block.tokens[..stop], y as u32), block.weight * w * py));
                        }
                    }
                }
            }
            out
        }
    }
}

/// One drafted block of a round with its probability under the draft, the q each candidate
/// was drawn from (truncated on the sparse wire, where the complement sample makes the draw
/// outside the support exact, so the law is that of dense q truncated) and the target's p.
struct DraftedBlock {
    tokens: Vec<u32>,
    weight: f64,
    q: Vec<DenseDist>,
    p: Vec<DenseDist>,
}

impl DraftedBlock {
    fn positions(&self) -> Vec<DensePosition<'_>> {
        self.tokens
            .iter()
            .zip(self.p.iter().zip(&self.q))
            .map(|(&token, (p, q))| DensePosition { p, q, token })
            .collect()
    }
}

/// Every block of `gamma` candidates the draft can propose after `prefix`.
fn drafted_blocks(model: &dyn PrefixModel, prefix: &[u32], gamma: usize, wire: WireFormat) -> Vec<DraftedBlock> {
    let mut blocks = vec![DraftedBlock { tokens: Vec::new(), weight: 1.0, q: Vec::new(), p: Vec::new() }];
    for _ in 0..gamma {
        let mut longer = Vec::new();
        for block in blocks {
            let context = [prefix, &block.tokens].concat();
            let q = match wire {
                WireFormat::Dense => model.draft(&context),
                WireFormat::Sparse(truncation) => model.draft(&context).truncate(truncation).to_dense(),
            };
            let p = model.target(&context);
            for (x, &qx) in q.probs().iter().enumerate() {
                if qx > 0.0 {
                    longer.push(DraftedBlock {
                        tokens: with(&block.tokens, x as u32),
                        weight: block.weight * qx,
                        q: [block.q.clone(), vec![q.clone()]].concat(),
                        p: [block.p.clone(), vec![p.clone()]].concat(),
                    });
                }
            }
        }
        blocks = longer;
    }
    for block in &mut blocks {
        block.p.push(model.target(&[prefix, &block.tokens].concat()));
    }
    blocks
}

/// max(s·p − q, 0) normalised; p when that has no mass.
fn excess_law(p: &DenseDist, q: &DenseDist, s: f64) -> Vec<f64> {
    let excess: Vec<f64> = p.probs().iter().zip(q.probs()).map(|(p, q)| (s * p - q).max(0.0)).collect();
    let mass: f64 = excess.iter().sum();
    if mass > 0.0 { excess.iter().map(|e| e / mass).collect() } else { p.probs().to_vec() }
}

/// The exact expected number of candidates a round from `prefix` accepts under
/// `verification`: Σ over drafted blocks of their probability times the rule's expectation
/// given the block.
pub fn expected_accepted(
    model: &dyn PrefixModel,
    prefix: &[u32],
    gamma: usize,
    wire: WireFormat,
    verification: Verification,
) -> f64 {
    drafted_blocks(model, prefix, gamma, wire)
        .iter()
        .map(|block| {
            let positions = block.positions();
            let given = match verification {
                Verification::Token => crate::block_weights::token_expected_accepted(&positions),
                Verification::Block => BlockWeights::of(&positions).expected_accepted(),
            };
            block.weight * given
        })
        .sum()
}

fn explore_round(
    model: &dyn PrefixModel,
    context: &mut Vec<u32>,
    base: usize,
    gamma: usize,
    wire: WireFormat,
    weight: f64,
    out: &mut Vec<(Vec<u32>, f64)>,
) {
    let p = model.target(context);
    let block_len = context.len() - base;
    if block_len == gamma {
        for (y, &py) in p.probs().iter().enumerate() {
            if py > 0.0 {
                out.push((with(&context[base..], y as u32), weight * py));
            }
        }
        return;
    }
    let raw_q = model.draft(context);
    let (q, rejection_law) = match wire {
        WireFormat::Dense => {
            let law = position_law(&p, &raw_q);
            let rejection_law = law.residual.unwrap_or_else(|| p.probs().to_vec());
            (raw_q, rejection_law)
        }
        WireFormat::Sparse(truncation) => {
            let sparse = raw_q.truncate(truncation);
            let rejection_law = sparse_rejection_law(&p, &sparse);
            (sparse.to_dense(), rejection_law)
        }
    };
    let mut rejection = 0.0;
    for (x, &qx) in q.probs().iter().enumerate() {
        if qx <= 0.0 {
            continue;
        }
        let a = acceptance_probability(p.probs()[x], qx);
        rejection += qx * (1.0 - a);
        if a > 0.0 {
            context.push(x as u32);
            explore_round(model, context, base, gamma, wire, weight * qx * a, out);
            context.pop();
        }
    }
    if rejection > 0.0 {
        for (y, &ry) in rejection_law.iter().enumerate() {
            if ry > 0.0 {
                out.push((with(&context[base..], y as u32), weight * rejection * ry));
            }
        }
    }
}

fn with(tokens: &[u32], last: u32) -> Vec<u32> {
    let mut v = tokens.to_vec();
    v.push(last);
    v
}

/// The joint law of the first `length` tokens generated by speculative rounds of draft length
/// `gamma` from `prompt`, under token verification.
pub fn speculative_sequence_law(
    model: &dyn PrefixModel,
    prompt: &[u32],
    gamma: usize,
    length: usize,
    wire: WireFormat,
) -> BTreeMap<Vec<u32>, f64> {
    speculative_sequence_law_with(model, prompt, gamma, length, wire, Verification::Token)
}

/// [`speculative_sequence_law`] under `verification`.
pub fn speculative_sequence_law_with(
    model: &dyn PrefixModel,
    prompt: &[u32],
    gamma: usize,
    length: usize,
    wire: WireFormat,
    verification: Verification,
) -> BTreeMap<Vec<u32>, f64> {
    let mut law = BTreeMap::new();
    let mut context = prompt.to_vec();
    let rounds = Rounds { model, base: prompt.len(), gamma, length, wire, verification };
    rounds.chain(&mut context, 1.0, &mut law);
    law
}

/// What [`speculative_sequence_law_with`] chains.
struct Rounds<'a> {
    model: &'a dyn PrefixModel,
    base: usize,
    gamma: usize,
    length: usize,
    wire: WireFormat,
    verification: Verification,
}

impl Rounds<'_> {
    fn chain(&self, context: &mut Vec<u32>, weight: f64, law: &mut BTreeMap<Vec<u32>, f64>) {
        if context.len() - self.base >= self.length {
            *law.entry(context[self.base..self.base + self.length].to_vec()).or_default() += weight;
            return;
        }
        for (tokens, w) in round_law_with(self.model, context, self.gamma, self.wire, self.verification) {
            let before = context.len();
            context.extend(&tokens);
            self.chain(context, weight * w, law);
            context.truncate(before);
        }
    }
}

/// The joint law of the first `length` tokens of target-only sampling from `prompt`.
pub fn target_sequence_law(model: &dyn PrefixModel, prompt: &[u32], length: usize) -> BTreeMap<Vec<u32>, f64> {
    let mut law = BTreeMap::new();
    let mut context = prompt.to_vec();
    chain_target(model, &mut context, prompt.len(), length, 1.0, &mut law);
    law
}

fn chain_target(
    model: &dyn PrefixModel,
    context: &mut Vec<u32>,
    base: usize,
    length: usize,
    weight: f64,
    law: &mut BTreeMap<Vec<u32>, f64>,
) {
    if context.len() - base == length {
        *law.entry(context[base..].to_vec()).or_default() += weight;
        return;
    }
    let p = model.target(context);
    for (y, &py) in p.probs().iter().enumerate() {
        if py > 0.0 {
            context.push(y as u32);
            chain_target(model, context, base, length, weight * py, law);
            context.pop();
        }
    }
}

/// The largest absolute difference between two laws over the union of their supports.
pub fn max_law_difference(a: &BTreeMap<Vec<u32>, f64>, b: &BTreeMap<Vec<u32>, f64>) -> f64 {
    a.keys()
        .chain(b.keys())
        .map(|k| (a.get(k).copied().unwrap_or(0.0) - b.get(k).copied().unwrap_or(0.0)).abs())
        .fold(0.0, f64::max)
}
