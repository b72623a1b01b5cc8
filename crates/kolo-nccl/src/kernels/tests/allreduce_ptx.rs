//! Checks of the peer allreduce kernels: the PTX text's structure (the
//! memory-order qualifiers of the flag protocol, declared registers,
//! labels), and what they compute, by running 2, 3, 4 and 8 simulated
//! ranks on the interpreter with their threads interleaved at random (so
//! the spin waits make progress and a fast rank runs ahead into its next
//! call while a slow one still reads), against the host's
//! `Element::reduce_many` and `Element::scale`, bit for bit.

use super::interp::{parse, Flow, Insn, Memory, Thread};
use crate::kernels::allreduce_ptx::*;
use half::{bf16, f16};
use kolo_protocol::ReduceOp;
use kolo_transport::byte_view::{as_bytes, copy_from_bytes};
use kolo_transport::Element;
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One simulated allreduce setup.
#[derive(Clone, Debug)]
struct Case {
    algorithm: Algorithm,
    world: usize,
    n: usize,
    op: ReduceOp,
    calls: usize,
    /// `(blocks, threads)`; threads at least [`MAX_RANKS`].
    grid: (u32, u32),
    /// Input and output share their memory.
    in_place: bool,
    /// Elements by which inputs and outputs are offset (unaligned).
    skew: usize,
    /// This rank starts only once the others have run this many steps.
    late: Option<(usize, u64)>,
    /// This rank never runs (its process died).
    dead: Option<usize>,
    /// The kernels' `timeout_ns`, in interpreter steps of a thread.
    timeout: u64,
    seed: u64,
}

/// One rank's launch of one call.
struct Launch {
    params: HashMap<String, u64>,
    threads: Vec<Thread>,
    at_barrier: Vec<bool>,
    done: Vec<bool>,
}

fn launch(params: HashMap<String, u64>, grid: (u32, u32)) -> Launch {
    let (blocks, ntid) = grid;
    let threads: Vec<Thread> = (0..blocks)
        .flat_map(|c| (0..ntid).map(move |t| Thread::new((c, ntid, t, blocks))))
        .collect();
    let count = threads.len();
    Launch {
        params,
        threads,
        at_barrier: vec![false; count],
        done: vec![false; count],
    }
}

/// The reference: `reduce_many` in rank order, then the average's scale.
fn reference<T: Element>(inputs: &[Vec<T>], op: ReduceOp) -> Vec<T> {
    let srcs: Vec<&[T]> = inputs.iter().map(Vec::as_slice).collect();
    let mut want = inputs[0].clone();
    T::reduce_many(&mut want, &srcs, ReduceOp::Sum);
    if op == ReduceOp::Average {
        T::scale(&mut want, 1.0 / inputs.len() as f64);
    }
    want
}

/// Per call, every rank's output and the reference.
type Outcome<T> = Vec<(Vec<Vec<T>>, Vec<T>)>;

