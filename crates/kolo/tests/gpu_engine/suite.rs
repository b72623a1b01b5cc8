//! kolo's engine suite on the GPU engine: its main job (every operation,
//! the mismatch matrix, submission orders, join, the cache and fusion,
//! the timeline, shutdown) with host tensors, which a GPU engine serves
//! too, plus the cases written over a memory with tensors on the engine's
//! GPU; and those device cases again without a timeline, where a repeated
//! group takes the engine's fast path. Judged as every backend's jobs
//! are (every rank passed, digests agree, the timeline file holds the
//! events).

use kolo::nccl::cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use kolo::nccl::{DeviceTensorMut, NcclOptions};
use kolo::{Error, Kolo};
use kolo_engine_suite::memory::Memory;
use kolo_engine_suite::{judge, run_rank, Case, Digest, Job};
use std::sync::Arc;

/// Tensors on the engine's GPU, uploaded and read on a stream of the
/// caller's (not the engine's: the engine orders its work after it).
pub struct Gpu {
    stream: Arc<CudaStream>,
}

impl Gpu {
    /// A new stream on `kolo`'s GPU.
    fn of(kolo: &Kolo) -> Result<Gpu, Error> {
        let start = |message: String| Error::Start { message };
        let gpu = kolo
            .gpu()
            .ok_or_else(|| start("the engine has no GPU".into()))?;
        let stream = CudaContext::new(gpu)
            .and_then(|ctx| ctx.new_stream())
            .map_err(|e| start(format!("{e:?}")))?;
        Ok(Gpu { stream })
    }
}

impl Memory for Gpu {
    type Buf = CudaSlice<f32>;
    type View<'a> = DeviceTensorMut<'a, f32>;

    fn name(&self) -> String {
        format!("cuda:{}", self.stream.context().ordinal())
    }

    fn upload(&self, data: &[f32]) -> CudaSlice<f32> {
        self.stream
            .clone_htod(data)
            .unwrap_or_else(|e| panic!("uploading {} floats: {e:?}", data.len()))
    }

    fn download(&self, buf: &CudaSlice<f32>) -> Vec<f32> {
        self.stream
            .clone_dtoh(buf)
            .unwrap_or_else(|e| panic!("reading {} floats back: {e:?}", buf.len()))
    }

    fn len(&self, buf: &CudaSlice<f32>) -> usize {
        buf.len()
    }

    fn view<'a>(&self, buf: &'a mut CudaSlice<f32>, shape: Option<&[usize]>) -> Self::View<'a> {
        match shape {
            Some(shape) => DeviceTensorMut::with_shape(buf.as_view_mut(), shape),
            None => DeviceTensorMut::from(buf),
        }
    }
}

fn any_order_any_style(kolo: &Kolo) -> Result<Digest, Error> {
    kolo_engine_suite::any_order_any_style_in(kolo, &Gpu::of(kolo)?)
}

fn group_after_cache_reuse(kolo: &Kolo) -> Result<Digest, Error> {
    kolo_engine_suite::group_after_cache_reuse_in(kolo, &Gpu::of(kolo)?)
}

fn refused_tensor_alone_is_untouched(kolo: &Kolo) -> Result<Digest, Error> {
    kolo_engine_suite::refused_tensor_alone_is_untouched_in(kolo, &Gpu::of(kolo)?)
}

/// The suite's cases over a memory, on the engine's GPU.
const DEVICE: [Case; 3] = [
    Case::new("device_any_order_any_style", any_order_any_style),
    Case::new("device_group_after_cache_reuse", group_after_cache_reuse),
    Case::new(
        "device_refused_tensor_alone_is_untouched",
        refused_tensor_alone_is_untouched,
    ),
];

/// Runs both jobs on `n` GPUs (a thread per GPU) and prints a line per
/// verdict; true when every verdict passed.
pub fn run(n: usize, options: NcclOptions) -> bool {
    println!("== engine suite on the GPU engine, {n} GPU(s) ==");
    let jobs = [
        Job::main(n, &DEVICE),
        Job::new(format!("device_np{n}"), n, DEVICE.to_vec()),
    ];
    let mut ok = true;
    for job in jobs {
        let dir = match tempfile::tempdir() {
            Ok(dir) => dir,
            Err(e) => {
                println!("FAIL {}: no temporary directory: {e}", job.name);
                return false;
            }
        };
        let config = job.configure(kolo::Config::default(), dir.path());
        let lines = kolo::nccl::run_with(n, config, options.clone(), |kolo| {
            let mut lines = Vec::new();
            // A failed case is in the lines; the judge reads them all.
            let _ = run_rank(kolo, &job.cases, &mut |line| lines.push(line));
            Ok(lines)
        });
        let lines: Vec<_> = match lines {
            Ok(lines) => lines.into_iter().flatten().collect(),
            Err(e) => {
                println!("FAIL {}: the engines failed: {e}", job.name);
                ok = false;
                continue;
            }
        };
        // Host tensors on a thread-per-GPU engine go through kolo-threads,
        // which reduces fused allreduces in place: nothing is packed.
        for verdict in judge(&job, &lines, dir.path(), false) {
            match verdict.failure {
                None => println!("ok   {}", verdict.name),
                Some(why) => {
                    println!("FAIL {}: {why}", verdict.name);
                    ok = false;
                }
            }
        }
    }
    ok
}
