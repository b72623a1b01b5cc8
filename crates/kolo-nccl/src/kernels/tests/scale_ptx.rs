//! Checks of the PTX text: its structure (declarations, labels, one entry
//! per dtype), and its meaning, by running each kernel on a small
//! interpreter of the instructions it uses (modelled on the PTX ISA's
//! definitions) against kolo's host `Element::scale`.

use super::interp::{parse, run_thread, Memory};
use crate::kernels::scale_ptx::*;
use half::{bf16, f16};
use kolo_protocol::DataType;
use kolo_transport::Element;
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};

/// Runs `kernel` over `src` (in place when `dst_offset` is `None`) on a
/// `(blocks, threads)` grid and returns the destination elements.
fn launch<T: Element>(
    kernel: ScaleKernel,
    src: &[T],
    factor: f64,
    grid: (u32, u32),
    in_place: bool,
) -> Vec<T> {
    let (insns, labels) = parse(&kernel.entry());
    let bytes = std::mem::size_of_val(src);
    let base = 0x7000_0000u64;
    let mut mem = Memory {
        base,
        bytes: vec![0xAB; 2 * bytes + 8],
    };
    for (k, x) in src.iter().enumerate() {
        let b = bytemuck_bytes(x);
        let at = k * b.len();
        mem.bytes[at..at + b.len()].copy_from_slice(&b);
    }
    let dst = if in_place { base } else { base + bytes as u64 };
    let name = kernel.name();
    let params: HashMap<String, u64> = [
        (format!("{name}_dst"), dst),
        (format!("{name}_src"), base),
        (format!("{name}_n"), src.len() as u64),
        (format!("{name}_factor"), factor.to_bits()),
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
    let start = (dst - base) as usize;
    let mut out = src.to_vec();
    kolo_transport::byte_view::copy_from_bytes(&mut out, &mem.bytes[start..start + bytes])
        .expect("element bytes");
    // Nothing past the destination was touched.
    assert!(mem.bytes[2 * bytes..].iter().all(|&b| b == 0xAB));
    out
}

fn bytemuck_bytes<T: Element>(x: &T) -> Vec<u8> {
    kolo_transport::byte_view::as_bytes(std::slice::from_ref(x)).to_vec()
}

/// The kernel's result equals kolo's host scale bit for bit (NaNs as NaN).
fn agrees<T: Element>(
    kernel: ScaleKernel,
    src: &[T],
    factor: f64,
    grid: (u32, u32),
) -> Result<(), TestCaseError> {
    let mut want = src.to_vec();
    T::scale(&mut want, factor);
    for in_place in [true, false] {
        let got = launch(kernel, src, factor, grid, in_place);
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            let same = bytemuck_bytes(g) == bytemuck_bytes(w)
                || (g.to_f64().is_nan() && w.to_f64().is_nan());
            prop_assert!(
                same,
                "{} element {k} of {}: got {g:?}, want {w:?} (factor {factor})",
                kernel.name(),
                src.len()
            );
        }
    }
    Ok(())
}

#[test]
fn the_module_declares_one_entry_per_dtype_once() {
    let text = module_source();
    assert_eq!(text.matches(".version ").count(), 1);
    assert!(text.contains(".target sm_80\n.address_size 64"));
    for k in ScaleKernel::ALL {
        assert_eq!(
            text.matches(&format!(".visible .entry {}(", k.name()))
                .count(),
            1,
            "{k:?}"
        );
        assert_eq!(ScaleKernel::for_dtype(dtype_of(k)), Some(k));
        assert_eq!(k.elem_bytes(), dtype_of(k).size());
    }
    assert_eq!(text.matches('{').count(), text.matches('}').count());
    assert!(ScaleKernel::for_dtype(DataType::I16).is_none());
    assert!(ScaleKernel::for_dtype(DataType::Bool).is_none());
    // The driver reads a NUL-terminated image: no NUL inside.
    assert!(!text.contains('\0'));
}

fn dtype_of(k: ScaleKernel) -> DataType {
    match k {
        ScaleKernel::F32 => DataType::F32,
        ScaleKernel::F64 => DataType::F64,
        ScaleKernel::F16 => DataType::F16,
        ScaleKernel::Bf16 => DataType::BF16,
        ScaleKernel::I32 => DataType::I32,
        ScaleKernel::I64 => DataType::I64,
        ScaleKernel::U8 => DataType::U8,
        ScaleKernel::I8 => DataType::I8,
    }
}

