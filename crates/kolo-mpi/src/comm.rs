//! `MpiComm`: one rank's MPI communicators — a private duplicate of the world
//! for the control plane, another for the data plane — and its topology.

use crate::communicator::Communicator;
use crate::datatype::Types;
use crate::error::MpiError;
use crate::raw;
use crate::runtime::{Runtime, ThreadLevel};
use kolo_transport::{Result, Topology, TransportError};
use mpi::traits::AsRaw;
use std::os::raw::c_int;
use std::sync::Arc;

/// The largest tag [`MpiComm::create_group`] takes: MPI guarantees tags up
/// to 32767.
pub const MAX_GROUP_TAG: u16 = 32767;

/// One rank of an MPI job, implementing kolo's control plane and host data
/// plane. Create it with [`MpiComm::init`] (once per process).
pub struct MpiComm {
    // Field order matters: MPI objects are freed before MPI is finalised.
    pub(crate) types: Types,
    pub(crate) control: Communicator,
    pub(crate) data: Communicator,
    tag_ub: u32,
    rank: usize,
    size: usize,
    local_rank: usize,
    local_size: usize,
    runtime: Arc<Runtime>,
}

// SAFETY: MPI handles are process-wide values, valid from any thread. kolo
// calls MPI from one thread at a time (the owner of `&mut MpiComm`); when MPI
// granted less than MPI_THREAD_MULTIPLE, kolo's engine creates the MpiComm on
// its background thread and makes every call from there (see `init`).
unsafe impl Send for MpiComm {}

impl MpiComm {
    /// Initialises MPI on the calling thread and returns this process's
    /// rank of the world. Requests `MPI_THREAD_MULTIPLE`, or `MPI_THREAD_FUNNELED` when
    /// `threads_disable` (kolo's `KOLO_MPI_THREADS_DISABLE=1`); with anything
    /// below MULTIPLE, use the communicator only from this thread.
    pub fn init(threads_disable: bool) -> Result<MpiComm> {
        let runtime = Runtime::init(!threads_disable)?;
        let world = runtime
            .world()
            .ok_or_else(|| TransportError::Backend("MPI world communicator unavailable".into()))?;
        let control = Communicator::duplicate_world(&world)?;
        let data = Communicator::duplicate_world(&world)?;
        let ((rank, size), (local_rank, local_size)) = data.topology()?;
        // SAFETY: rsmpi's world is live while `runtime` holds the universe.
        let tag_ub = unsafe { raw::comm::tag_ub(world.as_raw()) }?
            // The standard's guaranteed minimum.
            .unwrap_or(32767)
            .max(0) as u32;
        Ok(MpiComm {
            types: Types::create()?,
            control,
            data,
            tag_ub,
            rank,
            size,
            local_rank,
            local_size,
            runtime,
        })
    }

    /// A new communicator of the same ranks with message spaces of its own
    /// (`MPI_Comm_dup` of this one's control and data communicators), for
    /// another thread: kolo-pipeline's helper threads each own one per
    /// channel (`kolo_pipeline::duplicate_channels`).
    ///
    /// **Collective.** Every rank of the communicator must call
    /// `duplicate` the same number of times, in the same order (with other
    /// collectives on this communicator), or the ranks that call it wait
    /// for the others forever. Code that duplicates per channel or per
    /// peer must therefore duplicate on every rank, also on ranks that end
    /// up not using the duplicate.
    ///
    /// **Threads.** Each duplicate, like every `MpiComm`, is used from one
    /// thread at a time; different duplicates (and the original) may be
    /// used from different threads at once. That needs
    /// `MPI_THREAD_MULTIPLE`: below it this returns
    /// [`MpiError::ThreadLevel`] naming the level MPI granted, before
    /// calling MPI (so every rank of a job, which share the level, fails
    /// alike instead of some waiting in `MPI_Comm_dup`).
    ///
    /// The duplicate keeps MPI initialised: MPI is finalised when the last
    /// `MpiComm`, original or duplicate, is dropped — which should happen
    /// on the thread that initialised MPI.
    pub fn duplicate(&self) -> std::result::Result<MpiComm, MpiError> {
        let granted = self.runtime.level;
        if granted < ThreadLevel::Multiple {
            return Err(MpiError::ThreadLevel {
                operation: "MpiComm::duplicate (a communicator for another thread)",
                needed: ThreadLevel::Multiple,
                granted,
            });
        }
        // Datatypes are local (not collective): made first, so a failure
        // here leaves no rank waiting in a collective.
        let types = Types::create()?;
        let control = self.control.duplicate()?;
        let data = self.data.duplicate()?;
        Ok(MpiComm {
            types,
            control,
            data,
            tag_ub: self.tag_ub,
            rank: self.rank,
            size: self.size,
            local_rank: self.local_rank,
            local_size: self.local_size,
            runtime: Arc::clone(&self.runtime),
        })
    }

