//! Checks of the PTX text: its structure (declarations, labels, one entry
//! per dtype), and its meaning, by running each kernel on a small
//! interpreter of the instructions it uses (modelled on the PTX ISA's
//! definitions) against kolo's host `Element::scale`.

use super::*;
use half::{bf16, f16};
use kolo_transport::Element;
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};

/// One instruction: optional predicate guard, opcode, operands.
#[derive(Debug, Clone)]
struct Insn {
    guard: Option<String>,
    op: String,
    args: Vec<String>,
}

/// The instructions and label positions of an entry's body.
fn parse(entry: &str) -> (Vec<Insn>, HashMap<String, usize>) {
    let body = entry
        .split_once('{')
        .and_then(|(_, rest)| rest.rsplit_once('}'))
        .map(|(body, _)| body)
        .expect("an entry has a body");
    let mut insns = Vec::new();
    let mut labels = HashMap::new();
    for line in body.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(label) = line.strip_suffix(':') {
            assert!(labels.insert(label.to_string(), insns.len()).is_none());
            continue;
        }
        if line.starts_with(".reg") {
            continue;
        }
        let line = line.strip_suffix(';').expect("instructions end with ';'");
        let (guard, rest) = match line.strip_prefix('@') {
            Some(g) => {
                let (g, rest) = g.split_once(' ').expect("a guarded instruction");
                (Some(g.to_string()), rest)
            }
            None => (None, line),
        };
        let (op, args) = rest.split_once(' ').unwrap_or((rest, ""));
        let args = args
            .split(',')
            .map(|a| a.trim().to_string())
            .filter(|a| !a.is_empty())
            .collect();
        insns.push(Insn {
            guard,
            op: op.to_string(),
            args,
        });
    }
    (insns, labels)
}

/// Global memory: `bytes` at address `base`.
struct Memory {
    base: u64,
    bytes: Vec<u8>,
}

impl Memory {
    fn range(&self, addr: u64, len: usize) -> std::ops::Range<usize> {
        let start = (addr - self.base) as usize;
        assert!(
            start + len <= self.bytes.len(),
            "out of bounds at {addr:#x}"
        );
        start..start + len
    }
    fn load(&self, addr: u64, len: usize) -> u64 {
        let mut w = [0u8; 8];
        w[..len].copy_from_slice(&self.bytes[self.range(addr, len)]);
        u64::from_le_bytes(w)
    }
    fn store(&mut self, addr: u64, len: usize, value: u64) {
        let r = self.range(addr, len);
        self.bytes[r].copy_from_slice(&value.to_le_bytes()[..len]);
    }
}

fn f32_of(bits: u64) -> f32 {
    f32::from_bits(bits as u32)
}

