// Process start-up and shut-down over MPI, the world communicator, and the
// bounded barrier of the error path.
#include "trident/comm/process.hpp"

#include <chrono>
#include <cstdlib>
#include <thread>

#include "mpi_check.hpp"
#include "trident/comm/mpi/mpi_communicator.hpp"

namespace trident {

namespace {

// The launcher's rank variable of this process, or null.
const char* launcher_rank_env() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* s = std::getenv(v)) return s;
  }
  return nullptr;
}

}  // namespace

int comm_launcher_rank() {
  const char* s = launcher_rank_env();
  return s ? std::atoi(s) : 0;
}

bool comm_launched() { return launcher_rank_env() != nullptr; }

void comm_init(int* argc, char*** argv) {
  int provided = 0;
  MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided));
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

bool comm_active() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

void comm_finalize() {
  if (comm_active()) MPI_Finalize();
}

void comm_abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; this satisfies [[noreturn]]
}

int comm_world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int comm_world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

bool comm_all_arrive_within(double seconds) {
  MPI_Request req;
  if (MPI_Ibarrier(MPI_COMM_WORLD, &req) != MPI_SUCCESS) return false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int done = 0;
  while (true) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

std::unique_ptr<Communicator> world_communicator(double timeout_s) {
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, CommKind::world, "world", timeout_s,
                                           false);
}

}  // namespace trident
