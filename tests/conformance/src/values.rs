//! Deterministic inputs: every rank can compute any rank's input for any
//! case, so each checks its results against a reference computed locally.
//! Values are small integers (products: in {-1, 1, 2}, or {1, 2} unsigned),
//! so sums and products are exact in every dtype for up to 8 ranks.

use kolo_protocol::DataType;
use kolo_transport::Element;

/// Which inputs a case uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Values {
    /// Integers in -8..=8 (0..=15 unsigned, either value for bool).
    General,
    /// Integers in {-1, 1, 2} ({1, 2} unsigned; mostly `true` for bool):
    /// products of 8 of them stay exact even in bf16.
    ProductSafe,
}

impl Values {
    /// The inputs for a reduction with `op`.
    pub(crate) fn for_op(op: kolo_protocol::ReduceOp) -> Values {
        if op == kolo_protocol::ReduceOp::Product {
            Values::ProductSafe
        } else {
            Values::General
        }
    }
}

/// A 64-bit mix of the case's salt, a rank and an index (splitmix64's
/// finalizer): cheap, and different for neighbouring indices.
pub(crate) fn mix(salt: u64, rank: usize, index: u64) -> u64 {
    let mut x = salt
        ^ (rank as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ index.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    x
}

/// A case's salt: a hash (FNV-1a) of its name, the same on every rank.
pub(crate) fn salt_of(name: &str) -> u64 {
    name.bytes().fold(0xCBF2_9CE4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3)
    })
}

/// The residues a hash is reduced to; each maps to a value through a table.
const RESIDUES: usize = 17;

/// Inputs repeat with this period (a prime, far from powers of two) along
/// the low 32 bits of the index: buffers up to it are pseudo-random
/// throughout, and larger ones are filled, and checked, period by period
/// at memory speed. A bug that moves data by an exact multiple of the
/// period would go unseen; block sizes of real algorithms are not.
pub(crate) const PERIOD: usize = 65_521;

/// One rank's inputs of one case: `value(index)` is a table lookup at a
/// 32-bit hash of the index.
#[derive(Clone, Debug)]
pub(crate) struct Stream<T> {
    table: [T; RESIDUES],
    key: u32,
}

impl<T: Element> Stream<T> {
    pub(crate) fn new(values: Values, salt: u64, rank: usize) -> Self {
        let unsigned = matches!(T::DTYPE, DataType::U8 | DataType::U16);
        let table = std::array::from_fn(|residue| {
            let r = residue as f64;
            let v = match (values, T::DTYPE) {
                (Values::General, DataType::Bool) => r % 2.0,
                (Values::General, _) if unsigned => r % 16.0,
                (Values::General, _) => r - 8.0,
                (Values::ProductSafe, DataType::Bool) => f64::from(u8::from(residue % 4 != 0)),
                (Values::ProductSafe, _) if unsigned => 1.0 + r % 2.0,
                (Values::ProductSafe, _) => [-1.0, 1.0, 2.0][residue % 3],
            };
            T::from_f64(v)
        });
        let key = (salt ^ (salt >> 32)) as u32 ^ (rank as u32).wrapping_mul(0x85EB_CA77);
        Stream { table, key }
    }

    /// The input at `index`.
    #[inline]
    pub(crate) fn value(&self, index: u64) -> T {
        let phase = (index as u32) % PERIOD as u32;
        let mut h = self.key
            ^ ((index >> 32) as u32).wrapping_mul(0xC2B2_AE3D)
            ^ phase.wrapping_mul(0x9E37_79B1);
        h ^= h >> 15;
        h = h.wrapping_mul(0x2C1B_3C6D);
        h ^= h >> 12;
        h = h.wrapping_mul(0x297A_2D39);
        h ^= h >> 15;
        self.table[(h % RESIDUES as u32) as usize]
    }

    /// One period of inputs starting at `index` (every index of
    /// `index..index + PERIOD`), for [`periodic`].
    pub(crate) fn period(&self, index: u64) -> Vec<T> {
        (0..PERIOD as u64).map(|j| self.value(index + j)).collect()
    }

    /// `buf[j] = value(start + j)`.
    pub(crate) fn fill(&self, buf: &mut [T], start: u64) {
        if periodic(start, buf.len()) {
            let period = self.period(start);
            for chunk in buf.chunks_mut(PERIOD) {
                chunk.copy_from_slice(&period[..chunk.len()]);
            }
        } else {
            for (j, x) in buf.iter_mut().enumerate() {
                *x = self.value(start + j as u64);
            }
        }
    }
}

