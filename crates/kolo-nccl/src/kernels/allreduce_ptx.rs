//! The PTX text of kolo-nccl's peer-to-peer allreduce: every rank reads
//! the other ranks' *registered buffers* directly (NVLink peer access in
//! thread mode, CUDA IPC in process mode), for small and medium tensors
//! where NCCL's ring is latency-bound. Written by hand like
//! [`crate::kernels::scale_ptx`], JIT-compiled by the driver on first use.
//!
//! Two algorithms, each for f32, f16 and bf16, sum or average:
//!
//! - **one-shot**: every rank copies its input into its registered buffer,
//!   signals, waits for every peer, then reduces all `world` buffers into
//!   its output (each rank reads `world * n` elements);
//! - **two-shot**: the same copy and wait, then rank `r` reduces only its
//!   slice `r` (`[r * chunk, (r + 1) * chunk)` units, `chunk = ceil(units
//!   / world)`) from every buffer, writes it over its own buffer's slice
//!   `r` and into its output, signals again, waits again and gathers the
//!   other slices from their owners' buffers (reduce-scatter then
//!   all-gather).
//!
//! Both move 16-byte *units* (4 f32 or 8 halves, `ld.global.v4.u32`):
//! the registered buffers always (their data regions are 256-byte
//! aligned), inputs and outputs when they are 16-byte aligned and element
//! by element otherwise (each rank decides for its own pointers: the
//! positions every CTA covers do not depend on it). The last `n % lanes`
//! elements (the *tail*) go element by element, copied in before the first
//! wait and reduced by every rank itself (see [`crate::kernels::allreduce_units`]).
//!
//! # Arithmetic
//!
//! Element `i` is reduced in rank order 0, 1, ..., world - 1, in f32
//! (`add.rn`, never fused), f16 and bf16 widened exactly and rounded once
//! (RN) at the end; an average is that sum rounded to the type, then scaled
//! as kolo's `Element::scale` does (`x * (factor as f32)`, halves through
//! f32, rounded once), skipped when the factor is exactly 1. This is the
//! host's `Element::reduce_many` followed by `Element::scale`, bit for
//! bit, and every rank computes the same bits (two-shot ranks copy the
//! owner's bits).
//!
//! # Synchronisation
//!
//! A registered buffer is [`HEADER_BYTES`] of flags followed by two data
//! regions of `capacity` bytes each. Flags are u64 *epochs*: the host
//! numbers the calls of a registration 1, 2, 3, ... (every rank counts the
//! same calls), so a flag only ever grows and is never reset. Flag
//! `[phase][block][sender]` lives in the *receiver's* buffer: CTA `b` of
//! rank `r` publishes phase `p` by writing `epoch` into slot
//! `[p][b][r]` of every rank's buffer (threads `0..world`, one peer each:
//! `bar.sync`, `fence.acq_rel.sys`, `st.relaxed.sys`), and waits by
//! polling its own slots `[p][b][0..world]` until each is `>= epoch`
//! (`ld.acquire.sys`), then `bar.sync`. Every rank launches the same grid
//! (it depends only on `n` and `world`) and CTA `b` visits the same
//! positions of every slice on every rank, so CTA `b` only ever reads data
//! that the peers' CTA `b` wrote before they signalled: the ranks
//! synchronise per CTA, never across a whole grid.
//!
//! Call `e` writes data region `e & 1` (`data_off`): a rank entering call
//! `e + 1` writes the other region, so a slow peer still reading call `e`
//! is undisturbed. A rank can only reach call `e + 2` (the same region
//! again) after its call `e + 1` kernel finished, which needed every
//! peer's phase-0 flag of `e + 1` in every CTA, which each peer wrote only
//! after its own call `e` kernel had finished (kernels of one stream run in
//! order): nobody reads region `e & 1` any more. In two-shot, rank `r`
//! overwrites only its own slice `r` with the result, which no peer reads
//! in phase 0. A late rank only delays the others (they spin until its
//! flags come); it never deadlocks them, provided each rank's CTAs can be
//! resident together: at most [`MAX_BLOCKS`] (fewer than any supported
//! GPU's SMs) of [`BLOCK_THREADS`] threads. A rank that never comes (its
//! process died) makes the others `trap` once they have waited
//! `timeout_ns` (`%globaltimer`): the kernel fails, and with it the
//! communicator, instead of occupying the GPU for ever.
//!
//! # Parameters
//!
//! `(out, in, peer0 .. peer7, rank, world, n, chunk, epoch, data_off,
//! factor, timeout_ns)`: all u64 but `factor` (f64). `peerK` is rank `K`'s registered
//! buffer as this device addresses it (unused ones may be 0), `n` the
//! element count, `chunk` the two-shot slice length in units ([`chunk`],
//! ignored by one-shot),
//! `data_off` the byte offset of this call's region ([`data_offset`]).
//! `out == in` reduces in place; both are any element-aligned addresses.
//! The grid must have at least [`MAX_RANKS`] threads per CTA and at most
//! [`MAX_BLOCKS`] CTAs ([`launch_dims`]).
//!
//! Pure text and arithmetic: checked by `kernels/tests/` (an interpreter
//! runs simulated ranks with interleaved CTAs), run on a GPU by the crate's
//! GPU test binaries.