    /// Splits the ranks into disjoint communicators (`MPI_Comm_split` of
    /// this one's control and data communicators): the ranks passing the
    /// same `color` form one, ordered by `key` (ties by their rank here);
    /// a rank passing `None` (`MPI_UNDEFINED`) joins none and gets
    /// `Ok(None)`. kolo-pipeline's NCCL channels under `mpirun` split a
    /// pair communicator off the world per channel to bootstrap the
    /// channel's two-rank NCCL communicator.
    ///
    /// **Collective**, like [`MpiComm::duplicate`]: every rank of this
    /// communicator calls `split` the same number of times in the same
    /// order, also the ranks that pass `None`. A color MPI cannot take
    /// (above `i32::MAX`) is an [`MpiError::Mpi`] naming it, returned
    /// after this rank took part as `None`, so the other ranks still get
    /// their communicators instead of waiting for it.
    ///
    /// The new communicator has its own topology (rank, size, and local
    /// rank and size from a shared-memory split of it) and message spaces,
    /// keeps MPI initialised like a duplicate, and is used from one thread
    /// at a time; it needs no more than the thread level MPI granted (a
    /// communicator used on another thread needs `MPI_THREAD_MULTIPLE`).
    pub fn split(
        &self,
        color: Option<u32>,
        key: i32,
    ) -> std::result::Result<Option<MpiComm>, MpiError> {
        let valid = color.map(c_int::try_from).transpose();
        // A color MPI cannot take joins as no color, so the other ranks
        // still get their communicators.
        let mpi_color = valid.unwrap_or(None);
        // Datatypes are local (not collective): made first, so a failure
        // here leaves no rank waiting in a collective.
        let types = Types::create()?;
        let control = self.control.split(mpi_color, key)?;
        let data = self.data.split(mpi_color, key)?;
        let (control, data) = match (control, data, valid) {
            (Some(control), Some(data), Ok(Some(_))) => (control, data),
            (None, None, Ok(None)) => return Ok(None),
            (_, _, valid) => {
                return Err(MpiError::Mpi(TransportError::InvalidArgument(
                    match valid {
                        Err(_) => format!(
                            "MpiComm::split: color {} is above MPI's limit {} (this rank took \
                         part without a color)",
                            color.unwrap_or_default(),
                            c_int::MAX
                        ),
                        Ok(_) => format!(
                            "MpiComm::split: MPI gave rank {} {} communicator for color {color:?}",
                            self.rank,
                            if color.is_some() { "no" } else { "a" }
                        ),
                    },
                )));
            }
        };
        Ok(Some(self.derived(types, control, data)?))
    }

