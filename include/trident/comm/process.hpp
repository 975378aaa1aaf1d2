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

// This process's rank and the job's size (comm_init first).
int comm_world_rank();
int comm_world_size();

// Whether every rank reaches this call within `seconds` (a barrier that
// gives up instead of waiting forever): the error path uses it to finish
// cleanly when all ranks failed alike. It runs on a control communicator of
// its own, so it never meets the collectives of ranks still at work.
bool comm_all_arrive_within(double seconds);

// The failure notice. A rank that fails alone tells every other rank
// (comm_notify_failure posts its rank and exit code on the control
// communicator and returns; comm_exit_now gives the sends a moment, since a
// stopped or dead peer never takes its own). Every wait of a
// Communicator polls for a notice and throws PeerFailure when one arrived,
// so the other ranks end quietly within moments instead of at their
// deadline, in a launcher's kill, or in library backtraces.
void comm_notify_failure(int code);
// A notice that arrived (then *rank and *code are set); never blocks.
bool comm_failure_notice(int* rank, int* code);
// What a Communicator's waits poll for notices: the process layer that owns
// the control channel installs comm_failure_notice in comm_init; without it
// (a build of the communicators without MPI, such as the standalone GPU
// tests) no notices arrive and waits end at their deadline.
using FailureNoticeProbe = bool (*)(int* rank, int* code);
void set_failure_notice_probe(FailureNoticeProbe probe);
// Whether a notice from a rank below this one arrives within `seconds`: of
// ranks that failed at the same moment, the lowest one prints.
bool comm_lower_rank_failed_within(double seconds);
// Whether this process was stopped and continued (SIGCONT) since comm_init:
// its own timeouts then say nothing about the job (the launcher continues a
// stopped rank to end it after another rank has reported).
bool comm_was_stopped();
// Flushes stdout and stderr and ends this process with `code` within 0.2 s
// (its notices' sends), without finalising MPI (peers may be gone or stuck).
[[noreturn]] void comm_exit_now(int code);

// Every rank of the job, on the host backend, with this deadline.
std::unique_ptr<Communicator> world_communicator(double timeout_s);

}  // namespace trident
