//! The pure half of the copy-engine rounds (see `safe/copy_engine.rs`): what
//! each rank posts through the board, and which copies a rank makes given
//! every rank's posts, checked identically on every rank.

use crate::error::NcclError;

/// One point-to-point buffer posted for a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Post {
    pub(crate) peer: usize,
    pub(crate) ptr: u64,
    pub(crate) bytes: u64,
}

/// What one rank posts: its ready event, the send buffers of its
/// all-gathers (bytes per rank), its sends and its receives.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Posts {
    pub(crate) ready_event: u64,
    pub(crate) gathers: Vec<(u64, u64)>,
    pub(crate) sends: Vec<Post>,
    pub(crate) recvs: Vec<Post>,
}

impl Posts {
    /// Little-endian u64 words: event, then each list as a length and its items.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut words = vec![self.ready_event, self.gathers.len() as u64];
        for &(ptr, bytes) in &self.gathers {
            words.extend([ptr, bytes]);
        }
        for list in [&self.sends, &self.recvs] {
            words.push(list.len() as u64);
            for p in list {
                words.extend([p.peer as u64, p.ptr, p.bytes]);
            }
        }
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Posts, NcclError> {
        let bad = || {
            NcclError::InvalidArgument(format!(
                "malformed copy-engine post of {} bytes",
                bytes.len()
            ))
        };
        if bytes.len() % 8 != 0 {
            return Err(bad());
        }
        let mut words = bytes.chunks_exact(8).map(|c| {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            u64::from_le_bytes(w)
        });
        let mut next = || words.next().ok_or_else(bad);
        let ready_event = next()?;
        let mut gathers = Vec::new();
        for _ in 0..next()? {
            gathers.push((next()?, next()?));
        }
        let mut lists = [Vec::new(), Vec::new()];
        for list in &mut lists {
            for _ in 0..next()? {
                let peer = usize::try_from(next()?).map_err(|_| bad())?;
                list.push(Post {
                    peer,
                    ptr: next()?,
                    bytes: next()?,
                });
            }
        }
        let [sends, recvs] = lists;
        Ok(Posts {
            ready_event,
            gathers,
            sends,
            recvs,
        })
    }
}

/// One copy this rank makes: `bytes` from `src` (in `src_rank`'s device)
/// to `dst` (in this rank's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pull {
    pub(crate) src_rank: usize,
    pub(crate) src: u64,
    pub(crate) dst: u64,
    pub(crate) bytes: u64,
}