    /// A communicator of `members` (ranks of this one, in the order that
    /// gives their ranks in it), made by the members alone
    /// (`MPI_Comm_create_group` of the control and data communicators):
    /// ranks outside the list call nothing. `tag` tells apart creations
    /// that may overlap on this communicator (every member passes the
    /// same, at most [`MAX_GROUP_TAG`]).
    ///
    /// **Collective over the members**, who call it the same number of
    /// times in the same order. Like [`MpiComm::duplicate`] it is meant
    /// for another thread, so it needs `MPI_THREAD_MULTIPLE` and returns
    /// [`MpiError::ThreadLevel`] below it, before calling MPI.
    pub fn create_group(
        &self,
        members: &[usize],
        tag: u16,
    ) -> std::result::Result<MpiComm, MpiError> {
        let granted = self.runtime.level;
        if granted < ThreadLevel::Multiple {
            return Err(MpiError::ThreadLevel {
                operation: "MpiComm::create_group (a process set's communicator)",
                needed: ThreadLevel::Multiple,
                granted,
            });
        }
        let mut ranks = Vec::with_capacity(members.len());
        for &m in members {
            match c_int::try_from(m) {
                Ok(r) if m < self.size => ranks.push(r),
                _ => {
                    return Err(MpiError::Mpi(TransportError::InvalidArgument(format!(
                        "MpiComm::create_group: rank {m} is not a rank of a communicator of {}",
                        self.size
                    ))))
                }
            }
        }
        if !members.contains(&self.rank) {
            return Err(MpiError::Mpi(TransportError::InvalidArgument(format!(
                "MpiComm::create_group: rank {} is not among {members:?}",
                self.rank
            ))));
        }
        let tag = c_int::from(tag.min(MAX_GROUP_TAG));
        let types = Types::create()?;
        let control = self.control.create_group(&ranks, tag)?;
        let data = self.data.create_group(&ranks, tag)?;
        self.derived(types, control, data)
    }

    /// A communicator of new `control` and `data` communicators made from
    /// this one (a split or a group of it), with their own topology (rank
    /// and size, and local ones from a shared-memory split), keeping MPI
    /// initialised as this one does. Collective over the new one.
    fn derived(
        &self,
        types: Types,
        control: Communicator,
        data: Communicator,
    ) -> std::result::Result<MpiComm, MpiError> {
        let ((rank, size), (local_rank, local_size)) = data.topology()?;
        Ok(MpiComm {
            types,
            control,
            data,
            tag_ub: self.tag_ub,
            rank,
            size,
            local_rank,
            local_size,
            runtime: Arc::clone(&self.runtime),
        })
    }

    /// The thread level MPI granted.
    pub fn thread_level(&self) -> ThreadLevel {
        self.runtime.level
    }

    /// True when MPI granted `MPI_THREAD_MULTIPLE` (kolo may then call MPI
    /// from several threads).
    pub fn threads_supported(&self) -> bool {
        self.runtime.level == ThreadLevel::Multiple
    }

    /// Ends the whole MPI job with `code` after printing `message` (used when
    /// a rank cannot continue and peers would otherwise wait forever).
    pub fn abort(&self, code: i32, message: &str) -> ! {
        eprintln!("kolo-mpi: rank {} aborts the job: {message}", self.rank);
        // SAFETY: the data communicator is live while `self` is.
        if let Err(e) = unsafe { raw::comm::abort(self.data.handle(), code) } {
            eprintln!("kolo-mpi: rank {}: {e}; exiting instead", self.rank);
        }
        std::process::exit(code)
    }

    pub(crate) fn check_peer(&self, peer: usize, what: &str) -> Result<c_int> {
        if peer >= self.size {
            return Err(TransportError::InvalidArgument(format!(
                "{what}: rank {peer} out of range for {} ranks",
                self.size
            )));
        }
        Ok(peer as c_int)
    }

    /// kolo's tag as an MPI tag. kolo reserves the top 65,536 `u32` tags
    /// (from [`kolo_transport::RESERVED_TAG_BASE`]) for itself; they map onto
    /// the top of MPI's tag range, `tag_ub - 65535 ..= tag_ub`, and user
    /// tags must stay below that.
    pub(crate) fn check_tag(&self, tag: u32) -> Result<c_int> {
        const RESERVED: u32 = u32::MAX - kolo_transport::RESERVED_TAG_BASE; // 65,535
        let user_limit = self.tag_ub.saturating_sub(RESERVED);
        let mapped = if tag >= kolo_transport::RESERVED_TAG_BASE {
            user_limit + (tag - kolo_transport::RESERVED_TAG_BASE)
        } else if tag < user_limit {
            tag
        } else {
            return Err(TransportError::InvalidArgument(format!(
                "tag {tag} is too large for this MPI: user tags must be below {user_limit} \
                 (MPI_TAG_UB {} minus kolo's 65,536 reserved tags)",
                self.tag_ub
            )));
        };
        c_int::try_from(mapped).map_err(|_| {
            TransportError::InvalidArgument(format!("tag {tag} does not fit MPI's int tags"))
        })
    }
}

impl Topology for MpiComm {
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
