//! The pure steps of bootstrapping a communicator over a control plane:
//! status messages every rank agrees on, NCCL's unique id on the wire, and
//! the layout checks.

use crate::error::NcclError;
use crate::options::{CopyEngine, Mode};
use kolo_transport::Controller;

/// All ranks learn whether `local` failed anywhere: the first failing rank
/// is reported on every rank.
pub(crate) fn agree<C: Controller + ?Sized>(
    ctrl: &mut C,
    what: &str,
    local: Result<(), NcclError>,
) -> Result<(), NcclError> {
    let statuses = ctrl.allgather_bytes(&encode_status(local.map(|()| Vec::new())))?;
    match first_failure(&statuses) {
        Some((rank, message)) => Err(NcclError::Bootstrap {
            rank,
            message: format!("{what}: {message}"),
        }),
        None => Ok(()),
    }
}

/// `[1, payload...]` for success, `[0, message...]` for failure.
pub(crate) fn encode_status(status: Result<Vec<u8>, NcclError>) -> Vec<u8> {
    match status {
        Ok(payload) => std::iter::once(1).chain(payload).collect(),
        Err(e) => std::iter::once(0)
            .chain(e.to_string().into_bytes())
            .collect(),
    }
}

/// The first rank whose status is a failure, with its message.
pub(crate) fn first_failure(statuses: &[Vec<u8>]) -> Option<(usize, String)> {
    statuses
        .iter()
        .enumerate()
        .find_map(|(rank, s)| match s.split_first() {
            Some((1, _)) => None,
            Some((_, message)) => Some((rank, String::from_utf8_lossy(message).into_owned())),
            None => Some((rank, "sent an empty status".into())),
        })
}

/// Rank 0's broadcast: its unique id's bytes (checked by
/// `RawComm::init`), or why it could not make one.
pub(crate) fn decode_unique_id(msg: &[u8]) -> Result<Vec<u8>, NcclError> {
    match msg.split_first() {
        Some((1, bytes)) => Ok(bytes.to_vec()),
        Some((_, why)) => Err(NcclError::Bootstrap {
            rank: 0,
            message: format!("ncclGetUniqueId: {}", String::from_utf8_lossy(why)),
        }),
        None => Err(NcclError::Bootstrap {
            rank: 0,
            message: "rank 0 sent no unique id".into(),
        }),
    }
}

/// The wire form of a requested mode (`None`: detect).
pub(crate) fn mode_code(mode: Option<Mode>) -> u8 {
    match mode {
        None => 0,
        Some(Mode::ProcessPerGpu) => 1,
        Some(Mode::ThreadPerGpu) => 2,
    }
}

/// The mode of a communicator from every rank's `[found rank 0's board,
/// requested mode]`: the same answer on every rank. Thread mode needs
/// every rank in this process; without a request it is chosen for two or
/// more ranks, or one rank with copy engines (one MPI process alone is in
/// process mode).
pub(crate) fn choose_mode(
    statuses: &[Vec<u8>],
    copy_engine: CopyEngine,
) -> Result<Mode, NcclError> {
    let malformed = |rank: usize| NcclError::Bootstrap {
        rank,
        message: "sent a malformed mode status".into(),
    };
    let mut parsed = Vec::with_capacity(statuses.len());
    for (rank, s) in statuses.iter().enumerate() {
        match s.as_slice() {
            [found, code @ 0..=2] => parsed.push((*found == 1, *code)),
            _ => return Err(malformed(rank)),
        }
    }
    let requested = parsed.first().map(|&(_, code)| code).unwrap_or(0);
    if let Some(rank) = parsed.iter().position(|&(_, code)| code != requested) {
        return Err(NcclError::InvalidArgument(format!(
            "ranks 0 and {rank} ask for different modes ({} and {})",
            mode_name(requested),
            mode_name(parsed[rank].1)
        )));
    }
    let in_process = parsed.iter().all(|&(found, _)| found);
    match requested {
        1 => Ok(Mode::ProcessPerGpu),
        2 if in_process => Ok(Mode::ThreadPerGpu),
        2 => Err(NcclError::InvalidArgument(format!(
            "thread mode was requested, but rank {} is not a thread of rank 0's process",
            parsed.iter().position(|&(found, _)| !found).unwrap_or(0)
        ))),
        _ if in_process && (parsed.len() > 1 || copy_engine == CopyEngine::On) => {
            Ok(Mode::ThreadPerGpu)
        }
        _ => Ok(Mode::ProcessPerGpu),
    }
}

fn mode_name(code: u8) -> &'static str {
    match code {
        1 => "process mode",
        2 => "thread mode",
        _ => "detection",
    }
}

