//! Effective next-token distributions: logits plus settings plus history to the p (or q)
//! that is actually sampled from.

use std::collections::HashMap;

use multiversion::multiversion;

use crate::dist::{DenseDist, check_token};
use crate::error::{Result, SamplingError};
use crate::kernels::{exp_nonpositive, lane_max, lane_sum};
use crate::params::SamplingParams;
use crate::rows::map_positions;

/// The tokens the penalties look at: the prompt, and everything generated before the
/// position being scored (committed output followed by any speculated tokens before it).
#[derive(Debug, Clone, Copy, Default)]
pub struct TokenHistory<'a> {
    pub prompt: &'a [u32],
    pub generated: &'a [u32],
}

/// The effective distribution for one position.
///
/// Order (docs/rule.md): penalties → temperature → top-k → top-p → min-p. Logits may be
/// `-inf` (a masked token) but not NaN or `+inf`. Temperature 0 is the one-hot distribution
/// on the argmax of the penalised logits, ties to the lowest id.
///
/// Compiled for AVX-512 and for AVX2 besides the build's baseline, and run with the widest
/// set the CPU has: a row's loops then take 8 or 4 values an instruction instead of 2. The
/// numbers are the same bit for bit on each, since Rust never fuses a multiply and an add
/// on its own, and every loop adds in the same order whatever the width.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+avx2+fma", "x86_64+avx2+fma"))]
pub fn effective_distribution<'a>(
    logits: &'a [f32],
    params: &'a SamplingParams,
    history: TokenHistory<'a>,
) -> Result<DenseDist> {
    if logits.is_empty() {
        return Err(SamplingError::EmptyDistribution);
    }
    check_logits(logits)?;
    if params.has_penalties() {
        let mut scores: Vec<f64> = logits.iter().map(|&l| f64::from(l)).collect();
        apply_penalties(&mut scores, params, history)?;
        distribution_of_scores(&scores, params)
    } else {
        // Without penalties the scores are the logits: f64::from is exact and monotonic, so
        // reading them in place gives the same numbers without a copy of the row (1 MB at a
        // vocabulary of 128 000).
        distribution_of_scores(logits, params)
    }
}

/// Temperature, top-k, top-p and min-p on `scores` (the logits, penalised or not).
#[inline(always)]
fn distribution_of_scores<S: Copy + Into<f64>>(scores: &[S], params: &SamplingParams) -> Result<DenseDist> {
    let vocab_size = scores.len();
    let best = argmax(scores).ok_or(SamplingError::NoFiniteLogit)?;
    if params.is_greedy() {
        return DenseDist::one_hot(vocab_size, best);
    }
    let max: f64 = scores[best as usize].into();
    let inv_t = 1.0 / params.temperature;
    // Every score is at most the maximum, so each weight is e^x for an x ≤ 0. A plain loop,
    // not an iterator collected: the iterator's fold is a function of its own, which would
    // be compiled for the baseline alone and called from every instruction set's copy.
    let mut probs = vec![0.0f64; vocab_size];
    for i in 0..vocab_size {
        probs[i] = exp_nonpositive((scores[i].into() - max) * inv_t);
    }
    let top_k = params.top_k > 0 && (params.top_k as usize) < vocab_size;
    if !(top_k || params.top_p < 1.0 || params.min_p > 0.0) {
        let sum = lane_sum(0..probs.len(), |i| probs[i]);
        // Weights of e^x are finite and non-negative: nothing for `from_weights` to check.
        // Not so when a penalty pushed a score to +inf (a repetition penalty near 0) and a
        // weight is NaN: `from_weights` below then says which.
        if sum.is_finite() {
            return DenseDist::from_summed_weights(probs, sum);
        }
    }
    if top_k {
        keep_top_k(&mut probs, params.top_k as usize);
    }
    if params.top_p < 1.0 {
        keep_top_p(&mut probs, params.top_p);
    }
    if params.min_p > 0.0 {
        // The argmax always survives top-k and top-p, so it is still the maximum here.
        let floor = params.min_p * probs[best as usize];
        probs.iter_mut().filter(|p| **p < floor).for_each(|p| *p = 0.0);
    }
    DenseDist::from_weights(probs)
}

