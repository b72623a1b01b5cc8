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
//!   slice `r` (`[r * chunk, (r + 1) * chunk)`, `chunk = ceil(n / world)`)
//!   from every buffer, writes it over its own buffer's slice `r` and into
//!   its output, signals again, waits again and gathers the other slices
//!   from their owners' buffers (reduce-scatter then all-gather).
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
//! GPU's SMs) of [`BLOCK_THREADS`] threads.
//!
//! # Parameters
//!
//! `(out, in, peer0 .. peer7, rank, world, n, chunk, epoch, data_off,
//! factor)`: all u64 but `factor` (f64). `peerK` is rank `K`'s registered
//! buffer as this device addresses it (unused ones may be 0), `n` the
//! element count, `chunk` the two-shot slice length (ignored by one-shot),
//! `data_off` the byte offset of this call's region ([`data_offset`]).
//! `out == in` reduces in place; both are any element-aligned addresses.
//! The grid must have at least [`MAX_RANKS`] threads per CTA and at most
//! [`MAX_BLOCKS`] CTAs ([`launch_dims`]).
//!
//! Pure text and arithmetic: checked by `kernels/tests/` (an interpreter
//! runs simulated ranks with interleaved CTAs), run on a GPU by the crate's
//! GPU test binaries.

use crate::kernels::scale_ptx::{PTX_TARGET, PTX_VERSION};
use kolo_protocol::DataType;
use std::fmt::Write;

/// The most ranks (peer buffers) a kernel handles.
pub const MAX_RANKS: usize = 8;
/// The most CTAs of one launch (the flag slots per phase and sender).
pub const MAX_BLOCKS: u32 = 32;
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

/// The element types the kernels handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ArDtype {
    /// f32 in f32.
    F32,
    /// f16 through f32.
    F16,
    /// bf16 through f32.
    Bf16,
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

    /// The raw bits' register and load / store type.
    fn raw(self) -> (&'static str, &'static str) {
        match self {
            ArDtype::F32 => ("%r1", "u32"),
            ArDtype::F16 | ArDtype::Bf16 => ("%rs1", "u16"),
        }
    }

    /// `%f3 = widen([addr])`, loaded past L1 (`.cg`: peers' memory).
    fn load_f32(self, addr: &str) -> Vec<String> {
        match self {
            ArDtype::F32 => vec![format!("ld.global.cg.f32 %f3, [{addr}];")],
            ArDtype::F16 => vec![
                format!("ld.global.cg.u16 %rs2, [{addr}];"),
                "cvt.f32.f16 %f3, %rs2;".into(),
            ],
            // bf16 is the top half of an f32: widening is a shift.
            ArDtype::Bf16 => vec![
                format!("ld.global.cg.u16 %rs2, [{addr}];"),
                "cvt.u32.u16 %r2, %rs2;".into(),
                "shl.b32 %r2, %r2, 16;".into(),
                "mov.b32 %f3, %r2;".into(),
            ],
        }
    }

    /// Rounds the f32 accumulator `%f2` to the type (in `%f2` for f32,
    /// `%rs3` for halves).
    fn narrow(self) -> Vec<String> {
        match self {
            ArDtype::F32 => vec![],
            ArDtype::F16 => vec!["cvt.rn.f16.f32 %rs3, %f2;".into()],
            ArDtype::Bf16 => vec!["cvt.rn.bf16.f32 %rs3, %f2;".into()],
        }
    }

    /// Scales the narrowed value by `%f1` (kolo's `Element::scale`).
    fn scale(self) -> Vec<String> {
        match self {
            ArDtype::F32 => vec!["mul.rn.f32 %f2, %f2, %f1;".into()],
            ArDtype::F16 => vec![
                "cvt.f32.f16 %f2, %rs3;".into(),
                "mul.rn.f32 %f2, %f2, %f1;".into(),
                "cvt.rn.f16.f32 %rs3, %f2;".into(),
            ],
            ArDtype::Bf16 => vec![
                "cvt.u32.u16 %r2, %rs3;".into(),
                "shl.b32 %r2, %r2, 16;".into(),
                "mov.b32 %f2, %r2;".into(),
                "mul.rn.f32 %f2, %f2, %f1;".into(),
                "cvt.rn.bf16.f32 %rs3, %f2;".into(),
            ],
        }
    }

    /// Stores the result at `addr`.
    fn store_result(self, addr: &str) -> String {
        match self {
            ArDtype::F32 => format!("st.global.f32 [{addr}], %f2;"),
            ArDtype::F16 | ArDtype::Bf16 => format!("st.global.u16 [{addr}], %rs3;"),
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
        ["rank", "world", "n", "chunk", "epoch", "data_off", "factor"]
            .iter()
            .map(|s| s.to_string()),
    );
    names
}

