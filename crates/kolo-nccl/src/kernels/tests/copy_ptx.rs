//! Checks of the batched copy's table planning (coverage, splitting,
//! alignment), its encoding, and the PTX text's structure.

use super::interp::{parse, run_thread, Memory};
use crate::kernels::copy_ptx::*;
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};

fn seg(src: u64, dst: u64, bytes: u64) -> Segment {
    Segment { src, dst, bytes }
}

/// Every entry's addresses are aligned to its width, every entry is
/// non-empty and at most `chunk` long, and the entries of each segment
/// tile it in order.
fn check_plan(segments: &[Segment], chunk: u64) -> Result<Vec<Entry>, TestCaseError> {
    let entries = plan(segments, chunk);
    let chunk = (chunk & !15).max(16);
    let mut rows = entries.iter();
    for s in segments.iter().filter(|s| s.bytes > 0) {
        let (mut src, mut dst, mut left) = (s.src, s.dst, s.bytes);
        while left > 0 {
            let e = rows
                .next()
                .ok_or_else(|| TestCaseError::fail("entries end early"))?;
            prop_assert_eq!((e.src, e.dst), (src, dst));
            prop_assert!(e.bytes > 0 && e.bytes <= left && e.bytes <= chunk);
            prop_assert!(e.width_log2 <= 4);
            let width = 1u64 << e.width_log2;
            prop_assert_eq!(e.src % width, 0);
            prop_assert_eq!(e.dst % width, 0);
            prop_assert_eq!(e.width_log2, width_log2(e.src, e.dst));
            // Equal misalignment: everything after the first row (the
            // head, if any) moves in 16-byte vectors.
            if (s.src ^ s.dst) & 15 == 0 && src != s.src {
                prop_assert_eq!(e.width_log2, 4);
            }
            (src, dst, left) = (src + e.bytes, dst + e.bytes, left - e.bytes);
        }
    }
    prop_assert!(rows.next().is_none(), "entries left over");
    Ok(entries)
}

#[test]
fn widths_follow_the_common_alignment() {
    assert_eq!(width_log2(0x1000, 0x2000), 4);
    assert_eq!(width_log2(0x1008, 0x2000), 3);
    assert_eq!(width_log2(0x1000, 0x2004), 2);
    assert_eq!(width_log2(0x1002, 0x2006), 1);
    assert_eq!(width_log2(0x1001, 0x2000), 0);
    assert_eq!(width_log2(0, 0), 4);
}

#[test]
fn equally_misaligned_segments_get_a_head_then_vectors() {
    let entries = plan(&[seg(0x1003, 0x2003, 100)], CHUNK_BYTES);
    assert_eq!(entries.len(), 2);
    assert_eq!(
        entries[0],
        Entry {
            src: 0x1003,
            dst: 0x2003,
            bytes: 13,
            width_log2: 0
        }
    );
    assert_eq!(
        entries[1],
        Entry {
            src: 0x1010,
            dst: 0x2010,
            bytes: 87,
            width_log2: 4
        }
    );
    // Differently misaligned: no head, the common width all along.
    let entries = plan(&[seg(0x1004, 0x2008, 100)], CHUNK_BYTES);
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].width_log2, 2);
    // A short misaligned segment is all head.
    assert_eq!(plan(&[seg(0x1001, 0x2001, 3)], CHUNK_BYTES).len(), 1);
    // Empty segments vanish.
    assert!(plan(&[seg(0x10, 0x20, 0)], CHUNK_BYTES).is_empty());
}

#[test]
fn huge_segments_are_shared_by_many_ctas() {
    let gib = 1u64 << 30;
    let entries = plan(&[seg(0x1_0000_0000, 0x2_0000_0000, gib + 5)], CHUNK_BYTES);
    assert_eq!(entries.len() as u64, gib / CHUNK_BYTES + 1);
    assert!(entries.iter().all(|e| e.width_log2 == 4));
    assert_eq!(entries.last().map(|e| e.bytes), Some(5));
    assert_eq!(launch_dims(entries.len()), (MAX_BLOCKS, BLOCK_THREADS));
    assert_eq!(launch_dims(1000), (1000, BLOCK_THREADS));
    assert_eq!(launch_dims(0), (1, BLOCK_THREADS));
}

