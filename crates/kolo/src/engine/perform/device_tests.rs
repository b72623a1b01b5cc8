//! How the engine hands device tensors to its plane, without a GPU: a
//! plane that records what it was asked and completes at once.

use crate::config::Config;
use crate::engine::batches::Order;
use crate::engine::completion::{Completion, Payload};
use crate::engine::placement::{DeviceEntry, DevicePlane};
use crate::engine::submission::{Inputs, Submission};
use crate::error::Error;
use crate::group::TensorGroup;
use crate::handle::Handle;
use crate::kolo::Kolo;
use kolo_protocol::{DataType, Device, Params, ReduceOp, RequestKind, Response};
use kolo_timeline::Timeline;
use std::any::TypeId;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// What the plane was asked to do.
#[derive(Default)]
struct Asked {
    /// Tensors performed one response at a time.
    one_by_one: AtomicUsize,
    /// Whole submissions allreduced at once.
    whole: AtomicUsize,
    /// Requests to free the device fusion buffers.
    released: AtomicUsize,
}

/// The bytes the recording plane says each release freed.
const RELEASED_BYTES: usize = 4096;

struct Recording(Arc<Asked>);

impl DevicePlane for Recording {
    fn ordinal(&self) -> usize {
        0
    }

    fn perform(
        &mut self,
        _kind: RequestKind,
        _response: &Response,
        slots: Vec<Option<DeviceEntry>>,
        _timeline: &Timeline,
    ) {
        for entry in slots.into_iter().flatten() {
            self.0.one_by_one.fetch_add(1, Ordering::Relaxed);
            entry.part.complete(Ok(Box::new(()) as Payload));
        }
    }

    fn allreduce_whole(&mut self, _: &Response, _: Inputs, _: &Order, completion: Arc<Completion>) {
        self.0.whole.fetch_add(1, Ordering::Relaxed);
        completion.complete_all_ok();
    }

    fn release_buffers(&mut self) -> usize {
        self.0.released.fetch_add(1, Ordering::Relaxed);
        RELEASED_BYTES
    }
}

/// A GPU engine of one rank over kolo-threads with the recording plane.
fn engine(asked: &Arc<Asked>) -> Kolo {
    let asked = Arc::clone(asked);
    let make = move || {
        let comm = kolo_threads::communicators(1)
            .map_err(|e| Error::Start {
                message: e.to_string(),
            })?
            .pop()
            .expect("one rank");
        let plane: Box<dyn DevicePlane> = Box::new(Recording(asked));
        Ok((comm, Some(plane)))
    };
    Kolo::start_engine(
        make,
        Config::default(),
        |_, _| {},
        None,
        crate::engine::watchdog::Guards::default(),
    )
    .expect("an engine")
}

/// Submits `group`'s tensors as device tensors lent by address (never
/// dereferenced: the plane only records).
fn submit_group(kolo: &Kolo, group: &TensorGroup) -> Result<(), Error> {
    let template = Params {
        device: Device::Cuda(0),
        ..Params::new(RequestKind::Allreduce, DataType::F32, [])
    };
    let template = Params {
        reduce_op: ReduceOp::Sum,
        ..template
    };
    kolo.scope(|s| {
        let mut submission = Submission::known(template, group.list(), Some(s.lease()));
        submission.inputs = Inputs::on_device(TypeId::of::<[f32; 0]>(), group.len());
        for t in 0..group.len() {
            let ptr = NonNull::new((0x1000 + 64 * t) as *mut u8).expect("not 0");
            submission.push_device(None, &[16], ptr, 16);
        }
        submission.inputs.set_ready(Arc::new(()));
        let completion = kolo.submit(submission)?;
        Handle::new(completion, |_| Ok(())).wait()
    })
}

#[test]
fn a_repeated_device_group_goes_to_the_plane_whole() {
    let asked = Arc::new(Asked::default());
    let kolo = engine(&asked);
    let group = TensorGroup::new((0..50).map(|t| format!("g{t}"))).unwrap();
    for _ in 0..5 {
        submit_group(&kolo, &group).unwrap();
    }
    let whole = asked.whole.load(Ordering::Relaxed);
    let one_by_one = asked.one_by_one.load(Ordering::Relaxed);
    // The first step negotiates every name; the repeats are one whole
    // submission each.
    assert!(whole >= 4, "whole {whole}, one by one {one_by_one}");
    kolo.shutdown().unwrap();
}

#[test]
fn a_repeated_device_group_goes_whole_after_the_cache_evicted_others() {
    let asked = Arc::new(Asked::default());
    let kolo = engine(&asked);
    let earlier = TensorGroup::new((0..600).map(|t| format!("earlier{t}"))).unwrap();
    submit_group(&kolo, &earlier).unwrap();
    let group = TensorGroup::new((0..800).map(|t| format!("g{t}"))).unwrap();
    let before = asked.whole.load(Ordering::Relaxed);
    for _ in 0..5 {
        submit_group(&kolo, &group).unwrap();
    }
    let whole = asked.whole.load(Ordering::Relaxed) - before;
    let one_by_one = asked.one_by_one.load(Ordering::Relaxed);
    assert!(whole >= 4, "whole {whole}, one by one {one_by_one}");
    kolo.shutdown().unwrap();
}

#[test]
fn releasing_the_buffers_reaches_the_device_plane() {
    let asked = Arc::new(Asked::default());
    let kolo = engine(&asked);
    let group = TensorGroup::new((0..8).map(|t| format!("g{t}"))).unwrap();
    submit_group(&kolo, &group).unwrap();
    // No host buffer was used: the bytes are the plane's.
    assert_eq!(kolo.release_buffers().unwrap(), RELEASED_BYTES);
    assert_eq!(asked.released.load(Ordering::Relaxed), 1);
    submit_group(&kolo, &group).unwrap();
    kolo.shutdown().unwrap();
    assert!(matches!(
        kolo.release_buffers(),
        Err(Error::ShutDown { .. })
    ));
}
