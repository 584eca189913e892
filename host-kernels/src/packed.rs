//! A linear layer's weight laid out for the kernels, in `f32` or `bf16`.

/// Outputs computed together: their partial sums stay in registers (two AVX-512 registers,
/// four AVX2 ones) while the input is walked once, so no sum is reduced across lanes.
pub const BLOCK: usize = 32;

/// How a matrix's weights are stored, and so how a linear layer multiplies by them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    /// `f32` weights, `f32` arithmetic.
    F32,
    /// bf16 weights widened to `f32` as they are read: a bf16 checkpoint computes exactly as
    /// its `f32` upcast does, in half the bytes a pass reads.
    Bf16,
    /// bf16 weights, each panel row holding the weights of two inputs side by side, and each
    /// layer's inputs rounded to bf16 (nearest, ties to even) before they are multiplied; the
    /// products are exact and summed in `f32`. A CPU with bf16 instructions
    /// ([`crate::Isa::multiplies_bf16_pairs`]) does two products and their sum per lane in one
    /// instruction, twice the products of [`Self::Bf16`]'s multiply-adds, which is what a
    /// prompt's pass is bound by; other CPUs compute the same products widened. This is what
    /// torch's and llama.cpp's bf16 matrix products do with their inputs. The price: each
    /// input moves by up to 2⁻⁹ of itself, so a layer's sums are no longer those of the `f32`
    /// upcast.
    Bf16Pairs,
}

impl WeightFormat {
    /// Bytes per weight.
    pub fn bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::Bf16 | Self::Bf16Pairs => 2,
        }
    }

    /// Whether the weights are stored as bf16.
    pub fn is_bf16(self) -> bool {
        self.bytes() == 2
    }

    /// What it stores and multiplies, as logs say it.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::Bf16Pairs => "bf16, inputs rounded to bf16",
        }
    }
}

/// A cache line: panels start on one, so that no 64-byte load of a panel straddles two
/// lines (each such load would cost two).
pub(crate) const LINE: usize = 64;

/// `len` values starting on a cache line, inside a vector allocated a line longer. The
/// vector is never resized, so its buffer, and the alignment, stay put.
#[derive(Debug, PartialEq)]
pub(crate) struct Aligned<T> {
    data: Vec<T>,
    start: usize,
    len: usize,
}

impl<T: Copy + Default> Aligned<T> {
    fn zeroed(len: usize) -> Self {
        let per_line = LINE / size_of::<T>();
        let data = vec![T::default(); len + per_line];
        let misalignment = data.as_ptr() as usize % LINE;
        let start = if misalignment == 0 { 0 } else { (LINE - misalignment) / size_of::<T>() };
        Self { data, start, len }
    }

    pub(crate) fn as_slice(&self) -> &[T] {
        &self.data[self.start..self.start + self.len]
    }

    fn as_mut_slice(&mut self) -> &mut [T] {
        &mut self.data[self.start..self.start + self.len]
    }
}

#[derive(Debug, PartialEq)]
pub(crate) enum Panels {
    F32(Aligned<f32>),
    Bf16(Aligned<u16>),
    /// Each panel `⌈inputs / 2⌉ × BLOCK × 2`: row `j` holds, for each output, its weights of
    /// inputs `2j` and `2j + 1` (zero past the last input), the 32-bit lane a bf16 pair
    /// instruction multiplies.
    Bf16Pairs(Aligned<u16>),
}

/// The checkpoint's `outputs × inputs` matrix cut into panels of [`BLOCK`] outputs, each
/// stored input-major (`inputs × BLOCK`, the last padded with zero rows; input pairs for
/// [`WeightFormat::Bf16Pairs`]), so that a pass reads the whole weight front to back and each
/// panel is the unit one thread computes.
/// (Not `Clone`: a copied vector would not keep the alignment.)
#[derive(Debug, PartialEq)]
pub struct PackedMatrix {
    pub(crate) inputs: usize,
    pub(crate) outputs: usize,
    pub(crate) panels: Panels,
}

impl PackedMatrix {
    /// Packs the row-major `outputs × inputs` matrix `w` in `format` (bf16 rounds to
    /// nearest, ties to even, as torch converts).
    ///
    /// # Panics
    /// If `w` is not `outputs × inputs` long.
    pub fn new(w: &[f32], outputs: usize, inputs: usize, format: WeightFormat) -> Self {
        assert_eq!(w.len(), outputs * inputs, "a {outputs} × {inputs} matrix");
        let panels = match format {
            WeightFormat::F32 => Panels::F32(laid_out(w, outputs, inputs, format, |v| v)),
            WeightFormat::Bf16 => Panels::Bf16(laid_out(w, outputs, inputs, format, to_bf16)),
            WeightFormat::Bf16Pairs => Panels::Bf16Pairs(laid_out(w, outputs, inputs, format, to_bf16)),
        };
        Self { inputs, outputs, panels }
    }

    pub fn inputs(&self) -> usize {
        self.inputs
    }

    pub fn outputs(&self) -> usize {
        self.outputs
    }

    pub fn format(&self) -> WeightFormat {
        match self.panels {
            Panels::F32(_) => WeightFormat::F32,
            Panels::Bf16(_) => WeightFormat::Bf16,
            Panels::Bf16Pairs(_) => WeightFormat::Bf16Pairs,
        }
    }

    /// The bytes its panels hold (padding included): what a pass over it reads.
    pub fn bytes(&self) -> usize {
        match &self.panels {
            Panels::F32(p) => p.len * 4,
            Panels::Bf16(p) | Panels::Bf16Pairs(p) => p.len * 2,
        }
    }

