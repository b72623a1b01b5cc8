//! The PTX text of kolo-nccl's only device code: `dst[i] = src[i] * factor`
//! with kolo's element semantics ([`kolo_transport::Element::scale`]), one
//! kernel per dtype, written by hand so that no compiler (nvrtc, nvcc) is
//! needed: the driver's JIT compiles it when the device first needs it
//! (`cuModuleLoadDataEx`).
//!
//! Each kernel is a 1-D grid-stride loop over `n` elements with the
//! parameters `(dst: u64, src: u64, n: u64, factor: f64)`; `dst == src`
//! scales in place. The arithmetic mirrors the host kernels exactly:
//!
//! | dtype      | per element                                                |
//! |------------|------------------------------------------------------------|
//! | f64        | `x * factor` (round to nearest)                            |
//! | f32        | `x * (factor as f32)`                                      |
//! | f16, bf16  | widened to f32 (exact), as f32, rounded back once (RN)     |
//! | i32, i64   | `(x as f64 * factor) as T`: toward zero, saturating        |
//! | u8, i8     | as i32, then clamped to the type's range                   |
//!
//! `mul.rn` is never fused into an FMA and keeps subnormals (no `.ftz`);
//! PTX's float-to-integer `cvt` saturates. Pure text: checked by
//! `kernels/tests/`, run on the GPU by the crate's GPU test binaries.

use kolo_protocol::DataType;

/// The PTX ISA version and target: sm_80 covers `cvt.rn.bf16.f32`; the
/// driver JIT-compiles it for any newer GPU (Hopper's sm_90 included).
pub const PTX_VERSION: &str = "7.0";
/// The oldest architecture the module targets.
pub const PTX_TARGET: &str = "sm_80";

/// Threads per block of every scale launch.
pub const BLOCK_THREADS: u32 = 256;
/// At most this many blocks; the grid-stride loop covers the rest.
pub const MAX_BLOCKS: u32 = 4096;

/// The element types the scale kernels handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleKernel {
    /// f32 in f32.
    F32,
    /// f64 in f64.
    F64,
    /// f16 through f32.
    F16,
    /// bf16 through f32.
    Bf16,
    /// i32 through f64.
    I32,
    /// i64 through f64.
    I64,
    /// u8 through f64, clamped to 0..=255.
    U8,
    /// i8 through f64, clamped to -128..=127.
    I8,
}

impl ScaleKernel {
    /// Every kernel of the module.
    pub const ALL: [ScaleKernel; 8] = [
        ScaleKernel::F32,
        ScaleKernel::F64,
        ScaleKernel::F16,
        ScaleKernel::Bf16,
        ScaleKernel::I32,
        ScaleKernel::I64,
        ScaleKernel::U8,
        ScaleKernel::I8,
    ];

    /// The kernel for `dtype`, if there is one (u16, i16 and bool have
    /// none: NCCL cannot reduce 16-bit integers, and a bool scale is a
    /// memset).
    pub fn for_dtype(dtype: DataType) -> Option<ScaleKernel> {
        Some(match dtype {
            DataType::F32 => ScaleKernel::F32,
            DataType::F64 => ScaleKernel::F64,
            DataType::F16 => ScaleKernel::F16,
            DataType::BF16 => ScaleKernel::Bf16,
            DataType::I32 => ScaleKernel::I32,
            DataType::I64 => ScaleKernel::I64,
            DataType::U8 => ScaleKernel::U8,
            DataType::I8 => ScaleKernel::I8,
            DataType::U16 | DataType::I16 | DataType::Bool => return None,
        })
    }

