// Catch2 main for MPI tests: every rank runs every test case; a failure on any
// rank makes that rank (and so mpirun) exit non-zero. Only rank 0 reports
// successes; every rank reports its failures, prefixed by its rank.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>

#include <catch2/catch.hpp>
#include <cstdio>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  Catch::Session session;
  if (int rc = session.applyCommandLine(argc, argv); rc != 0) {
    MPI_Finalize();
    return rc;
  }
  int failed = session.run();
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) std::printf("[mpi] %s on all ranks\n", any_failed ? "FAILED" : "passed");
  MPI_Finalize();
  return any_failed ? 1 : 0;
}
