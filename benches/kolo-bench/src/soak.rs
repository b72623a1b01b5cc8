//! The soak run: every rank issues random operations (allreduce, grouped
//! allreduce, broadcast, allgather, reduce-scatter, alltoall), data types,
//! sizes (0 to a bound, most small), reduce ops and submission orders
//! through the engine, step after step, checks every result against a
//! reference computed from the known inputs, and samples the process's
//! resident memory between steps (no rank mid-step, the allocator's free
//! memory returned first) twice: with the engines' fusion buffers, which
//! follow the sizes the last steps fused, and after every rank released
//! them ([`Kolo::release_buffers`]), which leaves what kolo holds for
//! good — the series a leak would raise. All ranks draw the same plan from the seed; each
//! shuffles its own submission order; they agree once per step whether
//! the time is up, so every rank runs the same steps.

use half::{bf16, f16};
use kolo::raw::{RawHandle, RawMemory, RawOutput, RawTensor};
use kolo::{DataType, Error, Kolo, ReduceOp, ReduceOptions, TensorGroup};
use std::time::{Duration, Instant};

mod memory;
mod report;
pub use memory::{heap_in_use_kib, held_kib, resident_kib, settle_allocator};
pub use report::SoakReport;

/// What a soak run does.
#[derive(Clone, Debug)]
pub struct SoakOptions {
    /// How long it runs.
    pub duration: Duration,
    /// The seed of the plan (the same on every rank).
    pub seed: u64,
    /// The largest tensor, in bytes.
    pub max_bytes: usize,
    /// How often rank 0 samples the resident memory.
    pub sample_every: Duration,
}

/// splitmix64: a small deterministic generator, the same on every rank.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Allreduce,
    Group,
    Broadcast,
    Allgather,
    ReduceScatter,
    Alltoall,
}

/// One operation of a step, as every rank plans it.
#[derive(Clone, Debug)]
struct Op {
    kind: Kind,
    dtype: DataType,
    reduce: ReduceOp,
    /// Elements per row.
    width: usize,
    /// Rows (per tensor of a group: `rows + member`).
    rows: usize,
    root: usize,
    members: usize,
    salt: u64,
}

/// The value rank `rank` puts at `index` of operation `salt`: small
/// integers, so that sums over ranks are exact in every data type.
fn input(dtype: DataType, salt: u64, rank: usize, index: usize) -> f64 {
    let h = Rng(salt ^ ((rank as u64) << 40) ^ index as u64).next();
    match dtype {
        DataType::U8 | DataType::U16 => (h % 5) as f64,
        _ => (h % 9) as f64 - 4.0,
    }
}

fn reduce(op: ReduceOp, values: impl Iterator<Item = f64>, ranks: usize) -> f64 {
    let values: Vec<f64> = values.collect();
    match op {
        ReduceOp::Min => values.iter().copied().fold(f64::INFINITY, f64::min),
        ReduceOp::Max => values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        ReduceOp::Average => values.iter().sum::<f64>() / ranks as f64,
        _ => values.iter().sum(),
    }
}

/// Writes `value` as `dtype` at element `index` of `bytes`.
fn put(bytes: &mut [u8], dtype: DataType, index: usize, value: f64) {
    let at = index * dtype.size();
    let slot = &mut bytes[at..at + dtype.size()];
    match dtype {
        DataType::U8 => slot.copy_from_slice(&(value as u8).to_le_bytes()),
        DataType::I8 => slot.copy_from_slice(&(value as i8).to_le_bytes()),
        DataType::U16 => slot.copy_from_slice(&(value as u16).to_le_bytes()),
        DataType::I16 => slot.copy_from_slice(&(value as i16).to_le_bytes()),
        DataType::I32 => slot.copy_from_slice(&(value as i32).to_le_bytes()),
        DataType::I64 => slot.copy_from_slice(&(value as i64).to_le_bytes()),
        DataType::F16 => slot.copy_from_slice(&f16::from_f64(value).to_le_bytes()),
        DataType::BF16 => slot.copy_from_slice(&bf16::from_f64(value).to_le_bytes()),
        DataType::F32 => slot.copy_from_slice(&(value as f32).to_le_bytes()),
        DataType::F64 | DataType::Bool => slot.copy_from_slice(&value.to_le_bytes()[..slot.len()]),
    }
}

