//! A connection to the store: each operation is one request and one
//! reply, bounded by a timeout (the store answers a get or a wait that
//! outlives it with the keys still missing).

use crate::error::{RendezvousError, Result};
use crate::wire::{
    decode, read_frame, write_message, FrameError, Hello, Reply, Request, MAGIC, MAX_FRAME_BYTES,
    MAX_TIMEOUT, VERSION,
};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// How long a reply may lag behind an operation's own timeout (the store
/// answers at the timeout; this covers the network).
const REPLY_SLACK: Duration = Duration::from_secs(10);
/// The pause between two attempts to reach a store not up yet.
const RETRY: Duration = Duration::from_millis(50);

/// A client of the store at one address.
#[derive(Debug)]
pub struct Client {
    address: String,
    stream: TcpStream,
}

impl Client {
    /// Connects to the store at `address` (`host:port`), retrying until
    /// it answers or `timeout` has passed (the store's process may start
    /// after this one), and presents `token`.
    pub fn connect(address: &str, token: Option<&str>, timeout: Duration) -> Result<Client> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match Self::try_connect(address, deadline) {
                Ok(stream) => return Self::greet(address, stream, token),
                Err(e) => e,
            };
            if Instant::now() + RETRY >= deadline {
                return Err(RendezvousError::Unreachable {
                    address: address.to_owned(),
                    waited: timeout,
                    reason: last,
                });
            }
            std::thread::sleep(RETRY);
        }
    }

    fn try_connect(address: &str, deadline: Instant) -> std::result::Result<TcpStream, String> {
        let addrs: Vec<SocketAddr> = address
            .to_socket_addrs()
            .map_err(|e| e.to_string())?
            .collect();
        let mut last = format!("{address} resolves to no address");
        for addr in addrs {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(10));
            match TcpStream::connect_timeout(&addr, left) {
                Ok(stream) => return Ok(stream),
                Err(e) => last = e.to_string(),
            }
        }
        Err(last)
    }

    fn greet(address: &str, mut stream: TcpStream, token: Option<&str>) -> Result<Client> {
        let _ = stream.set_nodelay(true);
        let hello = Hello {
            magic: MAGIC,
            version: VERSION,
            token: token.map(str::to_owned),
        };
        let mut client = Client {
            address: address.to_owned(),
            stream: stream.try_clone().map_err(|e| RendezvousError::Io {
                address: address.to_owned(),
                reason: e.to_string(),
            })?,
        };
        write_message(&mut stream, &hello).map_err(|e| client.io(&e.to_string()))?;
        match client.reply(REPLY_SLACK, "hello")? {
            Reply::Done => Ok(client),
            Reply::Error(reason) => Err(RendezvousError::Refused {
                address: address.to_owned(),
                reason,
            }),
            other => Err(client.io(&format!("unexpected answer to the hello: {other:?}"))),
        }
    }

    /// The store's address, as given.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Sets `key` to `value`.
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        let request = Request::Set {
            key: key.to_owned(),
            value: value.to_vec(),
        };
        match self.call(&request, Duration::ZERO, &format!("set {key:?}"))? {
            Reply::Done => Ok(()),
            other => Err(self.unexpected("set", other)),
        }
    }

    /// The value of `key`, waiting for it to be set at most `timeout`.
    pub fn get(&mut self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let request = Request::Get {
            key: key.to_owned(),
            timeout_ms: millis(timeout),
        };
        match self.call(&request, timeout, &format!("get {key:?}"))? {
            Reply::Value(value) => Ok(value),
            other => Err(self.unexpected("get", other)),
        }
    }

    /// Returns once every one of `keys` is set, waiting at most `timeout`.
    pub fn wait(&mut self, keys: &[String], timeout: Duration) -> Result<()> {
        let request = Request::Wait {
            keys: keys.to_vec(),
            timeout_ms: millis(timeout),
        };
        match self.call(&request, timeout, &format!("wait for {} keys", keys.len()))? {
            Reply::Done => Ok(()),
            other => Err(self.unexpected("wait", other)),
        }
    }

    /// Adds `delta` to the number at `key` (0 if unset); the sum.
    pub fn add(&mut self, key: &str, delta: i64) -> Result<i64> {
        let request = Request::Add {
            key: key.to_owned(),
            delta,
        };
        match self.call(&request, Duration::ZERO, &format!("add to {key:?}"))? {
            Reply::Number(n) => Ok(n),
            other => Err(self.unexpected("add", other)),
        }
    }

    /// Sets `key` to `desired` if it holds `expected` (`None`: if it is
    /// unset); the value it holds afterwards (`None`: unset).
    pub fn compare_set(
        &mut self,
        key: &str,
        expected: Option<&[u8]>,
        desired: &[u8],
    ) -> Result<Option<Vec<u8>>> {
        let request = Request::CompareSet {
            key: key.to_owned(),
            expected: expected.map(<[u8]>::to_vec),
            desired: desired.to_vec(),
        };
        match self.call(&request, Duration::ZERO, &format!("compare-set {key:?}"))? {
            Reply::Value(value) => Ok(Some(value)),
            Reply::Existed(false) => Ok(None),
            other => Err(self.unexpected("compare-set", other)),
        }
    }

    /// Removes `key`; whether it was set.
    pub fn delete(&mut self, key: &str) -> Result<bool> {
        let request = Request::Delete {
            key: key.to_owned(),
        };
        match self.call(&request, Duration::ZERO, &format!("delete {key:?}"))? {
            Reply::Existed(existed) => Ok(existed),
            other => Err(self.unexpected("delete", other)),
        }
    }

    /// Sends `request` and reads its reply; a store error, a timeout or a
    /// broken connection becomes the matching error naming `what`.
    fn call(&mut self, request: &Request, timeout: Duration, what: &str) -> Result<Reply> {
        write_message(&mut self.stream, request).map_err(|e| self.io(&e.to_string()))?;
        match self.reply(timeout + REPLY_SLACK, what)? {
            Reply::Error(reason) => Err(RendezvousError::Store {
                operation: what.to_owned(),
                reason,
            }),
            Reply::TimedOut { missing } => Err(RendezvousError::Timeout {
                operation: format!("{what} (still missing: {})", summary(&missing)),
                waited: timeout,
            }),
            reply => Ok(reply),
        }
    }

    fn reply(&mut self, timeout: Duration, what: &str) -> Result<Reply> {
        self.stream
            .set_read_timeout(Some(timeout.max(Duration::from_millis(1))))
            .map_err(|e| self.io(&e.to_string()))?;
        let body = match read_frame(&mut self.stream, MAX_FRAME_BYTES) {
            Ok(body) => body,
            Err(FrameError::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(RendezvousError::Timeout {
                    operation: format!("{what} (no answer from {})", self.address),
                    waited: timeout,
                })
            }
            Err(e) => return Err(self.io(&e.to_string())),
        };
        decode::<Reply>(&body).map_err(|e| self.io(&e.to_string()))
    }

    fn io(&self, reason: &str) -> RendezvousError {
        RendezvousError::Io {
            address: self.address.clone(),
            reason: reason.to_owned(),
        }
    }

    fn unexpected(&self, what: &str, reply: Reply) -> RendezvousError {
        self.io(&format!("unexpected answer to {what}: {reply:?}"))
    }
}

/// `timeout` in milliseconds, within the protocol's bound.
fn millis(timeout: Duration) -> u64 {
    timeout.min(MAX_TIMEOUT).as_millis() as u64
}

/// A few of `keys`, for an error message.
fn summary(keys: &[String]) -> String {
    const SHOWN: usize = 8;
    let mut text = keys
        .iter()
        .take(SHOWN)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if keys.len() > SHOWN {
        text.push_str(&format!(" and {} more", keys.len() - SHOWN));
    }
    text
}
