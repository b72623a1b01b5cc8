//! `cargo xtask bench`: the benchmark sweeps of docs/PERFORMANCE.md.

use crate::cargo;
use anyhow::Result;
use std::path::Path;

pub(crate) fn bench(root: &Path, extra: &[String]) -> Result<()> {
    let mut args = vec!["run", "--release", "-p", "kolo-bench", "--"];
    args.extend(extra.iter().map(String::as_str));
    cargo(root, &args)
}
