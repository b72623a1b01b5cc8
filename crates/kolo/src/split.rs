//! How tensors are cut among ranks: reduce-scatter's row split, the
//! element counts of alltoall and allgather. Pure functions.

/// Splits `rows` among `parts` as evenly as possible, the first ranks
/// taking one extra row each (Horovod's rule): `split_rows(10, 4) ==
/// [3, 3, 2, 2]`.
pub fn split_rows(rows: usize, parts: usize) -> Vec<usize> {
    if parts == 0 {
        return Vec::new();
    }
    let (base, extra) = (rows / parts, rows % parts);
    (0..parts).map(|r| base + usize::from(r < extra)).collect()
}

/// Elements in one first-dimension row of `shape` (1 for a 1-D tensor or
/// a scalar; saturating on overflow).
pub(crate) fn row_elems(shape: &[u64]) -> usize {
    shape
        .iter()
        .skip(1)
        .try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
        .unwrap_or(usize::MAX)
}

/// Alltoall element counts of `rank`: what it sends to each peer and what
/// it receives from each, from the `size x size` split matrix (rows rank
/// after rank) and the row size. `None` if the matrix has the wrong size
/// or a count overflows.
pub(crate) fn alltoall_counts(
    splits: &[u64],
    size: usize,
    rank: usize,
    row: usize,
) -> Option<(Vec<usize>, Vec<usize>)> {
    if splits.len() != size.checked_mul(size)? || rank >= size {
        return None;
    }
    let elems = |rows: u64| usize::try_from(rows).ok()?.checked_mul(row);
    let send = (0..size)
        .map(|p| elems(splits[rank * size + p]))
        .collect::<Option<Vec<_>>>()?;
    let recv = (0..size)
        .map(|p| elems(splits[p * size + rank]))
        .collect::<Option<Vec<_>>>()?;
    Some((send, recv))
}

/// The row size of allgathered tensor `index` for a rank that did not
/// submit it (it joined): the gathered elements over the gathered rows, as
/// far as the response tells (`tensor_sizes` holding the gathered element
/// count of each tensor); 0 when no rows are gathered or it cannot tell.
pub(crate) fn gathered_row_elems(
    tensor_sizes: &[u64],
    first_dims: &[u64],
    index: usize,
    size: usize,
) -> usize {
    let rows: u64 = first_dims.iter().skip(index * size).take(size).sum();
    match tensor_sizes.get(index) {
        Some(&elements) if rows > 0 => usize::try_from(elements / rows).unwrap_or(0),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn horovod_split() {
        assert_eq!(split_rows(10, 4), [3, 3, 2, 2]);
        assert_eq!(split_rows(2, 4), [1, 1, 0, 0]);
        assert_eq!(split_rows(8, 4), [2, 2, 2, 2]);
        assert!(split_rows(5, 0).is_empty());
    }

    #[test]
    fn rows() {
        assert_eq!(row_elems(&[]), 1);
        assert_eq!(row_elems(&[7]), 1);
        assert_eq!(row_elems(&[7, 3, 2]), 6);
        assert_eq!(row_elems(&[1, u64::MAX, 2]), usize::MAX);
    }

    #[test]
    fn alltoall_matrix() {
        // Rank 0 sends [1, 2] rows, rank 1 sends [3, 4] rows; rows of 2.
        let splits = [1, 2, 3, 4];
        assert_eq!(
            alltoall_counts(&splits, 2, 0, 2),
            Some((vec![2, 4], vec![2, 6]))
        );
        assert_eq!(
            alltoall_counts(&splits, 2, 1, 2),
            Some((vec![6, 8], vec![4, 8]))
        );
        assert_eq!(alltoall_counts(&splits, 3, 0, 2), None);
        assert_eq!(alltoall_counts(&splits, 2, 2, 2), None);
    }

    #[test]
    fn joined_rows() {
        // Two tensors over 2 ranks; tensor 1 gathers 3 + 1 rows of 5.
        assert_eq!(gathered_row_elems(&[6, 20], &[1, 2, 3, 1], 1, 2), 5);
        assert_eq!(gathered_row_elems(&[], &[1, 2], 0, 2), 0);
        assert_eq!(gathered_row_elems(&[0], &[0, 0], 0, 2), 0);
    }

    proptest! {
        #[test]
        fn split_is_even_and_complete(rows in 0usize..10_000, parts in 1usize..64) {
            let split = split_rows(rows, parts);
            prop_assert_eq!(split.len(), parts);
            prop_assert_eq!(split.iter().sum::<usize>(), rows);
            let (min, max) = (split.iter().min().copied(), split.iter().max().copied());
            prop_assert!(max.zip(min).is_some_and(|(max, min)| max - min <= 1));
            prop_assert!(split.windows(2).all(|w| w[0] >= w[1]));
        }

        #[test]
        fn alltoall_counts_are_transposes(size in 1usize..6, row in 1usize..4, seed in any::<u64>()) {
            let splits: Vec<u64> = (0..size * size).map(|i| seed.rotate_left(i as u32) % 5).collect();
            let all: Vec<_> = (0..size).map(|r| alltoall_counts(&splits, size, r, row)).collect::<Option<_>>().unwrap_or_default();
            prop_assert_eq!(all.len(), size);
            for a in 0..size {
                for b in 0..size {
                    prop_assert_eq!(all[a].0[b], all[b].1[a]);
                }
            }
        }
    }
}