/// Reads element `index` of `bytes` as `dtype`.
fn get(bytes: &[u8], dtype: DataType, index: usize) -> f64 {
    let at = index * dtype.size();
    let b = &bytes[at..at + dtype.size()];
    let two = || [b[0], b[1]];
    let four = || [b[0], b[1], b[2], b[3]];
    match dtype {
        DataType::U8 => b[0] as f64,
        DataType::I8 => b[0] as i8 as f64,
        DataType::U16 => u16::from_le_bytes(two()) as f64,
        DataType::I16 => i16::from_le_bytes(two()) as f64,
        DataType::I32 => i32::from_le_bytes(four()) as f64,
        DataType::I64 => i64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as f64,
        DataType::F16 => f16::from_le_bytes(two()).to_f64(),
        DataType::BF16 => bf16::from_le_bytes(two()).to_f64(),
        DataType::F32 => f32::from_le_bytes(four()) as f64,
        DataType::F64 => f64::from_le_bytes(b.try_into().unwrap_or([0; 8])),
        DataType::Bool => b[0] as f64,
    }
}

/// A host buffer aligned for every data type.
struct Buffer {
    words: Vec<u64>,
    len: usize,
}

impl Buffer {
    fn new(len: usize) -> Buffer {
        Buffer {
            words: vec![0; len.div_ceil(8)],
            len,
        }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `words` holds at least `len` initialised bytes; u8 has no
        // alignment or validity requirement.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast(), self.len) }
    }

    fn tensor(&mut self, name: &str, dtype: DataType, shape: &[i64]) -> Result<RawTensor, Error> {
        RawTensor::new(
            name,
            self.words.as_mut_ptr().cast(),
            dtype,
            shape,
            RawMemory::Host,
        )
    }
}

/// Draws one step's operations.
fn plan(rng: &mut Rng, ranks: usize, max_bytes: usize) -> Vec<Op> {
    // Every data type but bool (whose sum is not a number's).
    let dtypes: Vec<DataType> = DataType::ALL
        .into_iter()
        .filter(|&d| d != DataType::Bool)
        .collect();
    let count = 1 + rng.below(6) as usize;
    (0..count)
        .map(|_| {
            let kind = [
                Kind::Allreduce,
                Kind::Allreduce,
                Kind::Group,
                Kind::Broadcast,
                Kind::Allgather,
                Kind::ReduceScatter,
                Kind::Alltoall,
            ][rng.below(7) as usize];
            let dtype = dtypes[rng.below(dtypes.len() as u64) as usize];
            let reduce = match rng.below(if matches!(dtype, DataType::F32 | DataType::F64) {
                4
            } else {
                3
            }) {
                0 => ReduceOp::Sum,
                1 => ReduceOp::Min,
                2 => ReduceOp::Max,
                _ => ReduceOp::Average,
            };
            // Most tensors small, some medium, a few up to the bound.
            let bytes = match rng.below(20) {
                0 => rng.below(max_bytes as u64 + 1) as usize,
                1..=5 => rng.below(256 << 10) as usize,
                _ => rng.below(4 << 10) as usize,
            };
            let elements = bytes / dtype.size();
            let width = 1 + rng.below(4) as usize;
            let rows = elements / width / ranks.max(1);
            Op {
                kind,
                dtype,
                reduce,
                width,
                rows,
                root: rng.below(ranks as u64) as usize,
                members: 2 + rng.below(4) as usize,
                salt: rng.next(),
            }
        })
        .collect()
}

/// One submitted operation: its buffers (kept until the handle is done)
/// and how to check it.
struct Pending {
    op: Op,
    name: String,
    buffers: Vec<Buffer>,
    handle: Option<RawHandle>,
}

