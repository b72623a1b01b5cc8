//! What a request says about its tensor besides the tensor's name and the
//! sender: the part a rank compares to tell whether a request repeats an
//! earlier one (the coordinator's response cache), held without a heap
//! allocation for shapes of up to four dimensions so that a training step
//! that repeats the last one allocates nothing to describe its tensors.

use crate::message::Request;
use crate::types::{Compression, DataType, Device, ReduceOp, RequestKind};
use smallvec::SmallVec;

/// A tensor shape; up to four dimensions are stored inline.
pub type Shape = SmallVec<[u64; 4]>;

/// The parameters of a [`Request`]: everything but `rank` and
/// `tensor_name`.
///
/// ```
/// use kolo_protocol::{DataType, Params, Request, RequestKind};
///
/// let params = Params::new(RequestKind::Allreduce, DataType::F32, [2, 3]);
/// let request = params.to_request(1, "grad/w");
/// assert_eq!(request.shape, vec![2, 3]);
/// assert_eq!(Params::of(&request), params);
/// assert!(params.same_as(&Params::of(&request)));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    /// The collective asked for.
    pub kind: RequestKind,
    /// The tensor's element type.
    pub dtype: DataType,
    /// The tensor's shape on this rank (empty for a scalar).
    pub shape: Shape,
    /// Where the tensor lives on this rank.
    pub device: Device,
    /// Root rank for broadcast; 0 otherwise.
    pub root_rank: u32,
    /// Reduce op for allreduce and reduce-scatter; `Sum` otherwise.
    pub reduce_op: ReduceOp,
    /// Factor applied to the input before the reduction.
    pub prescale: f64,
    /// Factor applied to the output after the reduction.
    pub postscale: f64,
    /// Alltoall: first-dimension rows for each rank (empty: even split).
    pub splits: Vec<u64>,
    /// Allreduce: how floating-point data travels.
    pub compression: Compression,
}

impl Params {
    /// Parameters with neutral defaults (CPU, root 0, sum, scale factors
    /// 1, no splits), as [`Request::new`] makes them.
    pub fn new(kind: RequestKind, dtype: DataType, shape: impl AsRef<[u64]>) -> Self {
        Params {
            kind,
            dtype,
            shape: Shape::from_slice(shape.as_ref()),
            device: Device::Cpu,
            root_rank: 0,
            reduce_op: ReduceOp::Sum,
            prescale: 1.0,
            postscale: 1.0,
            splits: Vec::new(),
            compression: Compression::None,
        }
    }

    /// The parameters of `request`.
    pub fn of(request: &Request) -> Self {
        Params {
            kind: request.kind,
            dtype: request.dtype,
            shape: Shape::from_slice(&request.shape),
            device: request.device,
            root_rank: request.root_rank,
            reduce_op: request.reduce_op,
            prescale: request.prescale,
            postscale: request.postscale,
            splits: request.splits.clone(),
            compression: request.compression,
        }
    }

    /// The request `rank` sends for `name` with these parameters.
    pub fn to_request(&self, rank: u32, name: &str) -> Request {
        Request {
            rank,
            tensor_name: name.to_owned(),
            kind: self.kind,
            dtype: self.dtype,
            shape: self.shape.to_vec(),
            device: self.device,
            root_rank: self.root_rank,
            reduce_op: self.reduce_op,
            prescale: self.prescale,
            postscale: self.postscale,
            splits: self.splits.clone(),
            compression: self.compression,
        }
    }

    /// True when both ask for the same collective: every field equal, the
    /// scale factors compared bit for bit (so that `NaN` equals itself and
    /// `-0.0` differs from `0.0`: a repeat must be exact).
    pub fn same_as(&self, other: &Params) -> bool {
        self.same_as_with_shape(other, &other.shape)
    }

