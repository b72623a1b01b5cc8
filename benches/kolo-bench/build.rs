//! With the `mpi` feature, compiles the one C line the plain-MPI baseline
//! needs: `MPI_IN_PLACE` is a macro whose value differs between OpenMPI
//! and MPICH, and rsmpi does not export it. Without the feature, nothing.

fn main() {
    println!("cargo:rerun-if-changed=src/mpi_in_place.c");
    #[cfg(feature = "mpi")]
    mpi_shim();
}

#[cfg(feature = "mpi")]
fn mpi_shim() {
    let lib = match build_probe_mpi::probe() {
        Ok(lib) => lib,
        Err(errs) => {
            for (i, err) in errs.iter().enumerate() {
                println!("cargo:warning=MPI probe #{}: {err}", i + 1);
            }
            panic!("kolo-bench's `mpi` feature needs an MPI library (OpenMPI or MPICH with mpicc); run scripts/install-deps.sh");
        }
    };
    let mut build = cc::Build::new();
    build.file("src/mpi_in_place.c");
    if let Some(mpicc) = lib.mpicc {
        build.compiler(mpicc);
    } else {
        for inc in &lib.include_paths {
            build.include(inc);
        }
    }
    build.compile("kolo_bench_mpi_in_place");
}
