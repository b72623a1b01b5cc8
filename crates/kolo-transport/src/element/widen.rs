//! Converting blocks of f16 / bf16 to f32 and back, for the half-precision
//! kernels (which reduce in f32 and round once).
//!
//! f16 uses the `half` crate's slice conversions (F16C instructions where
//! the CPU has them). bf16 has no such instructions on x86, and `half`'s
//! element-wise rounding branches; here both directions are branch-free bit
//! operations the compiler vectorizes, with exactly `half`'s results
//! (round to nearest, ties to even; NaNs stay NaN, quieted, both ways).

use half::{bf16, f16, slice::HalfFloatSliceExt};

/// A 16-bit float type the kernels widen to f32.
pub(crate) trait Widen: Copy {
    /// `dst[i] = src[i] as f32` (exact). Lengths must match.
    fn widen(src: &[Self], dst: &mut [f32]);
    /// `dst[i] = round(src[i])` to the nearest value of `Self`. Lengths must match.
    fn narrow(src: &[f32], dst: &mut [Self]);
}

impl Widen for f16 {
    fn widen(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }

    fn narrow(src: &[f32], dst: &mut [Self]) {
        dst.convert_from_f32_slice(src);
    }
}

impl Widen for bf16 {
    fn widen(src: &[Self], dst: &mut [f32]) {
        assert_eq!(src.len(), dst.len(), "widen: lengths differ");
        for (d, s) in dst.iter_mut().zip(src) {
            let bits = s.to_bits();
            // A NaN comes out quieted, as `half` does it.
            let quiet = if bits & 0x7FFF > 0x7F80 { 0x0040 } else { 0 };
            *d = f32::from_bits(u32::from(bits | quiet) << 16);
        }
    }

    fn narrow(src: &[f32], dst: &mut [Self]) {
        assert_eq!(src.len(), dst.len(), "narrow: lengths differ");
        for (d, s) in dst.iter_mut().zip(src) {
            *d = bf16::from_bits(f32_to_bf16_bits(*s));
        }
    }
}

/// f32 to bf16 bits, rounding to nearest with ties to even, without
/// branches: adding `0x7FFF` plus the lowest kept bit carries into the kept
/// bits exactly when the dropped half is above, or at and odd, the halfway
/// point (a carry out of the largest finite value gives infinity, as it
/// should). A NaN keeps its top bits with the quiet bit set.
#[inline(always)]
fn f32_to_bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    let lsb = (bits >> 16) & 1;
    let rounded = (bits.wrapping_add(0x7FFF + lsb) >> 16) as u16;
    let quiet_nan = ((bits >> 16) | 0x0040) as u16;
    // Both sides are below 2^31: a signed compare, which SSE2 has.
    let is_nan = ((bits & 0x7FFF_FFFF) as i32) > 0x7F80_0000_i32;
    if is_nan {
        quiet_nan
    } else {
        rounded
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn bf16_narrowing_matches_half(bits in any::<u32>()) {
            let x = f32::from_bits(bits);
            prop_assert_eq!(f32_to_bf16_bits(x), bf16::from_f32(x).to_bits(), "{:#010x}", bits);
        }

        #[test]
        fn bf16_widening_matches_half(bits in any::<u16>()) {
            let mut out = [0f32];
            bf16::widen(&[bf16::from_bits(bits)], &mut out);
            prop_assert_eq!(out[0].to_bits(), bf16::from_bits(bits).to_f32().to_bits());
        }
    }

    #[test]
    fn bf16_edge_cases_match_half() {
        let cases = [
            0.0f32,
            -0.0,
            1.0,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::from_bits(0x3F80_8000), // a tie, even below: stays
            f32::from_bits(0x3F81_8000), // a tie, odd below: rounds up
            f32::from_bits(0x7F7F_FFFF), // rounds to infinity
            f32::from_bits(0xFF80_0001), // a signalling negative NaN
            f32::from_bits(0x0000_8001), // a subnormal just above a tie
        ];
        let mut narrowed = [bf16::ZERO; 14];
        bf16::narrow(&cases, &mut narrowed);
        for (x, got) in cases.iter().zip(narrowed) {
            assert_eq!(
                got.to_bits(),
                bf16::from_f32(*x).to_bits(),
                "{:#010x}",
                x.to_bits()
            );
        }
    }
}
