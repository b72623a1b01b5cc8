//! Requests the ranks cannot perform together fail that tensor on every
//! rank, with a message naming both values, and the next operation works.
//! Bad arguments seen locally fail at once.

use crate::{expect_err, Digest};
use kolo::{Error, Kolo, ReduceOp, ReduceOptions, Tensor, TensorGroup, TensorMut};

/// One mismatch: what each rank submits as tensor "m" (rank 0 one way,
/// the others the other way) and the two values the message must name.
struct Case {
    what: &'static str,
    submit: fn(&Kolo, bool) -> Result<(), Error>,
    values: [&'static str; 2],
}

const CASES: &[Case] = &[
    Case {
        what: "dtype",
        submit: |k, first| {
            if first {
                k.allreduce("m", &mut [1.0f32; 4], ReduceOp::Sum)
            } else {
                k.allreduce("m", &mut [1i32; 4], ReduceOp::Sum)
            }
        },
        values: ["f32", "i32"],
    },
    Case {
        what: "kind",
        submit: |k, first| {
            if first {
                k.allreduce("m", &mut [1i32; 4], ReduceOp::Sum)
            } else {
                k.allgather("m", &[1i32; 4]).map(drop)
            }
        },
        values: ["ALLREDUCE", "ALLGATHER"],
    },
    Case {
        what: "reduce op",
        submit: |k, first| {
            let op = if first { ReduceOp::Sum } else { ReduceOp::Max };
            k.allreduce("m", &mut [1i32; 4], op)
        },
        values: ["sum", "max"],
    },
    Case {
        what: "shape",
        submit: |k, first| {
            let n = if first { 4 } else { 5 };
            k.allreduce("m", &mut vec![1i64; n], ReduceOp::Sum)
        },
        values: ["[4]", "[5]"],
    },
    Case {
        what: "2-D shape",
        submit: |k, first| {
            let shape = if first { [2, 3] } else { [3, 2] };
            k.allreduce(
                "m",
                TensorMut::with_shape(&mut [1i64; 6], shape),
                ReduceOp::Sum,
            )
        },
        values: ["[2, 3]", "[3, 2]"],
    },
    Case {
        what: "allgather scalar",
        submit: |k, first| allgather_shaped(k, first, &[1], [&[], &[1]]),
        values: ["scalar", "[]"],
    },
    Case {
        what: "allgather dimensions",
        submit: |k, first| allgather_shaped(k, first, &[1; 4], [&[2, 2], &[4]]),
        values: ["[2, 2]", "[4]"],
    },
    Case {
        what: "allgather trailing dimension",
        submit: |k, first| allgather_shaped(k, first, &[1; 6], [&[2, 3], &[3, 2]]),
        values: ["[2, 3]", "[3, 2]"],
    },
    Case {
        what: "broadcast root",
        submit: |k, first| k.broadcast("m", &mut [1i32; 2], if first { 0 } else { 1 }),
        values: ["root 0", "root 1"],
    },
    Case {
        what: "prescale",
        submit: |k, first| {
            let options = ReduceOptions::new(ReduceOp::Sum).prescale(if first { 1.0 } else { 2.0 });
            k.allreduce("m", &mut [1.0f64; 2], options)
        },
        values: ["1.0", "2.0"],
    },
    Case {
        what: "postscale",
        submit: |k, first| {
            let options =
                ReduceOptions::new(ReduceOp::Sum).postscale(if first { 0.5 } else { 0.25 });
            k.allreduce("m", &mut [1.0f64; 2], options)
        },
        values: ["0.5", "0.25"],
    },
    Case {
        what: "compression",
        submit: |k, first| {
            let compression = if first {
                kolo::Compression::Fp16
            } else {
                kolo::Compression::None
            };
            let options = ReduceOptions::new(ReduceOp::Sum).compression(compression);
            k.allreduce("m", &mut [1.0f32; 2], options)
        },
        values: ["fp16", "none"],
    },
    Case {
        what: "reduce-scatter shape",
        submit: |k, first| {
            let rows = if first { 4 } else { 6 };
            let input = vec![1i32; rows];
            let mut out = vec![0i32; kolo::split_rows(rows, k.size())[k.rank()]];
            k.reduce_scatter("m", &input, &mut out, ReduceOp::Sum)
        },
        values: ["[4]", "[6]"],
    },
];

/// Every mismatch, each followed by an operation that must succeed.
pub fn the_mismatch_matrix(kolo: &Kolo) -> Result<Digest, Error> {
    // A mismatch takes two ranks.
    if kolo.size() < 2 {
        return Ok(None);
    }
    for (i, case) in CASES.iter().enumerate() {
        let err = expect_err((case.submit)(kolo, kolo.rank() == 0), case.what);
        assert!(
            matches!(err, Error::Mismatch { .. } | Error::Remote { .. }),
            "{}: {err:?}",
            case.what
        );
        assert_eq!(err.tensor(), Some("m"), "{}", case.what);
        let message = err.to_string();
        for value in case.values {
            assert!(
                message.contains(value),
                "{}: {message:?} lacks {value:?}",
                case.what
            );
        }
        // The engine keeps serving: the next operation succeeds.
        let mut next = [1i32; 3];
        kolo.allreduce(&format!("after/{i}"), &mut next, ReduceOp::Sum)?;
        assert_eq!(next, [kolo.size() as i32; 3], "{}", case.what);
    }
    Ok(None)
}

/// A name submitted again while in flight is rejected at once; so is a
/// group naming a tensor twice. Each rank submits a name of its own first,
/// which no other rank submits before the barrier after the check: the
/// first submission is surely still in flight then (with one name for all,
/// a rank descheduled between its two calls saw the first complete).
pub fn a_name_in_flight_is_rejected(kolo: &Kolo) -> Result<Digest, Error> {
    let (n, me) = (kolo.size(), kolo.rank());
    let names: Vec<String> = (0..n).map(|r| format!("dup/{r}")).collect();
    let mut bufs = vec![vec![1i32; 4]; n];
    let mut b = [1i32; 4];
    kolo.scope(|s| {
        let mut handles = Vec::with_capacity(n);
        let mut others = Vec::with_capacity(n);
        for (r, buf) in bufs.iter_mut().enumerate() {
            if r == me {
                handles.push(s.allreduce_async(&names[r], buf, ReduceOp::Sum)?);
            } else {
                others.push((r, buf));
            }
        }
        let err = expect_err(
            s.allreduce_async(&names[me], &mut b, ReduceOp::Sum),
            "duplicate",
        );
        assert_eq!(
            err,
            Error::DuplicateName {
                tensor: names[me].clone()
            }
        );
        assert!(err.to_string().contains(&format!("'{}'", names[me])));
        kolo.barrier()?;
        for (r, buf) in others {
            handles.push(s.allreduce_async(&names[r], buf, ReduceOp::Sum)?);
        }
        handles.into_iter().try_for_each(|h| h.wait())
    })?;
    for buf in &bufs {
        assert_eq!(buf, &vec![n as i32; 4]);
    }
    // A group naming a tensor twice is refused when it is made.
    let err = expect_err(TensorGroup::new(["twice", "twice"]), "group");
    match &err {
        Error::InvalidArgument { tensor, reason } => {
            assert_eq!(tensor, "twice");
            assert!(reason.contains("named twice"), "{reason}");
        }
        other => panic!("expected an invalid argument, got {other:?}"),
    }
    // Once complete, the name is free again.
    kolo.allreduce(&names[0], &mut b, ReduceOp::Sum)?;
    assert_eq!(b, [n as i32; 4]);
    Ok(None)
}

/// Bad arguments seen locally fail at once, naming the tensor.
pub fn local_argument_errors(kolo: &Kolo) -> Result<Digest, Error> {
    let mut data = [0i32; 6];
    let err = expect_err(
        kolo.allreduce(
            "bad/shape",
            TensorMut::with_shape(&mut data, [4, 2]),
            ReduceOp::Sum,
        ),
        "shape",
    );
    assert!(
        matches!(&err, Error::InvalidArgument { tensor, reason } if tensor == "bad/shape" && reason.contains("[4, 2]"))
    );

    let input = [0i32; 10];
    let mut wrong = vec![0i32; kolo::split_rows(10, kolo.size())[kolo.rank()] + 1];
    let holds = format!("holds {}", wrong.len());
    let err = expect_err(
        kolo.reduce_scatter("bad/rs", &input, &mut wrong, ReduceOp::Sum),
        "output",
    );
    assert!(
        matches!(&err, Error::InvalidArgument { tensor, reason } if tensor == "bad/rs" && reason.contains(&holds)),
        "{err:?}"
    );
    // Nothing was submitted: the names are free and the engine serves.
    kolo.allreduce("bad/shape", &mut data, ReduceOp::Sum)?;
    Ok(None)
}

/// [`TensorGroup`]s refused: a name given twice, too few or too many
/// buffers, a shape that does not fit (found locally: nothing is
/// submitted), and a tensor whose length differs between ranks (every
/// rank's handle errs naming it); then the same group works.
pub fn tensor_group_errors(kolo: &Kolo) -> Result<Digest, Error> {
    let twice = expect_err(
        TensorGroup::new(["tge/x", "tge/y", "tge/x"]),
        "a name twice",
    );
    assert!(
        matches!(&twice, Error::InvalidArgument { tensor, reason } if tensor == "tge/x" && reason.contains("0 and 2")),
        "{twice:?}"
    );
    let group = TensorGroup::new(["tge/a", "tge/b"])?;
    let (mut a, mut b, mut extra) = (vec![1i32; 4], vec![1i32; 4], vec![1i32; 4]);
    let few = kolo.scope(|s| {
        s.allreduce_group_async(&group, [&mut a[..]], ReduceOp::Sum)
            .map(drop)
    });
    let few = expect_err(few, "too few buffers");
    assert!(
        matches!(&few, Error::InvalidArgument { tensor, reason } if tensor == "tge/a" && reason.contains("2 tensors got 1 buffers")),
        "{few:?}"
    );
    let many = kolo.scope(|s| {
        let bufs = [&mut a[..], &mut b[..], &mut extra[..]];
        s.allreduce_group_async(&group, bufs, ReduceOp::Sum)
            .map(drop)
    });
    let many = expect_err(many, "too many buffers");
    assert!(many.to_string().contains("more than 2"), "{many}");
    let shaped = kolo.scope(|s| {
        let bufs = [
            TensorMut::from(&mut a[..]),
            TensorMut::with_shape(&mut b[..], [5]),
        ];
        s.allreduce_group_async(&group, bufs, ReduceOp::Sum)
            .map(drop)
    });
    let shaped = expect_err(shaped, "a shape that does not fit");
    assert!(
        matches!(&shaped, Error::InvalidArgument { tensor, reason } if tensor == "tge/b" && reason.contains("[5]")),
        "{shaped:?}"
    );
    assert_eq!(
        (&a, &b),
        (&vec![1; 4], &vec![1; 4]),
        "nothing was submitted"
    );
    if kolo.size() > 1 {
        let mut uneven = vec![1i32; 4 + kolo.rank()];
        let differs = kolo.scope(|s| {
            let bufs = [&mut a[..], &mut uneven[..]];
            s.allreduce_group_async(&group, bufs, ReduceOp::Sum)?.wait()
        });
        let differs = expect_err(differs, "a length that differs between ranks");
        assert!(
            matches!(differs, Error::Mismatch { .. }) && differs.to_string().contains("tge/b"),
            "{differs}"
        );
        assert_eq!(
            uneven,
            vec![1; 4 + kolo.rank()],
            "a refused tensor is untouched"
        );
    }
    let (mut a, mut b) = (vec![1i32; 4], vec![2i32; 4]);
    kolo.allreduce_group(&group, &mut [&mut a[..], &mut b[..]], ReduceOp::Sum)?;
    let n = kolo.size() as i32;
    assert_eq!((a, b), (vec![n; 4], vec![2 * n; 4]));
    Ok(None)
}

/// Alltoall splits that do not add up fail on every rank.
pub fn alltoall_bad_splits(kolo: &Kolo) -> Result<Digest, Error> {
    let n = kolo.size();
    let send = vec![1i32; 2 * n];
    let good = vec![2; n];
    // Rank 0's splits add up to one row less than it sends.
    let mut bad = good.clone();
    bad[0] = 1;
    let splits = if kolo.rank() == 0 { &bad } else { &good };
    let err = expect_err(kolo.alltoall("bad/a2a", &send, splits), "splits");
    assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
    let got = kolo.alltoall("good/a2a", &send, &good)?;
    assert_eq!(got.splits, good);
    Ok(None)
}

/// Allgathers `data` as "m" with the first shape on the first ranks and
/// the second on the others.
fn allgather_shaped(
    k: &Kolo,
    first: bool,
    data: &[i32],
    shapes: [&[usize]; 2],
) -> Result<(), Error> {
    let shape = if first { shapes[0] } else { shapes[1] };
    k.allgather("m", Tensor::with_shape(data, shape)).map(drop)
}