/// Runs `entry` for one thread `(ctaid, tid)` of a `(nctaid, ntid)` grid.
fn run_thread(
    insns: &[Insn],
    labels: &HashMap<String, usize>,
    params: &HashMap<String, u64>,
    grid: (u32, u32, u32, u32),
    mem: &mut Memory,
) {
    let (ctaid, ntid, tid, nctaid) = grid;
    let mut regs: HashMap<String, u64> = HashMap::new();
    let mut pc = 0;
    let mut steps = 0u64;
    while pc < insns.len() {
        steps += 1;
        assert!(steps < 10_000_000, "runaway kernel");
        let i = &insns[pc];
        pc += 1;
        if let Some(p) = &i.guard {
            if regs.get(p).copied().unwrap_or(0) == 0 {
                continue;
            }
        }
        let a = &i.args;
        let get = |regs: &HashMap<String, u64>, s: &str| -> u64 {
            match s {
                "%ctaid.x" => u64::from(ctaid),
                "%ntid.x" => u64::from(ntid),
                "%tid.x" => u64::from(tid),
                "%nctaid.x" => u64::from(nctaid),
                _ if s.starts_with('%') => *regs
                    .get(s)
                    .unwrap_or_else(|| panic!("{s} read before written")),
                _ => s
                    .parse::<i64>()
                    .map(|v| v as u64)
                    .unwrap_or_else(|_| panic!("bad operand {s}")),
            }
        };
        let addr = |regs: &HashMap<String, u64>, s: &str| {
            get(regs, s.trim_start_matches('[').trim_end_matches(']'))
        };
        let out: Option<u64> = match i.op.as_str() {
            "ret" => break,
            "bra" => {
                pc = labels[&a[0]];
                None
            }
            "ld.param.u64" | "ld.param.f64" => {
                Some(params[a[1].trim_start_matches('[').trim_end_matches(']')])
            }
            "cvta.to.global.u64" | "mov.u32" | "mov.b32" => Some(get(&regs, &a[1])),
            "mul.wide.u32" => {
                Some((get(&regs, &a[1]) as u32 as u64) * (get(&regs, &a[2]) as u32 as u64))
            }
            "cvt.u64.u32" => Some(get(&regs, &a[1]) as u32 as u64),
            "cvt.u32.u16" => Some(get(&regs, &a[1]) as u16 as u64),
            "add.u64" => Some(get(&regs, &a[1]).wrapping_add(get(&regs, &a[2]))),
            "shl.b64" => Some(get(&regs, &a[1]) << get(&regs, &a[2])),
            "shl.b32" => Some(u64::from((get(&regs, &a[1]) as u32) << get(&regs, &a[2]))),
            "setp.ge.u64" => Some(u64::from(get(&regs, &a[1]) >= get(&regs, &a[2]))),
            "setp.lt.u64" => Some(u64::from(get(&regs, &a[1]) < get(&regs, &a[2]))),
            "max.s32" => {
                Some((get(&regs, &a[1]) as i32).max(get(&regs, &a[2]) as i32) as u32 as u64)
            }
            "min.s32" => {
                Some((get(&regs, &a[1]) as i32).min(get(&regs, &a[2]) as i32) as u32 as u64)
            }
            // Loads into a wider register extend by the instruction type.
            "ld.global.u8" => Some(mem.load(addr(&regs, &a[1]), 1)),
            "ld.global.s8" => {
                Some(mem.load(addr(&regs, &a[1]), 1) as u8 as i8 as i32 as u32 as u64)
            }
            "ld.global.u16" => Some(mem.load(addr(&regs, &a[1]), 2)),
            "ld.global.f32" | "ld.global.s32" => Some(mem.load(addr(&regs, &a[1]), 4)),
            "ld.global.f64" | "ld.global.s64" => Some(mem.load(addr(&regs, &a[1]), 8)),
            op if op.starts_with("st.global.") => {
                let len = match &op["st.global.".len()..] {
                    "u8" | "s8" => 1,
                    "u16" => 2,
                    "f32" | "s32" => 4,
                    _ => 8,
                };
                let value = get(&regs, &a[1]);
                mem.store(addr(&regs, &a[0]), len, value);
                None
            }
            "cvt.rn.f32.f64" => Some(u64::from(
                (f64::from_bits(get(&regs, &a[1])) as f32).to_bits(),
            )),
            "cvt.f32.f16" => Some(u64::from(
                f16::from_bits(get(&regs, &a[1]) as u16).to_f32().to_bits(),
            )),
            "cvt.rn.f16.f32" => Some(u64::from(
                f16::from_f32(f32_of(get(&regs, &a[1]))).to_bits(),
            )),
            "cvt.rn.bf16.f32" => Some(u64::from(
                bf16::from_f32(f32_of(get(&regs, &a[1]))).to_bits(),
            )),
            "cvt.rn.f64.s32" => Some((get(&regs, &a[1]) as i32 as f64).to_bits()),
            "cvt.rn.f64.u32" => Some((get(&regs, &a[1]) as u32 as f64).to_bits()),
            "cvt.rn.f64.s64" => Some((get(&regs, &a[1]) as i64 as f64).to_bits()),
            // PTX float-to-integer conversions saturate (NaN gives 0).
            "cvt.rzi.s32.f64" => Some(f64::from_bits(get(&regs, &a[1])) as i32 as u32 as u64),
            "cvt.rzi.s64.f64" => Some(f64::from_bits(get(&regs, &a[1])) as i64 as u64),
            "mul.rn.f32" => Some(u64::from(
                (f32_of(get(&regs, &a[1])) * f32_of(get(&regs, &a[2]))).to_bits(),
            )),
            "mul.rn.f64" => Some(
                (f64::from_bits(get(&regs, &a[1])) * f64::from_bits(get(&regs, &a[2]))).to_bits(),
            ),
            other => panic!("the interpreter does not know {other}"),
        };
        if let Some(v) = out {
            regs.insert(a[0].clone(), v);
        }
    }
}

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
