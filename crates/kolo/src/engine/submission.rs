//! One submission: the tensors a caller hands the engine together (one
//! tensor, a list, or a [`crate::TensorGroup`]'s), gathered on the
//! submitting thread in the shape that costs least to check against the
//! last submission and to hand to the background thread: the names as
//! given (borrowed, or a group's list, checked once), the shapes flat in
//! one buffer, and — for lent tensors of one element type — one (address,
//! length) pair per tensor. The tensor table queues it; the performer
//! holds it (`batches`) until its last tensor is done.

use crate::engine::completion::Payload;
use crate::engine::lease::Lease;
use crate::engine::names::TensorNames;
use kolo_protocol::Params;
use kolo_transport::Element;
use std::any::TypeId;
use std::ptr::NonNull;
use std::sync::Arc;

/// What the engine gets of one tensor's input.
pub(crate) enum Input {
    /// Nothing (barrier, join).
    None,
    /// The engine's own copy (`Vec<T>` of the request's dtype), or a
    /// device plane's arguments.
    Owned(Payload),
    /// The caller's memory, lent for a scope (see [`Lent`]).
    Lent(Lent),
}

/// A caller's tensor lent to the engine for a scope: the engine reads and
/// writes it in place. The submission it belongs to holds a lease of the
/// scope, which it returns once its last tensor completed — after the
/// engine's last access to every one of its tensors.
pub(crate) struct Lent {
    ptr: NonNull<u8>,
    len: usize,
    element: TypeId,
}

// SAFETY: a `Lent` stands for the `&'scope mut [T]` it was made from,
// which the scope keeps borrowed (nothing else can reach the memory) until
// every lease is back; moving that exclusive access to the engine's thread
// is sound because it is only ever read as a `T: Element`, and `Element`
// types are `Send`.
unsafe impl Send for Lent {}

impl Lent {
    /// Lends `data`.
    pub(crate) fn new<T: Element>(data: &mut [T]) -> Self {
        Lent {
            len: data.len(),
            ptr: NonNull::from(data).cast(),
            element: TypeId::of::<T>(),
        }
    }

    /// The view's address, length and element type, to keep elsewhere.
    pub(crate) fn parts(&self) -> (NonNull<u8>, usize, TypeId) {
        (self.ptr, self.len, self.element)
    }

    /// A view rebuilt from [`Lent::parts`].
    ///
    /// # Safety
    ///
    /// The parts come from [`Lent::parts`] of a view whose submission's
    /// lease is still out (or `len` is 0 with the original address), and
    /// no other view rebuilt from them is used while this one lives.
    pub(crate) unsafe fn from_parts(ptr: NonNull<u8>, len: usize, element: TypeId) -> Self {
        Lent { ptr, len, element }
    }

    /// True when the lent elements are `T`s.
    pub(crate) fn holds<T: Element>(&self) -> bool {
        self.element == TypeId::of::<T>()
    }

    /// The lent elements, if they are `T`s.
    pub(crate) fn as_mut_slice<T: Element>(&mut self) -> Option<&mut [T]> {
        if !self.holds::<T>() {
            return None;
        }
        // SAFETY: `ptr` and `len` come from a live `&'scope mut [T]` of
        // exactly this `T` (checked above). The scope does not end — so the
        // memory stays valid and unaliased — before the lease of this
        // tensor's submission is back, which happens only once every
        // tensor of the submission completed; the engine completes a
        // tensor only after its last access through this view, and `&mut
        // self` makes this the only access through it.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().cast::<T>(), self.len) })
    }
}

/// A submission's names.
pub(crate) enum Names<'n> {
    /// Given tensor by tensor.
    Each(Vec<&'n str>),
    /// A [`crate::TensorGroup`]'s: unique, and the same list (by address) at every
    /// submission of the group.
    Known(Arc<TensorNames>),
}

impl Names<'_> {
    /// The number of names.
    pub(crate) fn len(&self) -> usize {
        match self {
            Names::Each(names) => names.len(),
            Names::Known(names) => names.len(),
        }
    }

    /// Name `index` ("" when out of range).
    pub(crate) fn get(&self, index: usize) -> &str {
        match self {
            Names::Each(names) => names.get(index).copied().unwrap_or_default(),
            Names::Known(names) => names.get(index),
        }
    }
}

