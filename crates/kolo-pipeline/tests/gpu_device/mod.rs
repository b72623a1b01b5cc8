//! The device-tensor check of `gpu_nccl`: widths (1, 1) over NCCL
//! channels in thread mode, rank r on GPU r % GPUs, f32 "act" and i32 "ids"
//! moved GPU to GPU forward and back (`send_device` / `recv_device`) for
//! several minibatches whose shapes differ, one of them 8 MiB; every
//! tensor is checked on its receiver after a copy to the host.

use super::common::TestError;
use super::{run_ranks, Outcome};
use kolo_nccl::Device;
use kolo_pipeline::{
    DeviceTensor, Direction, Options, Pipeline, PipelineError, PipelineSpec, Tensor, TensorSpec,
};
use kolo_protocol::DataType;

/// Minibatches per run (minibatch 2's "act" is the 8 MiB one).
const MINIBATCHES: u64 = 5;

/// Device tensors forward and back on widths (1, 1); the receiver checks
/// every value, its GPU, and that a device message cannot be taken as a
/// host tensor (it stays queued for `recv_device`).
pub fn device_run(gpus: usize) -> Outcome {
    let spec = PipelineSpec::with_widths(&[1, 1])
        .tensor(
            TensorSpec::new("act", DataType::F32, 1)
                .from_stage(0)
                .to_stage(1),
        )
        .tensor(
            TensorSpec::new("ids", DataType::I32, 2)
                .from_stage(0)
                .to_stage(1),
        );
    // The upload streams are opened before any channel exists: cudarc
    // synchronizes the whole CUDA context when a `CudaContext` gets its
    // first stream, which would wait for the channels' pending receives.
    let mut devices = Vec::new();
    for gpu in 0..2 {
        match Device::open(gpu % gpus) {
            Ok(device) => devices.push(device),
            Err(e) => return Outcome::Fail(format!("opening GPU {gpu}: {e}")),
        }
    }
    let options = Options::training(MINIBATCHES);
    let results = match run_ranks(&spec, options, gpus, |pipe| {
        device_stage(pipe, &devices, gpus)
    }) {
        Ok(results) => results,
        Err(outcome) => return outcome,
    };
    let mut bytes = 0;
    for (rank, result) in results.into_iter().enumerate() {
        match result {
            Ok(received) => bytes += received,
            Err(why) => return Outcome::Fail(format!("rank {rank}: {why}")),
        }
    }
    Outcome::Pass(format!(
        ": {MINIBATCHES} minibatches of f32 and i32 each way, {:.1} MiB received on the GPUs",
        bytes as f64 / (1 << 20) as f64
    ))
}

/// Minibatch `g`'s shape of `name`: it changes with `g`; "act" of
/// minibatch 2 is 512 x 4096 f32 = 8 MiB.
fn shape(name: &str, g: u64) -> Vec<usize> {
    let g = g as usize;
    match (name, g) {
        ("act", 2) => vec![512, 4096],
        ("act", _) => vec![1 + g % 3, 33 + g],
        _ => vec![2 + g, 5],
    }
}

/// The values of `name`, minibatch `g`, `direction`: forward "act" is
/// `1000 g + i`, backward its negation (exact in f32 below 2^24); "ids" is
/// `100 g + i` both ways (the receiver sends the buffer it received back).
fn values(name: &str, g: u64, direction: Direction) -> Result<Tensor, TestError> {
    let shape = shape(name, g);
    let n: usize = shape.iter().product();
    let tensor = if name == "act" {
        let sign = if direction == Direction::Forward {
            1.0
        } else {
            -1.0
        };
        let data = (0..n).map(|i| sign * (g as f32 * 1000.0 + i as f32));
        Tensor::new(shape, data.collect::<Vec<f32>>())
    } else {
        let data = (0..n).map(|i| g as i32 * 100 + i as i32);
        Tensor::new(shape, data.collect::<Vec<i32>>())
    };
    Ok(tensor?)
}

/// Rank 0 sends "act" and "ids" of each minibatch forward from its GPU
/// (uploaded on `devices[rank]`'s stream)
/// and checks the gradients that come back; rank 1 checks what arrives,
/// sends a new "act" back and the received "ids" buffer itself. Returns
/// the bytes this rank received.
fn device_stage(pipe: &Pipeline, devices: &[Device], gpus: usize) -> Result<usize, TestError> {
    let rank = pipe.plan().rank();
    let gpu = rank % gpus;
    let device = devices
        .get(rank)
        .ok_or_else(|| TestError(format!("no device opened for rank {rank}")))?;
    let upload = |name: &str, g: u64, direction: Direction| -> Result<DeviceTensor, TestError> {
        Ok(DeviceTensor::from_host(
            device.stream(),
            &values(name, g, direction)?,
        )?)
    };
    let mut bytes = 0;
    for g in 0..MINIBATCHES {
        if rank == 0 {
            for name in ["act", "ids"] {
                pipe.send_device(
                    name,
                    upload(name, g, Direction::Forward)?,
                    g,
                    Direction::Forward,
                )?;
            }
            for name in ["act", "ids"] {
                let got = pipe.recv_device(name, g, Direction::Backward)?;
                bytes += check(&got, name, g, Direction::Backward, gpu)?;
            }
        } else {
            if g == 0 {
                match pipe.recv("act", 0, Direction::Forward) {
                    Err(PipelineError::WrongMemory { .. }) => {}
                    other => {
                        return Err(TestError(format!(
                            "recv of a device message gave {other:?}, not WrongMemory"
                        )))
                    }
                }
            }
            let act = pipe.recv_device("act", g, Direction::Forward)?;
            bytes += check(&act, "act", g, Direction::Forward, gpu)?;
            let ids = pipe.recv_device("ids", g, Direction::Forward)?;
            bytes += check(&ids, "ids", g, Direction::Forward, gpu)?;
            let grad = upload("act", g, Direction::Backward)?;
            pipe.send_device("act", grad, g, Direction::Backward)?;
            pipe.send_device("ids", ids, g, Direction::Backward)?;
        }
    }
    Ok(bytes)
}

/// `got` must live on `gpu` and hold `values(name, g, direction)`;
/// returns its byte size.
fn check(
    got: &DeviceTensor,
    name: &str,
    g: u64,
    direction: Direction,
    gpu: usize,
) -> Result<usize, TestError> {
    let what = format!("'{name}' {direction} minibatch {g}");
    if got.ordinal() != gpu {
        return Err(TestError(format!(
            "{what} arrived on GPU {}, not the channel's GPU {gpu}",
            got.ordinal()
        )));
    }
    let host = got.to_host()?;
    let want = values(name, g, direction)?;
    if host != want {
        let size = want.dtype().size();
        let first = host
            .as_bytes()
            .iter()
            .zip(want.as_bytes())
            .position(|(a, b)| a != b)
            .map(|byte| byte / size);
        return Err(TestError(format!(
            "{what}: got shape {:?}, expected {:?}; first different element {first:?}",
            host.shape(),
            want.shape()
        )));
    }
    Ok(host.as_bytes().len())
}