use crate::kernels::allreduce_units::Emitter;
pub use crate::kernels::allreduce_units::{ArDtype, MAX_BLOCKS, MAX_RANKS};
use crate::kernels::scale_ptx::{PTX_TARGET, PTX_VERSION};
use kolo_protocol::DataType;
use std::fmt::Write;

/// Threads per CTA (at least [`MAX_RANKS`]: threads `0..world` signal).
pub const BLOCK_THREADS: u32 = 512;
/// Flag phases: the input is in; (two-shot) the reduced slice is in.
pub const PHASES: usize = 2;
/// Bytes of flags at the start of a registered buffer.
pub const HEADER_BYTES: usize = PHASES * MAX_BLOCKS as usize * MAX_RANKS * 8;
/// Data regions start at multiples of this.
pub const REGION_ALIGN: usize = 256;

/// One-shot or two-shot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Every rank reduces every element from every buffer.
    OneShot,
    /// Reduce-scatter of slices, then all-gather of the reduced slices.
    TwoShot,
}

impl ArDtype {
    /// Every dtype.
    pub const ALL: [ArDtype; 3] = [ArDtype::F32, ArDtype::F16, ArDtype::Bf16];

    /// The kernel dtype for `dtype`, if there is one.
    pub fn for_dtype(dtype: DataType) -> Option<ArDtype> {
        match dtype {
            DataType::F32 => Some(ArDtype::F32),
            DataType::F16 => Some(ArDtype::F16),
            DataType::BF16 => Some(ArDtype::Bf16),
            _ => None,
        }
    }

    /// log2 of the element size.
    pub fn shift(self) -> u32 {
        match self {
            ArDtype::F32 => 2,
            ArDtype::F16 | ArDtype::Bf16 => 1,
        }
    }
}

/// One kernel of the module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AllreduceKernel {
    /// One-shot or two-shot.
    pub algorithm: Algorithm,
    /// The element type.
    pub dtype: ArDtype,
}

