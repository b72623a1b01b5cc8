//! Finds UCX (1.10 or newer) with pkg-config, links libucp and libucs, and
//! generates the raw UCP declarations (`src/sys`) from the installed
//! headers, so that every struct's layout is the library's own.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let ucx = match pkg_config::Config::new()
        .atleast_version("1.10")
        .probe("ucx")
    {
        Ok(ucx) => ucx,
        Err(e) => panic!(
            "kolo-ucx needs UCX 1.10 or newer with its headers and pkg-config file \
             (Debian and Ubuntu: libucx-dev; scripts/install-deps.sh installs it): {e}"
        ),
    };
    let mut builder = bindgen::Builder::default()
        .header_contents("kolo_ucx.h", "#include <ucp/api/ucp.h>\n")
        .allowlist_function("ucp_(init_version|cleanup|config_read|config_release)")
        .allowlist_function("ucp_worker_(create|destroy|get_address|release_address|progress)")
        .allowlist_function("ucp_ep_(create|close_nbx)")
        .allowlist_function("ucp_tag_(send_nbx|recv_nbx|probe_nb|msg_recv_nbx|recv_request_test)")
        .allowlist_function("ucp_request_(check_status|free|cancel)")
        .allowlist_function("ucs_status_string")
        .allowlist_type("ucs_status_t")
        // The flag enums of the parameter structs kolo fills.
        .allowlist_type("ucp_(params_field|feature|worker_params_field|ep_params_field|ep_close_flags_t|op_attr_t|err_handling_mode_t)")
        .allowlist_var("UCP_API_(MAJOR|MINOR)")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false);
    for path in &ucx.include_paths {
        builder = builder.clang_arg(format!("-I{}", path.display()));
    }
    let bindings = builder
        .generate()
        .unwrap_or_else(|e| panic!("generating UCP's declarations from <ucp/api/ucp.h>: {e}"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings
        .write_to_file(out.join("ucp.rs"))
        .unwrap_or_else(|e| panic!("writing UCP's declarations: {e}"));
}
