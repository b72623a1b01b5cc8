//! One rule for a tensor that negotiation refuses, whatever call
//! submitted it: that tensor is left as the caller passed it, the other
//! tensors of its submission are reduced (every rank reduced them), and
//! the call fails with the refused tensor's error.

use crate::memory::{Host, Memory};
use crate::orders::{submit_plan, Style, Submission};
use crate::{expect_err, Digest};
use kolo::{Error, Kolo, TensorGroup};

/// For every way of submitting, a submission of three tensors whose
/// middle one rank 0 passes with another length: every rank ends with the
/// outer two reduced, the middle one untouched and a mismatch naming it.
pub fn refused_tensor_alone_is_untouched(kolo: &Kolo) -> Result<Digest, Error> {
    refused_tensor_alone_is_untouched_in(kolo, &Host)
}

/// [`refused_tensor_alone_is_untouched`] on tensors in `mem`.
pub fn refused_tensor_alone_is_untouched_in<M: Memory>(
    kolo: &Kolo,
    mem: &M,
) -> Result<Digest, Error> {
    let (r, n) = (kolo.rank(), kolo.size());
    if n < 2 {
        return Ok(None);
    }
    for style in Style::BLOCKING.into_iter().chain(Style::ASYNC) {
        let names: Vec<String> = ["ok0", "bad", "ok1"]
            .iter()
            .map(|t| format!("refused/{style:?}/{t}"))
            .collect();
        let lens = [4, if r == 0 { 3 } else { 4 }, 5];
        let input = |t: usize| -> Vec<f32> { vec![(r + t) as f32; lens[t]] };
        let mut bufs: Vec<M::Buf> = (0..3).map(|t| mem.upload(&input(t))).collect();
        let submission = Submission {
            tensors: vec![0, 1, 2],
            style,
        };
        let group = TensorGroup::new(&names)?;
        let result = submit_plan(kolo, mem, &[submission], &[group], &names, &mut bufs);
        let bufs: Vec<Vec<f32>> = bufs.iter().map(|b| mem.download(b)).collect();
        let err = expect_err(result, &format!("{style:?}: a refused tensor"));
        assert!(
            matches!(err, Error::Mismatch { .. }) && err.to_string().contains(&names[1]),
            "{style:?}: {err}"
        );
        assert_eq!(
            bufs[1],
            input(1),
            "{style:?}: the refused tensor is untouched"
        );
        for t in [0, 2] {
            let want = (0..n).map(|q| (q + t) as f32).sum::<f32>();
            assert_eq!(
                bufs[t],
                vec![want; lens[t]],
                "{style:?}: tensor {t} of the submission is reduced on rank {r}"
            );
        }
    }
    Ok(None)
}
