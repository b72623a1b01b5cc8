//! The store's TCP server: one thread accepting on the address it was
//! given (and no other), one thread per connection (at most
//! [`MAX_CONNECTIONS`]), the [`Store`] behind one lock with a condition
//! variable for the gets and waits. A connection that does not open with
//! this protocol's hello (or the job's token), announces an oversized
//! frame or sends garbage is answered with why and closed; the others are
//! served on.

use crate::error::{RendezvousError, Result};
use crate::store::{Outcome, Store};
use crate::wire::{
    decode, read_frame, write_message, FrameError, Hello, Reply, Request, MAGIC, MAX_FRAME_BYTES,
    VERSION,
};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The most connections served at once.
pub const MAX_CONNECTIONS: usize = 4096;
/// How long a new connection may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest hello frame.
const MAX_HELLO_BYTES: usize = 4096;

/// What the accepting thread and the connections share.
struct Shared {
    store: Mutex<Store>,
    changed: Condvar,
    token: Option<String>,
    stop: AtomicBool,
    connections: AtomicUsize,
    /// The open connections, to close them at shutdown.
    open: Mutex<Vec<(usize, TcpStream)>>,
}

/// A running store (see the module docs). Dropping it stops it: the
/// listener closes, every connection is shut and every waiter answered.
pub struct Server {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("addr", &self.addr).finish()
    }
}

