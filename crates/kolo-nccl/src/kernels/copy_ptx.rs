//! The batched copy kernel: many device-to-device copies in one launch,
//! for the device fusion buffer (1,000 gradients packed with one launch
//! instead of 1,000 `cuMemcpyDtoDAsync` calls). PTX written by hand, like
//! [`crate::kernels::scale_ptx`], JIT-compiled by the driver on first use.
//!
//! The host turns the copies ([`Segment`]s) into a table of [`Entry`]s
//! ([`plan_into`]): segments longer than [`CHUNK_BYTES`] are split so that
//! several CTAs share them, and each entry carries the widest access width
//! (16, 8, 4, 2 or 1 bytes) its source and destination addresses both
//! allow; a segment whose two ends are equally misaligned gets a short
//! head entry so that the rest moves in 16-byte vectors. The kernel
//! `kolo_batched_copy(table, entries)` walks the table (which
//! `batched_copy` keeps in mapped pinned host memory): CTA `c` takes entries
//! `c, c + nctaid, ...`; its threads copy `bytes >> width_log2` units of
//! the entry's width (`ld.global.v4.u32` for 16 bytes), then the last
//! `bytes % width` bytes one byte per thread.
//!
//! Each entry is four little-endian u64 words: source, destination, bytes,
//! log2 of the width. Pure text and planning: checked by `kernels/tests/`,
//! run on the GPU by the crate's GPU test binaries.

use crate::kernels::scale_ptx::{PTX_TARGET, PTX_VERSION};

/// The kernel's name in its module.
pub const KERNEL: &str = "kolo_batched_copy";
/// Bytes per table entry.
pub const ENTRY_BYTES: usize = 32;
/// The longest piece one entry (one CTA at a time) copies; a multiple of 16.
pub const CHUNK_BYTES: u64 = 64 << 10;
/// Threads per CTA.
pub const BLOCK_THREADS: u32 = 256;
/// At most this many CTAs; they stride over the remaining entries.
pub const MAX_BLOCKS: u32 = 4096;

/// One copy: `bytes` from device address `src` to `dst` (not overlapping).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Source address.
    pub src: u64,
    /// Destination address.
    pub dst: u64,
    /// Bytes to copy.
    pub bytes: u64,
}

/// One row of the kernel's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Source address.
    pub src: u64,
    /// Destination address.
    pub dst: u64,
    /// Bytes to copy (at most [`CHUNK_BYTES`] unless planned otherwise).
    pub bytes: u64,
    /// log2 of the access width: both addresses are multiples of it.
    pub width_log2: u32,
}

/// log2 of the widest access (at most 16 bytes) that both `src` and `dst`
/// are aligned to.
pub fn width_log2(src: u64, dst: u64) -> u32 {
    (src | dst).trailing_zeros().min(4)
}

/// The table for `segments`: empty segments dropped, equally misaligned
/// ones given a head entry up to the next 16-byte boundary, and every
/// piece at most `chunk` bytes (rounded down to a multiple of 16, at least
/// 16), so pieces after the first keep the first's alignment. The launch
/// plans straight into its table ([`plan_into`]); this list is what the
/// tests compare that table against.
#[cfg(test)]
pub fn plan(segments: &[Segment], chunk: u64) -> Vec<Entry> {
    let mut entries = Vec::with_capacity(segments.len());
    for_each_entry(segments, chunk, |e| entries.push(e));
    entries
}

/// `plan`'s entries, one at a time, without collecting them.
fn for_each_entry(segments: &[Segment], chunk: u64, mut f: impl FnMut(Entry)) {
    let chunk = (chunk & !15).max(16);
    for s in segments.iter().filter(|s| s.bytes > 0) {
        let (mut src, mut dst, mut left) = (s.src, s.dst, s.bytes);
        let misaligned = src & 15;
        if misaligned != 0 && (src ^ dst) & 15 == 0 {
            let head = left.min(16 - misaligned);
            f(Entry {
                src,
                dst,
                bytes: head,
                width_log2: width_log2(src, dst),
            });
            (src, dst, left) = (src + head, dst + head, left - head);
        }
        while left > 0 {
            let bytes = left.min(chunk);
            f(Entry {
                src,
                dst,
                bytes,
                width_log2: width_log2(src, dst),
            });
            (src, dst, left) = (src + bytes, dst + bytes, left - bytes);
        }
    }
}