/// Two ranks of one process on one GPU would deadlock NCCL; copy engines
/// need thread mode. Every rank sees the same inputs, so all agree.
pub(crate) fn check_layout(
    mode: Mode,
    copy_engine: CopyEngine,
    ordinals: &[usize],
) -> Result<(), NcclError> {
    if mode == Mode::ThreadPerGpu {
        for (a, &oa) in ordinals.iter().enumerate() {
            if let Some(b) = ordinals[a + 1..].iter().position(|&ob| ob == oa) {
                return Err(NcclError::InvalidArgument(format!(
                    "ranks {a} and {} of this process both use device {oa}; NCCL needs one GPU per rank",
                    a + 1 + b
                )));
            }
        }
    }
    if copy_engine == CopyEngine::On && mode != Mode::ThreadPerGpu {
        return Err(NcclError::InvalidArgument(
            "CopyEngine::On needs every rank in this process (one thread per GPU)".into(),
        ));
    }
    Ok(())
}

pub(crate) fn u64_from(bytes: &[u8]) -> Result<u64, NcclError> {
    <[u8; 8]>::try_from(bytes)
        .map(u64::from_le_bytes)
        .map_err(|_| NcclError::Bootstrap {
            rank: 0,
            message: format!("expected an 8-byte value, got {} bytes", bytes.len()),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_name_the_first_failing_rank() {
        let ok = encode_status(Ok(vec![]));
        let bad = encode_status(Err(NcclError::NoDevice {
            reason: "device 3 was requested but 2 are visible".into(),
        }));
        assert_eq!(first_failure(&[ok.clone(), ok.clone()]), None);
        let (rank, message) = first_failure(&[ok, bad.clone(), bad]).unwrap();
        assert_eq!(rank, 1);
        assert!(message.contains("device 3"), "{message}");
        assert_eq!(first_failure(&[vec![]]).map(|(r, _)| r), Some(0));
    }

    #[test]
    fn unique_ids_cross_the_control_plane_intact() {
        let id: Vec<u8> = (0..128).map(|i: u8| i.wrapping_mul(37)).collect();
        let back = decode_unique_id(&encode_status(Ok(id.clone()))).unwrap();
        assert_eq!(back, id);
        let e = decode_unique_id(&encode_status(Err(NcclError::LibraryMissing {
            library: "libnccl",
            hint: "x".into(),
        })))
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("ncclGetUniqueId: libnccl is not available"),
            "{e}"
        );
        assert!(decode_unique_id(&[]).is_err());
    }

    #[test]
    fn one_process_alone_is_process_mode_unless_asked() {
        let alone = [vec![1, 0]];
        assert_eq!(
            choose_mode(&alone, CopyEngine::Off),
            Ok(Mode::ProcessPerGpu)
        );
        assert_eq!(choose_mode(&alone, CopyEngine::On), Ok(Mode::ThreadPerGpu));
        let asked = [vec![1, mode_code(Some(Mode::ThreadPerGpu))]];
        assert_eq!(choose_mode(&asked, CopyEngine::Off), Ok(Mode::ThreadPerGpu));
        let threads = [vec![1, 0], vec![1, 0]];
        assert_eq!(
            choose_mode(&threads, CopyEngine::Off),
            Ok(Mode::ThreadPerGpu)
        );
        let processes = [vec![1, 0], vec![0, 0]];
        assert_eq!(
            choose_mode(&processes, CopyEngine::Off),
            Ok(Mode::ProcessPerGpu)
        );
        let forced = [vec![1, 1], vec![1, 1]];
        assert_eq!(
            choose_mode(&forced, CopyEngine::Off),
            Ok(Mode::ProcessPerGpu)
        );
    }

    #[test]
    fn impossible_or_disagreeing_modes_fail_on_every_rank() {
        let e = choose_mode(&[vec![1, 2], vec![0, 2]], CopyEngine::Off).unwrap_err();
        assert!(e.to_string().contains("rank 1 is not a thread"), "{e}");
        let e = choose_mode(&[vec![1, 0], vec![1, 2]], CopyEngine::Off).unwrap_err();
        assert!(e.to_string().contains("different modes"), "{e}");
        assert!(choose_mode(&[vec![1]], CopyEngine::Off).is_err());
        assert!(choose_mode(&[vec![1, 7]], CopyEngine::Off).is_err());
    }

    #[test]
    fn layouts_that_cannot_work_are_refused_everywhere() {
        assert!(check_layout(Mode::ThreadPerGpu, CopyEngine::On, &[0, 1]).is_ok());
        assert!(check_layout(Mode::ProcessPerGpu, CopyEngine::Off, &[0, 0]).is_ok());
        let e = check_layout(Mode::ThreadPerGpu, CopyEngine::Off, &[0, 1, 1]).unwrap_err();
        assert!(
            e.to_string()
                .contains("ranks 1 and 2 of this process both use device 1"),
            "{e}"
        );
        let e = check_layout(Mode::ProcessPerGpu, CopyEngine::On, &[0, 1]).unwrap_err();
        assert!(e.to_string().contains("one thread per GPU"), "{e}");
    }
}