/// Logits may be `-inf` (a masked token) but not NaN or `+inf`.
#[inline(always)]
fn check_logits(logits: &[f32]) -> Result<()> {
    // One branch-free pass over the row; the index is looked for only when something is wrong.
    let bad = |value: f32| value.is_nan() || value == f32::INFINITY;
    if !logits.iter().fold(false, |any, &value| any | bad(value)) {
        return Ok(());
    }
    let index = logits.iter().position(|&value| bad(value)).unwrap_or_default();
    Err(SamplingError::NonFiniteLogit { index, value: logits[index] })
}

/// Effective distributions for a block: row i of `rows` scores the token after
/// `generated ++ block[..i]`, so penalties at position i see the i speculated tokens before it.
/// Large blocks are spread over at most `threads` threads (module `rows`), with the same numbers.
pub fn block_distributions(
    rows: &[&[f32]],
    params: &SamplingParams,
    prompt: &[u32],
    generated: &[u32],
    block: &[u32],
    threads: usize,
) -> Result<Vec<DenseDist>> {
    if block.len() + 1 < rows.len() {
        return Err(SamplingError::ShapeMismatch(format!(
            "{} logit rows need at least {} block tokens, got {}",
            rows.len(),
            rows.len() - 1,
            block.len()
        )));
    }
    let history: Vec<u32> = generated.iter().chain(block).copied().collect();
    let vocab_size = rows.iter().map(|row| row.len()).max().unwrap_or(0);
    map_positions(
        rows.len(),
        vocab_size,
        threads,
        || (),
        |_, i| {
            let before = TokenHistory { prompt, generated: &history[..generated.len() + i] };
            effective_distribution(rows[i], params, before)
        },
    )
    .into_iter()
    .collect()
}

fn apply_penalties(scores: &mut [f64], params: &SamplingParams, history: TokenHistory<'_>) -> Result<()> {
    let vocab_size = scores.len();
    let mut generated_counts: HashMap<u32, u32> = HashMap::new();
    for &t in history.generated {
        check_token(t, vocab_size)?;
        *generated_counts.entry(t).or_default() += 1;
    }
    if params.repetition_penalty != 1.0 {
        let mut seen: Vec<u32> = history.prompt.to_vec();
        seen.extend(generated_counts.keys());
        seen.sort_unstable();
        seen.dedup();
        let r = params.repetition_penalty;
        for t in seen {
            check_token(t, vocab_size)?;
            let s = &mut scores[t as usize];
            *s = if *s > 0.0 { *s / r } else { *s * r };
        }
    }
    for (&t, &count) in &generated_counts {
        scores[t as usize] -= params.presence_penalty + params.frequency_penalty * f64::from(count);
    }
    Ok(())
}

/// Index of the largest score, ties to the lowest id; None when all are -inf. Scores are
/// never NaN: the logits are checked, and validated penalties keep them numbers.
#[inline(always)]
fn argmax<S: Copy + Into<f64>>(scores: &[S]) -> Option<u32> {
    let max = lane_max(scores);
    if max == f64::NEG_INFINITY {
        return None;
    }
    // Its first position: blocks are tested whole (a test the compiler can vectorise), and
    // only the block that holds it is walked.
    const BLOCK: usize = 64;
    let block = scores.chunks(BLOCK).position(|block| block.iter().fold(false, |any, &s| any | (s.into() == max)))?;
    let within = scores[block * BLOCK..].iter().position(|&s| s.into() == max)?;
    Some((block * BLOCK + within) as u32)
}

fn by_prob_desc_then_id(probs: &[f64]) -> impl Fn(&u32, &u32) -> std::cmp::Ordering + '_ {
    move |a, b| probs[*b as usize].total_cmp(&probs[*a as usize]).then(a.cmp(b))
}

fn keep_top_k(probs: &mut [f64], k: usize) {
    let mut order: Vec<u32> = (0..probs.len() as u32).collect();
    order.select_nth_unstable_by(k - 1, by_prob_desc_then_id(probs));
    for &t in &order[k..] {
        probs[t as usize] = 0.0;
    }
}

