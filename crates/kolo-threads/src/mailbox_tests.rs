use super::*;
use std::thread;
use std::time::Duration;

const BACKOFF: &Backoff = &Backoff::for_ranks(2, 2);

fn backoff() -> &'static Backoff {
    BACKOFF
}

fn recv_i32(
    mail: &Mailboxes,
    health: &Health,
    dst: usize,
    src: usize,
    tag: u32,
    len: usize,
) -> Result<Vec<i32>, TransportError> {
    let mut buf = vec![0i32; len];
    mail.recv(dst, src, tag, &mut buf, health, backoff())?;
    Ok(buf)
}

/// Waits until `dst` has a receive from `src` posted.
fn until_posted(mail: &Mailboxes, dst: usize, src: usize, tag: u32) {
    while !mail.inboxes[dst]
        .boxes
        .lock()
        .posted
        .contains_key(&(src, tag))
    {
        thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn order_is_kept_per_source_and_tag() {
    let (mail, health) = (Mailboxes::new(3), Health::new(3));
    for i in 0..5 {
        mail.send(0, 2, 7, &[i]).unwrap();
        mail.send(1, 2, 7, &[100 + i]).unwrap();
        mail.send(0, 2, 8, &[200 + i]).unwrap();
    }
    for i in 0..5 {
        assert_eq!(recv_i32(&mail, &health, 2, 0, 8, 1).unwrap(), [200 + i]);
    }
    for i in 0..5 {
        assert_eq!(recv_i32(&mail, &health, 2, 1, 7, 1).unwrap(), [100 + i]);
        assert_eq!(recv_i32(&mail, &health, 2, 0, 7, 1).unwrap(), [i]);
    }
}

#[test]
fn a_send_fills_a_posted_receive() {
    let (mail, health) = (Mailboxes::new(2), Health::new(2));
    thread::scope(|s| {
        let receiver = s.spawn(|| recv_i32(&mail, &health, 1, 0, 3, 2));
        until_posted(&mail, 1, 0, 3);
        mail.send(0, 1, 3, &[4, 5]).unwrap();
        assert_eq!(receiver.join().unwrap().unwrap(), [4, 5]);
    });
    assert!(
        mail.inboxes[1].boxes.lock().queued.is_empty(),
        "no copy queued"
    );
}

#[test]
fn a_lent_buffer_is_copied_by_the_receiver_then_released() {
    let (mail, health) = (Mailboxes::new(2), Health::new(2));
    let send: Vec<i64> = (0..10_000).collect();
    let loan = mail.lend(0, 1, 1, &send, &health, backoff()).unwrap();
    thread::scope(|s| {
        let receiver = s.spawn(|| {
            let mut buf = vec![0i64; 10_000];
            mail.recv(1, 0, 1, &mut buf, &health, backoff())
                .map(|()| buf)
        });
        assert_eq!(loan.settle(true), Ok(()));
        assert_eq!(receiver.join().unwrap().unwrap(), send);
    });
}

#[test]
fn a_loan_fills_a_posted_receive() {
    let (mail, health) = (Mailboxes::new(2), Health::new(2));
    thread::scope(|s| {
        let receiver = s.spawn(|| recv_i32(&mail, &health, 1, 0, 2, 3));
        until_posted(&mail, 1, 0, 2);
        let loan = mail.lend(0, 1, 2, &[7, 8, 9], &health, backoff());
        assert_eq!(loan.unwrap().settle(true), Ok(()));
        assert_eq!(receiver.join().unwrap().unwrap(), [7, 8, 9]);
    });
}

#[test]
fn a_loan_to_a_departed_rank_is_withdrawn() {
    let (mail, health) = (Mailboxes::new(2), Health::new(2));
    let send = [1i32; 4];
    let loan = mail.lend(0, 1, 0, &send, &health, backoff()).unwrap();
    thread::scope(|s| {
        let lender = s.spawn(|| loan.settle(true));
        thread::sleep(Duration::from_millis(20));
        health.mark(1, "rank 1 left the communicator".into(), 0);
        mail.wake_all();
        assert!(matches!(
            lender.join().unwrap(),
            Err(TransportError::PeerFailed { rank: 1, .. })
        ));
    });
    assert!(mail.inboxes[1].boxes.lock().queued.is_empty(), "withdrawn");
    // Dropped without settling: withdrawn too.
    drop(mail.lend(0, 1, 0, &send, &health, backoff()).unwrap());
    assert!(mail.inboxes[1].boxes.lock().queued.is_empty());
}

#[test]
fn a_departed_sender_delivers_then_fails() {
    let (mail, health) = (Mailboxes::new(2), Health::new(2));
    mail.send(0, 1, 0, &[1]).unwrap();
    health.mark(0, "rank 0 left the communicator".into(), 0);
    assert_eq!(recv_i32(&mail, &health, 1, 0, 0, 1).unwrap(), [1]);
    let err = recv_i32(&mail, &health, 1, 0, 0, 1).unwrap_err();
    assert_eq!(
        err,
        TransportError::PeerFailed {
            rank: 0,
            message: "rank 0 left the communicator".into()
        }
    );
}

#[test]
fn a_sleeping_receiver_wakes_when_its_peer_fails_and_withdraws() {
    let (mail, health) = (Mailboxes::new(2), Health::new(2));
    thread::scope(|s| {
        let receiver = s.spawn(|| recv_i32(&mail, &health, 1, 0, 0, 1));
        until_posted(&mail, 1, 0, 0);
        thread::sleep(Duration::from_millis(20));
        health.mark(0, "boom".into(), 0);
        mail.wake_all();
        assert!(matches!(
            receiver.join().unwrap(),
            Err(TransportError::PeerFailed { rank: 0, .. })
        ));
    });
    assert!(mail.inboxes[1].boxes.lock().posted.is_empty(), "withdrawn");
}

#[test]
fn wrong_length_or_type_is_an_error_naming_both_on_every_path() {
    let (mail, health) = (Mailboxes::new(2), Health::new(2));
    let check = |err: TransportError, words: [&str; 2]| {
        let text = err.to_string();
        assert!(text.contains("recv from rank 0 with tag 0"), "{text}");
        assert!(words.iter().all(|w| text.contains(w)), "{text}");
    };
    // Queued eager copies.
    mail.send(0, 1, 0, &[1, 2, 3]).unwrap();
    check(
        recv_i32(&mail, &health, 1, 0, 0, 2).unwrap_err(),
        ["3 elements", "has 2"],
    );
    mail.send(0, 1, 0, &[1.0f32]).unwrap();
    check(
        recv_i32(&mail, &health, 1, 0, 0, 1).unwrap_err(),
        ["f32", "i32"],
    );
    // Lent buffers: the receive fails, the loan is released.
    let send = [1u8; 5];
    let loan = mail.lend(0, 1, 0, &send, &health, backoff()).unwrap();
    check(
        recv_i32(&mail, &health, 1, 0, 0, 5).unwrap_err(),
        ["u8", "i32"],
    );
    assert_eq!(loan.settle(true), Ok(()));
    // Posted receives: the sender's copy is refused, the receive fails.
    thread::scope(|s| {
        let receiver = s.spawn(|| recv_i32(&mail, &health, 1, 0, 0, 4));
        until_posted(&mail, 1, 0, 0);
        mail.send(0, 1, 0, &[1, 2]).unwrap();
        check(
            receiver.join().unwrap().unwrap_err(),
            ["2 elements", "has 4"],
        );
    });
}
