//! Communicator calls: duplicate, split, rank and size, error handler,
//! attributes, free, abort.

use super::{check, kolo_mpi_tag_ub_key, Comm};
use kolo_transport::Result;
use mpi::ffi;
use std::os::raw::{c_int, c_void};

fn null() -> Comm {
    ffi::MPI_Comm(std::ptr::null_mut())
}

/// `MPI_Comm_dup`: a communicator of the same ranks with its own message
/// space. Collective over `comm`.
///
/// # Safety
/// `comm` is a live communicator; the caller frees the result once.
pub(crate) unsafe fn dup(comm: Comm) -> Result<Comm> {
    let mut out = null();
    // SAFETY: `comm` is live (the caller's contract), `out` a valid out-slot.
    check(unsafe { ffi::MPI_Comm_dup(comm, &mut out) }, "MPI_Comm_dup")?;
    Ok(out)
}

/// `MPI_Comm_split`: the ranks passing the same `color` form one
/// communicator, ordered by `key`; `None` is `MPI_UNDEFINED`, and such a
/// rank gets `None` (`MPI_COMM_NULL`). Collective over `comm`.
///
/// # Safety
/// As [`dup`].
pub(crate) unsafe fn split(comm: Comm, color: Option<c_int>, key: c_int) -> Result<Option<Comm>> {
    // SAFETY: reading MPI's constant, exported by rsmpi's shim.
    let color = color.unwrap_or(unsafe { ffi::RSMPI_UNDEFINED });
    let mut out = null();
    // SAFETY: `comm` is live, `out` a valid out-slot.
    check(
        unsafe { ffi::MPI_Comm_split(comm, color, key, &mut out) },
        "MPI_Comm_split",
    )?;
    // SAFETY: reading MPI's constant.
    if out == unsafe { ffi::RSMPI_COMM_NULL } {
        return Ok(None);
    }
    Ok(Some(out))
}

/// `MPI_Comm_create_group`: a communicator of the ranks `members` of
/// `comm` (in that order), made by those ranks alone; `tag` tells apart
/// creations that may run at once on `comm`. Collective over the members
/// only.
///
/// # Safety
/// As [`dup`].
pub(crate) unsafe fn create_group(comm: Comm, members: &[c_int], tag: c_int) -> Result<Comm> {
    let len = c_int::try_from(members.len()).map_err(|_| {
        kolo_transport::TransportError::InvalidArgument(format!(
            "{} members: more than MPI can count",
            members.len()
        ))
    })?;
    // SAFETY: rsmpi's constant for the null group, read before MPI fills it.
    let mut whole = unsafe { ffi::RSMPI_GROUP_NULL };
    // SAFETY: `comm` is live, `whole` a valid out-slot.
    check(
        unsafe { ffi::MPI_Comm_group(comm, &mut whole) },
        "MPI_Comm_group",
    )?;
    // SAFETY: as above.
    let mut part = unsafe { ffi::RSMPI_GROUP_NULL };
    // SAFETY: `whole` is the group MPI just made; `members` holds `len`
    // ranks and outlives the call; `part` a valid out-slot.
    let included = check(
        unsafe { ffi::MPI_Group_incl(whole, len, members.as_ptr(), &mut part) },
        "MPI_Group_incl",
    );
    // SAFETY: `whole` was made above and is not used after this.
    let _ = unsafe { ffi::MPI_Group_free(&mut whole) };
    included?;
    let mut out = null();
    // SAFETY: `comm` is live, `part` the group just made, `out` a valid
    // out-slot.
    let created = check(
        unsafe { ffi::MPI_Comm_create_group(comm, part, tag, &mut out) },
        "MPI_Comm_create_group",
    );
    // SAFETY: `part` was made above and is not used after this.
    let _ = unsafe { ffi::MPI_Group_free(&mut part) };
    created?;
    Ok(out)
}

/// `MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`: the ranks of `comm` that
/// share memory with this one (this host). Collective over `comm`.
///
/// # Safety
/// As [`dup`].
pub(crate) unsafe fn split_shared(comm: Comm) -> Result<Comm> {
    let mut out = null();
    // SAFETY: `comm` is live, `out` a valid out-slot; the split type and
    // info are MPI's predefined constants.
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
        "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)",
    )?;
    Ok(out)
}

/// `MPI_Comm_rank`: this process's rank in `comm`.
///
/// # Safety
/// `comm` is a live communicator.
pub(crate) unsafe fn rank(comm: Comm) -> Result<c_int> {
    let mut rank: c_int = 0;
    // SAFETY: `comm` is live, `rank` a valid out-slot.
    check(
        unsafe { ffi::MPI_Comm_rank(comm, &mut rank) },
        "MPI_Comm_rank",
    )?;
    Ok(rank)
}

/// `MPI_Comm_size`: the number of ranks in `comm`.
///
/// # Safety
/// `comm` is a live communicator.
pub(crate) unsafe fn size(comm: Comm) -> Result<c_int> {
    let mut size: c_int = 0;
    // SAFETY: `comm` is live, `size` a valid out-slot.
    check(
        unsafe { ffi::MPI_Comm_size(comm, &mut size) },
        "MPI_Comm_size",
    )?;
    Ok(size)
}

/// `MPI_Comm_set_errhandler(MPI_ERRORS_RETURN)`: MPI errors on `comm`
/// come back as return codes instead of aborting the job inside MPI.
///
/// # Safety
/// `comm` is a live communicator.
pub(crate) unsafe fn set_errors_return(comm: Comm) -> Result<()> {
    // SAFETY: `comm` is live; the handler is MPI's predefined one.
    check(
        unsafe { ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN) },
        "MPI_Comm_set_errhandler(MPI_ERRORS_RETURN)",
    )
}

/// `MPI_Comm_get_attr(MPI_TAG_UB)`: the largest tag `comm` takes, `None`
/// when MPI does not attach the attribute.
///
/// # Safety
/// `comm` is a live communicator.
pub(crate) unsafe fn tag_ub(comm: Comm) -> Result<Option<c_int>> {
    // SAFETY: the shim returns MPI's constant key; it touches no state.
    let key = unsafe { kolo_mpi_tag_ub_key() };
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
        return Ok(None);
    }
    // SAFETY: MPI set `value` to its own int, valid while MPI is initialised.
    Ok(Some(unsafe { *value }))
}

/// `MPI_Comm_free`.
///
/// # Safety
/// `comm` was created by [`dup`], [`split`] or [`split_shared`], MPI is
/// still initialised, and `comm` is not used again.
pub(crate) unsafe fn free(mut comm: Comm) -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { ffi::MPI_Comm_free(&mut comm) }, "MPI_Comm_free")
}

/// `MPI_Abort`: ends every process of `comm`'s job with `code`. Returns
/// only when MPI could not abort.
///
/// # Safety
/// `comm` is a live communicator.
pub(crate) unsafe fn abort(comm: Comm, code: c_int) -> Result<()> {
    // SAFETY: `comm` is live.
    check(unsafe { ffi::MPI_Abort(comm, code) }, "MPI_Abort")
}