/// Emits instructions and unique labels.
struct Emitter {
    name: &'static str,
    lines: Vec<String>,
    labels: usize,
}

impl Emitter {
    fn op(&mut self, line: impl AsRef<str>) {
        self.lines.push(format!("    {}", line.as_ref()));
    }
    fn ops(&mut self, lines: impl IntoIterator<Item = String>) {
        for l in lines {
            self.op(l);
        }
    }
    fn label(&mut self, what: &str) -> String {
        self.labels += 1;
        format!("{}_{what}{}", self.name, self.labels)
    }
    fn place(&mut self, label: &str) {
        self.lines.push(format!("{label}:"));
    }

    /// `%rd40 = lo + i0; while %rd40 < hi { %rd41 = byte offset; body;
    /// %rd40 += stride }`: the positions of this CTA's threads in
    /// `[lo, hi)`, the same on every rank.
    fn slice_loop(&mut self, lo: &str, hi: &str, shift: u32, body: &[String]) {
        let (top, end) = (self.label("loop"), self.label("end"));
        self.op(format!("add.u64 %rd40, %rd11, {lo};"));
        self.place(&top);
        self.op(format!("setp.ge.u64 %p1, %rd40, {hi};"));
        self.op(format!("@%p1 bra {end};"));
        self.op(format!("shl.b64 %rd41, %rd40, {shift};"));
        self.ops(body.iter().cloned());
        self.op("add.u64 %rd40, %rd40, %rd12;");
        self.op(format!("bra {top};"));
        self.place(&end);
    }

    /// `dst = peerK` (data base `%rd3K` when `data`, else `%rd2K`) for the
    /// rank held in `index`.
    fn select_peer(&mut self, dst: &str, index: &str, data: bool) {
        let base = if data { 30 } else { 20 };
        for k in 0..MAX_RANKS {
            self.op(format!("setp.eq.u64 %p2, {index}, {k};"));
            self.op(format!("@%p2 mov.u64 {dst}, %rd{};", base + k));
        }
    }

    /// `%rd50 = lo`, `%rd51 = hi` of slice `s` (a register or a number).
    fn slice_bounds(&mut self, s: &str) {
        self.op(format!("mul.lo.u64 %rd50, %rd7, {s};"));
        self.op("min.u64 %rd50, %rd50, %rd3;");
        self.op("add.u64 %rd51, %rd50, %rd7;");
        self.op("min.u64 %rd51, %rd51, %rd3;");
    }

    /// Phase `phase`'s signal and wait (see the module doc).
    fn barrier(&mut self, phase: usize) {
        let (signalled, waited, spin) = (self.label("sig"), self.label("wait"), self.label("spin"));
        self.op("bar.sync 0;");
        self.op("setp.ge.u64 %p3, %rd14, %rd5;");
        self.op(format!("@%p3 bra {signalled};"));
        // Slot [phase][ctaid][rank] of peer `tid`'s buffer.
        self.select_peer("%rd42", "%rd14", false);
        self.op(format!(
            "add.u64 %rd43, %rd13, {};",
            phase * MAX_BLOCKS as usize
        ));
        self.op(format!(
            "shl.b64 %rd43, %rd43, {};",
            MAX_RANKS.trailing_zeros()
        ));
        self.op("add.u64 %rd43, %rd43, %rd4;");
        self.op("shl.b64 %rd43, %rd43, 3;");
        self.op("add.u64 %rd42, %rd42, %rd43;");
        self.op("fence.acq_rel.sys;");
        self.op("st.relaxed.sys.global.u64 [%rd42], %rd6;");
        self.place(&signalled);
        self.op(format!("@%p3 bra {waited};"));
        // Slot [phase][ctaid][tid] of this rank's buffer.
        self.op(format!(
            "add.u64 %rd44, %rd13, {};",
            phase * MAX_BLOCKS as usize
        ));
        self.op(format!(
            "shl.b64 %rd44, %rd44, {};",
            MAX_RANKS.trailing_zeros()
        ));
        self.op("add.u64 %rd44, %rd44, %rd14;");
        self.op("shl.b64 %rd44, %rd44, 3;");
        self.op("add.u64 %rd44, %rd9, %rd44;");
        self.place(&spin);
        self.op("ld.acquire.sys.global.u64 %rd45, [%rd44];");
        self.op("setp.lt.u64 %p4, %rd45, %rd6;");
        self.op(format!("@%p4 bra {spin};"));
        self.op("fence.acq_rel.sys;");
        self.place(&waited);
        self.op("bar.sync 0;");
    }