#[test]
fn every_register_is_declared_and_every_branch_lands() {
    for k in ScaleKernel::ALL {
        let entry = k.entry();
        let mut declared = HashSet::new();
        for line in entry
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with(".reg"))
        {
            let decl = line.rsplit(' ').next().unwrap().trim_end_matches(';');
            let (prefix, count) = decl.split_once('<').unwrap();
            let count: usize = count.trim_end_matches('>').parse().unwrap();
            for i in 0..count {
                declared.insert(format!("{prefix}{i}"));
            }
        }
        let (insns, labels) = parse(&entry);
        for i in &insns {
            for reg in i
                .args
                .iter()
                .chain(&i.guard)
                .map(|a| a.trim_start_matches('[').trim_end_matches(']'))
            {
                if reg.starts_with('%') && !reg.contains('.') {
                    assert!(
                        declared.contains(reg),
                        "{}: {reg} is not declared",
                        k.name()
                    );
                }
            }
            if i.op == "bra" {
                assert!(
                    labels.contains_key(&i.args[0]),
                    "{}: no label {}",
                    k.name(),
                    i.args[0]
                );
            }
        }
        // Labels are unique across the module (prefixed by the entry).
        assert!(labels.keys().all(|l| l.starts_with(k.name())));
    }
}

#[test]
fn launch_dims_cover_every_element() {
    assert_eq!(launch_dims(1), (1, BLOCK_THREADS));
    assert_eq!(launch_dims(257), (2, BLOCK_THREADS));
    assert_eq!(launch_dims(usize::MAX / 2), (MAX_BLOCKS, BLOCK_THREADS));
}

#[test]
fn edges_match_the_host() {
    let g = (3, 4);
    agrees(ScaleKernel::I32, &[i32::MAX, i32::MIN, -7, 7, 0], 3.5, g).unwrap();
    agrees(ScaleKernel::I32, &[5, -5, 1], 0.5, g).unwrap();
    agrees(
        ScaleKernel::I64,
        &[i64::MAX, i64::MIN, -9, 1 << 60],
        1.75,
        g,
    )
    .unwrap();
    agrees(ScaleKernel::U8, &[255u8, 0, 3, 200], 2.0, g).unwrap();
    agrees(ScaleKernel::U8, &[255u8, 9], -1.0, g).unwrap();
    agrees(ScaleKernel::I8, &[127i8, -128, -3, 5], 1.5, g).unwrap();
    agrees(
        ScaleKernel::F32,
        &[
            f32::MIN_POSITIVE / 8.0,
            f32::MAX,
            -0.0,
            f32::NAN,
            f32::INFINITY,
        ],
        0.5,
        g,
    )
    .unwrap();
    agrees(ScaleKernel::F64, &[1e-310, -2.5, f64::MAX], 3.0, g).unwrap();
    agrees(
        ScaleKernel::F16,
        &[
            f16::from_f32(65504.0),
            f16::from_bits(1),
            f16::from_f32(-1.5),
        ],
        0.3,
        g,
    )
    .unwrap();
    agrees(
        ScaleKernel::Bf16,
        &[
            bf16::from_f32(1.0 + 1.0 / 128.0),
            bf16::MAX,
            bf16::from_bits(1),
        ],
        1.0 / 3.0,
        g,
    )
    .unwrap();
    // Zero elements: the loop is skipped.
    agrees::<f32>(ScaleKernel::F32, &[], 2.0, g).unwrap();
}

fn factors() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(0.0),
        Just(-1.0),
        Just(0.125),
        Just(1.0 / 3.0),
        -1e3f64..1e3
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn floats_match_the_host(xs in proptest::collection::vec(-1e6f32..1e6, 0..70), factor in factors(), blocks in 1u32..4, threads in 1u32..9) {
        agrees(ScaleKernel::F32, &xs, factor, (blocks, threads))?;
        let ds: Vec<f64> = xs.iter().map(|&x| f64::from(x) * 1.000001).collect();
        agrees(ScaleKernel::F64, &ds, factor, (blocks, threads))?;
        let hs: Vec<f16> = xs.iter().map(|&x| f16::from_f32(x / 64.0)).collect();
        agrees(ScaleKernel::F16, &hs, factor, (blocks, threads))?;
        let bs: Vec<bf16> = xs.iter().map(|&x| bf16::from_f32(x)).collect();
        agrees(ScaleKernel::Bf16, &bs, factor, (blocks, threads))?;
    }

    #[test]
    fn integers_match_the_host(xs in proptest::collection::vec(any::<i64>(), 0..70), factor in factors(), blocks in 1u32..4, threads in 1u32..9) {
        agrees(ScaleKernel::I64, &xs, factor, (blocks, threads))?;
        let is: Vec<i32> = xs.iter().map(|&x| x as i32).collect();
        agrees(ScaleKernel::I32, &is, factor, (blocks, threads))?;
        let us: Vec<u8> = xs.iter().map(|&x| x as u8).collect();
        agrees(ScaleKernel::U8, &us, factor, (blocks, threads))?;
        let ss: Vec<i8> = xs.iter().map(|&x| x as i8).collect();
        agrees(ScaleKernel::I8, &ss, factor, (blocks, threads))?;
    }
}