/// The tensors of one submission, gathered before they enter the table:
/// one set of parameters (the template's) for all, each with its shape.
pub(crate) struct Submission<'n> {
    pub(crate) template: Params,
    pub(crate) names: Names<'n>,
    pub(crate) shapes: Shapes,
    pub(crate) inputs: Inputs,
    /// The handle gets each tensor's output.
    pub(crate) payloads: bool,
    /// Released once every tensor is done (a scope's claim on lent memory).
    pub(crate) lease: Option<Lease>,
    /// The submitter waits for it at once and runs the engine's cycles
    /// itself if it can, so the background thread is not woken for it
    /// (see [`Submission::quietly`]).
    pub(crate) quiet: bool,
}

impl<'n> Submission<'n> {
    /// This submission, not waking the background thread: for a caller
    /// that waits for it right away (a blocking call), whose wait runs the
    /// engine's cycles on its own thread where it can, and wakes the
    /// background thread where it cannot (see [`crate::engine::progress`]).
    pub(crate) fn quietly(mut self, quiet: bool) -> Self {
        self.quiet = quiet;
        self
    }

    /// An empty submission of tensors with the parameters `template` (its
    /// shape is ignored) with room for `capacity` tensors.
    pub(crate) fn new(
        template: Params,
        capacity: usize,
        payloads: bool,
        lease: Option<Lease>,
    ) -> Self {
        Submission {
            template,
            names: Names::Each(Vec::with_capacity(capacity)),
            shapes: Shapes::with_capacity(capacity),
            inputs: Inputs::with_capacity(capacity),
            payloads,
            lease,
            quiet: false,
        }
    }

    /// An empty submission of the tensors of `group` (their inputs are
    /// pushed with [`Submission::push_lent_data`], in the group's order).
    pub(crate) fn known(template: Params, names: &Arc<TensorNames>, lease: Option<Lease>) -> Self {
        let capacity = names.len();
        Submission {
            template,
            names: Names::Known(Arc::clone(names)),
            shapes: Shapes::with_capacity(capacity),
            inputs: Inputs::with_capacity(capacity),
            payloads: false,
            lease,
            quiet: false,
        }
    }

    /// Adds `name` (to a group of names given one by one).
    #[inline]
    fn push_name(&mut self, name: &'n str) {
        if let Names::Each(names) = &mut self.names {
            names.push(name);
        }
    }

    /// Adds a tensor of `shape`.
    pub(crate) fn push(&mut self, name: &'n str, shape: &[u64], input: Input) {
        self.push_name(name);
        self.shapes.push(shape);
        self.inputs.push(input);
    }

    /// Adds a tensor of the dimensions `dims` lent from `data`.
    #[inline]
    pub(crate) fn push_lent<T: Element>(&mut self, name: &'n str, dims: &[usize], data: &mut [T]) {
        self.push_name(name);
        self.push_lent_data(dims, data);
    }

    /// Adds the next tensor of a [`crate::TensorGroup`]'s submission: of the
    /// dimensions `dims`, lent from `data`.
    #[inline]
    pub(crate) fn push_lent_data<T: Element>(&mut self, dims: &[usize], data: &mut [T]) {
        self.shapes.push_dims(dims);
        self.inputs.push_lent(data);
    }

    /// Adds the next device tensor (of a submission made with
    /// [`Inputs::on_device`]'s inputs): of the dimensions `dims`, lent at
    /// the device address `ptr` (not 0), `len` elements long. `name` is
    /// its name, unless the names are a [`crate::TensorGroup`]'s.
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) fn push_device(
        &mut self,
        name: Option<&'n str>,
        dims: &[usize],
        ptr: NonNull<u8>,
        len: usize,
    ) {
        if let Some(name) = name {
            self.push_name(name);
        }
        self.shapes.push_dims(dims);
        if let Inputs::Device { segments, .. } = &mut self.inputs {
            segments.push(Segment { ptr, len });
        }
    }

    /// Number of tensors (of a [`crate::TensorGroup`]'s submission: the group's).
    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }
}