fn keep_top_p(probs: &mut [f64], top_p: f64) {
    let total: f64 = probs.iter().sum();
    let mut order: Vec<u32> = (0..probs.len() as u32).filter(|&t| probs[t as usize] > 0.0).collect();
    order.sort_unstable_by(by_prob_desc_then_id(probs));
    let needed = top_p * total;
    let mut running = 0.0;
    let mut keep = order.len();
    for (i, &t) in order.iter().enumerate() {
        running += probs[t as usize];
        if running >= needed {
            keep = i + 1;
            break;
        }
    }
    for &t in &order[keep..] {
        probs[t as usize] = 0.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dist(logits: &[f32], params: SamplingParams) -> Vec<f64> {
        effective_distribution(logits, &params, TokenHistory::default()).unwrap().probs().to_vec()
    }

    #[test]
    fn the_widest_instruction_set_gives_the_baselines_numbers_bit_for_bit() {
        // The same row worked out here, in this test's code, which is compiled for the
        // baseline alone: the same kernels in the same order, one value at a time. Where the
        // CPU has AVX2 or AVX-512, `effective_distribution` runs its copy for them, so a fused
        // multiply-add or a sum in another order there would show as a differing bit.
        let mut rng = crate::rng::StreamKey::new(11, 0, 0, crate::rng::Purpose::Plain).stream();
        for vocab in [1usize, 7, 8, 9, 4_096, 4_099] {
            let row: Vec<f32> = (0..vocab).map(|_| (rng.next_uniform() * 30.0 - 20.0) as f32).collect();
            for temperature in [0.05, 0.8, 1.0, 1.7] {
                let params = SamplingParams { temperature, ..SamplingParams::default() };
                let got = dist(&row, params);
                let max = row.iter().fold(f64::NEG_INFINITY, |m, &l| m.max(f64::from(l)));
                let weights: Vec<f64> =
                    row.iter().map(|&l| exp_nonpositive((f64::from(l) - max) * (1.0 / temperature))).collect();
                let sum = lane_sum(0..vocab, |i| weights[i]);
                let want = DenseDist::from_summed_weights(weights, sum).unwrap();
                let bits = |probs: &[f64]| probs.iter().map(|p| p.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(want.probs()), "V = {vocab}, T = {temperature}");
            }
        }
    }

    fn assert_close(a: &[f64], b: &[f64]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-7, "{a:?} vs {b:?}"); // logits are f32
        }
    }

    #[test]
    fn softmax_at_temperature_one_and_two() {
        let l = [0.0f32, (2.0f32).ln(), (5.0f32).ln()];
        assert_close(&dist(&l, SamplingParams::default()), &[0.125, 0.25, 0.625]);
        let hot = dist(&l, SamplingParams { temperature: 2.0, ..Default::default() });
        let w = [1.0, 2f64.sqrt(), 5f64.sqrt()];
        let s: f64 = w.iter().sum();
        assert_close(&hot, &w.map(|x| x / s));
    }

    #[test]
    fn greedy_is_one_hot_on_the_lowest_argmax() {
        assert_eq!(dist(&[1.0, 3.0, 3.0, 2.0], SamplingParams::greedy()), vec![0.0, 1.0, 0.0, 0.0]);
    }

    #[test]
    fn argmax_is_the_first_maximum_across_blocks_and_lanes() {
        // Rows longer than the blocks and lanes the search splits them into, the maximum at
        // a block's edges, in a lane's tail, twice, or -0.0 beside 0.0.
        for (n, at) in [(200, vec![64, 130]), (200, vec![63, 64]), (131, vec![130]), (9, vec![8, 3]), (70, vec![0])] {
            let mut row = vec![-1.0f32; n];
            for &i in &at {
                row[i] = 2.5;
            }
            assert_eq!(argmax(&row), at.iter().min().map(|&i| i as u32), "{n} values, maximum at {at:?}");
        }
        let mut row = vec![f32::NEG_INFINITY; 100];
        assert_eq!(argmax(&row), None);
        row[99] = -0.0;
        row[77] = 0.0;
        assert_eq!(argmax(&row), Some(77));
    }

    #[test]
    fn top_k_top_p_min_p_in_order() {
        let probs = [0.4, 0.3, 0.2, 0.1];
        let l: Vec<f32> = probs.iter().map(|p: &f64| p.ln() as f32).collect();
        let k2 = dist(&l, SamplingParams { top_k: 2, ..Default::default() });
        assert!((k2[0] - 4.0 / 7.0).abs() < 1e-6 && k2[2] == 0.0 && k2[3] == 0.0);
        let p = dist(&l, SamplingParams { top_p: 0.75, ..Default::default() });
        assert!((p[2] - 2.0 / 9.0).abs() < 1e-6 && p[3] == 0.0, "0.4+0.3 < 0.75 so the third stays: {p:?}");
        let m = dist(&l, SamplingParams { min_p: 0.45, ..Default::default() });
        assert!(m[2] > 0.0 && m[3] == 0.0, "0.2 >= 0.45*0.4 stays, 0.1 goes: {m:?}");
        // top-k first, then top-p on the renormalised remainder: (4/7, 3/7) needs both for 0.6.
        let kp = dist(&l, SamplingParams { top_k: 2, top_p: 0.6, ..Default::default() });
        assert!(kp[0] > 0.0 && kp[1] > 0.0 && kp[2] == 0.0);
    }

    #[test]
    fn penalties_use_the_history() {
        let l = [2.0f32, -1.0, 0.5];
        let params = SamplingParams { temperature: 0.0, repetition_penalty: 4.0, ..Default::default() };
        // 2.0 / 4 = 0.5 ties with token 2; lowest id wins.
        let out = effective_distribution(&l, &params, TokenHistory { prompt: &[0], generated: &[] }).unwrap();
        assert_eq!(out.probs(), &[1.0, 0.0, 0.0]);
        let out = effective_distribution(&l, &params, TokenHistory { prompt: &[0, 0], generated: &[0, 0] }).unwrap();
        assert_eq!(out.probs(), &[1.0, 0.0, 0.0], "repetition penalty applies once per token, not per count");
        let freq = SamplingParams { temperature: 0.0, frequency_penalty: 0.6, ..Default::default() };
        let out = effective_distribution(&l, &freq, TokenHistory { prompt: &[0], generated: &[0, 0] }).unwrap();
        assert_eq!(out.probs(), &[1.0, 0.0, 0.0], "2.0 - 2*0.6 = 0.8 > 0.5: prompt tokens do not count");
        let out = effective_distribution(&l, &freq, TokenHistory { prompt: &[], generated: &[0, 0, 0] }).unwrap();
        assert_eq!(out.probs(), &[0.0, 0.0, 1.0], "2.0 - 3*0.6 = 0.2 < 0.5");
        let pres = SamplingParams { temperature: 0.0, presence_penalty: 1.6, ..Default::default() };
        let out = effective_distribution(&l, &pres, TokenHistory { prompt: &[0], generated: &[] }).unwrap();
        assert_eq!(out.probs(), &[1.0, 0.0, 0.0], "presence ignores the prompt");
        let out = effective_distribution(&l, &pres, TokenHistory { prompt: &[], generated: &[0] }).unwrap();
        assert_eq!(out.probs(), &[0.0, 0.0, 1.0], "2.0 - 1.6 = 0.4 < 0.5");
    }

    #[test]
    fn logits_read_in_place_give_what_penalised_scores_give() {
        // A presence penalty with nothing generated changes no score but takes the penalised
        // path, which copies the logits to f64 first: the two paths must agree bit for bit,
        // ties, masked tokens and every truncation included.
        let row: Vec<f32> = (0..257u32)
            .map(|i| match i % 17 {
                0 => f32::NEG_INFINITY,
                5 => 2.5, // ties for the maximum
                k => (k as f32 * 0.37).sin() * 3.0,
            })
            .collect();
        for (temperature, top_k, top_p, min_p) in [(1.0, 0, 1.0, 0.0), (0.7, 40, 0.9, 0.05), (0.0, 0, 1.0, 0.0)] {
            let plain = SamplingParams { temperature, top_k, top_p, min_p, ..Default::default() };
            let penalised = SamplingParams { presence_penalty: 0.5, ..plain };
            assert!(!plain.has_penalties() && penalised.has_penalties());
            let history = TokenHistory { prompt: &[3, 4], generated: &[] };
            assert_eq!(
                effective_distribution(&row, &plain, history).unwrap(),
                effective_distribution(&row, &penalised, history).unwrap(),
                "T = {temperature}, top-k {top_k}, top-p {top_p}, min-p {min_p}"
            );
        }
        // Untruncated, the weights are summed without the validating constructor: the same
        // distribution as it gives from libm's e^x, to a few ulp.
        let max = row.iter().fold(f64::NEG_INFINITY, |m, &l| m.max(f64::from(l)));
        let weights = row.iter().map(|&l| ((f64::from(l) - max) * (1.0 / 0.7)).exp()).collect();
        let reference = DenseDist::from_weights(weights).unwrap();
        let params = SamplingParams { temperature: 0.7, ..Default::default() };
        let dist = effective_distribution(&row, &params, TokenHistory::default()).unwrap();
        for (token, (&a, &b)) in dist.probs().iter().zip(reference.probs()).enumerate() {
            assert!((a - b).abs() <= 1e-15 * b, "token {token}: {a} against {b}");
            assert_eq!(a == 0.0, b == 0.0, "token {token}: the support differs");
        }
    }

    #[test]
    fn a_score_a_penalty_made_infinite_is_refused_as_before() {
        // 1.0 / 1e-310 overflows to +inf and exp(inf - inf) is NaN: the untruncated path does
        // not take its own sum then, and the validating constructor names the weight.
        let params = SamplingParams { repetition_penalty: 1e-310, ..Default::default() };
        let history = TokenHistory { prompt: &[0], generated: &[] };
        let result = effective_distribution(&[1.0, 0.5], &params, history);
        assert!(matches!(result, Err(SamplingError::InvalidProbability { index: 0, .. })), "{result:?}");
    }

    #[test]
    fn block_positions_see_the_speculated_tokens_before_them() {
        let row = [1.0f32, 0.9, 0.0];
        let rows = [&row[..], &row[..], &row[..]];
        let params = SamplingParams { temperature: 0.0, presence_penalty: 0.5, ..Default::default() };
        let dists = block_distributions(&rows, &params, &[], &[], &[0, 1], 1).unwrap();
        assert_eq!(dists[0].probs(), &[1.0, 0.0, 0.0]);
        assert_eq!(dists[1].probs(), &[0.0, 1.0, 0.0], "token 0 was speculated at position 1");
        assert_eq!(dists[2].probs(), &[1.0, 0.0, 0.0], "both penalised: 0.5 > 0.4");
    }

    #[test]
    fn a_block_spread_over_threads_has_the_same_numbers() {
        // Large enough to spread (6 rows of 70 000). The rows are the same, so positions
        // differ only by the speculated tokens their presence penalty sees.
        let row: Vec<f32> = (0..70_000).map(|i| ((i * 7) % 101) as f32 * 0.05).collect();
        let rows = vec![row.as_slice(); 6];
        let block = [3, 14, 15, 92, 65];
        let params = SamplingParams { temperature: 0.8, presence_penalty: 0.7, ..Default::default() };
        let one = block_distributions(&rows, &params, &[2, 7], &[1, 8], &block, 1).unwrap();
        let four = block_distributions(&rows, &params, &[2, 7], &[1, 8], &block, 4).unwrap();
        assert_eq!(one, four);
        for (i, pair) in one.windows(2).enumerate() {
            assert!(pair[1].prob(block[i]) < pair[0].prob(block[i]), "position {} sees token {}", i + 1, block[i]);
        }
    }

    #[test]
    fn bad_logits_are_clear_errors() {
        let p = SamplingParams::default();
        assert!(matches!(
            effective_distribution(&[0.0, f32::NAN], &p, TokenHistory::default()),
            Err(SamplingError::NonFiniteLogit { index: 1, .. })
        ));
        assert!(matches!(
            effective_distribution(&[f32::INFINITY], &p, TokenHistory::default()),
            Err(SamplingError::NonFiniteLogit { index: 0, .. })
        ));
        assert_eq!(
            effective_distribution(&[f32::NEG_INFINITY; 2], &p, TokenHistory::default()),
            Err(SamplingError::NoFiniteLogit)
        );
        let masked = effective_distribution(&[f32::NEG_INFINITY, 0.0], &p, TokenHistory::default()).unwrap();
        assert_eq!(masked.probs(), &[0.0, 1.0]);
        let rep = SamplingParams { repetition_penalty: 1.2, ..Default::default() };
        assert!(matches!(
            effective_distribution(&[0.0, 0.0], &rep, TokenHistory { prompt: &[5], generated: &[] }),
            Err(SamplingError::TokenOutOfRange { token: 5, vocab_size: 2 })
        ));
    }
}
