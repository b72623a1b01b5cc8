//! The store and the rendezvous over real TCP on loopback: every
//! operation between clients, timeouts, clients refused for speaking
//! another protocol, an oversized frame or a missing token (while the
//! others are served on), an unreachable store, and jobs whose ranks
//! claim one rank twice or disagree on the world size; the
//! rendezvous as a control plane.

use kolo_rendezvous::wire::{encode, Hello, MAGIC, VERSION};
use kolo_rendezvous::{Client, LaunchVars, Rendezvous, RendezvousError, Server};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const SHORT: Duration = Duration::from_secs(2);
const LONG: Duration = Duration::from_secs(20);

fn store(token: Option<&str>) -> (Server, String) {
    let server = Server::bind("127.0.0.1:0", token.map(str::to_owned)).unwrap();
    let address = server.local_addr().to_string();
    (server, address)
}

/// A port nothing listens on (bound, then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn every_operation_between_two_clients() {
    let (_server, address) = store(None);
    let mut a = Client::connect(&address, None, LONG).unwrap();
    let mut b = Client::connect(&address, None, LONG).unwrap();
    // A get waits for a later set by another client.
    let waiter = {
        let address = address.clone();
        std::thread::spawn(move || {
            let mut c = Client::connect(&address, None, LONG).unwrap();
            c.get("late", LONG).unwrap()
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    a.set("late", b"here").unwrap();
    assert_eq!(waiter.join().unwrap(), b"here");
    assert_eq!(b.get("late", SHORT).unwrap(), b"here");
    assert_eq!(a.add("n", 5).unwrap(), 5);
    assert_eq!(b.add("n", -2).unwrap(), 3);
    assert_eq!(a.compare_set("c", None, b"x").unwrap(), Some(b"x".to_vec()));
    assert_eq!(
        b.compare_set("c", None, b"y").unwrap(),
        Some(b"x".to_vec()),
        "the first compare-set wins"
    );
    b.wait(&["late".into(), "n".into(), "c".into()], SHORT)
        .unwrap();
    assert!(a.delete("c").unwrap());
    assert!(!b.delete("c").unwrap());
}

#[test]
fn a_wait_that_outlives_its_timeout_names_the_missing_keys() {
    let (_server, address) = store(None);
    let mut client = Client::connect(&address, None, LONG).unwrap();
    client.set("there", b"1").unwrap();
    let start = Instant::now();
    let err = client
        .wait(
            &["there".into(), "absent".into()],
            Duration::from_millis(200),
        )
        .unwrap_err();
    assert!(start.elapsed() < LONG);
    assert!(matches!(err, RendezvousError::Timeout { .. }), "{err}");
    assert!(err.to_string().contains("absent"), "{err}");
    assert!(!err.to_string().contains("there,"), "{err}");
    // The connection still works.
    assert_eq!(client.add("k", 1).unwrap(), 1);
}

#[test]
fn add_on_a_value_that_is_no_number_is_an_error() {
    let (_server, address) = store(None);
    let mut client = Client::connect(&address, None, LONG).unwrap();
    client.set("word", b"hello").unwrap();
    let err = client.add("word", 1).unwrap_err();
    assert!(err.to_string().contains("not a number"), "{err}");
    assert_eq!(client.add("other", 2).unwrap(), 2);
}

/// Reads the store's one reply to a raw client, if any.
fn raw_reply(stream: &mut TcpStream) -> Vec<u8> {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply);
    reply
}

#[test]
fn strangers_are_refused_and_the_others_served_on() {
    let (server, address) = store(None);
    let mut good = Client::connect(&address, None, LONG).unwrap();
    good.set("k", b"v").unwrap();

    // Another protocol.
    let mut http = TcpStream::connect(&address).unwrap();
    http.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let reply = raw_reply(&mut http);
    assert!(
        String::from_utf8_lossy(&reply).contains("rendezvous"),
        "{reply:?}"
    );

    // A hello, then a frame announcing 4 GiB.
    let mut greedy = TcpStream::connect(&address).unwrap();
    greedy
        .write_all(&encode(&Hello {
            magic: MAGIC,
            version: VERSION,
            token: None,
        }))
        .unwrap();
    greedy.write_all(&u32::MAX.to_le_bytes()).unwrap();
    let reply = raw_reply(&mut greedy);
    assert!(
        String::from_utf8_lossy(&reply).contains("more than"),
        "{reply:?}"
    );

    // Another version.
    let mut old = TcpStream::connect(&address).unwrap();
    old.write_all(&encode(&Hello {
        magic: MAGIC,
        version: VERSION + 1,
        token: None,
    }))
    .unwrap();
    let reply = raw_reply(&mut old);
    assert!(
        String::from_utf8_lossy(&reply).contains("version"),
        "{reply:?}"
    );

    // The client that spoke properly is still served.
    assert_eq!(good.get("k", SHORT).unwrap(), b"v");
    assert_eq!(good.add("n", 1).unwrap(), 1);
    let deadline = Instant::now() + LONG;
    while server.connections() > 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(server.connections(), 1, "the strangers' connections closed");
}

#[test]
fn with_a_token_only_clients_presenting_it_are_served() {
    let (_server, address) = store(Some("s3cret"));
    for token in [None, Some("wrong")] {
        let err = Client::connect(&address, token, LONG).unwrap_err();
        assert!(
            matches!(&err, RendezvousError::Refused { address: a, reason } if *a == address && reason.contains("KOLO_RENDEZVOUS_TOKEN")),
            "{err}"
        );
    }
    let mut client = Client::connect(&address, Some("s3cret"), LONG).unwrap();
    client.set("k", b"v").unwrap();
}

#[test]
fn an_unreachable_store_is_an_error_naming_its_address() {
    let address = format!("127.0.0.1:{}", free_port());
    let start = Instant::now();
    let err = Client::connect(&address, None, Duration::from_millis(300)).unwrap_err();
    assert!(start.elapsed() < LONG);
    assert!(
        matches!(&err, RendezvousError::Unreachable { address: a, .. } if *a == address),
        "{err}"
    );
    assert!(err.to_string().contains(&address), "{err}");
}

#[test]
fn the_store_listens_only_on_its_address() {
    let (_server, address) = store(None);
    let port = address.rsplit(':').next().unwrap();
    // Another loopback address of this host, where nothing listens.
    let other = format!("127.0.0.2:{port}");
    let err = Client::connect(&other, None, Duration::from_millis(300)).unwrap_err();
    assert!(matches!(err, RendezvousError::Unreachable { .. }), "{err}");
}

fn vars(port: u16, rank: usize, world_size: usize, timeout: Duration) -> LaunchVars {
    LaunchVars {
        master_addr: "127.0.0.1".into(),
        master_port: port,
        rank,
        world_size,
        local_rank: rank,
        local_world_size: world_size,
        token: None,
        timeout,
    }
}

#[test]
fn eight_ranks_join_and_exchange() {
    let port = free_port();
    let ranks: Vec<_> = (0..8)
        .map(|rank| {
            std::thread::spawn(move || {
                let mut rendezvous = Rendezvous::join(vars(port, rank, 8, LONG))?;
                let all = rendezvous.allgather("who", format!("r{rank}").as_bytes())?;
                let root = rendezvous.broadcast("id", 3, format!("from {rank}").as_bytes())?;
                let again = rendezvous.allgather("who", &[rank as u8])?;
                rendezvous.close()?;
                Ok::<_, RendezvousError>((all, root, again))
            })
        })
        .collect();
    for handle in ranks {
        let (all, root, again) = handle.join().unwrap().unwrap();
        let want: Vec<Vec<u8>> = (0..8).map(|r| format!("r{r}").into_bytes()).collect();
        assert_eq!(all, want);
        assert_eq!(root, b"from 3");
        assert_eq!(again, (0..8u8).map(|r| vec![r]).collect::<Vec<_>>());
    }
}

#[test]
fn two_processes_claiming_one_rank_are_refused() {
    let port = free_port();
    let timeout = Duration::from_secs(3);
    let zero = std::thread::spawn(move || Rendezvous::join(vars(port, 0, 3, timeout)).map(drop));
    let first = std::thread::spawn(move || Rendezvous::join(vars(port, 1, 3, timeout)).map(drop));
    let second = std::thread::spawn(move || Rendezvous::join(vars(port, 1, 3, timeout)).map(drop));
    let outcomes = [first.join().unwrap(), second.join().unwrap()];
    let claimed_twice = outcomes
        .iter()
        .filter(|o| matches!(o, Err(RendezvousError::RankClaimedTwice { rank: 1, .. })))
        .count();
    assert_eq!(claimed_twice, 1, "{outcomes:?}");
    // Rank 2 never came: the others time out naming the missing keys.
    let err = zero.join().unwrap().unwrap_err();
    assert!(matches!(err, RendezvousError::Timeout { .. }), "{err}");
}

#[test]
fn ranks_that_disagree_on_the_world_size_fail_naming_both() {
    let port = free_port();
    let timeout = Duration::from_secs(3);
    let zero = std::thread::spawn(move || Rendezvous::join(vars(port, 0, 2, timeout)).map(drop));
    // Let rank 0 set the world size first.
    std::thread::sleep(Duration::from_millis(300));
    let err = Rendezvous::join(vars(port, 1, 4, timeout)).unwrap_err();
    match &err {
        RendezvousError::WorldSizeMismatch {
            rank,
            mine,
            other_rank,
            theirs,
        } => assert_eq!((*rank, *mine, *other_rank, *theirs), (1, 4, 0, 2)),
        other => panic!("expected a world size mismatch, got {other}"),
    }
    assert!(err.to_string().contains("world size of 4"), "{err}");
    assert!(
        zero.join().unwrap().is_err(),
        "rank 0 waits for rank 1 in vain"
    );
}

#[test]
fn the_rendezvous_is_a_control_plane() {
    use kolo_transport::{BitOp, Controller, Topology};
    let port = free_port();
    let ranks: Vec<_> = (0..3)
        .map(|rank| {
            std::thread::spawn(
                move || -> Result<_, Box<dyn std::error::Error + Send + Sync>> {
                    let mut ctrl = Rendezvous::join(vars(port, rank, 3, LONG))?;
                    assert_eq!((Topology::rank(&ctrl), Topology::size(&ctrl)), (rank, 3));
                    let gathered = ctrl.gather_bytes(&[rank as u8; 2], 1)?;
                    let root = ctrl.broadcast_bytes(format!("id of {rank}").as_bytes(), 2)?;
                    let all = ctrl.allgather_bytes(&[rank as u8])?;
                    ctrl.control_barrier()?;
                    let mut and = [u64::MAX, 0b111 ^ (1 << rank)];
                    ctrl.bitwise_allreduce(&mut and, BitOp::And)?;
                    let mut or = [1u64 << rank];
                    ctrl.bitwise_allreduce(&mut or, BitOp::Or)?;
                    let bad_root = ctrl.broadcast_bytes(b"x", 3).unwrap_err().to_string();
                    ctrl.close()?;
                    Ok((gathered, root, all, and, or, bad_root))
                },
            )
        })
        .collect();
    for (rank, handle) in ranks.into_iter().enumerate() {
        let (gathered, root, all, and, or, bad_root) = handle.join().unwrap().unwrap();
        let want = (rank == 1).then(|| (0..3u8).map(|r| vec![r; 2]).collect::<Vec<_>>());
        assert_eq!(gathered, want);
        assert_eq!(root, b"id of 2");
        assert_eq!(all, (0..3u8).map(|r| vec![r]).collect::<Vec<_>>());
        assert_eq!(and, [u64::MAX, 0]);
        assert_eq!(or, [0b111]);
        assert!(bad_root.contains("root 3"), "{bad_root}");
    }
}
