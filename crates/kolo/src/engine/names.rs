//! The names of a submission's tensors, in one buffer: the handle's
//! names for its errors, and a [`crate::TensorGroup`]'s list, compared by
//! address and, failing that, byte for byte.

/// The names of a handle's tensors, in one buffer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TensorNames {
    text: String,
    ends: Vec<u32>,
}

impl TensorNames {
    /// Room for `tensors` names.
    pub(crate) fn with_capacity(tensors: usize) -> Self {
        TensorNames {
            text: String::with_capacity(tensors * 8),
            ends: Vec::with_capacity(tensors),
        }
    }

    /// Appends `name`.
    pub(crate) fn push(&mut self, name: &str) {
        self.text.push_str(name);
        self.ends.push(self.text.len() as u32);
    }

    /// The names, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &str> {
        let mut start = 0usize;
        self.ends.iter().map(move |&end| {
            let name = self.text.get(start..end as usize).unwrap_or("");
            start = end as usize;
            name
        })
    }

    /// The first name ("" for none).
    pub(crate) fn first(&self) -> &str {
        self.get(0)
    }

    /// Name `index` ("" when out of range).
    pub(crate) fn get(&self, index: usize) -> &str {
        let start = match index.checked_sub(1) {
            None => 0,
            Some(before) => self.ends.get(before).map_or(usize::MAX, |&e| e as usize),
        };
        self.ends
            .get(index)
            .and_then(|&end| self.text.get(start..end as usize))
            .unwrap_or("")
    }

    /// Number of names.
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// True when these are exactly `names`, in order.
    pub(crate) fn matches(&self, names: &[&str]) -> bool {
        if names.len() != self.ends.len() {
            return false;
        }
        let text = self.text.as_bytes();
        let mut start = 0usize;
        for (name, &end) in names.iter().zip(&self.ends) {
            let end = end as usize;
            let Some(have) = text.get(start..end) else {
                return false;
            };
            let name = name.as_bytes();
            if have.len() != name.len() || !same_bytes(have, name) {
                return false;
            }
            start = end;
        }
        true
    }
}

/// `a == b` for slices of equal length, in a few word loads: names are
/// short, and a call to `memcmp` per name (a training step checks every
/// name of a repeated group) costs more than the comparison. Two
/// overlapping loads cover a name of up to twice the word size; longer
/// ones go word by word.
#[inline]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    fn word(s: &[u8], at: usize) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&s[at..at + 8]);
        u64::from_ne_bytes(w)
    }
    fn half(s: &[u8], at: usize) -> u32 {
        let mut w = [0u8; 4];
        w.copy_from_slice(&s[at..at + 4]);
        u32::from_ne_bytes(w)
    }
    let n = a.len();
    if n != b.len() {
        return false;
    }
    match n {
        0 => true,
        // Bytes 0, n/2 and n-1 are every byte.
        1..=3 => a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1],
        4..=7 => half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4),
        8..=16 => word(a, 0) == word(b, 0) && word(a, n - 8) == word(b, n - 8),
        _ => {
            let whole = (0..n / 8).all(|k| word(a, 8 * k) == word(b, 8 * k));
            whole && word(a, n - 8) == word(b, n - 8)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn same_bytes_is_slice_equality(
            a in prop::collection::vec(any::<u8>(), 0..40),
            flip in any::<prop::sample::Index>(),
            bit in 0u8..8,
            differ: bool,
        ) {
            let mut b = a.clone();
            if differ && !b.is_empty() {
                let at = flip.index(b.len());
                b[at] ^= 1 << bit;
            }
            prop_assert_eq!(same_bytes(&a, &b), a == b);
            prop_assert!(same_bytes(&a, &a));
            prop_assert!(!same_bytes(&a, &[&a[..], b"x"].concat()));
        }
    }
}