/// Whether a buffer of `len` elements from `start` is handled period by
/// period (long enough, and within one 2^32 stretch of indices).
pub(crate) fn periodic(start: u64, len: usize) -> bool {
    len > 2 * PERIOD && (start >> 32) == ((start + len as u64) >> 32)
}

/// Rank `rank`'s input at `index` of a case.
#[cfg(test)]
pub(crate) fn input<T: Element>(values: Values, salt: u64, rank: usize, index: u64) -> T {
    Stream::new(values, salt, rank).value(index)
}

/// `buf[j] = input(values, salt, rank, start + j)`.
pub(crate) fn fill<T: Element>(buf: &mut [T], values: Values, salt: u64, rank: usize, start: u64) {
    Stream::new(values, salt, rank).fill(buf, start);
}

/// `len` inputs of `rank` from `start`.
pub(crate) fn inputs<T: Element>(
    len: usize,
    values: Values,
    salt: u64,
    rank: usize,
    start: u64,
) -> Vec<T> {
    let mut buf = vec![T::default(); len];
    fill(&mut buf, values, salt, rank, start);
    buf
}

/// Uneven per-rank counts derived from `base`: some ranks get 0, the
/// others `base + rank` (so that blocks differ in length).
pub fn uneven_counts(base: usize, size: usize) -> Vec<usize> {
    (0..size)
        .map(|r| if r % 3 == 1 { 0 } else { base + r })
        .collect()
}

/// Segment lengths that add up to `total`: pieces of 1, 0, 7, 1021, 4099,
/// 65,537 and 250,007 elements in turn (the last one cut short), so that
/// segments are empty, tiny, odd and large, and cross every block size.
/// No segments for a total of 0.
pub fn uneven_segments(total: usize) -> Vec<usize> {
    const PIECES: [usize; 7] = [1, 0, 7, 1021, 4099, 65_537, 250_007];
    let mut lens = Vec::new();
    let mut left = total;
    for piece in PIECES.iter().cycle() {
        if left == 0 {
            break;
        }
        let len = (*piece).min(left);
        lens.push(len);
        left -= len;
    }
    lens
}

/// Elements rank `src` sends to rank `dst` in the alltoallv case of
/// `base`: 0 for a third of the pairs, otherwise between `base` and
/// `2 * base`.
pub fn alltoall_count(base: usize, src: usize, dst: usize) -> usize {
    if (src + dst) % 3 == 2 {
        0
    } else {
        base + (src * 7 + dst * 3) % (base + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn inputs_are_small_integers_and_vary() {
        let salt = salt_of("case");
        let general: Vec<i32> = inputs(1000, Values::General, salt, 3, 0);
        assert!(general.iter().all(|v| (-8..=8).contains(v)));
        assert!(general.windows(2).any(|w| w[0] != w[1]));
        let product: Vec<bf16> = inputs(1000, Values::ProductSafe, salt, 1, 0);
        assert!(product
            .iter()
            .all(|v| [-1.0, 1.0, 2.0].contains(&v.to_f32())));
        let unsigned: Vec<u8> = inputs(1000, Values::ProductSafe, salt, 1, 0);
        assert!(unsigned.iter().all(|v| [1, 2].contains(v)));
        assert_ne!(
            inputs::<u16>(50, Values::General, salt, 0, 0),
            inputs::<u16>(50, Values::General, salt, 1, 0)
        );
    }

    #[test]
    fn uneven_segments_add_up() {
        assert_eq!(uneven_segments(0), Vec::<usize>::new());
        assert_eq!(uneven_segments(1), vec![1]);
        assert_eq!(uneven_segments(20), vec![1, 0, 7, 12]);
        for total in [3, 1021, 4 << 20] {
            assert_eq!(uneven_segments(total).iter().sum::<usize>(), total);
        }
        assert!(uneven_segments(1 << 20).len() > 10);
    }

    #[test]
    fn uneven_counts_include_zeros_and_differ() {
        assert_eq!(uneven_counts(2, 5), vec![2, 0, 4, 5, 0]);
        assert_eq!(uneven_counts(0, 1), vec![0]);
        assert_eq!(alltoall_count(0, 1, 1), 0);
        assert_eq!(alltoall_count(4, 0, 0), 4);
    }
}