/// The shapes of a submission's tensors, flat: one dimension each while
/// every shape is 1-D (the usual gradient), else with where each ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Shapes {
    dims: Vec<u64>,
    /// Where each shape ends in `dims`; empty while `one_d`.
    ends: Vec<u32>,
    /// Every shape so far is 1-D: shape `i` is `dims[i]`.
    one_d: bool,
}

impl Default for Shapes {
    fn default() -> Self {
        Shapes::with_capacity(0)
    }
}

impl Shapes {
    fn with_capacity(tensors: usize) -> Self {
        Shapes {
            dims: Vec::with_capacity(tensors),
            ends: Vec::new(),
            one_d: true,
        }
    }

    /// Appends a shape.
    pub(crate) fn push(&mut self, shape: &[u64]) {
        match shape {
            [d] if self.one_d => self.dims.push(*d),
            _ => {
                self.not_one_d();
                self.dims.extend_from_slice(shape);
                self.ends.push(self.dims.len() as u32);
            }
        }
    }

    /// Appends a shape given as dimensions.
    #[inline]
    fn push_dims(&mut self, dims: &[usize]) {
        match dims {
            [d] if self.one_d => self.dims.push(*d as u64),
            _ => {
                self.not_one_d();
                self.dims.extend(dims.iter().map(|&d| d as u64));
                self.ends.push(self.dims.len() as u32);
            }
        }
    }

    /// Leaves the 1-D form: every shape so far gets its end.
    #[cold]
    fn not_one_d(&mut self) {
        if std::mem::replace(&mut self.one_d, false) {
            self.ends = (1..=self.dims.len() as u32).collect();
        }
    }

    /// Shape `index` (empty when out of range).
    pub(crate) fn get(&self, index: usize) -> &[u64] {
        if self.one_d {
            return self.dims.get(index..=index).unwrap_or(&[]);
        }
        let start = match index.checked_sub(1) {
            None => 0,
            Some(before) => self.ends.get(before).map_or(0, |&e| e as usize),
        };
        let end = self.ends.get(index).map_or(start, |&e| e as usize);
        self.dims.get(start..end).unwrap_or(&[])
    }
}

/// One lent tensor's address and length.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Segment {
    ptr: NonNull<u8>,
    len: usize,
}

/// What orders the engine's work on lent device tensors after their
/// submitter's (a device plane's type).
pub(crate) type Ready = Arc<dyn std::any::Any + Send + Sync>;

/// The inputs of a submission's tensors.
pub(crate) enum Inputs {
    /// Lent tensors of one element type: one address and length each.
    Lent {
        element: TypeId,
        segments: Vec<Segment>,
    },
    /// Device tensors lent by address (see `crate::nccl`): `element` names
    /// their memory and element type (never an [`Element`] type, so no
    /// host view is ever made of them); `ready` is what orders the
    /// engine's work after the submitter's, one for the whole submission
    /// (set once every tensor is in).
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    Device {
        element: TypeId,
        segments: Vec<Segment>,
        ready: Option<Ready>,
    },
    /// Anything else, tensor by tensor.
    Each(Vec<Input>),
}

// SAFETY: the segments stand for `Lent` views (see `crate::scope::Lent`,
// which is `Send` for the same reason): exclusive access to lent memory,
// handed to the engine's thread, read only as the recorded element type
// (device segments only by the device plane, as device addresses).
unsafe impl Send for Inputs {}

impl Inputs {
    fn with_capacity(tensors: usize) -> Self {
        Inputs::Lent {
            element: TypeId::of::<()>(),
            segments: Vec::with_capacity(tensors),
        }
    }

    /// Appends a segment while the inputs are lent tensors of `of` (or
    /// none yet); false when they are not.
    #[inline]
    fn push_segment(&mut self, of: TypeId, ptr: NonNull<u8>, len: usize) -> bool {
        let Inputs::Lent { element, segments } = self else {
            return false;
        };
        if segments.is_empty() {
            *element = of;
        }
        if *element != of {
            return false;
        }
        segments.push(Segment { ptr, len });
        true
    }

