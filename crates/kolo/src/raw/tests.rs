//! The raw calls on thread ranks: every collective, every data type, the
//! handle's three ways of reporting, and refusals that name the tensor.

use super::{RawMemory, RawOutput, RawTensor};
use crate::{threads, Config, DataType, Error, ReduceOp, TensorGroup};
use std::ffi::c_void;
use std::sync::mpsc;
use std::time::Duration;

fn raw<T>(name: &str, data: &mut [T], dtype: DataType, shape: &[i64]) -> RawTensor {
    RawTensor::new(
        name,
        data.as_mut_ptr().cast(),
        dtype,
        shape,
        RawMemory::Host,
    )
    .expect("a valid description")
}

fn flat<T>(name: &str, data: &mut [T], dtype: DataType) -> RawTensor {
    let len = data.len() as i64;
    raw(name, data, dtype, &[len])
}

#[test]
fn allreduce_every_dtype_in_place() {
    let results = threads::run(3, Config::default(), |kolo| {
        let r = kolo.rank();
        let mut a = vec![r as f32 + 1.0; 5];
        let mut b = vec![r as i64 * 10; 3];
        let mut c = vec![half::bf16::from_f32(r as f32); 4];
        let mut d = vec![r == 1; 2];
        let mut e = vec![r as u8; 7];
        // SAFETY: every buffer lives, untouched, until its handle is waited for.
        unsafe {
            let ha = kolo.allreduce_raw("a", &flat("a", &mut a, DataType::F32), ReduceOp::Sum)?;
            let hb = kolo.allreduce_raw("b", &flat("b", &mut b, DataType::I64), ReduceOp::Max)?;
            let hc = kolo.allreduce_raw("c", &flat("c", &mut c, DataType::BF16), ReduceOp::Sum)?;
            let hd = kolo.allreduce_raw("d", &flat("d", &mut d, DataType::Bool), ReduceOp::Max)?;
            let options = crate::ReduceOptions::new(ReduceOp::Average).postscale(3.0);
            let he = kolo.allreduce_raw("e", &flat("e", &mut e, DataType::U8), options)?;
            for h in [ha, hb, hc, hd, he] {
                assert!(h.wait()?.is_none(), "an allreduce has no output");
            }
        }
        Ok((a, b, c, d, e))
    })
    .unwrap();
    for (a, b, c, d, e) in results {
        assert_eq!(a, [6.0; 5]);
        assert_eq!(b, [20; 3]);
        assert_eq!(c, [half::bf16::from_f32(3.0); 4]);
        assert_eq!(d, [true; 2]);
        assert_eq!(e, [3; 7]);
    }
}