/// Rows rank `from` sends rank `to` in an alltoall.
fn a2a_rows(op: &Op, from: usize, to: usize) -> usize {
    ((op.salt >> 8) as usize + 3 * from + to) % (op.rows + 1)
}

/// Rows rank `rank` contributes to an allgather.
fn gather_rows(op: &Op, rank: usize) -> usize {
    ((op.salt >> 16) as usize + rank) % (op.rows + 1)
}

fn submit(kolo: &Kolo, op: Op, name: String) -> Result<Pending, Error> {
    let (r, n) = (kolo.rank(), kolo.size());
    let size = op.dtype.size();
    let filled = |rows: usize, base_row: usize| {
        let mut b = Buffer::new(rows * op.width * size);
        let bytes = b.bytes();
        for i in 0..rows * op.width {
            put(
                bytes,
                op.dtype,
                i,
                input(op.dtype, op.salt, r, base_row * op.width + i),
            );
        }
        b
    };
    let shape = |rows: usize| [rows as i64, op.width as i64];
    let options = ReduceOptions::new(op.reduce);
    let mut buffers = Vec::new();
    // SAFETY (every call below): the buffers are kept in `Pending` and
    // neither moved (their heap storage) nor touched until its handle is
    // waited for.
    let handle = match op.kind {
        Kind::Allreduce | Kind::Broadcast => {
            let mut b = filled(op.rows, 0);
            let t = b.tensor(&name, op.dtype, &shape(op.rows))?;
            buffers.push(b);
            if op.kind == Kind::Allreduce {
                unsafe { kolo.allreduce_raw(&name, &t, options)? }
            } else {
                unsafe { kolo.broadcast_raw(&name, &t, op.root)? }
            }
        }
        Kind::Group => {
            let names: Vec<String> = (0..op.members).map(|m| format!("{name}.{m}")).collect();
            let group = TensorGroup::new(&names)?;
            let mut tensors = Vec::new();
            for (m, member) in names.iter().enumerate() {
                // Member m: its own rows, its inputs after the members before it.
                let before: usize = (0..m).map(|k| op.rows + k).sum();
                let mut b = filled(op.rows + m, before);
                tensors.push(b.tensor(member, op.dtype, &shape(op.rows + m))?);
                buffers.push(b);
            }
            unsafe { kolo.allreduce_group_raw(&group, &tensors, options)? }
        }
        Kind::Allgather => {
            let rows = gather_rows(&op, r);
            let mut b = filled(rows, 0);
            let t = b.tensor(&name, op.dtype, &shape(rows))?;
            buffers.push(b);
            unsafe { kolo.allgather_raw(&name, &t)? }
        }
        Kind::ReduceScatter => {
            let rows = op.rows * n;
            let mut input_buf = filled(rows, 0);
            let share = rows / n + usize::from(r < rows % n);
            let mut out = Buffer::new(share * op.width * size);
            let ti = input_buf.tensor(&name, op.dtype, &shape(rows))?;
            let to = out.tensor(&name, op.dtype, &shape(share))?;
            buffers.push(input_buf);
            buffers.push(out);
            unsafe { kolo.reduce_scatter_raw(&name, &ti, &to, options)? }
        }
        Kind::Alltoall => {
            let splits: Vec<usize> = (0..n).map(|p| a2a_rows(&op, r, p)).collect();
            let rows: usize = splits.iter().sum();
            let mut b = filled(rows, 0);
            let t = b.tensor(&name, op.dtype, &shape(rows))?;
            buffers.push(b);
            unsafe { kolo.alltoall_raw(&name, &t, &splits)? }
        }
    };
    Ok(Pending {
        op,
        name,
        buffers,
        handle: Some(handle),
    })
}