    /// Appends one tensor's input.
    fn push(&mut self, input: Input) {
        if let Input::Lent(lent) = &input {
            let (ptr, len, of) = lent.parts();
            if self.push_segment(of, ptr, len) {
                return;
            }
        }
        if let Inputs::Lent { element, segments } = self {
            // Not (or not uniformly) lent: tensor by tensor from now on.
            let element = *element;
            let each = segments
                .drain(..)
                // SAFETY: each segment holds the parts of a view pushed
                // here (under this submission's lease), rebuilt once as it
                // leaves the list.
                .map(|s| Input::Lent(unsafe { Lent::from_parts(s.ptr, s.len, element) }))
                .collect();
            *self = Inputs::Each(each);
        }
        if let Inputs::Each(each) = self {
            each.push(input);
        }
    }

    /// Appends a lent tensor (as a segment while the inputs are lent
    /// tensors of `T`).
    #[inline]
    fn push_lent<T: Element>(&mut self, data: &mut [T]) {
        let (ptr, len) = (NonNull::from(&mut *data).cast(), data.len());
        if !self.push_segment(TypeId::of::<T>(), ptr, len) {
            self.push(Input::Lent(Lent::new(data)));
        }
    }

    /// The element counts of lent segments (empty for other inputs).
    pub(crate) fn lent_lens(&self) -> Vec<usize> {
        match self {
            Inputs::Lent { segments, .. } | Inputs::Device { segments, .. } => {
                segments.iter().map(|s| s.len).collect()
            }
            Inputs::Each(_) => Vec::new(),
        }
    }

