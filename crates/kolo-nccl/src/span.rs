//! The arithmetic of device views ([`crate::CudaRef`], [`crate::CudaMut`]):
//! the range of its buffer a view covers, how views split, where the
//! pieces of a fused buffer lie. Pure functions over numbers, tested
//! without a GPU.

use crate::error::NcclError;
use kolo_protocol::DataType;

/// `len` elements from element `offset` of a buffer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Span {
    /// The first element, counted from the buffer's start.
    pub(crate) offset: usize,
    /// Elements covered.
    pub(crate) len: usize,
}

impl Span {
    /// The first `len` elements.
    pub(crate) fn whole(len: usize) -> Span {
        Span { offset: 0, len }
    }

    /// The first `at` elements and the rest; `at` is clamped to the length
    /// (as `Memory::split_at` asks), so both pieces stay inside this span.
    pub(crate) fn split_at(self, at: usize) -> (Span, Span) {
        let at = at.min(self.len);
        (
            Span {
                offset: self.offset,
                len: at,
            },
            Span {
                offset: self.offset + at,
                len: self.len - at,
            },
        )
    }

    /// The address of the first element, for a buffer starting at `base`
    /// with elements of `elem` bytes. Never overflows for a span inside a
    /// live allocation (its end is an address of the allocation).
    pub(crate) fn start(self, base: u64, elem: usize) -> u64 {
        base + (self.offset * elem) as u64
    }
}

/// Where each of the pieces of `lens` elements starts in a fused buffer of
/// `buffer` elements that holds them one after another, or why they do not
/// fill it exactly (`what` names the copy: `pack` or `unpack`).
pub(crate) fn fused_offsets(
    what: &str,
    dtype: DataType,
    lens: impl ExactSizeIterator<Item = usize>,
    buffer: usize,
) -> Result<Vec<usize>, NcclError> {
    let pieces = lens.len();
    let mut offsets = Vec::with_capacity(pieces);
    let mut total = 0usize;
    for len in lens {
        offsets.push(total);
        total = total.checked_add(len).ok_or_else(|| {
            NcclError::InvalidArgument(format!(
                "{what}: the lengths of {pieces} {dtype} tensors overflow usize"
            ))
        })?;
    }
    if total != buffer {
        return Err(NcclError::InvalidArgument(format!(
            "{what}: {pieces} {dtype} tensors of {total} elements in all, but the fused buffer holds {buffer}"
        )));
    }
    Ok(offsets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn splits_clamp_to_the_span() {
        let span = Span { offset: 4, len: 6 };
        assert_eq!(
            span.split_at(2),
            (Span { offset: 4, len: 2 }, Span { offset: 6, len: 4 })
        );
        assert_eq!(
            span.split_at(99),
            (Span { offset: 4, len: 6 }, Span { offset: 10, len: 0 })
        );
        assert_eq!(span.split_at(0).0, Span { offset: 4, len: 0 });
        assert_eq!(span.start(0x1000, 4), 0x1010);
        assert_eq!(Span::whole(3), Span { offset: 0, len: 3 });
    }

    #[test]
    fn fused_pieces_must_fill_the_buffer() {
        let at = fused_offsets("pack", DataType::F32, [3usize, 0, 5].into_iter(), 8).unwrap();
        assert_eq!(at, vec![0, 3, 3]);
        assert_eq!(
            fused_offsets("unpack", DataType::I8, std::iter::empty(), 0).unwrap(),
            Vec::<usize>::new()
        );
        let short = fused_offsets("pack", DataType::BF16, [3usize, 4].into_iter(), 6).unwrap_err();
        assert_eq!(
            short.to_string(),
            "invalid argument: pack: 2 bf16 tensors of 7 elements in all, but the fused buffer holds 6"
        );
        let huge = fused_offsets("unpack", DataType::U8, [usize::MAX, 1].into_iter(), 0);
        assert!(huge.unwrap_err().to_string().contains("overflow"));
    }

    proptest! {
        /// Splitting anywhere, repeatedly, tiles the span: the pieces are
        /// disjoint, in order, and never leave it.
        #[test]
        fn repeated_splits_tile_the_span(offset in 0usize..1000, len in 0usize..1000, cuts in proptest::collection::vec(0usize..1200, 0..8)) {
            let mut pieces = vec![Span { offset, len }];
            for cut in cuts {
                let last = pieces.pop().unwrap();
                let (head, tail) = last.split_at(cut);
                pieces.push(head);
                pieces.push(tail);
            }
            let mut at = offset;
            for piece in &pieces {
                prop_assert_eq!(piece.offset, at);
                at += piece.len;
            }
            prop_assert_eq!(at, offset + len);
        }
    }
}
