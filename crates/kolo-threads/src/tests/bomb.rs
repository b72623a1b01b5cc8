//! An element type whose reduction panics on demand: a panic inside a
//! collective must fail the round on every rank, not leave peers reading
//! freed memory or hanging.

use kolo_protocol::{DataType, ReduceOp};
use kolo_transport::Element;
use std::cell::Cell;

thread_local! {
    /// Set on the rank whose reductions should panic.
    pub(super) static ARMED: Cell<bool> = const { Cell::new(false) };
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(transparent)]
pub(super) struct Bomb(pub i32);

// SAFETY: a transparent i32: plain data, no padding, no pointers.
unsafe impl Element for Bomb {
    const DTYPE: DataType = DataType::I32;

    fn identity(_op: ReduceOp) -> Self {
        Bomb(0)
    }

    fn reduce_into(acc: &mut [Self], src: &[Self], _op: ReduceOp) {
        for (a, s) in acc.iter_mut().zip(src) {
            a.0 += s.0;
        }
    }

    fn reduce_many(dst: &mut [Self], srcs: &[&[Self]], op: ReduceOp) {
        if ARMED.get() {
            panic!("bomb went off");
        }
        dst.fill(Bomb(0));
        for src in srcs {
            Self::reduce_into(dst, src, op);
        }
    }

    fn scale(_buf: &mut [Self], _factor: f64) {}

    fn from_f64(v: f64) -> Self {
        Bomb(v as i32)
    }

    fn to_f64(self) -> f64 {
        f64::from(self.0)
    }
}
