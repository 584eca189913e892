//! The device path against the host path (`specd-sampling`, the reference) on CPU tensors:
//! the same sparse pieces up to f64 rounding and the same draws, over every sampling
//! setting, with ties, masked tokens and penalties that see the block; and the same errors.

use specd_device_sampling::{BlockHistory, DeviceSamplingError, draw_truncated, most_likely, score_block};
use specd_sampling::{
    RoundKey, SamplingError, SamplingParams, StreamKey, TokenHistory, Truncation, block_distributions, rng::Purpose,
};
use tch::Tensor;

/// Deterministic logits: smooth values with ties for the maximum, masked (-inf) tokens and,
/// in some rows, a spread wide enough that truncations bite.
fn logits(rows: usize, vocab: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..rows)
        .map(|r| {
            let scale = [0.5, 2.0, 6.0][r % 3];
            (0..vocab)
                .map(|i| match i % 97 {
                    13 => f32::NEG_INFINITY,
                    41 | 42 => 4.0 * scale as f32, // a tie for the maximum
                    _ => ((next() - 0.5) * 2.0 * scale) as f32,
                })
                .collect()
        })
        .collect()
}

fn tensor(rows: &[Vec<f32>]) -> Tensor {
    let flat: Vec<f32> = rows.concat();
    Tensor::from_slice(&flat).view([rows.len() as i64, rows[0].len() as i64])
}

fn settings() -> Vec<SamplingParams> {
    let mut all = Vec::new();
    for temperature in [0.0, 0.7, 1.0, 1.6] {
        for top_k in [0, 1, 7, 60] {
            for top_p in [1.0, 0.9, 0.4] {
                for min_p in [0.0, 0.05] {
                    for (repetition_penalty, presence_penalty, frequency_penalty) in
                        [(1.0, 0.0, 0.0), (1.3, 0.0, 0.0), (1.0, 0.5, 0.3), (0.8, -0.4, 0.6)]
                    {
                        let params = SamplingParams {
                            temperature,
                            top_k,
                            top_p,
                            min_p,
                            repetition_penalty,
                            presence_penalty,
                            frequency_penalty,
                        };
                        params.validate().unwrap();
                        all.push(params);
                    }
                }
            }
        }
    }
    all
}

fn assert_close(device: f64, host: f64, what: &str) {
    assert!((device - host).abs() <= 1e-12 + 1e-9 * host.abs(), "{what}: device {device} against host {host}");
}

#[test]
fn the_target_pieces_agree_with_the_host_over_every_setting() {
    let vocab = 400;
    let gamma = 4;
    let prompt = [41u32, 5, 6, 300];
    let generated = [42u32, 7, 7, 99];
    let block = [41u32, 12, 42, 7];
    let supports: Vec<Vec<u32>> = vec![vec![41], vec![12, 3, 42], vec![42, 41, 0, 1, 2, 7], vec![]];
    let supports: Vec<&[u32]> = supports.iter().map(Vec::as_slice).collect();
    let mut compared = 0;
    for (n, params) in settings().iter().enumerate() {
        let rows = logits(gamma + 1, vocab, n as u64);
        let row_refs: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
        let key = RoundKey { seed: 1000 + n as u64, round: 3 };
        let p = block_distributions(&row_refs, params, &prompt, &generated, &block, 1).unwrap();
        let host = specd_sampling::score_block(&p, &supports, key, 1).unwrap();
        let history = BlockHistory { prompt: &prompt, generated: &generated, block: &block };
        let device = score_block(&tensor(&rows), params, history, &supports, key).unwrap();
        let what = format!("setting {n}: {params:?}");
        assert_eq!(device.block.bonus, host.bonus, "{what}: bonus");
        for (i, (d, h)) in device.block.positions.iter().zip(&host.positions).enumerate() {
            assert_eq!(d.p_on_support.len(), h.p_on_support.len());
            for (&dp, &hp) in d.p_on_support.iter().zip(&h.p_on_support) {
                assert_close(dp, hp, &format!("{what}: p on support {i}"));
            }
            assert_close(d.complement_mass, h.complement_mass, &format!("{what}: mass {i}"));
            assert_eq!(d.complement_sample, h.complement_sample, "{what}: complement sample {i}");
        }
        // Σ|S| + 2γ + 1 numbers and γ + 1 flags, 8 bytes each.
        assert_eq!(device.bytes_to_host, 8 * (10 + 2 * gamma + 1 + gamma + 1));
        compared += 1;
    }
    assert_eq!(compared, 384);
}