#[test]
fn the_table_layout_is_four_little_endian_words() {
    let entries = [
        Entry {
            src: 0x0102_0304_0506_0708,
            dst: 0x1000,
            bytes: 77,
            width_log2: 3,
        },
        Entry {
            src: 1,
            dst: 2,
            bytes: 3,
            width_log2: 0,
        },
    ];
    let mut out = vec![0xEEu8; 2 * ENTRY_BYTES + 8];
    assert_eq!(encode_into(&entries, &mut out), 2 * ENTRY_BYTES);
    assert_eq!(&out[..8], &[8, 7, 6, 5, 4, 3, 2, 1]);
    assert_eq!(&out[8..16], &0x1000u64.to_le_bytes());
    assert_eq!(&out[16..24], &77u64.to_le_bytes());
    assert_eq!(&out[24..32], &3u64.to_le_bytes());
    assert_eq!(&out[32..40], &1u64.to_le_bytes());
    assert!(out[2 * ENTRY_BYTES..].iter().all(|&b| b == 0xEE));
}

#[test]
fn the_module_is_well_formed() {
    let text = module_source();
    assert_eq!(text.matches(".version ").count(), 1);
    assert_eq!(text.matches(".visible .entry ").count(), 1);
    assert!(text.contains(&format!(".visible .entry {KERNEL}(")));
    assert_eq!(text.matches('{').count(), text.matches('}').count());
    assert!(!text.contains('\0'));
    let body = entry();
    // Every branch lands on a label defined once; every register used is
    // declared.
    let labels: Vec<&str> = body
        .lines()
        .filter_map(|l| l.trim().strip_suffix(':'))
        .collect();
    let unique: HashSet<&str> = labels.iter().copied().collect();
    assert_eq!(unique.len(), labels.len());
    assert!(labels.iter().all(|l| l.starts_with(KERNEL)));
    for line in body.lines().map(str::trim) {
        if let Some(target) = line.split("bra ").nth(1) {
            assert!(unique.contains(target.trim_end_matches(';')), "{line}");
        }
    }
    let declared: HashSet<String> = body
        .lines()
        .map(str::trim)
        .filter_map(|l| l.strip_prefix(".reg "))
        .flat_map(|decl| {
            let decl = decl.rsplit(' ').next().unwrap_or("").trim_end_matches(';');
            let (prefix, count) = decl.split_once('<').unwrap_or(("", "0>"));
            let count: usize = count.trim_end_matches('>').parse().unwrap_or(0);
            (0..count).map(move |i| format!("{prefix}{i}"))
        })
        .collect();
    for line in body.lines().map(str::trim).filter(|l| !l.starts_with('.')) {
        for token in line.split(|c: char| !(c == '%' || c == '.' || c.is_alphanumeric())) {
            if token.starts_with('%') && !token.contains('.') {
                assert!(declared.contains(token), "{token} in {line}");
            }
        }
    }
}

/// Runs the kernel on the interpreter: `lens[k]` bytes from source offset
/// `srcs[k]` to destination offset `dsts[k]` (destinations disjoint), on a
/// `(blocks, threads)` grid, with pieces of at most `chunk` bytes; checks
/// every destination and that nothing else changed.
fn interpret(
    lens: &[u64],
    srcs: &[u64],
    dsts: &[u64],
    chunk: u64,
    grid: (u32, u32),
) -> Result<(), TestCaseError> {
    let base = 0x7000_0000u64;
    let region = 1u64 << 16;
    let (table_at, src_at, dst_at) = (base, base + region, base + 2 * region);
    let segments: Vec<Segment> = (0..lens.len())
        .map(|k| seg(src_at + srcs[k], dst_at + dsts[k], lens[k]))
        .collect();
    let entries = plan(&segments, chunk);
    prop_assert!((entries.len() * ENTRY_BYTES) as u64 <= region);
    let mut mem = Memory {
        base,
        bytes: vec![0xAB; 3 * region as usize],
    };
    for (i, b) in mem.bytes[region as usize..2 * region as usize]
        .iter_mut()
        .enumerate()
    {
        *b = (i * 7 + i / 251) as u8;
    }
    encode_into(&entries, &mut mem.bytes[..region as usize]);
    let before = mem.bytes.clone();
    let (insns, labels) = parse(&entry());
    let params: HashMap<String, u64> = [
        (format!("{KERNEL}_table"), table_at),
        (format!("{KERNEL}_n"), entries.len() as u64),
    ]
    .into_iter()
    .collect();
    let (blocks, threads) = grid;
    for ctaid in 0..blocks {
        for tid in 0..threads {
            run_thread(
                &insns,
                &labels,
                &params,
                (ctaid, threads, tid, blocks),
                &mut mem,
            );
        }
    }
    let mut want = before;
    for s in &segments {
        let (from, to) = ((s.src - base) as usize, (s.dst - base) as usize);
        let piece = want[from..from + s.bytes as usize].to_vec();
        want[to..to + s.bytes as usize].copy_from_slice(&piece);
    }
    if let Some(i) = mem.bytes.iter().zip(&want).position(|(a, b)| a != b) {
        return Err(TestCaseError::fail(format!(
            "byte {:#x} is {}, the host copy has {} (rows {entries:?})",
            base + i as u64,
            mem.bytes[i],
            want[i]
        )));
    }
    Ok(())
}

