//! `MpiComm`: one rank's MPI communicators — a private duplicate of the world
//! for the control plane, another for the data plane — and its topology.

use crate::datatype::Types;
use crate::error::MpiError;
use crate::raw::check;
use crate::runtime::{Runtime, ThreadLevel};
use kolo_transport::{Result, Topology, TransportError};
use mpi::ffi::{self, MPI_Comm};
use mpi::traits::AsRaw;
use std::os::raw::{c_int, c_void};
use std::sync::Arc;

extern "C" {
    fn kolo_mpi_in_place() -> *mut c_void;
    fn kolo_mpi_tag_ub_key() -> c_int;
}

/// One rank of an MPI job, implementing kolo's control plane and host data
/// plane. Create it with [`MpiComm::init`] (once per process).
pub struct MpiComm {
    // Field order matters: MPI objects are freed before MPI is finalised.
    pub(crate) types: Types,
    pub(crate) control: MPI_Comm,
    pub(crate) data: MPI_Comm,
    pub(crate) in_place: *mut c_void,
    pub(crate) tag_ub: u32,
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
    /// rank. Requests `MPI_THREAD_MULTIPLE`, or `MPI_THREAD_FUNNELED` when
    /// `threads_disable` (kolo's `KOLO_MPI_THREADS_DISABLE=1`); with anything
    /// below MULTIPLE, use the communicator only from this thread.
    pub fn init(threads_disable: bool) -> Result<MpiComm> {
        let runtime = Runtime::init(!threads_disable)?;
        let world = runtime
            .world()
            .ok_or_else(|| TransportError::Backend("MPI world communicator unavailable".into()))?;
        let world = world.as_raw();
        let control = dup(world)?;
        let data = dup(world)?;
        let ((rank, size), (local_rank, local_size)) = topology(data)?;
        // SAFETY: the shim returns MPI's own constants.
        let (in_place, tag_ub_key) = unsafe { (kolo_mpi_in_place(), kolo_mpi_tag_ub_key()) };
        let tag_ub = tag_upper_bound(world, tag_ub_key)?;
        Ok(MpiComm {
            types: Types::create()?,
            control,
            data,
            in_place,
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
        let control = dup(self.control)?;
        let data = match dup(self.data) {
            Ok(data) => data,
            Err(e) => {
                free_comm(control);
                return Err(e.into());
            }
        };
        Ok(MpiComm {
            types,
            control,
            data,
            in_place: self.in_place,
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
        // SAFETY: reading MPI's constant.
        let undefined = unsafe { ffi::RSMPI_UNDEFINED };
        let mpi_color = match valid {
            Ok(Some(c)) => c,
            Ok(None) | Err(_) => undefined,
        };
        // Datatypes are local (not collective): made first, so a failure
        // here leaves no rank waiting in a collective.
        let types = Types::create()?;
        let control = split(self.control, mpi_color, key)?;
        let data = match split(self.data, mpi_color, key) {
            Ok(data) => data,
            Err(e) => {
                control.into_iter().for_each(free_comm);
                return Err(e.into());
            }
        };
        let (control, data) = match (control, data, valid) {
            (Some(control), Some(data), Ok(Some(_))) => (control, data),
            (None, None, Ok(None)) => return Ok(None),
            (control, data, valid) => {
                control.into_iter().chain(data).for_each(free_comm);
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
        match topology(data) {
            Ok(((rank, size), (local_rank, local_size))) => Ok(Some(MpiComm {
                types,
                control,
                data,
                in_place: self.in_place,
                tag_ub: self.tag_ub,
                rank,
                size,
                local_rank,
                local_size,
                runtime: Arc::clone(&self.runtime),
            })),
            Err(e) => {
                free_comm(control);
                free_comm(data);
                Err(e.into())
            }
        }
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
        // SAFETY: MPI_Abort on a valid communicator; it does not return.
        unsafe {
            ffi::MPI_Abort(self.data, code);
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

impl Drop for MpiComm {
    fn drop(&mut self) {
        if crate::runtime::is_active() {
            free_comm(self.control);
            free_comm(self.data);
        }
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

fn dup(comm: MPI_Comm) -> Result<MPI_Comm> {
    let mut out = MPI_Comm(std::ptr::null_mut());
    // SAFETY: `comm` is a valid communicator, `out` a valid out-pointer.
    check(unsafe { ffi::MPI_Comm_dup(comm, &mut out) }, "MPI_Comm_dup")?;
    returning_errors(out)
}

/// `MPI_Comm_split` of `comm`: `None` for `MPI_UNDEFINED`'s
/// `MPI_COMM_NULL`.
fn split(comm: MPI_Comm, color: c_int, key: c_int) -> Result<Option<MPI_Comm>> {
    let mut out = MPI_Comm(std::ptr::null_mut());
    // SAFETY: `comm` is a valid communicator, `out` a valid out-pointer.
    check(
        unsafe { ffi::MPI_Comm_split(comm, color, key, &mut out) },
        "MPI_Comm_split",
    )?;
    // SAFETY: reading MPI's constant.
    if out == unsafe { ffi::RSMPI_COMM_NULL } {
        return Ok(None);
    }
    returning_errors(out).map(Some)
}

/// Makes `comm` (just created) return errors to kolo, which turns them
/// into kolo errors, instead of aborting the job inside MPI.
fn returning_errors(comm: MPI_Comm) -> Result<MPI_Comm> {
    // SAFETY: `comm` is a valid communicator; the handler is MPI's own.
    let set = check(
        unsafe { ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN) },
        "MPI_Comm_set_errhandler",
    );
    match set {
        Ok(()) => Ok(comm),
        Err(e) => {
            free_comm(comm);
            Err(e)
        }
    }
}

/// `comm`'s (rank, size), and its local (rank, size) from a shared-memory
/// split of it. Collective over `comm`.
fn topology(comm: MPI_Comm) -> Result<((usize, usize), (usize, usize))> {
    let global = rank_size(comm)?;
    let local = split_shared(comm)?;
    let local_topology = rank_size(local);
    free_comm(local);
    Ok((global, local_topology?))
}

fn split_shared(comm: MPI_Comm) -> Result<MPI_Comm> {
    let mut out = MPI_Comm(std::ptr::null_mut());
    // SAFETY: valid communicator and out-pointer; predefined constants.
    check(
        unsafe {
            ffi::MPI_Comm_split_type(
                comm,
                ffi::RSMPI_COMM_TYPE_SHARED,
                0,
                ffi::RSMPI_INFO_NULL,
                &mut out,
            )
        },
        "MPI_Comm_split_type(shared)",
    )?;
    Ok(out)
}

fn rank_size(comm: MPI_Comm) -> Result<(usize, usize)> {
    let (mut rank, mut size): (c_int, c_int) = (0, 0);
    // SAFETY: valid communicator and out-pointers.
    check(
        unsafe { ffi::MPI_Comm_rank(comm, &mut rank) },
        "MPI_Comm_rank",
    )?;
    // SAFETY: as above.
    check(
        unsafe { ffi::MPI_Comm_size(comm, &mut size) },
        "MPI_Comm_size",
    )?;
    Ok((rank.max(0) as usize, size.max(0) as usize))
}

fn free_comm(mut comm: MPI_Comm) {
    // SAFETY: `comm` was created by MPI_Comm_dup / split and is freed once.
    unsafe {
        ffi::MPI_Comm_free(&mut comm);
    }
}

fn tag_upper_bound(comm: MPI_Comm, key: c_int) -> Result<u32> {
    let mut value: *mut c_int = std::ptr::null_mut();
    let mut flag: c_int = 0;
    // SAFETY: MPI_TAG_UB's attribute value is a pointer to an int owned by
    // MPI; we pass the address of a pointer-sized out slot as required.
    check(
        unsafe {
            ffi::MPI_Comm_get_attr(
                comm,
                key,
                &mut value as *mut *mut c_int as *mut c_void,
                &mut flag,
            )
        },
        "MPI_Comm_get_attr(MPI_TAG_UB)",
    )?;
    if flag == 0 || value.is_null() {
        return Ok(32767); // the standard's guaranteed minimum
    }
    // SAFETY: MPI set `value` to its own int, valid while MPI is initialised.
    Ok(unsafe { *value }.max(0) as u32)
}