#[test]
fn the_draft_draw_agrees_with_the_host_over_every_setting() {
    let vocab = 300;
    let prompt = [1u32, 41, 2];
    let generated = [42u32, 42, 9];
    for (n, params) in settings().iter().enumerate() {
        let row = logits(1, vocab, 77 + n as u64);
        for truncation in [Truncation::new(0.0, 8).unwrap(), Truncation::new(0.05, 3).unwrap()] {
            let u = StreamKey::new(n as u64, 1, 2, Purpose::Draft).uniform();
            let history = TokenHistory { prompt: &prompt, generated: &generated };
            let dense = specd_sampling::effective_distribution(&row[0], params, history).unwrap();
            let host_q = dense.truncate(truncation);
            let device = draw_truncated(&tensor(&row), params, history, truncation, u).unwrap();
            let what = format!("setting {n} {truncation:?}: {params:?}");
            assert_eq!(device.q.tokens(), host_q.tokens(), "{what}");
            for (&d, &h) in device.q.probs().iter().zip(host_q.probs()) {
                assert_close(d, h, &what);
            }
            assert_eq!(device.token, host_q.sample(u), "{what}");
            let host_best =
                dense.probs().iter().enumerate().fold(0, |b, (t, p)| if *p > dense.probs()[b] { t } else { b });
            let device_best = most_likely(&tensor(&row), params, history).unwrap();
            assert_eq!(device_best as usize, host_best, "{what}: the most likely token");
            assert!(device.bytes_to_host <= 8 * (2 * truncation.max_entries + 1));
        }
    }
}

#[test]
fn bytes_to_the_host_at_a_large_vocabulary_are_a_few_hundred() {
    // The goal: at V = 128 256 and γ = 5, at most 16 KiB a verify (3 MB copied today).
    let vocab = 128_256;
    let gamma = 5;
    let rows = logits(gamma + 1, vocab, 5);
    let supports: Vec<Vec<u32>> = (0..gamma as u32).map(|i| (0..8).map(|k| i * 100 + k).collect()).collect();
    let supports: Vec<&[u32]> = supports.iter().map(Vec::as_slice).collect();
    let block = [1u32, 2, 3, 4, 5];
    let history = BlockHistory { prompt: &[9], generated: &[], block: &block };
    let params = SamplingParams { temperature: 0.8, top_p: 0.95, ..Default::default() };
    let scored = score_block(&tensor(&rows), &params, history, &supports, RoundKey { seed: 1, round: 1 }).unwrap();
    assert_eq!(scored.bytes_to_host, 8 * (40 + 2 * gamma + 1 + gamma + 1));
    assert!(scored.bytes_to_host <= 16 * 1024);
}