#[test]
fn group_broadcast_reduce_scatter_allgather_alltoall() {
    let results = threads::run(2, Config::default(), |kolo| {
        let r = kolo.rank() as i32;
        let group = TensorGroup::new(["g0", "g1"])?;
        let mut g0 = vec![r + 1; 4];
        let mut g1 = vec![r + 2; 1];
        let mut bcast = vec![r * 7; 3];
        let mut input: Vec<i32> = (0..6).map(|i| i + r).collect();
        let mut out = vec![0i32; 3 * 2 / 2];
        let mut rows: Vec<f64> = vec![r as f64; 2 * (r as usize + 1)];
        let mut send: Vec<u16> = vec![r as u16; 3];
        // SAFETY: every buffer lives, untouched, until its handle is waited for.
        let (gathered, arrived) = unsafe {
            let tensors = [
                flat("g0", &mut g0, DataType::I32),
                flat("g1", &mut g1, DataType::I32),
            ];
            kolo.allreduce_group_raw(&group, &tensors, ReduceOp::Sum)?
                .wait()?;
            kolo.broadcast_raw("b", &flat("b", &mut bcast, DataType::I32), 1)?
                .wait()?;
            let input_t = raw("rs", &mut input, DataType::I32, &[2, 3]);
            let out_t = raw("rs", &mut out, DataType::I32, &[1, 3]);
            kolo.reduce_scatter_raw("rs", &input_t, &out_t, ReduceOp::Sum)?
                .wait()?;
            let rows_t = raw("ag", &mut rows, DataType::F64, &[r as i64 + 1, 2]);
            let gathered = kolo.allgather_raw("ag", &rows_t)?.wait()?;
            let send_t = flat("a2a", &mut send, DataType::U16);
            let splits = if r == 0 { [1, 2] } else { [2, 1] };
            let arrived = kolo.alltoall_raw("a2a", &send_t, &splits)?.wait()?;
            (gathered, arrived)
        };
        Ok((g0, g1, bcast, out, gathered, arrived))
    })
    .unwrap();
    for (rank, (g0, g1, bcast, out, gathered, arrived)) in results.into_iter().enumerate() {
        assert_eq!((g0, g1), (vec![3; 4], vec![5]));
        assert_eq!(bcast, [7; 3]);
        let want: Vec<i32> = (0..3).map(|i| 2 * (rank as i32 * 3 + i) + 1).collect();
        assert_eq!(out, want);
        let gathered = gathered.expect("an allgather has an output");
        assert_eq!(
            (gathered.dtype(), gathered.shape()),
            (DataType::F64, &[3, 2][..])
        );
        assert_eq!(
            gathered.into_vec::<f64>().unwrap(),
            [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
        );
        let arrived = arrived.expect("an alltoall has an output");
        let splits = if rank == 0 { [1, 2] } else { [2, 1] };
        assert_eq!(arrived.splits(), splits);
        assert_eq!(arrived.shape(), &[3]);
        let from = |p: u16, n: usize| std::iter::repeat_n(p, n);
        let want: Vec<u16> = from(0, splits[0]).chain(from(1, splits[1])).collect();
        assert_eq!(arrived.into_vec::<u16>().unwrap(), want);
    }
}

#[test]
fn callbacks_poll_and_timeouts_report_the_same_result() {
    threads::run(2, Config::default(), |kolo| {
        let mut x = vec![1.0f64; 3];
        let mut y = vec![2.0f64; 3];
        let (tx, rx) = mpsc::channel();
        // SAFETY: `x` and `y` live until the callback and the poll reported.
        unsafe {
            let h = kolo.allreduce_raw("x", &flat("x", &mut x, DataType::F64), ReduceOp::Sum)?;
            h.on_complete(move |result| tx.send(result.map(|o| o.is_none())).unwrap());
            let mut h =
                kolo.allreduce_raw("y", &flat("y", &mut y, DataType::F64), ReduceOp::Sum)?;
            let got = loop {
                if let Some(got) = h.wait_timeout(Duration::from_millis(1)) {
                    break got;
                }
            };
            assert!(got?.is_none());
            assert!(
                h.poll().is_some_and(|r| r.is_err()),
                "spent after its result"
            );
        }
        assert_eq!(rx.recv_timeout(Duration::from_secs(30)).unwrap(), Ok(true));
        assert_eq!((x, y), (vec![2.0; 3], vec![4.0; 3]));
        Ok(())
    })
    .unwrap();
}

#[test]
fn a_mismatch_fails_every_rank_naming_the_tensor_and_the_next_call_works() {
    let results = threads::run(2, Config::default(), |kolo| {
        let mut bad = vec![1.0f32; 3 + kolo.rank()];
        let mut good = vec![1.0f32; 2];
        // SAFETY: the buffers live until their handles are waited for.
        unsafe {
            let t = flat("w", &mut bad, DataType::F32);
            let err = kolo
                .allreduce_raw("w", &t, ReduceOp::Sum)?
                .wait()
                .unwrap_err();
            let t = flat("ok", &mut good, DataType::F32);
            kolo.allreduce_raw("ok", &t, ReduceOp::Sum)?.wait()?;
            Ok((err, bad, good))
        }
    })
    .unwrap();
    for (rank, (err, bad, good)) in results.into_iter().enumerate() {
        let text = err.to_string();
        assert!(matches!(err, Error::Mismatch { .. }), "{text}");
        assert!(
            text.contains('w') && text.contains("[3]") && text.contains("[4]"),
            "{text}"
        );
        assert_eq!(bad, vec![1.0; 3 + rank], "a refused tensor is untouched");
        assert_eq!(good, [2.0; 2]);
    }
}

#[test]
fn refusals_before_submission_name_tensor_and_values() {
    threads::run(1, Config::default(), |kolo| {
        let mut bools = [0u8, 2];
        let t = flat("flags", &mut bools, DataType::Bool);
        // SAFETY: `bools` lives through the call (refused at submission).
        let e = unsafe { kolo.allreduce_raw("flags", &t, ReduceOp::Max) }.unwrap_err();
        assert!(
            e.to_string()
                .contains("element 1 of a bool tensor is the byte 2"),
            "{e}"
        );
        let (mut a, mut b) = ([0f32; 2], [0f64; 2]);
        let group = TensorGroup::new(["a", "b"])?;
        let tensors = [
            flat("a", &mut a, DataType::F32),
            flat("b", &mut b, DataType::F64),
        ];
        // SAFETY: the buffers live through the call (refused at submission).
        let e = unsafe { kolo.allreduce_group_raw(&group, &tensors, ReduceOp::Sum) }.unwrap_err();
        assert_eq!(e.tensor(), Some("b"));
        assert!(
            e.to_string()
                .contains("it is f64, but the group's first tensor is f32"),
            "{e}"
        );
        let mut dev = [0f32; 2];
        let cuda = RawMemory::Cuda {
            device: 0,
            stream: 0,
        };
        let t = RawTensor::new(
            "d",
            dev.as_mut_ptr().cast::<c_void>(),
            DataType::F32,
            &[2],
            cuda,
        )?;
        // SAFETY: refused before any access (no GPU engine).
        let e = unsafe { kolo.allreduce_raw("d", &t, ReduceOp::Sum) }.unwrap_err();
        assert_eq!(e.tensor(), Some("d"));
        Ok(())
    })
    .unwrap();
}

#[test]
fn a_dropped_handle_keeps_its_operation_and_outputs_free_their_memory() {
    let results = threads::run(2, Config::default(), |kolo| {
        let mut x = vec![kolo.rank() as i64; 1000];
        // SAFETY: `x` is read again only after a later operation on the
        // same engine completed, which the engine orders after this one.
        unsafe {
            let t = flat("dropped", &mut x, DataType::I64);
            drop(kolo.allreduce_raw("dropped", &t, ReduceOp::Sum)?);
        }
        kolo.barrier()?;
        let mut row = [kolo.rank() as f32];
        let t = flat("row", &mut row, DataType::F32);
        // SAFETY: `row` lives through the wait.
        let out: RawOutput = unsafe { kolo.allgather_raw("row", &t)?.wait()? }.unwrap();
        assert_eq!(out.byte_len(), 8);
        assert!(out.into_vec::<f64>().is_err(), "another type is refused");
        Ok(x)
    })
    .unwrap();
    for x in results {
        assert_eq!(x, vec![1; 1000]);
    }
}