/// An upper bound on the rows the planning makes for `segments` (a head and a
/// partial piece per segment, plus the whole pieces).
pub fn max_entries(segments: &[Segment], chunk: u64) -> usize {
    let chunk = (chunk & !15).max(16);
    segments
        .iter()
        .map(|s| (s.bytes / chunk) as usize + 2)
        .fold(0usize, usize::saturating_add)
}

/// Writes one row in the kernel's layout.
fn encode_row(e: &Entry, row: &mut [u8]) {
    row[0..8].copy_from_slice(&e.src.to_le_bytes());
    row[8..16].copy_from_slice(&e.dst.to_le_bytes());
    row[16..24].copy_from_slice(&e.bytes.to_le_bytes());
    row[24..32].copy_from_slice(&u64::from(e.width_log2).to_le_bytes());
}

/// Writes `entries` into `out` (at least `entries.len() * ENTRY_BYTES`
/// long) in the kernel's layout; returns the bytes written (for the
/// tests, like [`plan`]).
#[cfg(test)]
pub fn encode_into(entries: &[Entry], out: &mut [u8]) -> usize {
    let mut written = 0;
    for (e, row) in entries.iter().zip(out.chunks_exact_mut(ENTRY_BYTES)) {
        encode_row(e, row);
        written += ENTRY_BYTES;
    }
    written
}

/// Plans `segments` straight into `out` (the same rows as
/// `encode_into(&plan(segments, chunk), out)`, without the intermediate
/// list); returns the rows written, or `None` when `out` is too short.
pub fn plan_into(segments: &[Segment], chunk: u64, out: &mut [u8]) -> Option<usize> {
    let mut rows = out.chunks_exact_mut(ENTRY_BYTES);
    let (mut written, mut short) = (0, false);
    for_each_entry(segments, chunk, |e| match rows.next() {
        Some(row) => {
            encode_row(&e, row);
            written += 1;
        }
        None => short = true,
    });
    (!short).then_some(written)
}

/// `(blocks, threads)` for a table of `entries` rows (`entries > 0`).
pub fn launch_dims(entries: usize) -> (u32, u32) {
    (entries.clamp(1, MAX_BLOCKS as usize) as u32, BLOCK_THREADS)
}

/// One unit loop of the kernel: `units` accesses of `1 << shift` bytes.
fn unit_loop(shift: u32) -> Vec<String> {
    let label = format!("{KERNEL}_w{shift}");
    let (load, store) = match shift {
        4 => (
            "ld.global.v4.u32 {%r6, %r7, %r8, %r9}, [%rd14];",
            "st.global.v4.u32 [%rd15], {%r6, %r7, %r8, %r9};",
        ),
        3 => (
            "ld.global.u64 %rd18, [%rd14];",
            "st.global.u64 [%rd15], %rd18;",
        ),
        2 => ("ld.global.u32 %r6, [%rd14];", "st.global.u32 [%rd15], %r6;"),
        1 => (
            "ld.global.u16 %rs1, [%rd14];",
            "st.global.u16 [%rd15], %rs1;",
        ),
        _ => ("ld.global.u8 %r6, [%rd14];", "st.global.u8 [%rd15], %r6;"),
    };
    vec![
        format!("{label}:"),
        format!("    shl.b64 %rd16, %rd13, {shift};"),
        "    add.u64 %rd14, %rd8, %rd16;".into(),
        "    add.u64 %rd15, %rd9, %rd16;".into(),
        format!("    {load}"),
        format!("    {store}"),
        "    add.u64 %rd13, %rd13, %rd6;".into(),
        "    setp.lt.u64 %p2, %rd13, %rd12;".into(),
        format!("    @%p2 bra {label};"),
        format!("    bra {KERNEL}_tail;"),
    ]
}

