// The process's membership in the job: start-up and shut-down of the
// communication runtime (MPI), the world communicator, and ending the whole
// job. The one process-wide state of comm; `trident` calls init and finalize
// once, around the command that needs them.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "trident/comm/comm.hpp"

namespace trident {

// The rank the launcher (mpirun, srun) gave this process, readable before
// comm_init; 0 when not launched by one.
int comm_launcher_rank();
// Whether a launcher (mpirun, srun) started this process, so that peers may
// exist; readable before comm_init.
bool comm_launched();

// Initialises MPI (threads: multiple, for the watchdog of blocking calls;
// errors are returned, not fatal).
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
// (comm_notify_failure posts its rank, exit code and the time of its failure
// on the job's clock (core/clock.hpp) on the control communicator and
// returns; comm_exit_now gives the sends a moment, since a stopped or dead
// peer never takes its own). Every wait of a Communicator polls for a notice
// and throws PeerFailure when one arrived, so the other ranks end quietly
// within moments instead of at their deadline, in a launcher's kill, or in
// library backtraces. Of several failures the earliest is the cause: the
// others (a send to a rank that already left, a second deadline) are its
// consequences.
void comm_notify_failure(int code, double t_fail);
// The earliest failure heard of (then *rank and *code are set); never blocks.
// Polling it also answers other ranks' probes (comm_silent_ranks).
bool comm_failure_notice(int* rank, int* code);
// What a Communicator's waits poll for notices: the process layer that owns
// the control channel installs comm_failure_notice in comm_init; without it
// (a build of the communicators without MPI, such as the standalone GPU
// tests) no notices arrive and waits end at their deadline.
using FailureNoticeProbe = bool (*)(int* rank, int* code);
void set_failure_notice_probe(FailureNoticeProbe probe);
// Whether a notice of a failure earlier than this rank's (at t_fail; at the
// same time, of a lower rank) arrives within `seconds` (then *code is set):
// of ranks that failed, the first one prints.
bool comm_earlier_failure_within(double t_fail, double seconds, int* code);
// The ranks that do not answer a probe within `seconds`: stopped or dead
// (a rank answers wherever it waits, so a live rank answers within moments
// unless it computes or sits in a library call that cannot poll).
std::vector<int> comm_silent_ranks(double seconds);
// Whether this process was stopped and continued (SIGCONT) since comm_init:
// its own timeouts then say nothing about the job (the launcher continues a
// stopped rank to end it after another rank has reported).
bool comm_was_stopped();
// How long this process was stopped before a SIGCONT, at the longest
// (seconds; 0: never, or before the blocking calls' watchdog thread, whose
// ticks measure it, started): a launcher's SIGCONT to a running process
// says 0, where comm_was_stopped() says true.
double comm_stopped_s();
// Flushes stdout and stderr and ends this process with `code` within 0.2 s
// (its notices' sends), without finalising MPI (peers may be gone or stuck).
[[noreturn]] void comm_exit_now(int code);

// A call into a library that waits for other ranks and cannot be polled
// (parallel HDF5's collective I/O), held for the duration of the call: a
// watchdog thread keeps its deadline. Past it, the watchdog hands "<what>
// did not finish within Ns ..." to the handler set below (the CLI's error
// path: it asks which ranks answer, tells the others, prints one line and
// ends the process); while the call runs, the watchdog answers probes and
// ends this rank quietly when another rank's failure notice arrives. Nested
// calls keep the outermost deadline.
class BlockingCall {
 public:
  BlockingCall(const std::string& what, double timeout_s);
  ~BlockingCall();
  BlockingCall(const BlockingCall&) = delete;
  BlockingCall& operator=(const BlockingCall&) = delete;
};
// Must end the process (it runs on the watchdog thread); none set: blocking
// calls have no deadline.
using BlockingCallExpired = void (*)(const std::string& message);
void set_blocking_call_expired(BlockingCallExpired handler);

// Every rank of the job, on the host backend, with this deadline.
std::unique_ptr<Communicator> world_communicator(double timeout_s);

}  // namespace trident