/// The parameter names, in order, after the kernel's name and `_`.
pub fn param_names() -> Vec<String> {
    let mut names: Vec<String> = vec!["out".into(), "in".into()];
    names.extend((0..MAX_RANKS).map(|k| format!("peer{k}")));
    names.extend(
        [
            "rank",
            "world",
            "n",
            "chunk",
            "epoch",
            "data_off",
            "factor",
            "timeout_ns",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    names
}

impl AllreduceKernel {
    /// Every kernel of the module.
    pub fn all() -> Vec<AllreduceKernel> {
        let mut all = Vec::new();
        for algorithm in [Algorithm::OneShot, Algorithm::TwoShot] {
            for dtype in ArDtype::ALL {
                all.push(AllreduceKernel { algorithm, dtype });
            }
        }
        all
    }

    /// The entry's name in the module.
    pub fn name(self) -> &'static str {
        match (self.algorithm, self.dtype) {
            (Algorithm::OneShot, ArDtype::F32) => "kolo_allreduce_oneshot_f32",
            (Algorithm::OneShot, ArDtype::F16) => "kolo_allreduce_oneshot_f16",
            (Algorithm::OneShot, ArDtype::Bf16) => "kolo_allreduce_oneshot_bf16",
            (Algorithm::TwoShot, ArDtype::F32) => "kolo_allreduce_twoshot_f32",
            (Algorithm::TwoShot, ArDtype::F16) => "kolo_allreduce_twoshot_f16",
            (Algorithm::TwoShot, ArDtype::Bf16) => "kolo_allreduce_twoshot_bf16",
        }
    }

    /// The kernel's `.entry`.
    pub fn entry(self) -> String {
        let name = self.name();
        let dtype = self.dtype;
        let shift = dtype.shift();
        let params = param_names();
        let mut e = Emitter {
            name,
            lines: Vec::new(),
            labels: 0,
        };
        e.lines.push(format!(".visible .entry {name}("));
        for (k, p) in params.iter().enumerate() {
            let ty = if p == "factor" { "f64" } else { "u64" };
            let comma = if k + 1 < params.len() { "," } else { "" };
            e.lines.push(format!("    .param .{ty} {name}_{p}{comma}"));
        }
        e.lines.push(")".into());
        e.lines.push("{".into());
        for decl in [
            ".reg .pred %p<11>;",
            ".reg .b16 %rs<12>;",
            ".reg .b32 %r<10>;",
            ".reg .b64 %rd<52>;",
            ".reg .f32 %f<28>;",
            ".reg .f64 %fd<2>;",
        ] {
            e.op(decl);
        }
        // Parameters: %rd1 out, %rd2 in, %rd20.. peers, %rd4 rank, %rd5
        // world, %rd3 n, %rd7 chunk, %rd6 epoch, %rd8 data_off, %fd1.
        let regs = [("out", "%rd1"), ("in", "%rd2")];
        for (p, r) in regs {
            e.op(format!("ld.param.u64 {r}, [{name}_{p}];"));
            e.op(format!("cvta.to.global.u64 {r}, {r};"));
        }
        for k in 0..MAX_RANKS {
            e.op(format!("ld.param.u64 %rd{}, [{name}_peer{k}];", 20 + k));
            e.op(format!("cvta.to.global.u64 %rd{0}, %rd{0};", 20 + k));
        }
        for (p, r) in [
            ("rank", "%rd4"),
            ("world", "%rd5"),
            ("n", "%rd3"),
            ("chunk", "%rd7"),
            ("epoch", "%rd6"),
            ("data_off", "%rd8"),
        ] {
            e.op(format!("ld.param.u64 {r}, [{name}_{p}];"));
        }
        e.op(format!("ld.param.f64 %fd1, [{name}_factor];"));
        e.op(format!("ld.param.u64 %rd18, [{name}_timeout_ns];"));
        // Rust's `factor as f32` rounds to nearest; a factor of exactly 1
        // scales nothing (as the host's `Element::scale`).
        e.op("cvt.rn.f32.f64 %f1, %fd1;");
        e.op("setp.eq.f64 %p9, %fd1, 0d3FF0000000000000;");
        for k in 0..MAX_RANKS {
            e.op(format!("add.u64 %rd{}, %rd{}, %rd8;", 30 + k, 20 + k));
        }
        // %rd9 this rank's buffer, %rd10 its data region.
        e.select_peer("%rd9", "%rd4", false);
        e.op("add.u64 %rd10, %rd9, %rd8;");
        // %rd11 = ctaid * ntid + tid, %rd12 = nctaid * ntid, %rd13 ctaid,
        // %rd14 tid.
        e.op("mov.u32 %r1, %ctaid.x;");
        e.op("mov.u32 %r2, %ntid.x;");
        e.op("mov.u32 %r3, %tid.x;");
        e.op("mov.u32 %r4, %nctaid.x;");
        e.op("mul.wide.u32 %rd11, %r1, %r2;");
        e.op("cvt.u64.u32 %rd14, %r3;");
        e.op("add.u64 %rd11, %rd11, %rd14;");
        e.op("mul.wide.u32 %rd12, %r4, %r2;");
        e.op("cvt.u64.u32 %rd13, %r1;");

        // %rd15 whole units, %rd16 the first tail element; %p7 / %p8:
        // input / output not 16-byte aligned.
        let unit_shift = dtype.unit_shift();
        e.op(format!("shr.u64 %rd15, %rd3, {unit_shift};"));
        e.op(format!("shl.b64 %rd16, %rd15, {unit_shift};"));
        e.op("and.b64 %rd48, %rd2, 15;");
        e.op("setp.ne.u64 %p7, %rd48, 0;");
        e.op("and.b64 %rd48, %rd1, 15;");
        e.op("setp.ne.u64 %p8, %rd48, 0;");

        let (raw, raw_ty) = dtype.raw();
        let copy_in_tail = vec![
            "add.u64 %rd46, %rd2, %rd41;".to_string(),
            format!("ld.global.{raw_ty} {raw}, [%rd46];"),
            "add.u64 %rd47, %rd10, %rd41;".into(),
            format!("st.global.{raw_ty} [%rd47], {raw};"),
        ];
        let copy_in_unit = |e: &mut Emitter| {
            let (unaligned, done) = (e.label("in_unaligned"), e.label("in_loaded"));
            let mut body = vec!["add.u64 %rd46, %rd2, %rd41;".to_string()];
            body.extend(dtype.unit_load_input("%rd46", &unaligned, &done));
            body.push("add.u64 %rd47, %rd10, %rd41;".into());
            body.push("st.global.v4.u32 [%rd47], {%r5, %r6, %r7, %r8};".into());
            body
        };
        let mut tail = e.reduce_body(dtype);
        tail.push("add.u64 %rd47, %rd1, %rd41;".into());
        tail.push(dtype.store_result("%rd47"));
        match self.algorithm {
            Algorithm::OneShot => {
                let body = copy_in_unit(&mut e);
                e.slice_loop("0", "%rd15", 4, &body);
                e.slice_loop("%rd16", "%rd3", shift, &copy_in_tail);
                e.barrier(0);
                let mut body = e.unit_reduce_body(dtype);
                body.extend(e.unit_store_out(dtype));
                e.slice_loop("0", "%rd15", 4, &body);
                e.slice_loop("%rd16", "%rd3", shift, &tail);
            }
            Algorithm::TwoShot => {
                // Copy in slice by slice (of units), so that CTA b holds
                // the same positions of each slice on every rank.
                let copied = e.label("copied");
                for s in 0..MAX_RANKS {
                    e.op(format!("setp.le.u64 %p6, %rd5, {s};"));
                    e.op(format!("@%p6 bra {copied};"));
                    e.slice_bounds(&s.to_string());
                    let body = copy_in_unit(&mut e);
                    e.slice_loop("%rd50", "%rd51", 4, &body);
                }
                e.place(&copied);
                e.slice_loop("%rd16", "%rd3", shift, &copy_in_tail);
                e.barrier(0);
                // Reduce this rank's slice, publish it in place; every
                // rank reduces the tail itself.
                e.slice_bounds("%rd4");
                let mut body = e.unit_reduce_body(dtype);
                body.push("add.u64 %rd47, %rd10, %rd41;".into());
                body.push("st.global.v4.u32 [%rd47], {%r5, %r6, %r7, %r8};".into());
                body.extend(e.unit_store_out(dtype));
                e.slice_loop("%rd50", "%rd51", 4, &body);
                e.slice_loop("%rd16", "%rd3", shift, &tail);
                e.barrier(1);
                // Gather every other slice from its owner.
                let gathered = e.label("gathered");
                for s in 0..MAX_RANKS {
                    let next = e.label("next");
                    e.op(format!("setp.le.u64 %p6, %rd5, {s};"));
                    e.op(format!("@%p6 bra {gathered};"));
                    e.op(format!("setp.eq.u64 %p10, %rd4, {s};"));
                    e.op(format!("@%p10 bra {next};"));
                    e.slice_bounds(&s.to_string());
                    let mut body = vec![
                        format!("add.u64 %rd46, %rd{}, %rd41;", 30 + s),
                        "ld.global.cg.v4.u32 {%r5, %r6, %r7, %r8}, [%rd46];".into(),
                    ];
                    body.extend(e.unit_store_out(dtype));
                    e.slice_loop("%rd50", "%rd51", 4, &body);
                    e.place(&next);
                }
                e.place(&gathered);
            }
        }
        e.op("ret;");
        e.lines.push("}".into());
        e.lines.join("\n")
    }
}

/// The whole module: header and every kernel of [`AllreduceKernel::all`].
pub fn module_source() -> String {
    let mut text = String::new();
    let _ = write!(
        text,
        "//\n// kolo-nccl peer allreduce kernels (hand-written PTX)\n//\n.version {PTX_VERSION}\n.target {PTX_TARGET}\n.address_size 64\n"
    );
    for kernel in AllreduceKernel::all() {
        text.push('\n');
        text.push_str(&kernel.entry());
        text.push('\n');
    }
    text
}

/// The two-shot slice length in 16-byte units of `dtype`:
/// `ceil(units / world)` (`world >= 1`).
pub fn chunk(n: usize, world: usize, dtype: ArDtype) -> usize {
    (n >> dtype.unit_shift()).div_ceil(world.max(1))
}

/// `(blocks, threads)` of a launch over `n` elements of `dtype` on
/// `world` ranks: the same on every rank, at most [`MAX_BLOCKS`] CTAs.
pub fn launch_dims(algorithm: Algorithm, n: usize, world: usize, dtype: ArDtype) -> (u32, u32) {
    let span = match algorithm {
        Algorithm::OneShot => n >> dtype.unit_shift(),
        Algorithm::TwoShot => chunk(n, world, dtype),
    };
    let blocks = span
        .div_ceil(BLOCK_THREADS as usize)
        .clamp(1, MAX_BLOCKS as usize);
    (blocks as u32, BLOCK_THREADS)
}

/// A data region of `capacity` bytes, rounded up to [`REGION_ALIGN`];
/// `None` on overflow.
pub fn region_bytes(capacity: usize) -> Option<usize> {
    capacity
        .div_ceil(REGION_ALIGN)
        .max(1)
        .checked_mul(REGION_ALIGN)
}

/// The bytes a registered buffer for tensors of up to `capacity` bytes
/// takes: flags and two data regions; `None` on overflow.
pub fn registered_bytes(capacity: usize) -> Option<usize> {
    region_bytes(capacity)?
        .checked_mul(2)?
        .checked_add(HEADER_BYTES)
}

/// The byte offset of call `epoch`'s data region in a buffer of
/// [`registered_bytes`]`(capacity)` (which exists, so nothing overflows).
pub fn data_offset(epoch: u64, capacity: usize) -> u64 {
    let region = region_bytes(capacity).unwrap_or(0) as u64;
    HEADER_BYTES as u64 + (epoch & 1) * region
}