/// Checks `got` (elements of `op.dtype`) against `expected(i)`; the number
/// of wrong elements and the first one described.
fn compare(
    op: &Op,
    name: &str,
    got: &[u8],
    count: usize,
    expected: impl Fn(usize) -> f64,
) -> (u64, Option<String>) {
    let tolerance = if op.reduce == ReduceOp::Average {
        1e-3
    } else {
        0.0
    };
    let mut wrong = 0;
    let mut first = None;
    if got.len() != count * op.dtype.size() {
        return (
            1,
            Some(format!(
                "{name} ({:?}, {}): {} bytes, expected {}",
                op.kind,
                op.dtype.name(),
                got.len(),
                count * op.dtype.size()
            )),
        );
    }
    for i in 0..count {
        let (g, e) = (get(got, op.dtype, i), expected(i));
        if (g - e).abs() > tolerance * e.abs().max(1.0) {
            wrong += 1;
            first.get_or_insert_with(|| {
                format!(
                    "{name} ({:?}, {}, {:?}): element {i} is {g}, expected {e}",
                    op.kind,
                    op.dtype.name(),
                    op.reduce
                )
            });
        }
    }
    (wrong, first)
}

fn check(kolo: &Kolo, mut p: Pending, output: Option<RawOutput>) -> (u64, Option<String>) {
    let (r, n) = (kolo.rank(), kolo.size());
    let op = &p.op;
    let w = op.width;
    let value = |rank: usize, row: usize, col: usize| input(op.dtype, op.salt, rank, row * w + col);
    match op.kind {
        Kind::Allreduce => {
            let got = p.buffers[0].bytes().to_vec();
            compare(op, &p.name, &got, op.rows * w, |i| {
                reduce(op.reduce, (0..n).map(|q| value(q, i / w, i % w)), n)
            })
        }
        Kind::Group => {
            let mut total = (0, None);
            let mut before = 0;
            for m in 0..op.members {
                let got = p.buffers[m].bytes().to_vec();
                let rows = op.rows + m;
                let (bad, first) = compare(op, &p.name, &got, rows * w, |i| {
                    reduce(
                        op.reduce,
                        (0..n).map(|q| input(op.dtype, op.salt, q, before * w + i)),
                        n,
                    )
                });
                total.0 += bad;
                total.1 = total.1.or(first);
                before += rows;
            }
            total
        }
        Kind::Broadcast => {
            let got = p.buffers[0].bytes().to_vec();
            compare(op, &p.name, &got, op.rows * w, |i| {
                value(op.root, i / w, i % w)
            })
        }
        Kind::Allgather => {
            let Some(out) = output else {
                return (1, Some(format!("{}: no allgather output", p.name)));
            };
            let got = bytes_of(&out);
            let mut expected = Vec::new();
            for q in 0..n {
                for i in 0..gather_rows(op, q) * w {
                    expected.push(input(op.dtype, op.salt, q, i));
                }
            }
            compare(op, &p.name, &got, expected.len(), |i| expected[i])
        }
        Kind::ReduceScatter => {
            let rows = op.rows * n;
            let start: usize = (0..r).map(|q| rows / n + usize::from(q < rows % n)).sum();
            let share = rows / n + usize::from(r < rows % n);
            let got = p.buffers[1].bytes().to_vec();
            compare(op, &p.name, &got, share * w, |i| {
                reduce(
                    op.reduce,
                    (0..n).map(|q| input(op.dtype, op.salt, q, start * w + i)),
                    n,
                )
            })
        }
        Kind::Alltoall => {
            let Some(out) = output else {
                return (1, Some(format!("{}: no alltoall output", p.name)));
            };
            let got = bytes_of(&out);
            let mut expected = Vec::new();
            for q in 0..n {
                // What q sent to r: its rows after those it sent to ranks before r.
                let skip: usize = (0..r).map(|t| a2a_rows(op, q, t)).sum();
                for i in 0..a2a_rows(op, q, r) * w {
                    expected.push(input(op.dtype, op.salt, q, skip * w + i));
                }
            }
            compare(op, &p.name, &got, expected.len(), |i| expected[i])
        }
    }
}