impl Server {
    /// Serves a new, empty store on `addr` (port 0: any free port, see
    /// [`Server::local_addr`]). With a `token`, only clients presenting it
    /// are served.
    pub fn bind(addr: &str, token: Option<String>) -> Result<Server> {
        let resolved: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| io_error(addr, &e))?
            .collect();
        let listener = TcpListener::bind(&resolved[..]).map_err(|e| io_error(addr, &e))?;
        let local = listener.local_addr().map_err(|e| io_error(addr, &e))?;
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::default()),
            changed: Condvar::new(),
            token,
            stop: AtomicBool::new(false),
            connections: AtomicUsize::new(0),
            open: Mutex::new(Vec::new()),
        });
        let accepting = Arc::clone(&shared);
        let accept = std::thread::Builder::new()
            .name("kolo-rendezvous".into())
            .spawn(move || accept_loop(listener, accepting))
            .map_err(|e| io_error(addr, &e))?;
        tracing::debug!(%local, "rendezvous store listening");
        Ok(Server {
            addr: local,
            shared,
            accept: Some(accept),
        })
    }

    /// The address the store listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections served now.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::Acquire)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // Wakes the accepting thread, blocked in accept().
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Ok(open) = self.shared.open.lock() {
            for (_, stream) in open.iter() {
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
        }
        self.shared.changed.notify_all();
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

fn io_error(addr: &str, e: &std::io::Error) -> RendezvousError {
    RendezvousError::Io {
        address: addr.to_owned(),
        reason: e.to_string(),
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut next = 0usize;
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::Acquire) {
            break;
        }
        let Ok(mut stream) = stream else { continue };
        if shared.connections.load(Ordering::Acquire) >= MAX_CONNECTIONS {
            let _ = write_message(
                &mut stream,
                &Reply::Error(format!(
                    "the store serves {MAX_CONNECTIONS} connections already"
                )),
            );
            continue;
        }
        next += 1;
        let id = next;
        if let (Ok(clone), Ok(mut open)) = (stream.try_clone(), shared.open.lock()) {
            open.push((id, clone));
        }
        shared.connections.fetch_add(1, Ordering::AcqRel);
        let serving = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name("kolo-rendezvous-conn".into())
            .spawn(move || {
                let peer = stream
                    .peer_addr()
                    .map_or_else(|_| "?".to_owned(), |a| a.to_string());
                if let Err(why) = serve(&mut stream, &serving) {
                    tracing::debug!(%peer, %why, "rendezvous connection closed");
                }
                if let Ok(mut open) = serving.open.lock() {
                    open.retain(|(i, _)| *i != id);
                }
                serving.connections.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            shared.connections.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Serves one connection until it ends or breaks the protocol.
fn serve(stream: &mut TcpStream, shared: &Shared) -> std::result::Result<(), String> {
    stream
        .set_read_timeout(Some(HELLO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    let hello = read_frame(stream, MAX_HELLO_BYTES).and_then(|body| decode::<Hello>(&body));
    let refusal = match &hello {
        Err(e) => Some(format!("expected kolo's rendezvous hello: {e}")),
        Ok(hello) if hello.magic != MAGIC => {
            Some("not kolo's rendezvous protocol (bad magic)".to_owned())
        }
        Ok(hello) if hello.version != VERSION => Some(format!(
            "protocol version {} (this store speaks {VERSION})",
            hello.version
        )),
        Ok(hello) if !token_matches(shared.token.as_deref(), hello.token.as_deref()) => {
            Some("the job's token (KOLO_RENDEZVOUS_TOKEN) is missing or wrong".to_owned())
        }
        Ok(_) => None,
    };
    if let Some(why) = refusal {
        let _ = write_message(stream, &Reply::Error(why.clone()));
        return Err(why);
    }
    write_message(stream, &Reply::Done).map_err(|e| e.to_string())?;
    stream.set_read_timeout(None).map_err(|e| e.to_string())?;
    loop {
        let body = match read_frame(stream, MAX_FRAME_BYTES) {
            Ok(body) => body,
            Err(FrameError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Ok(())
            }
            Err(e) => {
                // The stream cannot be resynchronised: say why and close.
                let _ = write_message(stream, &Reply::Error(e.to_string()));
                return Err(e.to_string());
            }
        };
        let request = match decode::<Request>(&body) {
            Ok(request) => request,
            Err(e) => {
                let _ = write_message(stream, &Reply::Error(e.to_string()));
                return Err(e.to_string());
            }
        };
        let reply = answer(shared, &request);
        write_message(stream, &reply).map_err(|e| e.to_string())?;
    }
}

/// Answers `request`, waiting (for a get or a wait) until the store holds
/// its keys, its timeout passes or the store stops.
fn answer(shared: &Shared, request: &Request) -> Reply {
    let timeout = match request {
        Request::Get { timeout_ms, .. } | Request::Wait { timeout_ms, .. } => {
            Duration::from_millis(*timeout_ms)
        }
        _ => Duration::ZERO,
    };
    let deadline = Instant::now() + timeout;
    let Ok(mut store) = shared.store.lock() else {
        return Reply::Error("the store failed (a poisoned lock)".into());
    };
    loop {
        match store.apply(request) {
            Outcome::Answer { reply, changed } => {
                if changed {
                    shared.changed.notify_all();
                }
                return reply;
            }
            Outcome::Pending { missing } => {
                let now = Instant::now();
                if now >= deadline {
                    return Reply::TimedOut { missing };
                }
                if shared.stop.load(Ordering::Acquire) {
                    return Reply::Error("the store is shutting down".into());
                }
                store = match shared.changed.wait_timeout(store, deadline - now) {
                    Ok((store, _)) => store,
                    Err(_) => return Reply::Error("the store failed (a poisoned lock)".into()),
                };
            }
        }
    }
}

/// Whether a client's `given` token is the store's `expected` one (any
/// client when the store has none), compared in constant time.
fn token_matches(expected: Option<&str>, given: Option<&str>) -> bool {
    let Some(expected) = expected else {
        return true;
    };
    let Some(given) = given else {
        return false;
    };
    let (a, b) = (expected.as_bytes(), given.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_match_only_when_equal() {
        assert!(token_matches(None, None));
        assert!(token_matches(None, Some("x")));
        assert!(!token_matches(Some("abc"), None));
        assert!(!token_matches(Some("abc"), Some("abd")));
        assert!(!token_matches(Some("abc"), Some("abcd")));
        assert!(token_matches(Some("abc"), Some("abc")));
    }
}