#[test]
fn refusals_are_the_hosts() {
    let params = SamplingParams::default();
    let key = RoundKey { seed: 0, round: 0 };
    let mut rows = logits(2, 50, 1);
    rows[1][17] = f32::NAN;
    let history = BlockHistory { prompt: &[], generated: &[], block: &[3] };
    let err = score_block(&tensor(&rows), &params, history, &[&[3]], key).unwrap_err();
    assert!(matches!(err, DeviceSamplingError::Sampling(SamplingError::NonFiniteLogit { index: 17, .. })), "{err}");
    let masked = vec![vec![f32::NEG_INFINITY; 50]; 2];
    let err = score_block(&tensor(&masked), &params, history, &[&[3]], key).unwrap_err();
    assert!(matches!(err, DeviceSamplingError::Sampling(SamplingError::NoFiniteLogit)), "{err}");
    let err = score_block(&tensor(&logits(2, 50, 1)), &params, history, &[&[50]], key).unwrap_err();
    assert!(
        matches!(err, DeviceSamplingError::Sampling(SamplingError::TokenOutOfRange { token: 50, vocab_size: 50 })),
        "{err}"
    );
    let err = score_block(&tensor(&logits(3, 50, 1)), &params, history, &[&[3]], key).unwrap_err();
    assert!(matches!(err, DeviceSamplingError::Sampling(SamplingError::ShapeMismatch(_))), "{err}");
    // A repetition penalty near 0 makes a positive score infinite: the host refuses the
    // weights it gives, and so does the device path.
    let params = SamplingParams { repetition_penalty: 1e-310, ..Default::default() };
    let history = BlockHistory { prompt: &[0], generated: &[], block: &[3] };
    let mut rows = logits(2, 50, 2);
    rows[0][0] = 1.0;
    rows[1][0] = 1.0;
    let err = score_block(&tensor(&rows), &params, history, &[&[3]], key).unwrap_err();
    assert!(matches!(err, DeviceSamplingError::Sampling(SamplingError::InvalidProbability { index: 0, .. })), "{err}");
    let row = vec![vec![f32::NAN; 10]];
    let err = draw_truncated(
        &tensor(&row),
        &SamplingParams::default(),
        TokenHistory::default(),
        Truncation::new(0.0, 4).unwrap(),
        0.5,
    )
    .unwrap_err();
    assert!(matches!(err, DeviceSamplingError::Sampling(SamplingError::NonFiniteLogit { index: 0, .. })), "{err}");
}

#[test]
fn a_block_of_no_candidates_and_supports_that_repeat_a_token_agree_with_the_host() {
    let vocab = 300;
    let key = RoundKey { seed: 5, round: 2 };
    let params = SamplingParams { temperature: 0.9, top_p: 0.9, presence_penalty: 0.4, ..Default::default() };
    let cases: [(usize, Vec<Vec<u32>>); 2] = [(0, vec![]), (2, vec![vec![7, 7, 3], vec![3]])];
    for (gamma, supports) in cases {
        let supports: Vec<&[u32]> = supports.iter().map(Vec::as_slice).collect();
        let rows = logits(gamma + 1, vocab, 40 + gamma as u64);
        let row_refs: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
        let block = [7u32, 3];
        let p = block_distributions(&row_refs, &params, &[1], &[2], &block[..gamma], 1).unwrap();
        let host = specd_sampling::score_block(&p, &supports, key, 1).unwrap();
        let history = BlockHistory { prompt: &[1], generated: &[2], block: &block[..gamma] };
        let device = score_block(&tensor(&rows), &params, history, &supports, key).unwrap().block;
        assert_eq!(device.bonus, host.bonus, "γ = {gamma}");
        assert_eq!(device.positions.len(), host.positions.len());
        for (d, h) in device.positions.iter().zip(&host.positions) {
            assert_eq!(d.p_on_support.len(), h.p_on_support.len());
            for (&dp, &hp) in d.p_on_support.iter().zip(&h.p_on_support) {
                assert_close(dp, hp, "p on a repeating support");
            }
            assert_close(d.complement_mass, h.complement_mass, "mass");
            assert_eq!(d.complement_sample, h.complement_sample);
        }
    }
}

#[test]
fn weights_below_the_hosts_exp_floor_are_zero_on_both_paths() {
    // At T = 0.02 a logit gap of 14.4 is e^-720: a subnormal number for libtorch's exp, 0 for
    // the host's kernel, and so on the device, or the two would disagree on whether a
    // complement exists.
    let row = vec![20.0f32, 0.0, 0.0, 5.6];
    let rows = vec![row.clone(), row];
    let params = SamplingParams { temperature: 0.02, ..Default::default() };
    let key = RoundKey { seed: 1, round: 1 };
    let supports: [&[u32]; 1] = [&[0]];
    let row_refs: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
    let p = block_distributions(&row_refs, &params, &[], &[], &[0], 1).unwrap();
    let host = specd_sampling::score_block(&p, &supports, key, 1).unwrap();
    let history = BlockHistory { prompt: &[], generated: &[], block: &[0] };
    let device = score_block(&tensor(&rows), &params, history, &supports, key).unwrap().block;
    assert_eq!(host.positions[0].complement_mass, 0.0);
    assert_eq!(device.positions[0].complement_mass, 0.0);
    assert_eq!(device.positions[0].complement_sample, None);
}