fn bytes_of(out: &RawOutput) -> Vec<u8> {
    if out.byte_len() == 0 {
        return Vec::new();
    }
    // SAFETY: a host output of `byte_len()` bytes, alive while `out` is.
    unsafe { std::slice::from_raw_parts(out.data().cast::<u8>(), out.byte_len()) }.to_vec()
}

/// Runs the soak on this rank (see the module's doc).
pub fn soak_rank(kolo: &Kolo, options: &SoakOptions) -> Result<SoakReport, Error> {
    let start = Instant::now();
    let mut plan_rng = Rng(options.seed);
    let mut order_rng =
        Rng(options.seed ^ (kolo.rank() as u64 + 1).wrapping_mul(0xA24B_AED4_963E_E407));
    let mut report = SoakReport::default();
    let mut next_sample = Duration::ZERO;
    let mut stop = [0u8];
    while stop[0] == 0 {
        let ops = plan(&mut plan_rng, kolo.size(), options.max_bytes);
        let mut order: Vec<usize> = (0..ops.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, order_rng.below(i as u64 + 1) as usize);
        }
        let mut pending = Vec::new();
        for &i in &order {
            // Names repeat across steps (slot i), so the response cache
            // sees the same names with new shapes and types.
            pending.push(submit(kolo, ops[i].clone(), format!("soak.{i}"))?);
        }
        for mut p in pending {
            let output = match p.handle.take() {
                Some(handle) => handle.wait()?,
                None => None,
            };
            let (bad, first) = check(kolo, p, output);
            report.wrong += bad;
            if report.first_wrong.is_none() {
                report.first_wrong = first;
            }
            report.operations += 1;
        }
        report.steps += 1;
        // Rank 0's clock decides, for every rank alike, whether this step
        // is the last (bit 0) and whether memory is sampled after it (bit 1).
        let elapsed = start.elapsed();
        let mut word = [0u8];
        if kolo.rank() == 0 {
            word[0] =
                u8::from(elapsed >= options.duration) | (u8::from(elapsed >= next_sample) << 1);
        }
        kolo.allreduce("soak.step", &mut word, ReduceOp::Max)?;
        stop[0] = word[0] & 1;
        if word[0] & 2 != 0 {
            report.sample(kolo, elapsed)?;
            next_sample = elapsed + options.sample_every;
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_soak_on_three_thread_ranks_checks_every_result() {
        let options = SoakOptions {
            duration: Duration::from_millis(1500),
            seed: 7,
            max_bytes: 1 << 20,
            sample_every: Duration::from_millis(500),
        };
        let reports =
            kolo::threads::run(3, kolo::Config::default(), |kolo| soak_rank(kolo, &options))
                .expect("the soak runs");
        for r in &reports {
            assert_eq!(r.wrong, 0, "{:?}", r.first_wrong);
            assert_eq!(
                (r.steps, r.operations),
                (reports[0].steps, reports[0].operations)
            );
        }
        assert!(reports[0].operations > reports[0].steps && !reports[0].rss.is_empty());
        assert_eq!(reports[0].rss.len(), reports[0].rss_cached.len());
    }

    #[test]
    fn compare_counts_and_names_wrong_elements() {
        let op = Op {
            kind: Kind::Allreduce,
            dtype: DataType::I16,
            reduce: ReduceOp::Sum,
            width: 1,
            rows: 3,
            root: 0,
            members: 0,
            salt: 0,
        };
        let mut bytes = vec![0u8; 6];
        for (i, v) in [1.0, 2.0, 3.0].into_iter().enumerate() {
            put(&mut bytes, DataType::I16, i, v);
        }
        assert_eq!(compare(&op, "t", &bytes, 3, |i| i as f64 + 1.0).0, 0);
        let (wrong, first) = compare(&op, "t", &bytes, 3, |i| {
            if i == 2 {
                4.0
            } else {
                i as f64 + 1.0
            }
        });
        assert_eq!(wrong, 1);
        assert!(first.is_some_and(|f| f.contains("element 2 is 3, expected 4")));
        assert_eq!(compare(&op, "t", &bytes, 4, |_| 0.0).0, 1);
    }
}