    /// True when these parameters are `template`'s with the shape `shape`
    /// (compared as [`Params::same_as`] does; `template`'s own shape is
    /// ignored).
    pub fn same_as_with_shape(&self, template: &Params, shape: &[u64]) -> bool {
        same_dims(&self.shape, shape)
            && self.kind == template.kind
            && self.dtype == template.dtype
            && self.device == template.device
            && self.root_rank == template.root_rank
            && self.reduce_op == template.reduce_op
            && self.prescale.to_bits() == template.prescale.to_bits()
            && self.postscale.to_bits() == template.postscale.to_bits()
            && same_dims(&self.splits, &template.splits)
            && self.compression == template.compression
    }

    /// Number of elements (product of the shape; 1 for a scalar),
    /// saturating at `u64::MAX`.
    pub fn num_elements(&self) -> u64 {
        self.shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .unwrap_or(u64::MAX)
    }
}

/// `a == b` element by element: a few dimensions compare faster inline
/// than through a `memcmp` call (and the comparison runs for every tensor
/// of every step).
fn same_dims(a: &[u64], b: &[u64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn kind() -> impl Strategy<Value = RequestKind> {
        prop_oneof![
            Just(RequestKind::Allreduce),
            Just(RequestKind::Allgather),
            Just(RequestKind::Broadcast),
            Just(RequestKind::ReduceScatter),
            Just(RequestKind::Alltoall),
        ]
    }

    fn params() -> impl Strategy<Value = Params> {
        (
            kind(),
            prop::collection::vec(0u64..9, 0..7),
            0u32..4,
            prop_oneof![Just(1.0f64), Just(0.5), Just(-0.0), Just(f64::NAN)],
            prop::collection::vec(0u64..5, 0..3),
            prop::option::of(0u32..3),
        )
            .prop_map(|(kind, shape, root, postscale, splits, gpu)| Params {
                root_rank: root,
                postscale,
                splits,
                device: gpu.map_or(Device::Cpu, Device::Cuda),
                ..Params::new(kind, DataType::F32, shape)
            })
    }

    proptest! {
        /// A request rebuilt from its parameters is the request, and two
        /// parameter sets are the same exactly when their requests agree
        /// field by field (scales by bit pattern).
        #[test]
        fn round_trips_through_a_request(a in params(), b in params()) {
            let request = a.to_request(3, "t");
            prop_assert_eq!((request.rank, request.tensor_name.as_str()), (3, "t"));
            prop_assert!(Params::of(&request).same_as(&a));
            let rb = b.to_request(3, "t");
            let fields_equal = request.kind == rb.kind
                && request.dtype == rb.dtype
                && request.shape == rb.shape
                && request.device == rb.device
                && request.root_rank == rb.root_rank
                && request.reduce_op == rb.reduce_op
                && request.prescale.to_bits() == rb.prescale.to_bits()
                && request.postscale.to_bits() == rb.postscale.to_bits()
                && request.splits == rb.splits
                && request.compression == rb.compression;
            prop_assert_eq!(a.same_as(&b), fields_equal);
            let template = Params { shape: Shape::new(), ..b.clone() };
            prop_assert_eq!(a.same_as_with_shape(&template, &b.shape), fields_equal);
            prop_assert_eq!(a.num_elements(), request.num_elements());
        }
    }

    #[test]
    fn a_nan_scale_repeats_and_a_signed_zero_does_not() {
        let nan = Params {
            postscale: f64::NAN,
            ..Params::new(RequestKind::Allreduce, DataType::F32, [4])
        };
        assert!(nan.same_as(&nan.clone()));
        let zero = Params {
            postscale: 0.0,
            ..nan.clone()
        };
        let negative = Params {
            postscale: -0.0,
            ..nan
        };
        assert!(!zero.same_as(&negative));
    }

    #[test]
    fn short_shapes_stay_inline() {
        let params = Params::new(RequestKind::Allreduce, DataType::F32, [1, 2, 3, 4]);
        assert!(!params.shape.spilled());
        assert_eq!(params.num_elements(), 24);
        assert_eq!(
            Params::new(RequestKind::Allreduce, DataType::F32, []).num_elements(),
            1
        );
    }
}