/// Runs `case`: the outputs and references, and whether a kernel trapped
/// (a rank's launch then stops, and its later calls never start).
fn simulate<T: Element>(case: &Case, dtype: ArDtype) -> (Outcome<T>, bool) {
    let kernel = AllreduceKernel {
        algorithm: case.algorithm,
        dtype,
    };
    let (insns, labels): (Vec<Insn>, HashMap<String, usize>) = parse(&kernel.entry());
    let elem = std::mem::size_of::<T>();
    let mut rng = Rng(case.seed | 1);
    let capacity = case.n * elem + 3;
    let reg_bytes = registered_bytes(capacity).expect("small");
    let io_bytes = (case.n + case.skew) * elem;
    // Layout: registered buffers, then per call and rank an input and an
    // output (one block when in place).
    let base = 0x4000_0000u64;
    let mut next = 0usize;
    let mut take = |bytes: usize| {
        let at = next;
        next += bytes.div_ceil(64) * 64;
        base + at as u64
    };
    let peers: Vec<u64> = (0..case.world).map(|_| take(reg_bytes)).collect();
    let mut io = Vec::new();
    for _ in 0..case.calls {
        let mut per_rank = Vec::new();
        for _ in 0..case.world {
            let input = take(io_bytes) + (case.skew * elem) as u64;
            let output = if case.in_place {
                input
            } else {
                take(io_bytes) + (case.skew * elem) as u64
            };
            per_rank.push((input, output));
        }
        io.push(per_rank);
    }
    let mut mem = Memory {
        base,
        bytes: vec![0; next],
    };
    // Stale garbage in the data regions; flags start at zero.
    for &p in &peers {
        let at = (p - base) as usize + HEADER_BYTES;
        for b in &mut mem.bytes[at..at + reg_bytes - HEADER_BYTES] {
            *b = rng.next() as u8;
        }
    }
    let mut expected = Vec::new();
    for per_rank in &io {
        let inputs: Vec<Vec<T>> = per_rank
            .iter()
            .map(|_| {
                (0..case.n)
                    .map(|_| {
                        let mag = [1.0, 1e-3, 1e3, 3.0e4][rng.below(4)];
                        T::from_f64((rng.below(2001) as f64 - 1000.0) / 999.0 * mag)
                    })
                    .collect()
            })
            .collect();
        for ((input, _), data) in per_rank.iter().zip(&inputs) {
            let at = (input - base) as usize;
            let bytes = as_bytes(data);
            mem.bytes[at..at + bytes.len()].copy_from_slice(bytes);
        }
        expected.push(reference(&inputs, case.op));
    }
    let factor = match case.op {
        ReduceOp::Average => 1.0 / case.world as f64,
        _ => 1.0,
    };
    let name = kernel.name();
    let params_for = |rank: usize, call: usize| -> HashMap<String, u64> {
        let epoch = call as u64 + 1;
        let (input, output) = io[call][rank];
        let mut values: Vec<u64> = vec![output, input];
        values.extend((0..MAX_RANKS).map(|k| peers.get(k).copied().unwrap_or(0)));
        values.extend([
            rank as u64,
            case.world as u64,
            case.n as u64,
            chunk(case.n, case.world, dtype) as u64,
            epoch,
            data_offset(epoch, capacity),
            factor.to_bits(),
            case.timeout,
        ]);
        param_names()
            .into_iter()
            .map(|p| format!("{name}_{p}"))
            .zip(values)
            .collect()
    };
    // Each rank runs its calls in order, as a stream does.
    let mut call_of = vec![0usize; case.world];
    let mut current: Vec<Option<Launch>> = (0..case.world)
        .map(|r| Some(launch(params_for(r, 0), case.grid)))
        .collect();
    let weights: Vec<usize> = (0..case.world).map(|_| 1 + rng.below(4)).collect();
    let mut steps = 0u64;
    let mut trapped = false;
    loop {
        let runnable: Vec<usize> = (0..case.world)
            .filter(|&r| current[r].is_some() && Some(r) != case.dead)
            .filter(|&r| match case.late {
                Some((late, after)) => r != late || steps >= after,
                None => true,
            })
            .collect();
        if runnable.is_empty() {
            let alive = (0..case.world).filter(|&r| Some(r) != case.dead);
            if alive.clone().all(|r| current[r].is_none()) {
                break;
            }
            // Only the late rank is left before its time: it comes now.
            steps = u64::MAX / 2;
            continue;
        }
        let total: usize = runnable.iter().map(|&r| weights[r]).sum();
        let mut pick = rng.below(total);
        let rank = *runnable
            .iter()
            .find(|&&r| {
                if pick < weights[r] {
                    true
                } else {
                    pick -= weights[r];
                    false
                }
            })
            .expect("a runnable rank");
        let l = current[rank].as_mut().expect("runnable");
        let live: Vec<usize> = (0..l.threads.len())
            .filter(|&t| !l.done[t] && !l.at_barrier[t])
            .collect();
        let t = live[rng.below(live.len())];
        for _ in 0..1 + rng.below(40) {
            steps += 1;
            assert!(steps < 200_000_000, "no progress: deadlock? {case:?}");
            match l.threads[t].step(&insns, &labels, &l.params, &mut mem) {
                Flow::Next => continue,
                Flow::Barrier => l.at_barrier[t] = true,
                Flow::Exit => l.done[t] = true,
                Flow::Trap => trapped = true,
            }
            break;
        }
        if trapped {
            // The launch fails: its rank stops here.
            current[rank] = None;
            continue;
        }
        // A CTA whose threads all wait at the barrier goes on.
        let ntid = case.grid.1 as usize;
        let cta = t / ntid;
        let range = cta * ntid..(cta + 1) * ntid;
        if l.at_barrier[range.clone()].iter().all(|&b| b) {
            l.at_barrier[range].iter_mut().for_each(|b| *b = false);
        }
        if l.done.iter().all(|&d| d) {
            call_of[rank] += 1;
            current[rank] = (call_of[rank] < case.calls)
                .then(|| launch(params_for(rank, call_of[rank]), case.grid));
        }
    }
    let outcome = io
        .iter()
        .zip(expected)
        .map(|(per_rank, want)| {
            let outs = per_rank
                .iter()
                .map(|&(_, output)| {
                    let at = (output - base) as usize;
                    let mut out = vec![T::from_f64(0.0); case.n];
                    copy_from_bytes(&mut out, &mem.bytes[at..at + case.n * elem])
                        .expect("element bytes");
                    out
                })
                .collect();
            (outs, want)
        })
        .collect();
    (outcome, trapped)
}

