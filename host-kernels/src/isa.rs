//! Which instruction set the kernels run with. The build targets the baseline x86-64 (SSE2),
//! so loops compiled only for it use 4 lanes and no fused multiply-add; each kernel is also
//! compiled for AVX2 with FMA and for AVX-512, and the widest set the CPU reports is chosen
//! when [`Isa::detect`] runs. AVX-512 with its bf16 instructions (`avx512_bf16`) is a level
//! of its own: the same loops as AVX-512, and pair-interleaved bf16 panels multiplied two
//! products an instruction (`crate::bf16_pairs`).

/// An instruction set the kernels can run with on this CPU. Only [`Isa::detect`] and
/// [`Isa::available`] make one above the baseline, and only after the CPU reported its
/// features: that is what makes the dispatch below sound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Isa(pub(crate) Level);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    #[cfg(target_arch = "x86_64")]
    Avx512Bf16,
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2Fma,
    Baseline,
}

impl Isa {
    /// The widest instruction set this CPU runs.
    pub fn detect() -> Self {
        Self::available().into_iter().next().unwrap_or(Self(Level::Baseline))
    }

    /// The build's baseline, which every CPU it runs on has.
    pub fn baseline() -> Self {
        Self(Level::Baseline)
    }

    /// Every instruction set this CPU runs, widest first (the tests check each against the
    /// others).
    pub fn available() -> Vec<Self> {
        let mut sets = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma");
            if avx2
                && std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vl")
            {
                if std::arch::is_x86_feature_detected!("avx512bf16") {
                    sets.push(Self(Level::Avx512Bf16));
                }
                sets.push(Self(Level::Avx512));
            }
            if avx2 {
                sets.push(Self(Level::Avx2Fma));
            }
        }
        sets.push(Self(Level::Baseline));
        sets
    }

    /// Its name, as logs and benches print it.
    pub fn name(self) -> &'static str {
        match self.0 {
            #[cfg(target_arch = "x86_64")]
            Level::Avx512Bf16 => "avx512+bf16",
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => "avx512",
            #[cfg(target_arch = "x86_64")]
            Level::Avx2Fma => "avx2+fma",
            Level::Baseline => "baseline",
        }
    }

    /// Whether it multiplies pairs of bf16 values in one instruction (`vdpbf16ps`).
    pub fn multiplies_bf16_pairs(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        if self.0 == Level::Avx512Bf16 {
            return true;
        }
        false
    }

    /// How bf16 weights are best stored for it: as pairs where it multiplies them (inputs
    /// rounded to bf16), widened to f32 as read elsewhere.
    pub fn bf16_format(self) -> crate::WeightFormat {
        if self.multiplies_bf16_pairs() { crate::WeightFormat::Bf16Pairs } else { crate::WeightFormat::Bf16 }
    }
}

/// Asks the CPU to start bringing the cache line that holds `data[at]` into its caches, so
/// that a later read of it does not wait on memory; nothing when `at` is out of `data`.
/// A prefetch reads nothing the program sees and cannot fault.
#[inline(always)]
pub(crate) fn prefetch<T>(data: &[T], at: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(item) = data.get(at) {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        // SAFETY: `_mm_prefetch` is SSE, which every x86-64 CPU has (the build's baseline),
        // and it only hints the caches: the address is a valid element of `data` anyway.
        #[allow(unsafe_code)]
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>((item as *const T).cast());
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (data, at);
}

/// A kernel compiled three times (AVX-512, AVX2 with FMA, baseline) and called for the
/// [`Isa`] it is given. Each arm is the same generic loop with its own constants; AVX-512
/// with bf16 instructions runs the AVX-512 arm, which needs none of them.
macro_rules! dispatched {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? {
        avx512 => $avx512:expr,
        avx2 => $avx2:expr,
        baseline => $baseline:expr $(,)?
    }) => {
        $(#[$m])*
        $vis fn $name(isa: $crate::isa::Isa, $($arg: $ty),*) $(-> $ret)? {
            match isa.0 {
                #[cfg(target_arch = "x86_64")]
                $crate::isa::Level::Avx512 | $crate::isa::Level::Avx512Bf16 => {
                    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
                    fn avx512($($arg: $ty),*) $(-> $ret)? { $avx512 }
                    // SAFETY: an `Isa` at this level exists only after `is_x86_feature_detected!`
                    // reported every feature enabled above (`Isa::available`).
                    #[allow(unsafe_code)]
                    unsafe { avx512($($arg),*) }
                }
                #[cfg(target_arch = "x86_64")]
                $crate::isa::Level::Avx2Fma => {
                    #[target_feature(enable = "avx2,fma")]
                    fn avx2($($arg: $ty),*) $(-> $ret)? { $avx2 }
                    // SAFETY: as above, for AVX2 and FMA.
                    #[allow(unsafe_code)]
                    unsafe { avx2($($arg),*) }
                }
                $crate::isa::Level::Baseline => $baseline,
            }
        }
    };
}
pub(crate) use dispatched;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_detected_set_is_the_widest_available_and_the_baseline_is_always_there() {
        let sets = Isa::available();
        assert_eq!(Isa::detect(), sets[0]);
        assert_eq!(*sets.last().unwrap(), Isa::baseline());
    }
}