    /// The weights (padding included) one panel holds.
    pub(crate) fn panel_len(&self) -> usize {
        panel_len(self.format(), self.inputs)
    }

    pub(crate) fn blocks(&self) -> usize {
        self.outputs.div_ceil(BLOCK)
    }
}

/// The weights (padding included) one panel of `format` holds for `inputs` inputs.
fn panel_len(format: WeightFormat, inputs: usize) -> usize {
    match format {
        WeightFormat::F32 | WeightFormat::Bf16 => BLOCK * inputs,
        WeightFormat::Bf16Pairs => BLOCK * inputs.div_ceil(2) * 2,
    }
}

/// The row-major `outputs × inputs` matrix `w` laid out in `format`'s panels, each weight
/// stored as `store` makes it.
fn laid_out<T: Copy + Default>(
    w: &[f32],
    outputs: usize,
    inputs: usize,
    format: WeightFormat,
    store: impl Fn(f32) -> T,
) -> Aligned<T> {
    let panel_len = panel_len(format, inputs);
    let mut aligned = Aligned::zeroed(outputs.div_ceil(BLOCK) * panel_len);
    let p = aligned.as_mut_slice();
    for (o, row) in w.chunks_exact(inputs.max(1)).enumerate() {
        let (panel, lane) = ((o / BLOCK) * panel_len, o % BLOCK);
        for (k, &v) in row.iter().enumerate() {
            let at = match format {
                WeightFormat::F32 | WeightFormat::Bf16 => k * BLOCK + lane,
                WeightFormat::Bf16Pairs => (k / 2) * BLOCK * 2 + lane * 2 + k % 2,
            };
            p[panel + at] = store(v);
        }
    }
    aligned
}

/// `x` rounded to bf16 (nearest, ties to even; a NaN stays a quiet NaN).
///
/// The NaN test is a select rather than an early return, and the function is inlined into
/// its callers' loops, so that a loop rounding many values (a layer's inputs, a position's
/// keys and values) vectorises.
#[inline(always)]
pub fn to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    let rounded = (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16;
    if x.is_nan() { 0x7fc0 } else { rounded }
}

/// The `f32` of a bf16 value ([`to_bf16`]'s bits): the upper half of an f32, so widening is
/// exact.
pub fn from_bf16(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// `x` rounded to bf16 as [`to_bf16`] rounds it, as the `f32` of the same value.
pub fn bf16_value(x: f32) -> f32 {
    from_bf16(to_bf16(x))
}

/// Whether every value of `w` is a bf16 value (its low 16 bits zero), as a bf16 checkpoint
/// read into `f32` is: storing it as bf16 then loses nothing.
pub fn bf16_exact(w: &[f32]) -> bool {
    w.iter().all(|v| v.to_bits() & 0xffff == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even_and_keeps_bf16_values() {
        assert_eq!(to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even one, 1.
        assert_eq!(to_bf16(1.0 + 1.0 / 256.0), 0x3f80);
        // Just above halfway rounds up.
        assert_eq!(to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(to_bf16(-2.5), 0xc020);
        assert_eq!(to_bf16(f32::NAN), 0x7fc0);
        let exact = [0.0f32, -1.5, 3.0e-3f32].map(bf16_value);
        assert!(bf16_exact(&exact));
        assert!(!bf16_exact(&[0.1]));
    }

    #[test]
    fn a_panel_holds_its_outputs_input_major_with_the_last_padded() {
        // 3 outputs × 2 inputs: one panel, rows 3.. zero.
        let m = PackedMatrix::new(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 3, 2, WeightFormat::F32);
        let Panels::F32(p) = &m.panels else { panic!("f32") };
        let p = p.as_slice();
        assert_eq!(p.as_ptr() as usize % LINE, 0, "panels start on a cache line");
        assert_eq!(p.len(), 2 * BLOCK);
        assert_eq!((&p[..3], &p[BLOCK..BLOCK + 3]), (&[1.0, 3.0, 5.0][..], &[2.0, 4.0, 6.0][..]));
        assert!(p[3..BLOCK].iter().all(|&v| v == 0.0));
        assert_eq!(m.bytes(), 2 * BLOCK * 4);
        assert_eq!(PackedMatrix::new(&[1.0; 6], 3, 2, WeightFormat::Bf16).bytes(), 2 * BLOCK * 2);
    }

    #[test]
    fn a_pair_panel_holds_each_outputs_two_inputs_side_by_side_and_pads_an_odd_input() {
        // 2 outputs × 3 inputs: pair rows (0, 1) and (2, padding).
        let w = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let m = PackedMatrix::new(&w, 2, 3, WeightFormat::Bf16Pairs);
        let Panels::Bf16Pairs(p) = &m.panels else { panic!("pairs") };
        let p = p.as_slice();
        assert_eq!(p.as_ptr() as usize % LINE, 0, "panels start on a cache line");
        assert_eq!((p.len(), m.panel_len(), m.bytes()), (2 * BLOCK * 2, 2 * BLOCK * 2, 2 * BLOCK * 2 * 2));
        let bf = |v: f32| to_bf16(v);
        assert_eq!(&p[..4], &[bf(1.0), bf(2.0), bf(4.0), bf(5.0)]);
        assert_eq!(&p[2 * BLOCK..2 * BLOCK + 4], &[bf(3.0), 0, bf(6.0), 0]);
        assert!(p[4..2 * BLOCK].iter().chain(&p[2 * BLOCK + 4..]).all(|&v| v == 0));
        assert!(WeightFormat::Bf16Pairs.is_bf16() && !WeightFormat::F32.is_bf16());
    }
}