#[test]
fn the_kernel_copies_every_width_head_and_tail() {
    // 16-byte vectors with a tail, equal misalignment (head), 8 / 4 / 2 / 1
    // byte widths, an empty segment, and pieces split at 48-byte chunks.
    let lens = [100, 45, 64, 30, 20, 7, 0, 300];
    let srcs = [0, 0x203, 0x408, 0x604, 0x802, 0xa01, 0xc00, 0xe00];
    let dsts = [0, 0x203, 0x410, 0x60c, 0x80a, 0xa00, 0xc00, 0xe10];
    for grid in [(1, 1), (2, 3), (3, 32), (40, 4)] {
        interpret(&lens, &srcs, &dsts, 48, grid).unwrap();
        interpret(&lens, &srcs, &dsts, CHUNK_BYTES, grid).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn the_kernel_matches_the_host_copy(
        segs in proptest::collection::vec((0u64..400, 0u64..8000, 0u64..32), 1..12),
        chunk in 16u64..200,
        blocks in 1u32..5,
        threads in 1u32..40,
    ) {
        // Destinations one after another with gaps, sources anywhere.
        let (mut lens, mut srcs, mut dsts) = (Vec::new(), Vec::new(), Vec::new());
        let mut next = 0u64;
        for &(len, src, gap) in &segs {
            next += gap;
            lens.push(len);
            srcs.push(src);
            dsts.push(next);
            next += len;
        }
        interpret(&lens, &srcs, &dsts, chunk, (blocks, threads))?;
    }

    #[test]
    fn plans_tile_every_segment_with_aligned_entries(
        segs in proptest::collection::vec((0u64..1 << 20, 0u64..1 << 20, 0u64..300_000), 0..40),
        chunk in 0u64..200_000,
    ) {
        let segments: Vec<Segment> = segs
            .iter()
            .map(|&(s, d, b)| seg(0x1_0000_0000 + s, 0x9_0000_0000 + d, b))
            .collect();
        let entries = check_plan(&segments, chunk)?;
        // Planning straight into a table gives the same bytes, within the
        // bound; a table one row short is refused.
        prop_assert!(entries.len() <= max_entries(&segments, chunk));
        let mut direct = vec![0u8; max_entries(&segments, chunk) * ENTRY_BYTES];
        let mut listed = direct.clone();
        let written = encode_into(&entries, &mut listed);
        prop_assert_eq!(plan_into(&segments, chunk, &mut direct), Some(entries.len()));
        prop_assert_eq!(&direct[..written], &listed[..written]);
        if !entries.is_empty() {
            let mut short = vec![0u8; written - ENTRY_BYTES];
            prop_assert_eq!(plan_into(&segments, chunk, &mut short), None);
        }
    }

    #[test]
    fn many_small_segments_make_one_row_each(count in 1usize..5000, bytes in 1u64..=16384) {
        let segments: Vec<Segment> = (0..count as u64)
            .map(|i| seg(0x1_0000_0000 + i * 0x10000, 0x2_0000_0000 + i * bytes, bytes))
            .collect();
        let entries = check_plan(&segments, CHUNK_BYTES)?;
        prop_assert!(entries.len() >= count && entries.len() <= 2 * count);
    }
}