/// Every rank's output of every call equals the reference bit for bit.
fn agrees<T: Element>(case: &Case, dtype: ArDtype) -> Result<(), TestCaseError> {
    let (outcome, trapped) = simulate::<T>(case, dtype);
    prop_assert!(!trapped, "a kernel trapped ({case:?})");
    for (call, (outs, want)) in outcome.into_iter().enumerate() {
        for (rank, out) in outs.iter().enumerate() {
            prop_assert!(
                as_bytes(out) == as_bytes(&want),
                "{dtype:?} call {call} rank {rank}: got {out:?}, want {want:?} ({case:?})"
            );
        }
    }
    Ok(())
}

fn check(case: &Case) {
    for dtype in ArDtype::ALL {
        let result = match dtype {
            ArDtype::F32 => agrees::<f32>(case, dtype),
            ArDtype::F16 => agrees::<f16>(case, dtype),
            ArDtype::Bf16 => agrees::<bf16>(case, dtype),
        };
        if let Err(e) = result {
            panic!("{e}");
        }
    }
}

fn case(algorithm: Algorithm, world: usize, n: usize, op: ReduceOp, seed: u64) -> Case {
    Case {
        algorithm,
        world,
        n,
        op,
        calls: 3,
        grid: (2, 8),
        in_place: seed % 2 == 0,
        skew: (seed % 3) as usize,
        late: None,
        dead: None,
        timeout: u64::MAX,
        seed,
    }
}

#[test]
fn every_world_dtype_and_op_matches_the_host() {
    let mut seed = 11;
    for algorithm in [Algorithm::OneShot, Algorithm::TwoShot] {
        for world in [2, 3, 4, 8] {
            for op in [ReduceOp::Sum, ReduceOp::Average] {
                for n in [1, 2, 7, 33, 70] {
                    seed += 1;
                    check(&case(algorithm, world, n, op, seed));
                }
            }
        }
    }
}

#[test]
fn a_late_rank_delays_the_others_without_deadlock() {
    for algorithm in [Algorithm::OneShot, Algorithm::TwoShot] {
        for world in [2, 3, 8] {
            let mut c = case(algorithm, world, 29, ReduceOp::Average, 7 + world as u64);
            c.late = Some((world - 1, 20_000));
            c.calls = 4;
            check(&c);
        }
    }
}

