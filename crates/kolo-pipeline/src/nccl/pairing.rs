//! The pure part of bootstrapping NCCL channels over MPI
//! ([`super::nccl_mpi_channels`]): each rank's part in a channel's pair
//! split, the one status every rank agrees on after each channel, and the
//! check that a channel's two ends are on different GPUs.

use crate::channels::ChannelKey;
use std::fmt::Write;

/// This rank's end of a channel's pair communicator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PairEnd {
    /// The split key, and so the rank in the pair: the sender is 0, the
    /// receiver 1 (as in [`crate::pair_channels`]).
    pub(crate) rank: usize,
    /// The other end's rank in the pair.
    pub(crate) peer: usize,
}

/// The end of `key` that global `rank` is, if any (ranks not on the
/// channel pass no color to the split).
pub(crate) fn pair_end(key: &ChannelKey, rank: usize) -> Option<PairEnd> {
    if key.sender == rank {
        Some(PairEnd { rank: 0, peer: 1 })
    } else if key.receiver == rank {
        Some(PairEnd { rank: 1, peer: 0 })
    } else {
        None
    }
}

/// `[1]` for success, `[0, message...]` for a failure.
pub(crate) fn encode_status(status: &Result<(), String>) -> Vec<u8> {
    match status {
        Ok(()) => vec![1],
        Err(message) => std::iter::once(0).chain(message.bytes()).collect(),
    }
}

/// The first rank whose status (of an allgather, in rank order) is a
/// failure, with its message.
pub(crate) fn first_failure(statuses: &[Vec<u8>]) -> Option<(usize, String)> {
    statuses
        .iter()
        .enumerate()
        .find_map(|(rank, status)| match status.split_first() {
            Some((1, _)) => None,
            Some((_, message)) => Some((rank, String::from_utf8_lossy(message).into_owned())),
            None => Some((rank, "sent an empty status".into())),
        })
}

/// What one end of a channel tells the other about its GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GpuId {
    /// The CUDA ordinal in its process.
    pub(crate) ordinal: usize,
    /// The GPU's UUID, when the driver gave it.
    pub(crate) uuid: Option<[u8; 16]>,
}

impl GpuId {
    /// 8 bytes of ordinal, then the 16 of the UUID if known.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut bytes = (self.ordinal as u64).to_le_bytes().to_vec();
        if let Some(uuid) = self.uuid {
            bytes.extend_from_slice(&uuid);
        }
        bytes
    }

    /// The inverse of [`GpuId::encode`]; `None` for any other length.
    pub(crate) fn decode(bytes: &[u8]) -> Option<GpuId> {
        let ordinal = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?) as usize;
        let uuid = match bytes.len() {
            8 => None,
            24 => Some(bytes[8..].try_into().ok()?),
            _ => return None,
        };
        Some(GpuId { ordinal, uuid })
    }
}

/// The UUID as `nvidia-smi -L` prints it.
pub(crate) fn uuid_text(uuid: &[u8; 16]) -> String {
    let mut text = String::from("GPU-");
    for (i, b) in uuid.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            text.push('-');
        }
        let _ = write!(text, "{b:02x}");
    }
    text
}

