//! The batched copy kernel through the device fusion buffer: pack and
//! unpack of random segment sets (odd sizes, unaligned offsets, 1 to 5,000
//! segments, segments longer than one table chunk) against the host.

use super::{err, to_device, to_host, Report};
use kolo_nccl::{DeviceFusionBuffer, NcclComm};

/// xorshift64*: deterministic, the same on every rank.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Packs `lens.len()` segments taken at random (unaligned) offsets of one
/// random source buffer, checks the packed bytes, unpacks them into
/// separate buffers at random offsets, and checks those.
fn round_trip(comm: &mut NcclComm, lens: &[usize], seed: u64) -> Result<(), String> {
    let stream = comm.stream().clone();
    let mut rng = Rng(seed | 1);
    let src_len = lens.iter().max().copied().unwrap_or(0) + 4096;
    let src_host: Vec<u8> = (0..src_len).map(|_| rng.next() as u8).collect();
    let src = to_device(&stream, &src_host)?;
    let offsets: Vec<usize> = lens.iter().map(|&l| rng.below(src_len - l + 1)).collect();
    let mut fusion = DeviceFusionBuffer::new(comm, 1).map_err(err)?;
    let views: Vec<_> = lens
        .iter()
        .zip(&offsets)
        .map(|(&l, &o)| src.slice(o..o + l))
        .collect();
    let total = fusion.pack(comm, &views).map_err(err)?;
    drop(views);
    let want: Vec<u8> = lens
        .iter()
        .zip(&offsets)
        .flat_map(|(&l, &o)| src_host[o..o + l].iter().copied())
        .collect();
    if total != want.len() {
        return Err(format!("packed {total} bytes, expected {}", want.len()));
    }
    let packed = if total == 0 {
        Vec::new()
    } else {
        stream
            .clone_dtoh(&fusion.bytes().slice(..total))
            .map_err(|e| format!("dtoh: {e:?}"))?
    };
    if let Some(i) = packed.iter().zip(&want).position(|(a, b)| a != b) {
        return Err(format!(
            "packed byte {i}: got {}, expected {}",
            packed[i], want[i]
        ));
    }
    // Unpack into one buffer per segment, at an offset of 0..16 bytes.
    let shifts: Vec<usize> = lens.iter().map(|_| rng.below(16)).collect();
    let mut outs = lens
        .iter()
        .zip(&shifts)
        .map(|(&l, &s)| {
            stream
                .alloc_zeros::<u8>(l + s + 1)
                .map_err(|e| format!("alloc: {e:?}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    {
        let mut views: Vec<_> = outs
            .iter_mut()
            .zip(lens.iter().zip(&shifts))
            .map(|(o, (&l, &s))| o.slice_mut(s..s + l))
            .collect();
        fusion.unpack(comm, &mut views).map_err(err)?;
    }
    for (k, (out, (&l, &s))) in outs.iter().zip(lens.iter().zip(&shifts)).enumerate() {
        let got = to_host(&stream, out, l + s + 1)?;
        let start: usize = lens[..k].iter().sum();
        let untouched = got[..s].iter().chain(&got[s + l..]).all(|&b| b == 0);
        if got[s..s + l] != want[start..start + l] || !untouched {
            return Err(format!("segment {k} ({l} bytes at +{s}) unpacked wrong"));
        }
    }
    Ok(())
}

/// Every batched-copy check.
pub fn run(comm: &mut NcclComm, report: &mut Report) {
    let mut rng = Rng(0x5eed);
    let mut random =
        |n: usize, max: usize| -> Vec<usize> { (0..n).map(|_| rng.below(max + 1)).collect() };
    let cases: Vec<(String, Vec<usize>)> = vec![
        ("1 segment of 1001 bytes".into(), vec![1001]),
        ("1 empty segment".into(), vec![0]),
        ("2 segments of 1 byte".into(), vec![1, 1]),
        (
            "5 segments, one of 5 MiB + 3".into(),
            vec![17, 5 << 20 | 3, 0, 4096, 33],
        ),
        ("5000 segments of 0..300 bytes".into(), random(5000, 300)),
        (
            "5000 segments of 0..20000 bytes".into(),
            random(5000, 20_000),
        ),
        (
            "300 segments of 0..200000 bytes".into(),
            random(300, 200_000),
        ),
    ];
    for (k, (name, lens)) in cases.iter().enumerate() {
        report.check(
            &format!("batched copy: pack / unpack {name}"),
            round_trip(comm, lens, 0x1234_5678 + k as u64),
        );
    }
}