#[test]
fn a_dead_rank_makes_the_others_trap_after_the_timeout() {
    for algorithm in [Algorithm::OneShot, Algorithm::TwoShot] {
        let mut c = case(algorithm, 3, 40, ReduceOp::Sum, 5);
        c.dead = Some(1);
        c.timeout = 5_000;
        let (_, trapped) = simulate::<f32>(&c, ArDtype::F32);
        assert!(trapped, "{algorithm:?}: the others must trap, not spin");
        // A late rank within the timeout is only late.
        let mut c = case(algorithm, 3, 40, ReduceOp::Sum, 6);
        c.late = Some((1, 20_000));
        c.timeout = 10_000_000;
        agrees::<f32>(&c, ArDtype::F32).unwrap();
    }
}

#[test]
fn one_cta_and_more_ctas_than_positions_agree() {
    for algorithm in [Algorithm::OneShot, Algorithm::TwoShot] {
        for grid in [(1, 8), (3, 9), (5, 16)] {
            let mut c = case(algorithm, 4, 21, ReduceOp::Sum, 3);
            c.grid = grid;
            check(&c);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn random_cases_match_the_host(
        two_shot in any::<bool>(),
        world in prop::sample::select(vec![2usize, 3, 4, 5, 8]),
        n in 1usize..90,
        average in any::<bool>(),
        blocks in 1u32..4,
        threads in 8u32..12,
        seed in any::<u64>(),
    ) {
        let algorithm = if two_shot { Algorithm::TwoShot } else { Algorithm::OneShot };
        let op = if average { ReduceOp::Average } else { ReduceOp::Sum };
        let mut c = case(algorithm, world, n, op, seed);
        c.grid = (blocks, threads);
        c.calls = 2;
        agrees::<f32>(&c, ArDtype::F32)?;
        agrees::<bf16>(&c, ArDtype::Bf16)?;
    }
}

#[test]
fn the_module_declares_each_kernel_once() {
    let text = module_source();
    assert_eq!(text.matches(".version ").count(), 1);
    assert!(text.contains(".target sm_80\n.address_size 64"));
    for k in AllreduceKernel::all() {
        let decl = format!(".visible .entry {}(", k.name());
        assert_eq!(text.matches(&decl).count(), 1, "{k:?}");
    }
    assert_eq!(AllreduceKernel::all().len(), 6);
    assert_eq!(text.matches('{').count(), text.matches('}').count());
    assert!(!text.contains('\0'));
    assert_eq!(
        ArDtype::for_dtype(kolo_protocol::DataType::F32),
        Some(ArDtype::F32)
    );
    assert_eq!(ArDtype::for_dtype(kolo_protocol::DataType::F64), None);
}

#[test]
fn flags_are_published_with_release_and_read_with_acquire() {
    for k in AllreduceKernel::all() {
        let entry = k.entry();
        let (insns, labels) = parse(&entry);
        let phases = match k.algorithm {
            Algorithm::OneShot => 1,
            Algorithm::TwoShot => 2,
        };
        let stores: Vec<usize> = (0..insns.len())
            .filter(|&i| insns[i].op.starts_with("st.relaxed.sys"))
            .collect();
        let spins: Vec<usize> = (0..insns.len())
            .filter(|&i| insns[i].op.starts_with("ld.acquire.sys"))
            .collect();
        assert_eq!(stores.len(), phases, "{}", k.name());
        assert_eq!(spins.len(), phases, "{}", k.name());
        for &s in &stores {
            // The CTA's writes, then a system-scope fence, then the flag.
            assert_eq!(insns[s - 1].op, "fence.acq_rel.sys", "{}", k.name());
            assert!(insns[..s].iter().rev().any(|i| i.op == "bar.sync"));
            assert_eq!(insns[s].args[1], "%rd6", "the flag is the epoch");
        }
        for &l in &spins {
            // Spin until >= epoch (or trap past the timeout), fence, then
            // the CTA goes on together.
            assert_eq!(insns[l + 1].op, "setp.ge.u64");
            assert_eq!(insns[l + 1].args[2], "%rd6");
            assert!(insns[l..l + 8].iter().any(|i| i.op == "trap"));
            let arrived = &insns[l + 2].args[0];
            assert_eq!(labels[arrived], l + 8, "{}", k.name());
            assert_eq!(insns[l + 8].op, "fence.acq_rel.sys");
            assert_eq!(insns[l + 9].op, "bar.sync");
        }
        // Every load of peer data (addressed through %rd30..%rd37) goes
        // past L1, whose lines are not coherent with other GPUs' writes.
        let mut peer_loads = 0;
        for w in insns.windows(2) {
            let peer_addr = w[0].op == "add.u64" && w[0].args[1].starts_with("%rd3");
            if peer_addr && w[1].op.starts_with("ld.") {
                assert!(
                    w[1].op.starts_with("ld.global.cg."),
                    "{}: {:?}",
                    k.name(),
                    w[1]
                );
                peer_loads += 1;
            }
        }
        assert!(peer_loads >= 2 * MAX_RANKS, "{}", k.name());
        let vector_loads = insns
            .iter()
            .filter(|i| i.op == "ld.global.cg.v4.u32")
            .count();
        assert!(
            vector_loads >= MAX_RANKS,
            "{}: units are read whole",
            k.name()
        );
    }
}

#[test]
fn every_register_is_declared_and_every_branch_lands() {
    for k in AllreduceKernel::all() {
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
            // Vector operands `{%r5, %r6}` and addresses `[%rd46+4]` name
            // registers too.
            let regs: Vec<String> = i
                .args
                .iter()
                .chain(&i.guard)
                .flat_map(|a| {
                    a.trim_start_matches(['[', '{'])
                        .trim_end_matches([']', '}'])
                        .split([',', '+'])
                        .map(|r| r.trim().to_string())
                        .collect::<Vec<_>>()
                })
                .collect();
            for reg in &regs {
                // Special registers (`%tid.x`, `%globaltimer`) need none.
                let special = reg.contains('.') || reg == "%globaltimer";
                if reg.starts_with('%') && !special {
                    assert!(declared.contains(reg), "{}: {reg} undeclared", k.name());
                }
            }
            if i.op == "bra" {
                assert!(
                    labels.contains_key(&i.args[0]),
                    "{}: {}",
                    k.name(),
                    i.args[0]
                );
            }
        }
        assert!(labels.keys().all(|l| l.starts_with(k.name())));
    }
}

#[test]
fn layout_and_launch_dims() {
    assert_eq!(HEADER_BYTES, 4096);
    assert_eq!(registered_bytes(1), Some(HEADER_BYTES + 2 * REGION_ALIGN));
    assert_eq!(registered_bytes(usize::MAX), None);
    assert_eq!(data_offset(1, 1000), (HEADER_BYTES + 1024) as u64);
    assert_eq!(data_offset(2, 1000), HEADER_BYTES as u64);
    // Slices are of 16-byte units: 4 f32, 8 halves.
    assert_eq!(chunk(40, 3, ArDtype::F32), 4);
    assert_eq!(chunk(40, 3, ArDtype::F16), 2);
    assert_eq!(chunk(3, 8, ArDtype::F32), 0);
    assert_eq!(ArDtype::F32.lanes(), 4);
    assert_eq!(ArDtype::Bf16.lanes(), 8);
    let f32 = ArDtype::F32;
    assert_eq!(
        launch_dims(Algorithm::OneShot, 1, 2, f32),
        (1, BLOCK_THREADS)
    );
    assert_eq!(
        launch_dims(Algorithm::OneShot, 1 << 30, 2, f32).0,
        MAX_BLOCKS
    );
    assert_eq!(
        launch_dims(Algorithm::TwoShot, 32 * BLOCK_THREADS as usize, 8, f32),
        (1, BLOCK_THREADS)
    );
    assert_eq!(
        launch_dims(Algorithm::TwoShot, 64 * BLOCK_THREADS as usize, 8, f32),
        (2, BLOCK_THREADS)
    );
    assert!(BLOCK_THREADS as usize >= MAX_RANKS);
}
