// The process's membership in the job: start-up and shut-down of the
// communication runtime (MPI), the world communicator, and ending the whole
// job. The one process-wide state of comm; `trident` calls init and finalize
// once, around the command that needs them.
#pragma once
#include <memory>

#include "trident/comm/comm.hpp"

namespace trident {

// The rank the launcher (mpirun, srun) gave this process, readable before
// comm_init; 0 when not launched by one.
int comm_launcher_rank();
// Whether a launcher (mpirun, srun) started this process, so that peers may
// exist; readable before comm_init.
bool comm_launched();

// Initialises MPI (threads: serialized; errors are returned, not fatal).
void comm_init(int* argc, char*** argv);
// Initialised and not yet finalised.
bool comm_active();
void comm_finalize();
// Ends every rank of the job with `code` (MPI_Abort).
[[noreturn]] void comm_abort(int code);

// This process's rank and the job's size (comm_init first).
int comm_world_rank();
int comm_world_size();

// Whether every rank reaches this call within `seconds` (a barrier that
// gives up instead of waiting forever): the error path uses it to finish
// cleanly when all ranks failed alike, and to abort otherwise.
bool comm_all_arrive_within(double seconds);

// Every rank of the job, on the host backend, with this deadline.
std::unique_ptr<Communicator> world_communicator(double timeout_s);

}  // namespace trident
