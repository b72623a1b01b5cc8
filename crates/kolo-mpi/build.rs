//! Compiles kolo-mpi's tiny C shim: the values MPI defines as macros
//! (`MPI_IN_PLACE`, `MPI_TAG_UB`'s attribute key) differ between OpenMPI and
//! MPICH, so they are read through C rather than hard-coded.

fn main() {
    println!("cargo:rerun-if-changed=src/shim.c");
    let lib = match build_probe_mpi::probe() {
        Ok(lib) => lib,
        Err(errs) => {
            for (i, err) in errs.iter().enumerate() {
                println!("cargo:warning=MPI probe #{}: {err}", i + 1);
            }
            panic!("kolo-mpi needs an MPI library (OpenMPI or MPICH with mpicc); run scripts/install-deps.sh");
        }
    };
    let mut build = cc::Build::new();
    build.file("src/shim.c");
    if let Some(mpicc) = lib.mpicc {
        build.compiler(mpicc);
    } else {
        for inc in &lib.include_paths {
            build.include(inc);
        }
    }
    build.compile("kolo_mpi_shim");
}
