//! Seeded counter-based randomness: Philox4x32-10 (Salmon et al., SC'11).
//!
//! Every draw of a generation is addressed by (request seed, round, position, purpose) plus a
//! draw index inside that stream. The value of a draw depends on nothing else: not on thread
//! timing, not on which node made it, not on how many other draws happened before. That is
//! what makes a run reproducible from its seed, and what lets the target and the coordinator
//! draw from disjoint streams of one seed without talking to each other.

/// What a stream of draws is used for; streams of different purposes never overlap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Purpose {
    /// The draft sampling its candidate x_i from q_i.
    Draft = 1,
    /// The coordinator's uniform for accepting x_i.
    Accept = 2,
    /// The coordinator's draws from the residual at the first rejection.
    Residual = 3,
    /// The target's sample c_i from p_i restricted to the complement of the support S_i.
    Complement = 4,
    /// The bonus token drawn from p_{γ+1} when every candidate is accepted.
    Bonus = 5,
    /// Plain sampling from p (target-only decoding, γ = 0).
    Plain = 6,
}

/// The address of one stream of draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamKey {
    pub seed: u64,
    pub round: u32,
    pub position: u32,
    pub purpose: Purpose,
}

impl StreamKey {
    pub fn new(seed: u64, round: u32, position: u32, purpose: Purpose) -> Self {
        Self { seed, round, position, purpose }
    }

    /// The stream of uniforms for this key.
    pub fn stream(self) -> CounterRng {
        CounterRng::new(self)
    }

    /// The first uniform of this stream: most purposes need exactly one.
    pub fn uniform(self) -> f64 {
        self.stream().next_uniform()
    }
}

/// Where a rule's draws come from: the stream for each block position and purpose.
///
/// In service this is always [`RoundKey`], fresh for every round; the trait exists so
/// that a test can build a rule whose keys repeat across rounds and show that the law audits
/// catch it (docs/randomness.md).
pub trait DrawKeys: Copy {
    /// The stream for block `position` (1-based) and `purpose`.
    fn stream(self, position: usize, purpose: Purpose) -> StreamKey;
}

/// Where the round's draws come from: (seed, round) plus the position and purpose of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundKey {
    pub seed: u64,
    pub round: u32,
}

impl RoundKey {
    pub fn stream(self, position: usize, purpose: Purpose) -> StreamKey {
        StreamKey::new(self.seed, self.round, position as u32, purpose)
    }
}

impl DrawKeys for RoundKey {
    fn stream(self, position: usize, purpose: Purpose) -> StreamKey {
        RoundKey::stream(self, position, purpose)
    }
}

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let product = u64::from(a) * u64::from(b);
    ((product >> 32) as u32, product as u32)
}

/// Philox4x32 with 10 rounds: a bijection of the 128-bit counter under a 64-bit key.
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = counter;
    let mut k = key;
    for round in 0..10 {
        if round > 0 {
            k[0] = k[0].wrapping_add(W0);
            k[1] = k[1].wrapping_add(W1);
        }
        let (hi0, lo0) = mulhilo(M0, c[0]);
        let (hi1, lo1) = mulhilo(M1, c[2]);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// A stream of uniforms in [0, 1) for one [`StreamKey`].
#[derive(Debug, Clone)]
pub struct CounterRng {
    key: [u32; 2],
    counter: [u32; 4],
    block: [u32; 4],
    used: usize,
}

impl CounterRng {
    pub fn new(key: StreamKey) -> Self {
        Self {
            key: [key.seed as u32, (key.seed >> 32) as u32],
            counter: [0, key.position, key.round, key.purpose as u32],
            block: [0; 4],
            used: 4,
        }
    }

    pub fn next_u32(&mut self) -> u32 {
        if self.used == 4 {
            self.block = philox4x32_10(self.counter, self.key);
            self.counter[0] = self.counter[0].wrapping_add(1);
            self.used = 0;
        }
        let value = self.block[self.used];
        self.used += 1;
        value
    }

    pub fn next_u64(&mut self) -> u64 {
        let hi = u64::from(self.next_u32());
        (hi << 32) | u64::from(self.next_u32())
    }

    /// A uniform double in [0, 1) with 53 random bits; never returns 1.
    pub fn next_uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Known-answer vectors of Random123's kat_vectors for philox4x32_10.
    #[test]
    fn philox_known_answers() {
        assert_eq!(philox4x32_10([0; 4], [0; 2]), [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]);
        assert_eq!(philox4x32_10([u32::MAX; 4], [u32::MAX; 2]), [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]);
        assert_eq!(
            philox4x32_10([0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344], [0xa409_3822, 0x299f_31d0]),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let key = StreamKey::new(42, 3, 1, Purpose::Accept);
        let a: Vec<u64> = {
            let mut s = key.stream();
            (0..10).map(|_| s.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut s = key.stream();
            (0..10).map(|_| s.next_u64()).collect()
        };
        assert_eq!(a, b);
        for other in [
            StreamKey::new(43, 3, 1, Purpose::Accept),
            StreamKey::new(42, 4, 1, Purpose::Accept),
            StreamKey::new(42, 3, 2, Purpose::Accept),
            StreamKey::new(42, 3, 1, Purpose::Residual),
        ] {
            assert_ne!(key.stream().next_u64(), other.stream().next_u64(), "{other:?}");
        }
    }

    #[test]
    fn uniforms_are_in_unit_interval_with_the_right_mean() {
        let mut s = StreamKey::new(7, 0, 0, Purpose::Plain).stream();
        let n = 100_000;
        let mut sum = 0.0;
        for _ in 0..n {
            let u = s.next_uniform();
            assert!((0.0..1.0).contains(&u));
            sum += u;
        }
        // The mean of n uniforms has sd 1/sqrt(12 n) ≈ 0.0009; 5 sd is a 6e-7 false alarm.
        assert!((sum / n as f64 - 0.5).abs() < 0.0046);
    }
}
