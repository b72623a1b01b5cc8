//! A small interpreter of the PTX instructions kolo-nccl's hand-written
//! kernels use (modelled on the PTX ISA's definitions), for the tests of
//! [`crate::kernels::scale_ptx`], [`crate::kernels::copy_ptx`] and
//! [`crate::kernels::allreduce_ptx`]: [`run_thread`] runs one thread to
//! its end (kernels whose threads never wait for each other);
//! [`Thread::step`] runs one instruction, for the allreduce tests'
//! scheduler, which interleaves the threads of simulated ranks.

use half::{bf16, f16};
use std::collections::HashMap;

/// Operands separated by commas outside braces (`{%r1, %r2}` is one).
fn split_args(args: &str) -> Vec<String> {
    let mut out = Vec::new();
    let (mut depth, mut current) = (0, String::new());
    for c in args.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut current).trim().to_string());
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    out.push(current.trim().to_string());
    out.retain(|a| !a.is_empty());
    out
}

/// The registers of a vector operand `{%r1, %r2, ...}`.
fn vector(operand: &str) -> Vec<String> {
    operand
        .trim_start_matches('{')
        .trim_end_matches('}')
        .split(',')
        .map(|r| r.trim().to_string())
        .collect()
}

/// One instruction: optional predicate guard, opcode, operands.
#[derive(Debug, Clone)]
pub(super) struct Insn {
    pub(super) guard: Option<String>,
    pub(super) op: String,
    pub(super) args: Vec<String>,
}

/// The instructions and label positions of an entry's body.
pub(super) fn parse(entry: &str) -> (Vec<Insn>, HashMap<String, usize>) {
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
        let args = split_args(args);
        insns.push(Insn {
            guard,
            op: op.to_string(),
            args,
        });
    }
    (insns, labels)
}

/// Global memory: `bytes` at address `base`.
pub(super) struct Memory {
    pub(super) base: u64,
    pub(super) bytes: Vec<u8>,
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

/// A thread's outcome after one instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Flow {
    /// It goes on.
    Next,
    /// It waits at `bar.sync` until every thread of its CTA is there.
    Barrier,
    /// It returned.
    Exit,
    /// It executed `trap`: the whole launch fails.
    Trap,
}

/// One thread of a launch, resumable: [`Thread::step`] runs one
/// instruction, so threads of several CTAs (and of several simulated
/// ranks) can be interleaved and spin waits make progress. Memory is one
/// sequentially consistent array: fences and the `.acquire` / `.release`
/// qualifiers are checked by the PTX text's structure tests, not here.
pub(super) struct Thread {
    regs: HashMap<String, u64>,
    pc: usize,
    grid: (u32, u32, u32, u32),
    /// Instructions run: this thread's `%globaltimer`.
    steps: u64,
}

impl Thread {
    /// Thread `(ctaid, tid)` of a `(nctaid, ntid)` grid, given as
    /// `(ctaid, ntid, tid, nctaid)`.
    pub(super) fn new(grid: (u32, u32, u32, u32)) -> Thread {
        Thread {
            regs: HashMap::new(),
            pc: 0,
            grid,
            steps: 0,
        }
    }