    /// The entry's name in the module.
    pub fn name(self) -> &'static str {
        match self {
            ScaleKernel::F32 => "kolo_scale_f32",
            ScaleKernel::F64 => "kolo_scale_f64",
            ScaleKernel::F16 => "kolo_scale_f16",
            ScaleKernel::Bf16 => "kolo_scale_bf16",
            ScaleKernel::I32 => "kolo_scale_i32",
            ScaleKernel::I64 => "kolo_scale_i64",
            ScaleKernel::U8 => "kolo_scale_u8",
            ScaleKernel::I8 => "kolo_scale_i8",
        }
    }

    /// Bytes per element (the tests check it against the dtype's).
    #[cfg(test)]
    pub fn elem_bytes(self) -> usize {
        1 << self.shift()
    }

    /// log2 of the element size: the index-to-offset shift.
    fn shift(self) -> u32 {
        match self {
            ScaleKernel::U8 | ScaleKernel::I8 => 0,
            ScaleKernel::F16 | ScaleKernel::Bf16 => 1,
            ScaleKernel::F32 | ScaleKernel::I32 => 2,
            ScaleKernel::F64 | ScaleKernel::I64 => 3,
        }
    }

    /// Run once before the loop: `%fd1` holds the factor.
    fn prologue(self) -> &'static [&'static str] {
        match self {
            // Rust's `factor as f32` rounds to nearest.
            ScaleKernel::F32 | ScaleKernel::F16 | ScaleKernel::Bf16 => {
                &["cvt.rn.f32.f64 %f1, %fd1;"]
            }
            _ => &[],
        }
    }

    /// One element: read at `[%rd8]`, write at `[%rd9]`.
    fn body(self) -> &'static [&'static str] {
        match self {
            ScaleKernel::F32 => &[
                "ld.global.f32 %f2, [%rd8];",
                "mul.rn.f32 %f3, %f2, %f1;",
                "st.global.f32 [%rd9], %f3;",
            ],
            ScaleKernel::F64 => &[
                "ld.global.f64 %fd2, [%rd8];",
                "mul.rn.f64 %fd3, %fd2, %fd1;",
                "st.global.f64 [%rd9], %fd3;",
            ],
            ScaleKernel::F16 => &[
                "ld.global.u16 %rs1, [%rd8];",
                "cvt.f32.f16 %f2, %rs1;",
                "mul.rn.f32 %f3, %f2, %f1;",
                "cvt.rn.f16.f32 %rs2, %f3;",
                "st.global.u16 [%rd9], %rs2;",
            ],
            // bf16 is the top half of an f32: widening is a shift.
            ScaleKernel::Bf16 => &[
                "ld.global.u16 %rs1, [%rd8];",
                "cvt.u32.u16 %r5, %rs1;",
                "shl.b32 %r6, %r5, 16;",
                "mov.b32 %f2, %r6;",
                "mul.rn.f32 %f3, %f2, %f1;",
                "cvt.rn.bf16.f32 %rs2, %f3;",
                "st.global.u16 [%rd9], %rs2;",
            ],
            ScaleKernel::I32 => &[
                "ld.global.s32 %r5, [%rd8];",
                "cvt.rn.f64.s32 %fd2, %r5;",
                "mul.rn.f64 %fd3, %fd2, %fd1;",
                "cvt.rzi.s32.f64 %r6, %fd3;",
                "st.global.s32 [%rd9], %r6;",
            ],
            ScaleKernel::I64 => &[
                "ld.global.s64 %rd10, [%rd8];",
                "cvt.rn.f64.s64 %fd2, %rd10;",
                "mul.rn.f64 %fd3, %fd2, %fd1;",
                "cvt.rzi.s64.f64 %rd11, %fd3;",
                "st.global.s64 [%rd9], %rd11;",
            ],
            ScaleKernel::U8 => &[
                "ld.global.u8 %r5, [%rd8];",
                "cvt.rn.f64.u32 %fd2, %r5;",
                "mul.rn.f64 %fd3, %fd2, %fd1;",
                "cvt.rzi.s32.f64 %r6, %fd3;",
                "max.s32 %r7, %r6, 0;",
                "min.s32 %r7, %r7, 255;",
                "st.global.u8 [%rd9], %r7;",
            ],
            ScaleKernel::I8 => &[
                "ld.global.s8 %r5, [%rd8];",
                "cvt.rn.f64.s32 %fd2, %r5;",
                "mul.rn.f64 %fd3, %fd2, %fd1;",
                "cvt.rzi.s32.f64 %r6, %fd3;",
                "max.s32 %r7, %r6, -128;",
                "min.s32 %r7, %r7, 127;",
                "st.global.s8 [%rd9], %r7;",
            ],
        }
    }

    /// The kernel's `.entry`.
    pub fn entry(self) -> String {
        let name = self.name();
        let mut lines: Vec<String> = vec![
            format!(".visible .entry {name}("),
            format!("    .param .u64 {name}_dst,"),
            format!("    .param .u64 {name}_src,"),
            format!("    .param .u64 {name}_n,"),
            format!("    .param .f64 {name}_factor"),
            ")".into(),
            "{".into(),
            "    .reg .pred %p<2>;".into(),
            "    .reg .b16 %rs<3>;".into(),
            "    .reg .b32 %r<8>;".into(),
            "    .reg .b64 %rd<12>;".into(),
            "    .reg .f32 %f<4>;".into(),
            "    .reg .f64 %fd<4>;".into(),
            format!("    ld.param.u64 %rd1, [{name}_dst];"),
            format!("    ld.param.u64 %rd2, [{name}_src];"),
            format!("    ld.param.u64 %rd3, [{name}_n];"),
            format!("    ld.param.f64 %fd1, [{name}_factor];"),
            "    cvta.to.global.u64 %rd1, %rd1;".into(),
            "    cvta.to.global.u64 %rd2, %rd2;".into(),
            // i = ctaid * ntid + tid; stride = nctaid * ntid (64-bit).
            "    mov.u32 %r1, %ctaid.x;".into(),
            "    mov.u32 %r2, %ntid.x;".into(),
            "    mov.u32 %r3, %tid.x;".into(),
            "    mov.u32 %r4, %nctaid.x;".into(),
            "    mul.wide.u32 %rd4, %r1, %r2;".into(),
            "    cvt.u64.u32 %rd5, %r3;".into(),
            "    add.u64 %rd4, %rd4, %rd5;".into(),
            "    mul.wide.u32 %rd6, %r4, %r2;".into(),
        ];
        lines.extend(self.prologue().iter().map(|l| format!("    {l}")));
        lines.extend([
            "    setp.ge.u64 %p1, %rd4, %rd3;".into(),
            format!("    @%p1 bra {name}_done;"),
            format!("{name}_loop:"),
            format!("    shl.b64 %rd7, %rd4, {};", self.shift()),
            "    add.u64 %rd8, %rd2, %rd7;".into(),
            "    add.u64 %rd9, %rd1, %rd7;".into(),
        ]);
        lines.extend(self.body().iter().map(|l| format!("    {l}")));
        lines.extend([
            "    add.u64 %rd4, %rd4, %rd6;".into(),
            "    setp.lt.u64 %p1, %rd4, %rd3;".into(),
            format!("    @%p1 bra {name}_loop;"),
            format!("{name}_done:"),
            "    ret;".into(),
            "}".into(),
        ]);
        lines.join("\n")
    }
}

/// The whole module: header and every kernel of [`ScaleKernel::ALL`].
pub fn module_source() -> String {
    let mut text = format!(
        "//\n// kolo-nccl scale kernels (hand-written PTX)\n//\n.version {PTX_VERSION}\n.target {PTX_TARGET}\n.address_size 64\n"
    );
    for kernel in ScaleKernel::ALL {
        text.push('\n');
        text.push_str(&kernel.entry());
        text.push('\n');
    }
    text
}

/// `(blocks, threads)` for `n` elements (`n > 0`).
pub fn launch_dims(n: usize) -> (u32, u32) {
    let blocks = n
        .div_ceil(BLOCK_THREADS as usize)
        .clamp(1, MAX_BLOCKS as usize);
    (blocks as u32, BLOCK_THREADS)
}
