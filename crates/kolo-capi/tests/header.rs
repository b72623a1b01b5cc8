//! `include/kolo.h` is what cbindgen makes of the crate today: a change
//! to the ABI that did not regenerate the header fails here.
//! `KOLO_BLESS=1` rewrites the header instead.

use std::path::Path;

#[test]
fn the_checked_in_header_matches_the_code() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml parses");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen reads the crate")
        .write(&mut generated);
    let path = crate_dir.join("include/kolo.h");
    if std::env::var_os("KOLO_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("include/kolo.h is writable");
        return;
    }
    let checked_in = std::fs::read(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "include/kolo.h does not match the code: run `KOLO_BLESS=1 cargo test -p kolo-capi --test header`\n\
         generated:\n{}",
        String::from_utf8_lossy(&generated)
    );
}
