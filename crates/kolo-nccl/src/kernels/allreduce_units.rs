//! The per-dtype instructions of [`crate::kernels::allreduce_ptx`]'s
//! kernels: one element at a time (the tail, `n % lanes` elements) and one
//! 16-byte *unit* at a time (4 f32 or 8 halves, in `%r5..%r8`), the
//! registered buffers always read and written whole units (their regions
//! are 256-byte aligned), inputs and outputs whole units when 16-byte
//! aligned (`%p7` / `%p8` false) and element by element otherwise.
//! Lanes load into `%f4..`, accumulate in `%f20..` (f32, rank order),
//! round into `%rs4..` (halves). [`Emitter`] assembles them into loops,
//! peer selections and the flag barrier.

/// The most ranks (peer buffers) a kernel handles.
pub const MAX_RANKS: usize = 8;
/// The most CTAs of one launch (the flag slots per phase and sender).
pub const MAX_BLOCKS: u32 = 32;

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

/// The words of a unit.
const WORDS: [&str; 4] = ["%r5", "%r6", "%r7", "%r8"];

impl ArDtype {
    /// The raw bits' register and load / store type.
    pub(super) fn raw(self) -> (&'static str, &'static str) {
        match self {
            ArDtype::F32 => ("%r1", "u32"),
            ArDtype::F16 | ArDtype::Bf16 => ("%rs1", "u16"),
        }
    }

