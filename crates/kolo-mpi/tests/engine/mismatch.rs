//! The mismatch matrix over MPI: requests the ranks cannot perform
//! together fail that tensor on every rank with a message naming both
//! values, and the next operation works (as kolo's threads tests,
//! `crates/kolo/tests/mismatch.rs`).

use kolo::{Error, Kolo, ReduceOp, ReduceOptions, Tensor, TensorMut};

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
        submit: |k, first| {
            let data = [1i32];
            let t = if first {
                Tensor::with_shape(&data, [])
            } else {
                Tensor::from(&data)
            };
            k.allgather("m", t).map(drop)
        },
        values: ["scalar", "[]"],
    },
    Case {
        what: "allgather trailing dimension",
        submit: |k, first| {
            let data = [1i32; 6];
            let shape = if first { [2, 3] } else { [3, 2] };
            k.allgather("m", Tensor::with_shape(&data, shape)).map(drop)
        },
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
pub fn the_mismatch_matrix(kolo: &Kolo) -> Result<(), Error> {
    for (i, case) in CASES.iter().enumerate() {
        let err = match (case.submit)(kolo, kolo.rank() == 0) {
            Ok(()) => panic!("{}: expected an error, got Ok", case.what),
            Err(err) => err,
        };
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
    Ok(())
}
