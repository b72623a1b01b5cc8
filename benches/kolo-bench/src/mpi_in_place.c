/* MPI_IN_PLACE for the plain-MPI baseline (a macro; OpenMPI and MPICH differ). */
#include <mpi.h>

void *kolo_bench_mpi_in_place(void) { return MPI_IN_PLACE; }
