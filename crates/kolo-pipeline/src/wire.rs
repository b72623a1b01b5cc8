//! What travels on a channel: every message starts with a fixed-size
//! header, so a receiver always posts a receive of known length; a tensor's
//! header carries its dtype, shape and minibatch ahead of the data, so the
//! receiver allocates exactly.
//!
//! Header layout (80 bytes, little endian): magic `b"kpl1"`, kind (u8),
//! dtype (u8, index in [`DataType::ALL`]), ndim (u8), one zero byte,
//! minibatch (u64), then [`MAX_DIMS`] dimensions (u64, unused ones zero).
//!
//! | kind          | followed by                                  |
//! |---------------|----------------------------------------------|
//! | tensor        | the tensor's bytes (product of dims × size)  |
//! | device tensor | the same bytes, moved device to device by the |
//! |               | channel (NCCL); at least one element          |
//! | ack           | nothing: "minibatch taken"                    |
//! | abort         | `dims[0]` bytes of UTF-8 reason               |

use crate::tensor::{element_count, MAX_DIMS};
use kolo_protocol::DataType;
use kolo_transport::MemoryKind;

/// Bytes in every header.
pub(crate) const HEADER_LEN: usize = 16 + 8 * MAX_DIMS;
const MAGIC: [u8; 4] = *b"kpl1";
/// The longest abort reason sent (longer ones are cut).
pub(crate) const MAX_REASON: usize = 4096;

/// What a message is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Header {
    /// A tensor of `dtype` and `shape` for `minibatch` follows, in host
    /// or device memory.
    Tensor {
        dtype: DataType,
        shape: Vec<usize>,
        minibatch: u64,
        memory: MemoryKind,
    },
    /// The receiver took `minibatch`.
    Ack { minibatch: u64 },
    /// The sender gave up; a reason of `reason_len` bytes follows.
    Abort { reason_len: usize },
}

const KIND_TENSOR: u8 = 0;
const KIND_ACK: u8 = 1;
const KIND_ABORT: u8 = 2;
const KIND_DEVICE_TENSOR: u8 = 3;

impl Header {
    /// The header's bytes. Shapes come from [`crate::Tensor`], which holds
    /// at most [`MAX_DIMS`] dimensions; extra ones would be dropped.
    pub(crate) fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[..4].copy_from_slice(&MAGIC);
        let (kind, dtype, minibatch, dims): (u8, u8, u64, Vec<u64>) = match self {
            Header::Tensor {
                dtype,
                shape,
                minibatch,
                memory,
            } => (
                match memory {
                    MemoryKind::Host => KIND_TENSOR,
                    MemoryKind::Cuda => KIND_DEVICE_TENSOR,
                },
                dtype_code(*dtype),
                *minibatch,
                shape.iter().map(|&d| d as u64).collect(),
            ),
            Header::Ack { minibatch } => (KIND_ACK, 0, *minibatch, Vec::new()),
            Header::Abort { reason_len } => (KIND_ABORT, 0, 0, vec![*reason_len as u64]),
        };
        out[4] = kind;
        out[5] = dtype;
        out[6] = dims.len().min(MAX_DIMS) as u8;
        out[8..16].copy_from_slice(&minibatch.to_le_bytes());
        for (slot, d) in out[16..].chunks_exact_mut(8).zip(dims) {
            slot.copy_from_slice(&d.to_le_bytes());
        }
        out
    }

    /// Parses a header; a message that is not one is an error saying why.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Header, String> {
        if bytes.len() != HEADER_LEN {
            return Err(format!(
                "a header has {HEADER_LEN} bytes, this message {}",
                bytes.len()
            ));
        }
        if bytes[..4] != MAGIC {
            return Err(format!(
                "not a kolo-pipeline header (magic {:02x?})",
                &bytes[..4]
            ));
        }
        let word = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let minibatch = word(8);
        let ndim = bytes[6] as usize;
        if ndim > MAX_DIMS {
            return Err(format!(
                "header with {ndim} dimensions (at most {MAX_DIMS})"
            ));
        }
        let dims: Vec<u64> = (0..ndim).map(|i| word(16 + 8 * i)).collect();
        match bytes[4] {
            kind @ (KIND_TENSOR | KIND_DEVICE_TENSOR) => {
                let dtype = DataType::ALL
                    .get(bytes[5] as usize)
                    .copied()
                    .ok_or_else(|| format!("unknown dtype code {}", bytes[5]))?;
                let shape = dims
                    .iter()
                    .map(|&d| usize::try_from(d).map_err(|_| format!("dimension {d} too large")))
                    .collect::<Result<Vec<usize>, String>>()?;
                let count = element_count(&shape, dtype).map_err(|e| e.to_string())?;
                let memory = if kind == KIND_TENSOR {
                    MemoryKind::Host
                } else {
                    MemoryKind::Cuda
                };
                if memory == MemoryKind::Cuda && count == 0 {
                    return Err(format!(
                        "a device tensor header of shape {shape:?} (device tensors hold at \
                         least one element)"
                    ));
                }
                Ok(Header::Tensor {
                    dtype,
                    shape,
                    minibatch,
                    memory,
                })
            }
            KIND_ACK => Ok(Header::Ack { minibatch }),
            KIND_ABORT => {
                let reason_len = dims.first().copied().unwrap_or(0);
                match usize::try_from(reason_len) {
                    Ok(n) if n <= MAX_REASON => Ok(Header::Abort { reason_len: n }),
                    _ => Err(format!(
                        "abort reason of {reason_len} bytes (at most {MAX_REASON})"
                    )),
                }
            }
            kind => Err(format!("unknown message kind {kind}")),
        }
    }
}