/// The error when both ends of `key` (sender's GPU first) are one GPU:
/// on one host (`same_host`) with the same UUID. NCCL would refuse the
/// communicator ("Duplicate GPU detected"). Ends whose UUID is unknown
/// (no driver) are not judged here: opening the device fails on its own.
pub(crate) fn shared_gpu(key: &ChannelKey, ends: [GpuId; 2], same_host: bool) -> Option<String> {
    let [sender, receiver] = ends;
    match (sender.uuid, receiver.uuid) {
        (Some(a), Some(b)) if same_host && a == b => Some(format!(
            "channel {key}: ranks {} and {} both use GPU {} (device {} of rank {}, device {} of \
             rank {}); NCCL needs the two ends of a channel on different GPUs: give each rank \
             of a channel its own device",
            key.sender,
            key.receiver,
            uuid_text(&a),
            sender.ordinal,
            key.sender,
            receiver.ordinal,
            key.receiver
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channels::ChannelKind;
    use crate::options::Options;
    use crate::plan::channels;
    use crate::spec::{PipelineSpec, TensorSpec};
    use kolo_protocol::DataType;
    use proptest::prelude::*;

    fn key(sender: usize, receiver: usize) -> ChannelKey {
        ChannelKey {
            tensor: "h1".into(),
            tag: 1,
            kind: ChannelKind::Activations,
            sender,
            receiver,
        }
    }

    proptest! {
        /// On every channel of any pipeline exactly its two ranks take
        /// part, as pair ranks 0 (sender) and 1 (receiver), each the
        /// other's peer.
        #[test]
        fn exactly_the_two_ends_of_every_channel_pair_up(
            widths in proptest::collection::vec(1usize..=3, 2..=4),
            iterations in 0u64..6,
            forward_only in any::<bool>(),
        ) {
            let mut spec = PipelineSpec::with_widths(&widths);
            for s in 1..widths.len() {
                spec = spec.tensor(
                    TensorSpec::new(format!("h{s}"), DataType::F32, s as u32)
                        .from_stage(s - 1)
                        .to_stage(s),
                );
            }
            let options = if forward_only {
                Options::forward_only(iterations, 2)
            } else {
                Options::training(iterations)
            };
            for key in channels(&spec, &options).unwrap() {
                let ends: Vec<(usize, PairEnd)> = (0..spec.world_size)
                    .filter_map(|rank| pair_end(&key, rank).map(|end| (rank, end)))
                    .collect();
                prop_assert_ne!(key.sender, key.receiver);
                let mut want = vec![
                    (key.sender, PairEnd { rank: 0, peer: 1 }),
                    (key.receiver, PairEnd { rank: 1, peer: 0 }),
                ];
                want.sort_by_key(|&(rank, _)| rank);
                prop_assert_eq!(ends, want);
            }
        }

        /// Statuses and GPU ids cross the wire intact; the first failure
        /// is found whatever the messages.
        #[test]
        fn statuses_and_gpu_ids_round_trip(
            messages in proptest::collection::vec(proptest::option::of("[ -~]{0,40}"), 1..6),
            ordinal in 0usize..64,
            uuid in proptest::option::of(any::<[u8; 16]>()),
        ) {
            let statuses: Vec<Vec<u8>> = messages
                .iter()
                .map(|m| encode_status(&m.clone().map_or(Ok(()), Err)))
                .collect();
            let want = messages
                .iter()
                .enumerate()
                .find_map(|(rank, m)| m.clone().map(|m| (rank, m)));
            prop_assert_eq!(first_failure(&statuses), want);
            let id = GpuId { ordinal, uuid };
            prop_assert_eq!(GpuId::decode(&id.encode()), Some(id));
        }
    }

    #[test]
    fn one_gpu_under_both_ends_is_named() {
        let uuid = [0xab; 16];
        let a = GpuId {
            ordinal: 0,
            uuid: Some(uuid),
        };
        let b = GpuId {
            ordinal: 1,
            uuid: Some(uuid),
        };
        let text = shared_gpu(&key(0, 2), [a, b], true).unwrap_or_default();
        assert!(
            text.contains("ranks 0 and 2 both use GPU GPU-abababab-abab-abab-abab-abababababab")
                && text.contains("device 0 of rank 0, device 1 of rank 2"),
            "{text}"
        );
        // Another host, another GPU, or no UUID: not judged the same.
        assert_eq!(shared_gpu(&key(0, 2), [a, b], false), None);
        let other = GpuId {
            uuid: Some([1; 16]),
            ..b
        };
        assert_eq!(shared_gpu(&key(0, 2), [a, other], true), None);
        let unknown = GpuId { uuid: None, ..b };
        assert_eq!(shared_gpu(&key(0, 2), [a, unknown], true), None);
        assert_eq!(GpuId::decode(&[0; 9]), None);
        assert_eq!(first_failure(&[vec![1], vec![]]).map(|(r, _)| r), Some(1));
    }
}