/// The kernel's `.entry`.
pub fn entry() -> String {
    let k = KERNEL;
    let mut lines: Vec<String> = vec![
        format!(".visible .entry {k}("),
        format!("    .param .u64 {k}_table,"),
        format!("    .param .u64 {k}_n"),
        ")".into(),
        "{".into(),
        "    .reg .pred %p<4>;".into(),
        "    .reg .b16 %rs<2>;".into(),
        "    .reg .b32 %r<10>;".into(),
        "    .reg .b64 %rd<19>;".into(),
        format!("    ld.param.u64 %rd1, [{k}_table];"),
        format!("    ld.param.u64 %rd2, [{k}_n];"),
        "    cvta.to.global.u64 %rd1, %rd1;".into(),
        "    mov.u32 %r1, %ctaid.x;".into(),
        "    mov.u32 %r2, %nctaid.x;".into(),
        "    mov.u32 %r3, %tid.x;".into(),
        "    mov.u32 %r4, %ntid.x;".into(),
        // e = ctaid; entry stride = nctaid; tid; thread stride = ntid.
        "    cvt.u64.u32 %rd3, %r1;".into(),
        "    cvt.u64.u32 %rd4, %r2;".into(),
        "    cvt.u64.u32 %rd5, %r3;".into(),
        "    cvt.u64.u32 %rd6, %r4;".into(),
        "    setp.ge.u64 %p1, %rd3, %rd2;".into(),
        format!("    @%p1 bra {k}_done;"),
        format!("{k}_entry:"),
        "    shl.b64 %rd7, %rd3, 5;".into(),
        "    add.u64 %rd7, %rd1, %rd7;".into(),
        "    ld.global.u64 %rd8, [%rd7];".into(),
        "    ld.global.u64 %rd9, [%rd7+8];".into(),
        "    ld.global.u64 %rd10, [%rd7+16];".into(),
        "    ld.global.u64 %rd11, [%rd7+24];".into(),
        "    cvta.to.global.u64 %rd8, %rd8;".into(),
        "    cvta.to.global.u64 %rd9, %rd9;".into(),
        "    cvt.u32.u64 %r5, %rd11;".into(),
        // units = bytes >> shift; i = tid.
        "    shr.u64 %rd12, %rd10, %r5;".into(),
        "    mov.u64 %rd13, %rd5;".into(),
        "    setp.ge.u64 %p2, %rd13, %rd12;".into(),
        format!("    @%p2 bra {k}_tail;"),
    ];
    for shift in [4u32, 3, 2, 1] {
        lines.push(format!("    setp.eq.u32 %p3, %r5, {shift};"));
        lines.push(format!("    @%p3 bra {k}_w{shift};"));
    }
    for shift in [0u32, 4, 3, 2, 1] {
        lines.extend(unit_loop(shift));
    }
    lines.extend([
        // The tail: bytes - (units << shift) < width bytes, one byte per
        // thread (strided, for blocks narrower than a width).
        format!("{k}_tail:"),
        "    shl.b64 %rd16, %rd12, %r5;".into(),
        "    sub.u64 %rd17, %rd10, %rd16;".into(),
        "    mov.u64 %rd13, %rd5;".into(),
        format!("{k}_tail_loop:"),
        "    setp.ge.u64 %p2, %rd13, %rd17;".into(),
        format!("    @%p2 bra {k}_next;"),
        "    add.u64 %rd18, %rd16, %rd13;".into(),
        "    add.u64 %rd14, %rd8, %rd18;".into(),
        "    add.u64 %rd15, %rd9, %rd18;".into(),
        "    ld.global.u8 %r6, [%rd14];".into(),
        "    st.global.u8 [%rd15], %r6;".into(),
        "    add.u64 %rd13, %rd13, %rd6;".into(),
        format!("    bra {k}_tail_loop;"),
        format!("{k}_next:"),
        "    add.u64 %rd3, %rd3, %rd4;".into(),
        "    setp.lt.u64 %p1, %rd3, %rd2;".into(),
        format!("    @%p1 bra {k}_entry;"),
        format!("{k}_done:"),
        "    ret;".into(),
        "}".into(),
    ]);
    lines.join("\n")
}

/// The whole module: header and the kernel.
pub fn module_source() -> String {
    format!(
        "//\n// kolo-nccl batched copy kernel (hand-written PTX)\n//\n.version {PTX_VERSION}\n.target {PTX_TARGET}\n.address_size 64\n\n{}\n",
        entry()
    )
}