/// `reason` cut to at most [`MAX_REASON`] bytes on a character boundary.
pub(crate) fn reason_bytes(reason: &str) -> Vec<u8> {
    let mut end = reason.len().min(MAX_REASON);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason.as_bytes()[..end].to_vec()
}

fn dtype_code(dtype: DataType) -> u8 {
    DataType::ALL.iter().position(|&d| d == dtype).unwrap_or(0) as u8
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_dtype() -> impl Strategy<Value = DataType> {
        (0..DataType::ALL.len()).prop_map(|i| DataType::ALL[i])
    }

    proptest! {
        #[test]
        fn tensor_headers_round_trip(
            dtype in any_dtype(),
            shape in proptest::collection::vec(0usize..64, 0..=MAX_DIMS),
            minibatch in any::<u64>(),
        ) {
            let h = Header::Tensor { dtype, shape, minibatch, memory: MemoryKind::Host };
            prop_assert_eq!(Header::decode(&h.encode()), Ok(h));
        }

        /// Device tensors keep their memory kind through the header, and
        /// differ from host tensors in the kind byte only; one without
        /// elements is refused.
        #[test]
        fn device_tensor_headers_round_trip(
            dtype in any_dtype(),
            shape in proptest::collection::vec(0usize..64, 0..=MAX_DIMS),
            minibatch in any::<u64>(),
        ) {
            let device = Header::Tensor { dtype, shape: shape.clone(), minibatch, memory: MemoryKind::Cuda };
            let host = Header::Tensor { dtype, shape: shape.clone(), minibatch, memory: MemoryKind::Host };
            let (d, h) = (device.encode(), host.encode());
            prop_assert_eq!(d[4], KIND_DEVICE_TENSOR);
            prop_assert!(d.iter().zip(h.iter()).enumerate().all(|(i, (a, b))| i == 4 || a == b));
            if shape.iter().product::<usize>() == 0 {
                prop_assert!(Header::decode(&d).unwrap_err().contains("at least one element"));
            } else {
                prop_assert_eq!(Header::decode(&d), Ok(device));
            }
        }

        #[test]
        fn acks_and_aborts_round_trip(minibatch in any::<u64>(), len in 0usize..=MAX_REASON) {
            let ack = Header::Ack { minibatch };
            prop_assert_eq!(Header::decode(&ack.encode()), Ok(ack));
            let abort = Header::Abort { reason_len: len };
            prop_assert_eq!(Header::decode(&abort.encode()), Ok(abort));
        }

        #[test]
        fn any_bytes_decode_without_panicking(
            bytes in proptest::collection::vec(any::<u8>(), 0..2 * HEADER_LEN),
            magic in any::<bool>(),
        ) {
            let mut bytes = bytes;
            if magic && bytes.len() >= 4 {
                bytes[..4].copy_from_slice(&MAGIC);
            }
            let _ = Header::decode(&bytes);
        }
    }

    #[test]
    fn garbage_is_named() {
        assert_eq!(
            Header::decode(&[0; 3]),
            Err("a header has 80 bytes, this message 3".into())
        );
        let mut h = Header::Ack { minibatch: 1 }.encode();
        h[4] = 9;
        assert_eq!(Header::decode(&h), Err("unknown message kind 9".into()));
        let mut h = Header::Tensor {
            dtype: DataType::F32,
            shape: vec![2],
            minibatch: 0,
            memory: MemoryKind::Host,
        }
        .encode();
        h[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        h[6] = 2;
        h[24..32].copy_from_slice(&4u64.to_le_bytes());
        assert!(Header::decode(&h).unwrap_err().contains("too large"));
    }

    #[test]
    fn reasons_are_cut_on_a_character_boundary() {
        let long = "é".repeat(MAX_REASON);
        let cut = reason_bytes(&long);
        assert!(cut.len() <= MAX_REASON && std::str::from_utf8(&cut).is_ok());
    }
}
