/* Values MPI defines as macros, read through C so kolo works on any MPI. */
#include <mpi.h>

void *kolo_mpi_in_place(void) { return MPI_IN_PLACE; }
int kolo_mpi_tag_ub_key(void) { return MPI_TAG_UB; }
