//! The table of NCCL's functions, resolved from libnccl on first use.

use super::{Comm, DataType, NcclResult, RedOp, UniqueId};
use crate::error::NcclError;
use cudarc::driver::sys::CUstream;
use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

/// Environment variable naming the NCCL library to load (a path or a name),
/// tried before the default names.
pub const LIBRARY_ENV: &str = "KOLO_NCCL_LIBRARY";

/// Names tried, in order, after [`LIBRARY_ENV`].
pub const LIBRARY_NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

macro_rules! nccl_api {
    ($($field:ident = $symbol:literal : fn($($arg:ty),*) -> $ret:ty;)*) => {
        /// NCCL's functions, resolved once from the loaded library.
        pub struct Api {
            $(
                #[doc = concat!("`", $symbol, "`.")]
                pub $field: unsafe extern "C" fn($($arg),*) -> $ret,
            )*
            /// Where the library was found.
            pub path: String,
            // Keeps the function pointers above valid; never unloaded.
            _library: libloading::Library,
        }

        impl Api {
            fn resolve(library: libloading::Library, path: String) -> Result<Api, NcclError> {
                $(
                    // SAFETY: the symbol is NCCL's C function of this exact
                    // signature (nccl.h, every version since 2.18); the
                    // pointer is copied out and stored next to `library`,
                    // which keeps it valid for as long as the table lives
                    // (forever: the table is a static).
                    let $field = unsafe {
                        library.get::<unsafe extern "C" fn($($arg),*) -> $ret>($symbol)
                    }
                    .map(|symbol| *symbol)
                    .map_err(|_| NcclError::SymbolMissing {
                        library: path.clone(),
                        symbol: $symbol.to_string(),
                    })?;
                )*
                Ok(Api { $($field,)* path, _library: library })
            }
        }
    };
}

nccl_api! {
    get_version = "ncclGetVersion": fn(*mut c_int) -> NcclResult;
    get_unique_id = "ncclGetUniqueId": fn(*mut UniqueId) -> NcclResult;
    comm_init_rank = "ncclCommInitRank": fn(*mut Comm, c_int, UniqueId, c_int) -> NcclResult;
    comm_finalize = "ncclCommFinalize": fn(Comm) -> NcclResult;
    comm_destroy = "ncclCommDestroy": fn(Comm) -> NcclResult;
    comm_abort = "ncclCommAbort": fn(Comm) -> NcclResult;
    comm_get_async_error = "ncclCommGetAsyncError": fn(Comm, *mut NcclResult) -> NcclResult;
    get_error_string = "ncclGetErrorString": fn(NcclResult) -> *const c_char;
    get_last_error = "ncclGetLastError": fn(Comm) -> *const c_char;
    group_start = "ncclGroupStart": fn() -> NcclResult;
    group_end = "ncclGroupEnd": fn() -> NcclResult;
    all_reduce = "ncclAllReduce":
        fn(*const c_void, *mut c_void, usize, DataType, RedOp, Comm, CUstream) -> NcclResult;
    broadcast = "ncclBroadcast":
        fn(*const c_void, *mut c_void, usize, DataType, c_int, Comm, CUstream) -> NcclResult;
    reduce = "ncclReduce":
        fn(*const c_void, *mut c_void, usize, DataType, RedOp, c_int, Comm, CUstream) -> NcclResult;
    all_gather = "ncclAllGather":
        fn(*const c_void, *mut c_void, usize, DataType, Comm, CUstream) -> NcclResult;
    reduce_scatter = "ncclReduceScatter":
        fn(*const c_void, *mut c_void, usize, DataType, RedOp, Comm, CUstream) -> NcclResult;
    send = "ncclSend": fn(*const c_void, usize, DataType, c_int, Comm, CUstream) -> NcclResult;
    recv = "ncclRecv": fn(*mut c_void, usize, DataType, c_int, Comm, CUstream) -> NcclResult;
    red_op_create_pre_mul_sum = "ncclRedOpCreatePreMulSum":
        fn(*mut RedOp, *mut c_void, DataType, c_int, Comm) -> NcclResult;
    red_op_destroy = "ncclRedOpDestroy": fn(RedOp, Comm) -> NcclResult;
}

/// The NCCL function table, loading the library on first use. A missing
/// library or symbol is returned (and returned again on every call).
pub fn api() -> Result<&'static Api, NcclError> {
    static API: OnceLock<Result<Api, NcclError>> = OnceLock::new();
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// The names tried, in order: [`LIBRARY_ENV`] when set, then
/// [`LIBRARY_NAMES`].
fn candidates() -> Vec<String> {
    let mut names: Vec<String> = std::env::var(LIBRARY_ENV)
        .ok()
        .filter(|v| !v.is_empty())
        .into_iter()
        .collect();
    names.extend(LIBRARY_NAMES.iter().map(|n| n.to_string()));
    names
}

fn load() -> Result<Api, NcclError> {
    let names = candidates();
    let mut reasons = Vec::new();
    for name in &names {
        // SAFETY: loading libnccl runs its initialisers, which only set up
        // NCCL's own globals; no Rust invariants depend on them.
        match unsafe { libloading::Library::new(name.as_str()) } {
            Ok(library) => return Api::resolve(library, name.clone()),
            Err(e) => reasons.push(format!("{name}: {e}")),
        }
    }
    Err(NcclError::LibraryMissing {
        library: "libnccl",
        hint: format!(
            "tried {}; install NCCL (e.g. libnccl2, or the nvidia-nccl wheel) and add its lib \
             folder to LD_LIBRARY_PATH, or set {LIBRARY_ENV} to the library's path",
            reasons.join("; ")
        ),
    })
}