    /// The loop body reducing element `%rd41` (byte offset) of every rank's
    /// data into `%f2` / `%rs3`, scaled; stores are the caller's.
    fn reduce_body(&mut self, dtype: ArDtype) -> Vec<String> {
        let mut body = vec!["add.u64 %rd46, %rd30, %rd41;".to_string()];
        body.extend(dtype.load_f32("%rd46"));
        body.push("mov.f32 %f2, %f3;".into());
        let done = self.label("summed");
        for k in 1..MAX_RANKS {
            body.push(format!("setp.le.u64 %p5, %rd5, {k};"));
            body.push(format!("@%p5 bra {done};"));
            body.push(format!("add.u64 %rd46, %rd{}, %rd41;", 30 + k));
            body.extend(dtype.load_f32("%rd46"));
            body.push("add.rn.f32 %f2, %f2, %f3;".into());
        }
        body.push(format!("{done}:"));
        body.extend(dtype.narrow());
        let unscaled = self.label("unscaled");
        body.push(format!("@%p9 bra {unscaled};"));
        body.extend(dtype.scale());
        body.push(format!("{unscaled}:"));
        body
    }
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
            ".reg .pred %p<10>;",
            ".reg .b16 %rs<4>;",
            ".reg .b32 %r<5>;",
            ".reg .b64 %rd<52>;",
            ".reg .f32 %f<4>;",
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

        let (raw, raw_ty) = dtype.raw();
        let copy_in = vec![
            "add.u64 %rd46, %rd2, %rd41;".to_string(),
            format!("ld.global.{raw_ty} {raw}, [%rd46];"),
            "add.u64 %rd47, %rd10, %rd41;".into(),
            format!("st.global.{raw_ty} [%rd47], {raw};"),
        ];
        match self.algorithm {
            Algorithm::OneShot => {
                e.slice_loop("0", "%rd3", shift, &copy_in);
                e.barrier(0);
                let mut body = e.reduce_body(dtype);
                body.push("add.u64 %rd47, %rd1, %rd41;".into());
                body.push(dtype.store_result("%rd47"));
                e.slice_loop("0", "%rd3", shift, &body);
            }
            Algorithm::TwoShot => {
                // Copy in slice by slice, so that CTA b holds the same
                // positions of each slice on every rank.
                let copied = e.label("copied");
                for s in 0..MAX_RANKS {
                    e.op(format!("setp.le.u64 %p6, %rd5, {s};"));
                    e.op(format!("@%p6 bra {copied};"));
                    e.slice_bounds(&s.to_string());
                    e.slice_loop("%rd50", "%rd51", shift, &copy_in);
                }
                e.place(&copied);
                e.barrier(0);
                // Reduce this rank's slice, publish it in place.
                e.slice_bounds("%rd4");
                let mut body = e.reduce_body(dtype);
                body.push("add.u64 %rd47, %rd1, %rd41;".into());
                body.push(dtype.store_result("%rd47"));
                body.push("add.u64 %rd47, %rd10, %rd41;".into());
                body.push(dtype.store_result("%rd47"));
                e.slice_loop("%rd50", "%rd51", shift, &body);
                e.barrier(1);
                // Gather every other slice from its owner.
                let gathered = e.label("gathered");
                for s in 0..MAX_RANKS {
                    let next = e.label("next");
                    e.op(format!("setp.le.u64 %p6, %rd5, {s};"));
                    e.op(format!("@%p6 bra {gathered};"));
                    e.op(format!("setp.eq.u64 %p7, %rd4, {s};"));
                    e.op(format!("@%p7 bra {next};"));
                    e.slice_bounds(&s.to_string());
                    let body = vec![
                        format!("add.u64 %rd46, %rd{}, %rd41;", 30 + s),
                        format!("ld.global.cg.{raw_ty} {raw}, [%rd46];"),
                        "add.u64 %rd47, %rd1, %rd41;".into(),
                        format!("st.global.{raw_ty} [%rd47], {raw};"),
                    ];
                    e.slice_loop("%rd50", "%rd51", shift, &body);
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

/// The two-shot slice length: `ceil(n / world)` (`world >= 1`).
pub fn chunk(n: usize, world: usize) -> usize {
    n.div_ceil(world.max(1))
}

/// `(blocks, threads)` of a launch over `n` elements on `world` ranks:
/// the same on every rank, at most [`MAX_BLOCKS`] CTAs.
pub fn launch_dims(algorithm: Algorithm, n: usize, world: usize) -> (u32, u32) {
    let span = match algorithm {
        Algorithm::OneShot => n,
        Algorithm::TwoShot => chunk(n, world),
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
