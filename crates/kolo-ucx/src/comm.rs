//! [`UcxComm`]: a communicator of processes over UCX. One worker, an
//! endpoint to every peer (their addresses exchanged through
//! kolo-rendezvous), tagged send and receive (see [`crate::tags`]) for
//! the data plane, whose collectives are kolo-transport's generic
//! algorithms (the allreduce optionally hierarchical, see
//! [`crate::hierarchical`]), and probed variable-size messages for the
//! control plane.

use crate::hierarchical;
use crate::rails;
use crate::result::{self, UcsError};
use crate::safe::wait::{wait_all, InFlight, Interrupter, WaitError, SPIN_POLLS};
use crate::safe::worker::{buffer_ptr, plain_params, Endpoint, PeerState, Worker};
use crate::sys;
use crate::tags::{self, Plane, FULL_MASK, MAX_RANKS};
use kolo_protocol::ReduceOp;
use kolo_rendezvous::{Client, Rendezvous};
use kolo_transport::algorithms::{
    self, hierarchical_allreduce, threaded_rail_allreduce, HostLayout, RailThread,
};
use kolo_transport::byte_view::{as_bytes, as_bytes_mut, copy_from_bytes};
use kolo_transport::{
    Collectives, Controller, Element, Lane, Result, Scale, Topology, TransportError,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long closing an endpoint may take.
const CLOSE_BOUND: Duration = Duration::from_secs(5);

/// A failure of the UCX backend.
#[derive(Debug, thiserror::Error)]
pub enum UcxError {
    /// A UCX call failed.
    #[error(transparent)]
    Ucs(#[from] UcsError),
    /// The processes could not meet.
    #[error(transparent)]
    Rendezvous(#[from] kolo_rendezvous::RendezvousError),
    /// Too many ranks for the tag layout.
    #[error("{0} ranks: a UCX communicator holds at most {MAX_RANKS}")]
    TooManyRanks(usize),
    /// A list of members that cannot make a communicator.
    #[error("members of a UCX communicator: {0}")]
    Members(String),
    /// A malformed setting in the environment.
    #[error("{0}")]
    Setting(String),
    /// The second rail's thread could not start.
    #[error("starting the second rail's thread: {0}")]
    RailThread(#[source] std::io::Error),
}

impl From<UcxError> for TransportError {
    fn from(e: UcxError) -> Self {
        TransportError::Backend(e.to_string())
    }
}

/// A communicator of the processes of a job over UCX (see the module
/// docs). Operations are blocking and progress the worker on the calling
/// thread.
#[derive(Debug)]
pub struct UcxComm {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    local_rank: usize,
    local_size: usize,
    /// One per rank (this rank's own included), closed before the worker.
    endpoints: Vec<Endpoint>,
    /// What each endpoint's error handler records, by rank.
    pub(crate) peers: Vec<Arc<PeerState>>,
    /// Idle polls of a wait before it yields the CPU (see
    /// [`crate::safe::wait::SPIN_POLLS`]).
    pub(crate) spin_polls: u32,
    /// Ends this communicator's waits from another thread.
    pub(crate) interrupter: Interrupter,
    /// The hosts' layout where the allreduce is hierarchical (see
    /// [`crate::hierarchical`]); shared so that an allreduce can hold it
    /// while it borrows the communicator.
    hierarchy: Option<Arc<HostLayout>>,
    /// The second rail of a world communicator over TCP, on its thread
    /// (see [`crate::rails`]); the thread ends and the rail is closed
    /// after this one's endpoints.
    pub(crate) rail: Option<RailThread<UcxComm>>,
    pub(crate) worker: Worker,
}

impl UcxComm {
    /// Joins the job the environment describes (torchrun's variables, see
    /// `kolo_rendezvous::LaunchVars`) and connects to every rank.
    pub fn from_env() -> std::result::Result<UcxComm, UcxError> {
        let mut rendezvous = Rendezvous::from_env()?;
        let comm = UcxComm::connect(&mut rendezvous)?;
        rendezvous.close()?;
        Ok(comm)
    }

    /// Connects to every rank of `rendezvous`'s job: every rank's worker
    /// address is exchanged through the store, then an endpoint made to
    /// each (every rank calls it). Its large allreduces go over two rails
    /// where every rank asks for it (see [`crate::rails`]).
    pub fn connect(rendezvous: &mut Rendezvous) -> std::result::Result<UcxComm, UcxError> {
        let request =
            rails::requested(|name| std::env::var(name).ok()).map_err(UcxError::Setting)?;
        let everyone: Vec<usize> = (0..rendezvous.world_size()).collect();
        let comm = UcxComm::connect_ranks(rendezvous, &everyone)?;
        let mut comm = comm.expect("every rank is a member");
        if let Some(rail) = rails::connect(rendezvous, &comm, request)? {
            // Two waiting threads a process: spinning ones would keep the
            // ranks they wait for off the cores.
            if rail.crowded {
                comm.spin_polls = 0;
            }
            comm.rail = Some(rails::start(rail)?);
        }
        Ok(comm)
    }

    /// A communicator of `members` (ranks of `rendezvous`'s job, in the
    /// order that gives their ranks in it): every rank of the job calls it
    /// with the same list, at the same point of its exchanges; the members
    /// get `Some`, the others `None`. Its local ranks count the members on
    /// each host (torchrun's layout: a host's ranks are consecutive). Used
    /// for the channels of a pipeline (two ranks each) and groups of ranks:
    /// a communicator's wait fails when any of its ranks is lost, so one
    /// per group keeps the loss of a rank to the groups it is in.
    pub fn connect_ranks(
        rendezvous: &mut Rendezvous,
        members: &[usize],
    ) -> std::result::Result<Option<UcxComm>, UcxError> {
        let world = rendezvous.world_size();
        check_members(members, world)?;
        let me = rendezvous.rank();
        let position = members.iter().position(|&r| r == me);
        let across_hosts = rendezvous.local_world_size() < world;
        let worker = position.map(|_| Worker::new(across_hosts)).transpose()?;
        let asks =
            hierarchical::requested(|name| std::env::var(name).ok()).map_err(UcxError::Setting)?;
        // A member's first rank of its host, whether it asks for the
        // hierarchical allreduce, then its worker's address.
        let mine = match &worker {
            Some(worker) => {
                let host = (me - rendezvous.local_rank()) as u64;
                let asks = [u8::from(asks)];
                [host.to_le_bytes().as_slice(), &asks, &worker.address()?].concat()
            }
            None => Vec::new(),
        };
        let all = rendezvous.allgather("ucx/address", &mine)?;
        let (Some(rank), Some(worker)) = (position, worker) else {
            rendezvous.barrier("ucx/connected")?;
            return Ok(None);
        };
        let mut hosts = Vec::with_capacity(members.len());
        let mut askers = Vec::with_capacity(members.len());
        let mut addresses = Vec::with_capacity(members.len());
        for &member in members {
            let entry = &all[member];
            let parsed = entry
                .split_first_chunk::<8>()
                .and_then(|(host, rest)| Some((host, rest.split_first()?)));
            let Some((host, (&asks, address))) = parsed else {
                return Err(UcxError::Members(format!(
                    "rank {member} sent no address (it is not a member on its side: is the list the same on every rank?)"
                )));
            };
            hosts.push(u64::from_le_bytes(*host));
            askers.push(asks != 0);
            addresses.push(address.to_vec());
        }
        let hierarchy = hierarchical::agree(&hosts, &askers, rank)?;
        let mut comm = UcxComm::assemble(
            worker,
            rank,
            &hosts,
            &addresses,
            rendezvous.local_world_size(),
            hierarchy,
        )?;
        // Wires every endpoint up before anyone leaves the rendezvous.
        comm.control_barrier().map_err(|e| UcsError {
            call: "the first barrier over UCX",
            status: 0,
            text: e.to_string(),
        })?;
        rendezvous.barrier("ucx/connected")?;
        Ok(Some(comm))
    }

    /// A communicator of `members` (ranks of the job whose store `client`
    /// reaches, ascending or not: their order gives their ranks in it)
    /// made by the members alone, each calling it with the same list and
    /// `space`, a name no other communicator of the job uses. `me` is this
    /// process's rank in the job and `host` names its host (the job rank
    /// of its host's first rank). Ranks outside the list call nothing.
    /// Waits up to `timeout` for every member's address.
    pub fn connect_members(
        client: &mut Client,
        space: &str,
        me: usize,
        host: u64,
        members: &[usize],
        timeout: Duration,
    ) -> std::result::Result<UcxComm, UcxError> {
        let world = members.iter().max().map_or(0, |&r| r + 1);
        check_members(members, world)?;
        let rank = members
            .iter()
            .position(|&r| r == me)
            .ok_or_else(|| UcxError::Members(format!("rank {me} is not among {members:?}")))?;
        // The job's span as its launcher gave it (this call sees only its
        // members' hosts, after its worker exists).
        let across_hosts = kolo_rendezvous::LaunchVars::from_env()
            .is_ok_and(|job| job.local_world_size < job.world_size);
        let worker = Worker::new(across_hosts)?;
        let key = |member: usize| format!("{space}/address/{member}");
        let mine = [host.to_le_bytes().as_slice(), &worker.address()?].concat();
        client.set(&key(me), &mine)?;
        let keys: Vec<String> = members.iter().map(|&m| key(m)).collect();
        client.wait(&keys, timeout)?;
        let mut hosts = Vec::with_capacity(members.len());
        let mut addresses = Vec::with_capacity(members.len());
        for (&member, key) in members.iter().zip(&keys) {
            let entry = client.get(key, timeout)?;
            let Some((host, address)) = entry.split_first_chunk::<8>() else {
                return Err(UcxError::Members(format!(
                    "rank {member} posted no address under {key}"
                )));
            };
            hosts.push(u64::from_le_bytes(*host));
            addresses.push(address.to_vec());
        }
        let local_world = hosts.iter().filter(|&&h| h == host).count();
        // A set's allreduce stays flat: its members did not agree on a
        // hierarchy (the world's `KOLO_HIERARCHICAL_ALLREDUCE` is the world's).
        let mut comm = UcxComm::assemble(worker, rank, &hosts, &addresses, local_world, None)?;
        // Wires every endpoint up; a member's address stays in the store
        // only until all of them connected.
        comm.control_barrier().map_err(|e| UcsError {
            call: "the first barrier over UCX",
            status: 0,
            text: e.to_string(),
        })?;
        client.delete(&key(me))?;
        Ok(comm)
    }

    /// The communicator of this process's `worker`, rank `rank` among
    /// members with `addresses` on `hosts`, `local_world` processes on
    /// this host.
    pub(crate) fn assemble(
        worker: Worker,
        rank: usize,
        hosts: &[u64],
        addresses: &[Vec<u8>],
        local_world: usize,
        hierarchy: Option<Arc<HostLayout>>,
    ) -> std::result::Result<UcxComm, UcxError> {
        let endpoints = connect_all(&worker, addresses)?;
        let peers = endpoints.iter().map(|e| Arc::clone(e.state())).collect();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let spin_polls = if local_world > cores { 0 } else { SPIN_POLLS };
        Ok(UcxComm {
            rank,
            size: hosts.len(),
            local_rank: hosts[..rank].iter().filter(|&&h| h == hosts[rank]).count(),
            local_size: hosts.iter().filter(|&&h| h == hosts[rank]).count(),
            endpoints,
            peers,
            spin_polls,
            interrupter: Interrupter::default(),
            hierarchy,
            rail: None,
            worker,
        })
    }

    /// The hosts' layout where this communicator's allreduce is
    /// hierarchical (every rank set `KOLO_HIERARCHICAL_ALLREDUCE` and the
    /// hosts hold equal numbers of ranks, more than one host and more
    /// than one rank on each), for buffers above kolo-transport's
    /// `SHORT_ALLREDUCE_BYTES`; `None` where it is flat.
    pub fn hierarchy(&self) -> Option<&HostLayout> {
        self.hierarchy.as_deref()
    }

    /// Ends this communicator's waits from another thread (see
    /// [`Interrupter`]): kolo's watchdog uses it when an operation
    /// outlived its timeout.
    pub fn interrupter(&self) -> Interrupter {
        self.interrupter.clone()
    }

    pub(crate) fn check_peer(&self, peer: usize) -> Result<()> {
        if peer >= self.size {
            return Err(TransportError::InvalidArgument(format!(
                "rank {peer} out of range for a communicator of {} ranks",
                self.size
            )));
        }
        Ok(())
    }

    /// The error of a wait on `peer` that failed. A peer failure names the
    /// rank that failed first (whose loss broke the collective), which may
    /// not be the one this rank was waiting for.
    pub(crate) fn failed(&self, peer: usize, what: &str, e: WaitError) -> TransportError {
        match e {
            WaitError::PeerFailed(cause) => {
                let lost = (0..self.size)
                    .filter_map(|r| self.peers[r].failed_at().map(|at| (at, r)))
                    .min()
                    .map_or(peer, |(_, r)| r);
                TransportError::PeerFailed {
                    rank: lost,
                    message: format!("{what} with rank {peer}: UCX reported {cause}"),
                }
            }
            WaitError::Ucs(cause) => TransportError::Backend(format!("{what}: {cause}")),
            WaitError::TimedOut => TransportError::Timeout(format!("{what} with rank {peer}")),
            WaitError::Interrupted(why) => {
                TransportError::Backend(format!("{what} with rank {peer} interrupted: {why}"))
            }
        }
    }

    /// Waits for `requests` (progressing the worker); a failure is the
    /// error of a wait on `peer` doing `what`.
    pub(crate) fn wait(
        &mut self,
        requests: &mut [InFlight],
        peer: usize,
        what: &str,
    ) -> Result<()> {
        wait_all(
            &mut self.worker,
            requests,
            &self.peers,
            None,
            Some(&self.interrupter),
            self.spin_polls,
        )
        .map_err(|e| self.failed(peer, what, e))
    }

    pub(crate) fn start_send(&self, bytes: &[u8], peer: usize, tag: u64) -> Result<InFlight> {
        let params = plain_params();
        // SAFETY: the endpoint is live; the caller keeps `bytes` alive and
        // unchanged until the returned request completed.
        let started = unsafe {
            result::tag_send(
                self.endpoints[peer].raw(),
                buffer_ptr(bytes),
                bytes.len(),
                tag,
                &params,
            )
        }
        .map_err(|e| {
            // A send to a peer already lost fails at once: name the peer.
            if e.is_peer_failure() || self.peers[peer].failure().is_some() {
                self.failed(peer, "a send", WaitError::PeerFailed(e))
            } else {
                TransportError::Backend(e.to_string())
            }
        })?;
        Ok(InFlight::new(started, false, 0, "ucp_tag_send_nbx"))
    }

    pub(crate) fn start_recv(&self, bytes: &mut [u8], tag: u64) -> Result<InFlight> {
        // Always a request: its test reports the length received (UCX
        // 1.13 leaves `recv_info` unset when a receive completes at once).
        let mut params = plain_params();
        params.op_attr_mask = sys::UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
        let ptr = if bytes.is_empty() {
            std::ptr::null_mut()
        } else {
            bytes.as_mut_ptr().cast()
        };
        // SAFETY: the worker is live; the caller keeps `bytes` borrowed
        // until the returned request completed (or was cancelled and
        // completed).
        let started = unsafe {
            result::tag_recv(self.worker.raw(), ptr, bytes.len(), tag, FULL_MASK, &params)
        }
        .map_err(|e| TransportError::Backend(e.to_string()))?;
        Ok(InFlight::new(
            started,
            true,
            bytes.len(),
            "ucp_tag_recv_nbx",
        ))
    }

    /// Receives into `bytes` exactly its length from `peer` with `tag`.
    fn recv_bytes(&mut self, bytes: &mut [u8], peer: usize, tag: u64, what: &str) -> Result<()> {
        let mut requests = [self.start_recv(bytes, tag)?];
        self.wait(&mut requests, peer, what)?;
        check_length(requests[0].received, bytes.len(), peer, what)
    }

    pub(crate) fn send_bytes(
        &mut self,
        bytes: &[u8],
        peer: usize,
        tag: u64,
        what: &str,
    ) -> Result<()> {
        let mut requests = [self.start_send(bytes, peer, tag)?];
        self.wait(&mut requests, peer, what)
    }
}

/// Endpoints to every address, in UCX's peer error handling mode where
/// the transports offer it; otherwise (shared memory alone) without, and
/// a peer that dies is then noticed only by the job's launcher.
fn connect_all(
    worker: &Worker,
    addresses: &[Vec<u8>],
) -> std::result::Result<Vec<Endpoint>, UcsError> {
    let mut peer_errors = true;
    let mut endpoints = Vec::with_capacity(addresses.len());
    for address in addresses {
        let endpoint = match Endpoint::connect(worker, address, peer_errors) {
            Err(e) if peer_errors && endpoints.is_empty() => {
                tracing::warn!(
                    "UCX's transports (UCX_TLS) offer no peer error handling ({e}): \
                     a rank that dies is not detected by kolo-ucx"
                );
                peer_errors = false;
                Endpoint::connect(worker, address, false)?
            }
            other => other?,
        };
        endpoints.push(endpoint);
    }
    Ok(endpoints)
}

/// `members` must be distinct ranks of a job of `world`, at least one and
/// at most [`MAX_RANKS`].
fn check_members(members: &[usize], world: usize) -> std::result::Result<(), UcxError> {
    if members.len() > MAX_RANKS {
        return Err(UcxError::TooManyRanks(members.len()));
    }
    if members.is_empty() {
        return Err(UcxError::Members("the list is empty".into()));
    }
    if let Some(bad) = members.iter().find(|&&r| r >= world) {
        return Err(UcxError::Members(format!(
            "rank {bad} is not a rank of a job of {world}"
        )));
    }
    let mut seen = vec![false; world];
    for &r in members {
        if std::mem::replace(&mut seen[r], true) {
            return Err(UcxError::Members(format!("rank {r} is listed twice")));
        }
    }
    Ok(())
}

/// Fails unless a receive of `want` bytes got exactly that many.
pub(crate) fn check_length(got: Option<usize>, want: usize, peer: usize, what: &str) -> Result<()> {
    match got {
        Some(got) if got == want => Ok(()),
        Some(got) => Err(TransportError::InvalidArgument(format!(
            "{what}: rank {peer} sent {got} bytes, the receive expected {want}"
        ))),
        None => Ok(()),
    }
}

impl Drop for UcxComm {
    fn drop(&mut self) {
        for endpoint in self.endpoints.drain(..) {
            endpoint.close(&mut self.worker, false, CLOSE_BOUND);
        }
    }
}

impl Topology for UcxComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn local_rank(&self) -> usize {
        self.local_rank
    }
    fn local_size(&self) -> usize {
        self.local_size
    }
}

impl Collectives for UcxComm {
    /// The generic allreduce, or the hierarchical one where this
    /// communicator agreed on it at connect time and the buffer is large
    /// enough (`KOLO_HIERARCHICAL_ALLREDUCE`), or the generic one over two
    /// rails where it has a second (see [`crate::rails`]) and the buffer
    /// is large enough: the same on every rank, as they agreed and pass
    /// the same length.
    fn allreduce<T: Element>(&mut self, buf: &mut [T], op: ReduceOp, scale: Scale) -> Result<()> {
        match &self.hierarchy {
            Some(layout) if std::mem::size_of_val(buf) >= hierarchical::MIN_BYTES => {
                let layout = Arc::clone(layout);
                hierarchical_allreduce(self, &layout, buf, op, scale)
            }
            _ if std::mem::size_of_val(buf) >= rails::MIN_BYTES && self.rail.is_some() => {
                let Some(mut rail) = self.rail.take() else {
                    return algorithms::allreduce(self, buf, op, scale);
                };
                let outcome = threaded_rail_allreduce(self, &mut rail, buf, op, scale);
                self.rail = Some(rail);
                outcome
            }
            _ => algorithms::allreduce(self, buf, op, scale),
        }
    }

    fn send<T: Element>(&mut self, buf: &[T], peer: usize, tag: u32) -> Result<()> {
        self.check_peer(peer)?;
        let t = tags::tag(self.rank, tag, Plane::Data);
        self.send_bytes(as_bytes(buf), peer, t, "a send")
    }

    fn recv<T: Element>(&mut self, buf: &mut [T], peer: usize, tag: u32) -> Result<()> {
        self.check_peer(peer)?;
        let t = tags::tag(peer, tag, Plane::Data);
        match as_bytes_mut(buf) {
            Some(bytes) => self.recv_bytes(bytes, peer, t, "a receive"),
            None => {
                // bools: their bytes are checked before they become values.
                let mut staged = vec![0u8; std::mem::size_of_val(buf)];
                self.recv_bytes(&mut staged, peer, t, "a receive")?;
                copy_from_bytes(buf, &staged)
            }
        }
    }

    /// Every lane's receive and send in flight at once, then one wait
    /// for them all.
    fn sendrecv_lanes<T: Element>(&mut self, lanes: &mut [Lane<'_, T>]) -> Result<()> {
        self.exchange_lanes(lanes)
    }

    fn sendrecv<T: Element>(
        &mut self,
        send: &[T],
        dst: usize,
        recv: &mut [T],
        src: usize,
        tag: u32,
    ) -> Result<()> {
        self.check_peer(dst)?;
        self.check_peer(src)?;
        let Some(recv) = as_bytes_mut(recv) else {
            // bools: a send, then a checked receive (UCX sends do not wait
            // for their receiver's post).
            self.send(send, dst, tag)?;
            return self.recv(recv, src, tag);
        };
        let want = recv.len();
        let receive = self.start_recv(recv, tags::tag(src, tag, Plane::Data))?;
        let send =
            match self.start_send(as_bytes(send), dst, tags::tag(self.rank, tag, Plane::Data)) {
                Ok(send) => send,
                Err(e) => {
                    let mut pending = [receive];
                    let _ = wait_all(
                        &mut self.worker,
                        &mut pending,
                        &[],
                        Some(Instant::now()),
                        None,
                        0,
                    );
                    return Err(e);
                }
            };
        let mut requests = [receive, send];
        self.wait(&mut requests, src, "an exchange")?;
        check_length(requests[0].received, want, src, "an exchange")
    }
}