    /// `%f3 = widen([addr])`, loaded past L1 (`.cg`: peers' memory).
    pub(super) fn load_f32(self, addr: &str) -> Vec<String> {
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
    pub(super) fn narrow(self) -> Vec<String> {
        match self {
            ArDtype::F32 => vec![],
            ArDtype::F16 => vec!["cvt.rn.f16.f32 %rs3, %f2;".into()],
            ArDtype::Bf16 => vec!["cvt.rn.bf16.f32 %rs3, %f2;".into()],
        }
    }

    /// Scales the narrowed value by `%f1` (kolo's `Element::scale`).
    pub(super) fn scale(self) -> Vec<String> {
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
    pub(super) fn store_result(self, addr: &str) -> String {
        match self {
            ArDtype::F32 => format!("st.global.f32 [{addr}], %f2;"),
            ArDtype::F16 | ArDtype::Bf16 => format!("st.global.u16 [{addr}], %rs3;"),
        }
    }

    /// Elements per 16-byte unit.
    pub fn lanes(self) -> usize {
        16 >> self.shift()
    }

    /// log2 of [`Self::lanes`].
    pub fn unit_shift(self) -> u32 {
        4 - self.shift()
    }

    /// `%f{4+j}` = lane `j` of the unit in `%r5..%r8`.
    fn unpack(self) -> Vec<String> {
        let mut out = Vec::new();
        for (w, word) in WORDS.iter().enumerate() {
            match self {
                ArDtype::F32 => out.push(format!("mov.b32 %f{}, {word};", 4 + w)),
                ArDtype::F16 => {
                    out.push(format!("mov.b32 {{%rs2, %rs3}}, {word};"));
                    out.push(format!("cvt.f32.f16 %f{}, %rs2;", 4 + 2 * w));
                    out.push(format!("cvt.f32.f16 %f{}, %rs3;", 5 + 2 * w));
                }
                ArDtype::Bf16 => {
                    out.push(format!("shl.b32 %r9, {word}, 16;"));
                    out.push(format!("mov.b32 %f{}, %r9;", 4 + 2 * w));
                    out.push(format!("and.b32 %r9, {word}, 0xFFFF0000;"));
                    out.push(format!("mov.b32 %f{}, %r9;", 5 + 2 * w));
                }
            }
        }
        out
    }

    /// Loads the unit at `[addr]` of a registered buffer (past L1) and
    /// adds it into the accumulators (`first`: moves it there).
    pub(super) fn unit_accumulate(self, addr: &str, first: bool) -> Vec<String> {
        let mut out = vec![format!(
            "ld.global.cg.v4.u32 {{%r5, %r6, %r7, %r8}}, [{addr}];"
        )];
        out.extend(self.unpack());
        for j in 0..self.lanes() {
            out.push(if first {
                format!("mov.f32 %f{}, %f{};", 20 + j, 4 + j)
            } else {
                format!("add.rn.f32 %f{0}, %f{0}, %f{1};", 20 + j, 4 + j)
            });
        }
        out
    }

    /// Rounds the accumulators to the type, scales them unless `%p9`
    /// (kolo's `Element::scale`: halves through f32, rounded again) and
    /// packs them into `%r5..%r8`; `unscaled` is a fresh label.
    pub(super) fn unit_finish(self, unscaled: &str) -> Vec<String> {
        let lanes = self.lanes();
        let mut out = Vec::new();
        let narrow = match self {
            ArDtype::F32 => None,
            ArDtype::F16 => Some("cvt.rn.f16.f32"),
            ArDtype::Bf16 => Some("cvt.rn.bf16.f32"),
        };
        if let Some(cvt) = narrow {
            for j in 0..lanes {
                out.push(format!("{cvt} %rs{}, %f{};", 4 + j, 20 + j));
            }
        }
        out.push(format!("@%p9 bra {unscaled};"));
        for j in 0..lanes {
            let (f, rs) = (20 + j, 4 + j);
            match self {
                ArDtype::F32 => out.push(format!("mul.rn.f32 %f{f}, %f{f}, %f1;")),
                ArDtype::F16 => {
                    out.push(format!("cvt.f32.f16 %f{f}, %rs{rs};"));
                    out.push(format!("mul.rn.f32 %f{f}, %f{f}, %f1;"));
                    out.push(format!("cvt.rn.f16.f32 %rs{rs}, %f{f};"));
                }
                ArDtype::Bf16 => {
                    out.push(format!("cvt.u32.u16 %r9, %rs{rs};"));
                    out.push("shl.b32 %r9, %r9, 16;".into());
                    out.push(format!("mov.b32 %f{f}, %r9;"));
                    out.push(format!("mul.rn.f32 %f{f}, %f{f}, %f1;"));
                    out.push(format!("cvt.rn.bf16.f32 %rs{rs}, %f{f};"));
                }
            }
        }
        out.push(format!("{unscaled}:"));
        for (w, word) in WORDS.iter().enumerate() {
            out.push(match self {
                ArDtype::F32 => format!("mov.b32 {word}, %f{};", 20 + w),
                ArDtype::F16 | ArDtype::Bf16 => {
                    format!("mov.b32 {word}, {{%rs{}, %rs{}}};", 4 + 2 * w, 5 + 2 * w)
                }
            });
        }
        out
    }

    /// Loads the unit at `[addr]` (an input) into `%r5..%r8`: one vector
    /// load, or element by element when `%p7` says it is unaligned;
    /// `unaligned` and `done` are fresh labels.
    pub(super) fn unit_load_input(self, addr: &str, unaligned: &str, done: &str) -> Vec<String> {
        let mut out = vec![
            format!("@%p7 bra {unaligned};"),
            format!("ld.global.v4.u32 {{%r5, %r6, %r7, %r8}}, [{addr}];"),
            format!("bra {done};"),
            format!("{unaligned}:"),
        ];
        for (w, word) in WORDS.iter().enumerate() {
            match self {
                ArDtype::F32 => out.push(format!("ld.global.u32 {word}, [{addr}+{}];", 4 * w)),
                ArDtype::F16 | ArDtype::Bf16 => {
                    out.push(format!("ld.global.u16 %rs2, [{addr}+{}];", 4 * w));
                    out.push(format!("ld.global.u16 %rs3, [{addr}+{}];", 4 * w + 2));
                    out.push(format!("mov.b32 {word}, {{%rs2, %rs3}};"));
                }
            }
        }
        out.push(format!("{done}:"));
        out
    }

    /// Stores `%r5..%r8` at `[addr]` (an output): one vector store, or
    /// element by element when `%p8` says it is unaligned.
    pub(super) fn unit_store_output(self, addr: &str, unaligned: &str, done: &str) -> Vec<String> {
        let mut out = vec![
            format!("@%p8 bra {unaligned};"),
            format!("st.global.v4.u32 [{addr}], {{%r5, %r6, %r7, %r8}};"),
            format!("bra {done};"),
            format!("{unaligned}:"),
        ];
        for (w, word) in WORDS.iter().enumerate() {
            match self {
                ArDtype::F32 => out.push(format!("st.global.u32 [{addr}+{}], {word};", 4 * w)),
                ArDtype::F16 | ArDtype::Bf16 => {
                    out.push(format!("mov.b32 {{%rs2, %rs3}}, {word};"));
                    out.push(format!("st.global.u16 [{addr}+{}], %rs2;", 4 * w));
                    out.push(format!("st.global.u16 [{addr}+{}], %rs3;", 4 * w + 2));
                }
            }
        }
        out.push(format!("{done}:"));
        out
    }
}

/// Emits instructions and unique labels.
pub(super) struct Emitter {
    pub(super) name: &'static str,
    pub(super) lines: Vec<String>,
    pub(super) labels: usize,
}

impl Emitter {
    pub(super) fn op(&mut self, line: impl AsRef<str>) {
        self.lines.push(format!("    {}", line.as_ref()));
    }
    pub(super) fn ops(&mut self, lines: impl IntoIterator<Item = String>) {
        for l in lines {
            self.op(l);
        }
    }
    pub(super) fn label(&mut self, what: &str) -> String {
        self.labels += 1;
        format!("{}_{what}{}", self.name, self.labels)
    }
    pub(super) fn place(&mut self, label: &str) {
        self.lines.push(format!("{label}:"));
    }

    /// `%rd40 = lo + i0; while %rd40 < hi { %rd41 = byte offset; body;
    /// %rd40 += stride }`: the positions of this CTA's threads in
    /// `[lo, hi)`, the same on every rank.
    pub(super) fn slice_loop(&mut self, lo: &str, hi: &str, shift: u32, body: &[String]) {
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
    pub(super) fn select_peer(&mut self, dst: &str, index: &str, data: bool) {
        let base = if data { 30 } else { 20 };
        for k in 0..MAX_RANKS {
            self.op(format!("setp.eq.u64 %p2, {index}, {k};"));
            self.op(format!("@%p2 mov.u64 {dst}, %rd{};", base + k));
        }
    }

    /// `%rd50 = lo`, `%rd51 = hi` of slice `s` (a register or a number),
    /// in units.
    pub(super) fn slice_bounds(&mut self, s: &str) {
        self.op(format!("mul.lo.u64 %rd50, %rd7, {s};"));
        self.op("min.u64 %rd50, %rd50, %rd15;");
        self.op("add.u64 %rd51, %rd50, %rd7;");
        self.op("min.u64 %rd51, %rd51, %rd15;");
    }

    /// Phase `phase`'s signal and wait (see the module doc).
    pub(super) fn barrier(&mut self, phase: usize) {
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
        // A peer that never comes (it died) traps the kernel after
        // `timeout_ns` (%rd18) instead of spinning forever.
        let arrived = self.label("arrived");
        self.op("mov.u64 %rd17, %globaltimer;");
        self.place(&spin);
        self.op("ld.acquire.sys.global.u64 %rd45, [%rd44];");
        self.op("setp.ge.u64 %p4, %rd45, %rd6;");
        self.op(format!("@%p4 bra {arrived};"));
        self.op("mov.u64 %rd49, %globaltimer;");
        self.op("sub.u64 %rd49, %rd49, %rd17;");
        self.op("setp.gt.u64 %p4, %rd49, %rd18;");
        self.op("@%p4 trap;");
        self.op(format!("bra {spin};"));
        self.place(&arrived);
        self.op("fence.acq_rel.sys;");
        self.place(&waited);
        self.op("bar.sync 0;");
    }

    /// The loop body reducing element `%rd41` (byte offset) of every rank's
    /// data into `%f2` / `%rs3`, scaled; stores are the caller's.
    pub(super) fn reduce_body(&mut self, dtype: ArDtype) -> Vec<String> {
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

    /// The loop body reducing unit `%rd41` (byte offset) of every rank's
    /// data into `%r5..%r8`, scaled; stores are the caller's.
    pub(super) fn unit_reduce_body(&mut self, dtype: ArDtype) -> Vec<String> {
        let done = self.label("summed");
        let mut body = Vec::new();
        for k in 0..MAX_RANKS {
            if k > 0 {
                body.push(format!("setp.le.u64 %p5, %rd5, {k};"));
                body.push(format!("@%p5 bra {done};"));
            }
            body.push(format!("add.u64 %rd46, %rd{}, %rd41;", 30 + k));
            body.extend(dtype.unit_accumulate("%rd46", k == 0));
        }
        body.push(format!("{done}:"));
        let unscaled = self.label("unscaled");
        body.extend(dtype.unit_finish(&unscaled));
        body
    }

    /// Stores `%r5..%r8` at the output's unit `%rd41`.
    pub(super) fn unit_store_out(&mut self, dtype: ArDtype) -> Vec<String> {
        let (unaligned, done) = (self.label("out_unaligned"), self.label("out_stored"));
        let mut body = vec!["add.u64 %rd47, %rd1, %rd41;".to_string()];
        body.extend(dtype.unit_store_output("%rd47", &unaligned, &done));
        body
    }
}