    /// Runs one instruction.
    pub(super) fn step(
        &mut self,
        insns: &[Insn],
        labels: &HashMap<String, usize>,
        params: &HashMap<String, u64>,
        mem: &mut Memory,
    ) -> Flow {
        let (ctaid, ntid, tid, nctaid) = self.grid;
        let regs = &mut self.regs;
        self.steps += 1;
        let now = self.steps;
        if self.pc >= insns.len() {
            return Flow::Exit;
        }
        let i = &insns[self.pc];
        self.pc += 1;
        if let Some(p) = &i.guard {
            if regs.get(p).copied().unwrap_or(0) == 0 {
                return Flow::Next;
            }
        }
        let a = &i.args;
        let get =
            |regs: &HashMap<String, u64>, s: &str| -> u64 {
                match s {
                    "%ctaid.x" => u64::from(ctaid),
                    "%ntid.x" => u64::from(ntid),
                    "%tid.x" => u64::from(tid),
                    "%nctaid.x" => u64::from(nctaid),
                    "%globaltimer" => now,
                    _ if s.starts_with('%') => *regs
                        .get(s)
                        .unwrap_or_else(|| panic!("{s} read before written")),
                    // PTX's hexadecimal integer literal.
                    _ if s.starts_with("0x") => u64::from_str_radix(&s[2..], 16)
                        .unwrap_or_else(|_| panic!("bad operand {s}")),
                    // PTX's hexadecimal double literal.
                    _ if s.starts_with("0d") => u64::from_str_radix(&s[2..], 16)
                        .unwrap_or_else(|_| panic!("bad operand {s}")),
                    _ => s
                        .parse::<i64>()
                        .map(|v| v as u64)
                        .unwrap_or_else(|_| panic!("bad operand {s}")),
                }
            };
        let addr = |regs: &HashMap<String, u64>, s: &str| {
            let inner = s.trim_start_matches('[').trim_end_matches(']');
            match inner.split_once('+') {
                Some((reg, off)) => get(regs, reg).wrapping_add(get(regs, off)),
                None => get(regs, inner),
            }
        };
        // Cache operators and memory-order qualifiers do not change what a
        // load or store computes in a sequentially consistent memory.
        let op =
            i.op.replace(".cg.", ".")
                .replace("ld.acquire.sys.", "ld.")
                .replace("st.relaxed.sys.", "st.");
        let out: Option<u64> = match op.as_str() {
            "ret" => return Flow::Exit,
            "bar.sync" => return Flow::Barrier,
            "trap" => return Flow::Trap,
            "fence.acq_rel.sys" => None,
            "bra" => {
                self.pc = labels[&a[0]];
                None
            }
            "ld.param.u64" | "ld.param.f64" => {
                Some(params[a[1].trim_start_matches('[').trim_end_matches(']')])
            }
            // Unpacking a 32-bit value into two halves, low first.
            "mov.b32" if a[0].starts_with('{') => {
                let value = get(regs, &a[1]);
                let halves = vector(&a[0]);
                regs.insert(halves[0].clone(), value & 0xFFFF);
                regs.insert(halves[1].clone(), (value >> 16) & 0xFFFF);
                None
            }
            // Packing two halves into a 32-bit value, low first.
            "mov.b32" if a[1].starts_with('{') => {
                let halves = vector(&a[1]);
                let (lo, hi) = (get(regs, &halves[0]), get(regs, &halves[1]));
                Some((lo & 0xFFFF) | ((hi & 0xFFFF) << 16))
            }
            "cvta.to.global.u64" | "mov.u32" | "mov.b32" | "mov.u64" | "mov.f32" => {
                Some(get(regs, &a[1]))
            }
            "and.b32" => Some(get(regs, &a[1]) & get(regs, &a[2]) & 0xFFFF_FFFF),
            "and.b64" => Some(get(regs, &a[1]) & get(regs, &a[2])),
            "setp.gt.u64" => Some(u64::from(get(regs, &a[1]) > get(regs, &a[2]))),
            "setp.ne.u64" => Some(u64::from(get(regs, &a[1]) != get(regs, &a[2]))),
            "cvt.u32.u64" => Some(get(regs, &a[1]) as u32 as u64),
            "sub.u64" => Some(get(regs, &a[1]).wrapping_sub(get(regs, &a[2]))),
            "shr.u64" => Some(get(regs, &a[1]) >> get(regs, &a[2])),
            "mul.lo.u64" => Some(get(regs, &a[1]).wrapping_mul(get(regs, &a[2]))),
            "min.u64" => Some(get(regs, &a[1]).min(get(regs, &a[2]))),
            "setp.eq.u32" => Some(u64::from(
                get(regs, &a[1]) as u32 == get(regs, &a[2]) as u32,
            )),
            "setp.eq.u64" => Some(u64::from(get(regs, &a[1]) == get(regs, &a[2]))),
            "setp.le.u64" => Some(u64::from(get(regs, &a[1]) <= get(regs, &a[2]))),
            "setp.eq.f64" => Some(u64::from(
                f64::from_bits(get(regs, &a[1])) == f64::from_bits(get(regs, &a[2])),
            )),
            "ld.global.v4.u32" => {
                let at = addr(regs, &a[1]);
                for (k, reg) in vector(&a[0]).into_iter().enumerate() {
                    let word = mem.load(at + 4 * k as u64, 4);
                    regs.insert(reg, word);
                }
                None
            }
            "st.global.v4.u32" => {
                let at = addr(regs, &a[0]);
                for (k, reg) in vector(&a[1]).iter().enumerate() {
                    let word = get(regs, reg);
                    mem.store(at + 4 * k as u64, 4, word);
                }
                None
            }
            "mul.wide.u32" => {
                Some((get(regs, &a[1]) as u32 as u64) * (get(regs, &a[2]) as u32 as u64))
            }
            "cvt.u64.u32" => Some(get(regs, &a[1]) as u32 as u64),
            "cvt.u32.u16" => Some(get(regs, &a[1]) as u16 as u64),
            "add.u64" => Some(get(regs, &a[1]).wrapping_add(get(regs, &a[2]))),
            "shl.b64" => Some(get(regs, &a[1]) << get(regs, &a[2])),
            "shl.b32" => Some(u64::from((get(regs, &a[1]) as u32) << get(regs, &a[2]))),
            "setp.ge.u64" => Some(u64::from(get(regs, &a[1]) >= get(regs, &a[2]))),
            "setp.lt.u64" => Some(u64::from(get(regs, &a[1]) < get(regs, &a[2]))),
            "max.s32" => Some((get(regs, &a[1]) as i32).max(get(regs, &a[2]) as i32) as u32 as u64),
            "min.s32" => Some((get(regs, &a[1]) as i32).min(get(regs, &a[2]) as i32) as u32 as u64),
            // Loads into a wider register extend by the instruction type.
            "ld.global.u8" => Some(mem.load(addr(regs, &a[1]), 1)),
            "ld.global.s8" => Some(mem.load(addr(regs, &a[1]), 1) as u8 as i8 as i32 as u32 as u64),
            "ld.global.u16" => Some(mem.load(addr(regs, &a[1]), 2)),
            "ld.global.f32" | "ld.global.s32" | "ld.global.u32" => {
                Some(mem.load(addr(regs, &a[1]), 4))
            }
            "ld.global.f64" | "ld.global.s64" | "ld.global.u64" => {
                Some(mem.load(addr(regs, &a[1]), 8))
            }
            op if op.starts_with("st.global.") => {
                let len = match &op["st.global.".len()..] {
                    "u8" | "s8" => 1,
                    "u16" => 2,
                    "f32" | "s32" | "u32" => 4,
                    _ => 8,
                };
                let value = get(regs, &a[1]);
                mem.store(addr(regs, &a[0]), len, value);
                None
            }
            "cvt.rn.f32.f64" => Some(u64::from(
                (f64::from_bits(get(regs, &a[1])) as f32).to_bits(),
            )),
            "cvt.f32.f16" => Some(u64::from(
                f16::from_bits(get(regs, &a[1]) as u16).to_f32().to_bits(),
            )),
            "cvt.rn.f16.f32" => Some(u64::from(f16::from_f32(f32_of(get(regs, &a[1]))).to_bits())),
            "cvt.rn.bf16.f32" => Some(u64::from(
                bf16::from_f32(f32_of(get(regs, &a[1]))).to_bits(),
            )),
            "cvt.rn.f64.s32" => Some((get(regs, &a[1]) as i32 as f64).to_bits()),
            "cvt.rn.f64.u32" => Some((get(regs, &a[1]) as u32 as f64).to_bits()),
            "cvt.rn.f64.s64" => Some((get(regs, &a[1]) as i64 as f64).to_bits()),
            // PTX float-to-integer conversions saturate (NaN gives 0).
            "cvt.rzi.s32.f64" => Some(f64::from_bits(get(regs, &a[1])) as i32 as u32 as u64),
            "cvt.rzi.s64.f64" => Some(f64::from_bits(get(regs, &a[1])) as i64 as u64),
            "add.rn.f32" => Some(u64::from(
                (f32_of(get(regs, &a[1])) + f32_of(get(regs, &a[2]))).to_bits(),
            )),
            "mul.rn.f32" => Some(u64::from(
                (f32_of(get(regs, &a[1])) * f32_of(get(regs, &a[2]))).to_bits(),
            )),
            "mul.rn.f64" => Some(
                (f64::from_bits(get(regs, &a[1])) * f64::from_bits(get(regs, &a[2]))).to_bits(),
            ),
            other => panic!("the interpreter does not know {other}"),
        };
        if let Some(v) = out {
            regs.insert(a[0].clone(), v);
        }
        Flow::Next
    }
}

/// Runs `entry` for one thread `(ctaid, tid)` of a `(nctaid, ntid)` grid
/// to its end (kernels whose threads never wait for each other).
pub(super) fn run_thread(
    insns: &[Insn],
    labels: &HashMap<String, usize>,
    params: &HashMap<String, u64>,
    grid: (u32, u32, u32, u32),
    mem: &mut Memory,
) {
    let mut thread = Thread::new(grid);
    for _ in 0..10_000_000u64 {
        match thread.step(insns, labels, params, mem) {
            Flow::Next => {}
            Flow::Barrier => panic!("bar.sync in a kernel run one thread at a time"),
            Flow::Trap => panic!("the kernel trapped"),
            Flow::Exit => return,
        }
    }
    panic!("runaway kernel");
}