/// The copies `rank` makes, given every rank's posts and the receive
/// buffers of its own all-gathers. Checks every rank's posts the same way
/// (equal all-gathers, sends matched in order by receives of equal size),
/// so all ranks agree on an error.
pub(crate) fn plan_pulls(
    rank: usize,
    posts: &[Posts],
    gather_dsts: &[u64],
) -> Result<Vec<Pull>, NcclError> {
    let size = posts.len();
    let invalid = NcclError::InvalidArgument;
    let mine = posts
        .get(rank)
        .ok_or_else(|| invalid(format!("rank {rank} of {size} posted nothing")))?;
    let mut pulls = Vec::new();
    for (g, &(_, bytes)) in mine.gathers.iter().enumerate() {
        let dst = *gather_dsts
            .get(g)
            .ok_or_else(|| invalid(format!("all-gather {g} has no receive buffer")))?;
        for (p, peer_posts) in posts.iter().enumerate() {
            match peer_posts.gathers.get(g) {
                Some(&(src, b)) if b == bytes => pulls.push(Pull {
                    src_rank: p,
                    src,
                    dst: dst + p as u64 * bytes,
                    bytes,
                }),
                Some(&(_, b)) => {
                    return Err(invalid(format!(
                        "all-gather {g}: rank {p} contributes {b} bytes but rank {rank} {bytes}"
                    )))
                }
                None => {
                    return Err(invalid(format!(
                        "all-gather {g}: rank {p} scheduled only {} all-gathers",
                        peer_posts.gathers.len()
                    )))
                }
            }
        }
    }
    if posts.iter().any(|p| p.gathers.len() != mine.gathers.len()) {
        return Err(invalid(
            "ranks scheduled different numbers of all-gathers".into(),
        ));
    }
    for (d, dst_posts) in posts.iter().enumerate() {
        for (s, src_posts) in posts.iter().enumerate() {
            let sends: Vec<&Post> = src_posts.sends.iter().filter(|p| p.peer == d).collect();
            let recvs: Vec<&Post> = dst_posts.recvs.iter().filter(|p| p.peer == s).collect();
            if sends.len() != recvs.len() {
                return Err(invalid(format!(
                    "rank {s} sends {} messages to rank {d}, which receives {} from it",
                    sends.len(),
                    recvs.len()
                )));
            }
            for (i, (send, recv)) in sends.iter().zip(&recvs).enumerate() {
                if send.bytes != recv.bytes {
                    return Err(invalid(format!(
                        "message {i} from rank {s} to rank {d}: {} bytes sent, {} expected",
                        send.bytes, recv.bytes
                    )));
                }
                if d == rank {
                    pulls.push(Pull {
                        src_rank: s,
                        src: send.ptr,
                        dst: recv.ptr,
                        bytes: send.bytes,
                    });
                }
            }
        }
    }
    if let Some(p) = posts
        .iter()
        .flat_map(|p| p.sends.iter().chain(&p.recvs))
        .find(|p| p.peer >= size)
    {
        return Err(invalid(format!(
            "peer {} out of range for {size} ranks",
            p.peer
        )));
    }
    Ok(pulls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post(peer: usize, ptr: u64, bytes: u64) -> Post {
        Post { peer, ptr, bytes }
    }

    #[test]
    fn posts_round_trip_and_reject_garbage() {
        let p = Posts {
            ready_event: 0xdead,
            gathers: vec![(0x1000, 64)],
            sends: vec![post(1, 0x2000, 8)],
            recvs: vec![post(1, 0x3000, 8), post(0, 0x4000, 16)],
        };
        assert_eq!(Posts::decode(&p.encode()).unwrap(), p);
        assert!(Posts::decode(&[1, 2, 3]).is_err());
        assert!(Posts::decode(&p.encode()[..40]).is_err());
    }

    #[test]
    fn pulls_all_gather_blocks_and_matched_messages() {
        let posts = vec![
            Posts {
                ready_event: 1,
                gathers: vec![(0xa0, 4)],
                sends: vec![post(1, 0x10, 8)],
                recvs: vec![],
            },
            Posts {
                ready_event: 2,
                gathers: vec![(0xb0, 4)],
                sends: vec![],
                recvs: vec![post(0, 0x20, 8)],
            },
        ];
        let pulls = plan_pulls(1, &posts, &[0x900]).unwrap();
        assert_eq!(
            pulls,
            vec![
                Pull {
                    src_rank: 0,
                    src: 0xa0,
                    dst: 0x900,
                    bytes: 4
                },
                Pull {
                    src_rank: 1,
                    src: 0xb0,
                    dst: 0x904,
                    bytes: 4
                },
                Pull {
                    src_rank: 0,
                    src: 0x10,
                    dst: 0x20,
                    bytes: 8
                },
            ]
        );
        // Rank 0 pulls only its own gather blocks.
        assert_eq!(plan_pulls(0, &posts, &[0x500]).unwrap().len(), 2);
    }

    #[test]
    fn every_rank_sees_the_same_mismatch() {
        let posts = vec![
            Posts {
                sends: vec![post(1, 0x10, 8)],
                ..Posts::default()
            },
            Posts {
                recvs: vec![post(0, 0x20, 4)],
                ..Posts::default()
            },
        ];
        for rank in 0..2 {
            let e = plan_pulls(rank, &posts, &[]).unwrap_err();
            assert!(e.to_string().contains("8 bytes sent, 4 expected"), "{e}");
        }
        let unmatched = vec![
            Posts {
                sends: vec![post(1, 0x10, 8)],
                ..Posts::default()
            },
            Posts::default(),
        ];
        assert!(plan_pulls(1, &unmatched, &[])
            .unwrap_err()
            .to_string()
            .contains("receives 0"));
        let uneven = vec![
            Posts {
                gathers: vec![(1, 4)],
                ..Posts::default()
            },
            Posts {
                gathers: vec![(2, 8)],
                ..Posts::default()
            },
        ];
        assert!(plan_pulls(0, &uneven, &[0]).is_err());
    }

    #[test]
    fn rings_and_gathers_plan_at_three_four_and_eight_ranks() {
        for n in [3usize, 4, 8] {
            // Rank r gathers 64 bytes from 0x1000 * (r + 1) and sends two
            // messages right (8 and 16 bytes), receiving two from the left.
            let posts: Vec<Posts> = (0..n)
                .map(|r| {
                    let base = 0x1000 * (r as u64 + 1);
                    Posts {
                        ready_event: r as u64,
                        gathers: vec![(base, 64)],
                        sends: vec![
                            post((r + 1) % n, base + 0x100, 8),
                            post((r + 1) % n, base + 0x200, 16),
                        ],
                        recvs: vec![
                            post((r + n - 1) % n, base + 0x300, 8),
                            post((r + n - 1) % n, base + 0x400, 16),
                        ],
                    }
                })
                .collect();
            for rank in 0..n {
                let pulls = plan_pulls(rank, &posts, &[0x9000]).unwrap();
                assert_eq!(pulls.len(), n + 2, "n = {n}");
                for (p, pull) in pulls.iter().take(n).enumerate() {
                    assert_eq!(
                        (pull.src_rank, pull.dst, pull.bytes),
                        (p, 0x9000 + 64 * p as u64, 64)
                    );
                }
                let left = (rank + n - 1) % n;
                let lbase = 0x1000 * (left as u64 + 1);
                let mine = 0x1000 * (rank as u64 + 1);
                assert_eq!(
                    pulls[n],
                    Pull {
                        src_rank: left,
                        src: lbase + 0x100,
                        dst: mine + 0x300,
                        bytes: 8
                    }
                );
                assert_eq!(
                    pulls[n + 1],
                    Pull {
                        src_rank: left,
                        src: lbase + 0x200,
                        dst: mine + 0x400,
                        bytes: 16
                    }
                );
            }
            // A rank that receives from the wrong side: every rank sees it.
            let mut bad = posts.clone();
            bad[1].recvs[0].peer = 2 % n;
            for rank in 0..n {
                assert!(plan_pulls(rank, &bad, &[0x9000]).is_err(), "n = {n}");
            }
        }
    }
}
