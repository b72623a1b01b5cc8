//! The device-tensor check shared by `gpu_nccl` (threads) and
//! `gpu_nccl_mpi` (processes): widths (1, 1), f32 "act" and i32 "ids"
//! moved GPU to GPU forward and back (`send_device` / `recv_device`) for
//! several minibatches whose shapes differ, one of them 8 MiB; every
//! tensor is checked on its receiver after a copy to the host.

use super::common::TestError;
use kolo_nccl::Device;
use kolo_pipeline::{
    DeviceTensor, Direction, Pipeline, PipelineError, PipelineSpec, Tensor, TensorSpec,
};
use kolo_protocol::DataType;

/// Minibatches per run (minibatch 2's "act" is the 8 MiB one).
pub const MINIBATCHES: u64 = 5;

/// Widths (1, 1): "act" (f32) and "ids" (i32) from stage 0 to stage 1,
/// with gradients.
pub fn device_spec() -> PipelineSpec {
    PipelineSpec::with_widths(&[1, 1])
        .tensor(
            TensorSpec::new("act", DataType::F32, 1)
                .from_stage(0)
                .to_stage(1),
        )
        .tensor(
            TensorSpec::new("ids", DataType::I32, 2)
                .from_stage(0)
                .to_stage(1),
        )
}

/// The `PASS` note for `bytes` received on the GPUs.
pub fn device_note(bytes: usize) -> String {
    format!(
        ": {MINIBATCHES} minibatches of f32 and i32 each way, {:.1} MiB received on the GPUs",
        bytes as f64 / (1 << 20) as f64
    )
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
/// `device` (uploaded on its stream; open it before the channels: cudarc
/// synchronizes the whole CUDA context when a `CudaContext` gets its first
/// stream, which would wait for the channels' pending receives) and checks
/// the gradients that come back; rank 1 checks what arrives, sends a new
/// "act" back and the received "ids" buffer itself. Received tensors must
/// be on `device`. Returns the bytes this rank received.
pub fn device_stage(pipe: &Pipeline, device: &Device) -> Result<usize, TestError> {
    let rank = pipe.plan().rank();
    let gpu = device.ordinal();
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
