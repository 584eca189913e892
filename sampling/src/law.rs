//! Exact output laws by enumeration, for tests and for `specd rule`.
//!
//! [`position_law`] is the law of the token emitted at one position, with every intermediate
//! quantity of docs/rule.md; [`round_law`] enumerates every path of a whole round over a
//! small vocabulary with prefix-dependent tables; [`speculative_sequence_law`] chains rounds
//! to get the joint law of the first L committed tokens, which must equal
//! [`target_sequence_law`].

use std::collections::BTreeMap;

use crate::dist::{DenseDist, SparseDist, Truncation};
use crate::rule::acceptance_probability;

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
/// `gamma` from `prompt`.
pub fn speculative_sequence_law(
    model: &dyn PrefixModel,
    prompt: &[u32],
    gamma: usize,
    length: usize,
    wire: WireFormat,
) -> BTreeMap<Vec<u32>, f64> {
    let mut law = BTreeMap::new();
    let mut context = prompt.to_vec();
    chain_rounds(model, &mut context, prompt.len(), gamma, length, wire, 1.0, &mut law);
    law
}

#[allow(clippy::too_many_arguments)]
fn chain_rounds(
    model: &dyn PrefixModel,
    context: &mut Vec<u32>,
    base: usize,
    gamma: usize,
    length: usize,
    wire: WireFormat,
    weight: f64,
    law: &mut BTreeMap<Vec<u32>, f64>,
) {
    if context.len() - base >= length {
        *law.entry(context[base..base + length].to_vec()).or_default() += weight;
        return;
    }
    for (tokens, w) in round_law(model, context, gamma, wire) {
        let before = context.len();
        context.extend(&tokens);
        chain_rounds(model, context, base, gamma, length, wire, weight * w, law);
        context.truncate(before);
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