    /// Device tensors lent by address, none yet (see
    /// [`Submission::push_device`]), of the memory and element type
    /// `element`.
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) fn on_device(element: TypeId, tensors: usize) -> Self {
        Inputs::Device {
            element,
            segments: Vec::with_capacity(tensors),
            ready: None,
        }
    }

    /// Sets what orders the engine's work on lent device tensors.
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) fn set_ready(&mut self, to: Ready) {
        if let Inputs::Device { ready, .. } = self {
            *ready = Some(to);
        }
    }

    /// The device addresses and lengths of lent device tensors whose
    /// memory and element type is `element`.
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) fn device(
        &self,
        element: TypeId,
    ) -> Option<impl Iterator<Item = (u64, usize)> + '_> {
        match self {
            Inputs::Device {
                element: lent,
                segments,
                ..
            } if *lent == element => Some(
                segments
                    .iter()
                    .map(|s| (s.ptr.as_ptr() as usize as u64, s.len)),
            ),
            _ => None,
        }
    }

    /// What orders the engine's work on lent device tensors.
    pub(crate) fn device_ready(&self) -> Option<&Ready> {
        match self {
            Inputs::Device { ready, .. } => ready.as_ref(),
            _ => None,
        }
    }

    /// True when the inputs are lent tensors of `T` (or none at all).
    pub(crate) fn lends<T: 'static>(&self) -> bool {
        matches!(self, Inputs::Lent { element, segments }
            if *element == TypeId::of::<T>() || segments.is_empty())
    }

    /// Every tensor's lent memory as `T`s, if the inputs are lent `T`s;
    /// each segment is taken (left empty), as by [`Inputs::take`].
    pub(crate) fn lent_views<T: Element>(&mut self) -> Option<Vec<&mut [T]>> {
        if !self.lends::<T>() {
            return None;
        }
        let Inputs::Lent { segments, .. } = self else {
            return None;
        };
        Some(
            segments
                .iter_mut()
                .map(|s| {
                    let len = std::mem::take(&mut s.len);
                    // SAFETY: the segment holds the address and length of
                    // a `&mut [T]` lent for this submission (its element
                    // type checked above), whose lease is out until the
                    // submission's last tensor completes — after the
                    // caller is done with this view. The length is zeroed,
                    // so no second view of the memory is made from here.
                    unsafe { std::slice::from_raw_parts_mut(s.ptr.as_ptr().cast::<T>(), len) }
                })
                .collect(),
        )
    }

    /// Takes tensor `index`'s input, leaving nothing (a lent segment keeps
    /// its address with no elements).
    pub(crate) fn take(&mut self, index: usize) -> Input {
        match self {
            Inputs::Lent { element, segments } => match segments.get_mut(index) {
                Some(s) => {
                    let len = std::mem::take(&mut s.len);
                    // SAFETY: the segment holds the parts of a view pushed
                    // here, under this submission's lease; its length is
                    // zeroed now, so a later take rebuilds an empty view.
                    Input::Lent(unsafe { Lent::from_parts(s.ptr, len, *element) })
                }
                None => Input::None,
            },
            Inputs::Device {
                element, segments, ..
            } => match segments.get_mut(index) {
                Some(s) => {
                    let len = std::mem::take(&mut s.len);
                    // SAFETY: as for lent host tensors; `element` is a
                    // device memory's, so the view made of it is never
                    // read as host memory (`Lent::as_mut_slice` checks).
                    Input::Lent(unsafe { Lent::from_parts(s.ptr, len, *element) })
                }
                None => Input::None,
            },
            Inputs::Each(each) => each
                .get_mut(index)
                .map_or(Input::None, |input| std::mem::replace(input, Input::None)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_flat_and_indexed() {
        let mut shapes = Shapes::default();
        shapes.push(&[2, 3]);
        shapes.push(&[]);
        shapes.push(&[7]);
        assert_eq!(shapes.get(0), &[2, 3]);
        assert_eq!(shapes.get(1), &[] as &[u64]);
        assert_eq!(shapes.get(2), &[7]);
        assert_eq!(shapes.get(3), &[] as &[u64]);
    }

    proptest::proptest! {
        /// Any sequence of shapes reads back as pushed, whether it stays
        /// 1-D or not, and two sequences are equal exactly when their
        /// shapes are.
        #[test]
        fn shapes_read_back_and_compare_as_pushed(
            a in proptest::collection::vec(proptest::collection::vec(0u64..5, 0..4), 0..12),
            b in proptest::collection::vec(proptest::collection::vec(0u64..5, 0..4), 0..12),
            one_d in proptest::collection::vec(0u64..5, 0..12),
        ) {
            let build = |list: &[Vec<u64>]| {
                let mut shapes = Shapes::default();
                let mut dims = Shapes::default();
                for shape in list {
                    shapes.push(shape);
                    dims.push_dims(&shape.iter().map(|&d| d as usize).collect::<Vec<_>>());
                }
                assert_eq!(&shapes, &dims);
                shapes
            };
            let flat: Vec<Vec<u64>> = one_d.iter().map(|&d| vec![d]).collect();
            for list in [&a, &b, &flat] {
                let shapes = build(list);
                for (i, shape) in list.iter().enumerate() {
                    proptest::prop_assert_eq!(shapes.get(i), shape.as_slice());
                }
                proptest::prop_assert_eq!(shapes.get(list.len()), &[] as &[u64]);
            }
            proptest::prop_assert_eq!(build(&a) == build(&b), a == b);
        }
    }

    #[test]
    fn uniform_lent_inputs_stay_segments_and_anything_else_goes_tensor_by_tensor() {
        let mut a = [1.0f32; 4];
        let mut b = [2u8; 3];
        let mut inputs = Inputs::with_capacity(2);
        inputs.push(Input::Lent(Lent::new(&mut a[..2])));
        inputs.push(Input::Lent(Lent::new(&mut a[2..])));
        assert!(matches!(&inputs, Inputs::Lent { segments, .. } if segments.len() == 2));
        inputs.push(Input::Lent(Lent::new(&mut b[..])));
        inputs.push(Input::None);
        let Inputs::Each(each) = &inputs else {
            panic!("mixed inputs go tensor by tensor");
        };
        assert_eq!(each.len(), 4);
        match inputs.take(2) {
            Input::Lent(mut lent) => assert_eq!(lent.as_mut_slice::<u8>(), Some(&mut [2u8; 3][..])),
            _ => panic!("the third input is lent"),
        }
        assert!(matches!(inputs.take(2), Input::None), "taken once");
        let mut uniform = Inputs::with_capacity(1);
        uniform.push(Input::Lent(Lent::new(&mut a[..])));
        for expected in [4, 0] {
            match uniform.take(0) {
                Input::Lent(mut lent) => {
                    assert_eq!(lent.as_mut_slice::<f32>().map(|s| s.len()), Some(expected))
                }
                _ => panic!("the input is lent"),
            }
        }
    }
}
