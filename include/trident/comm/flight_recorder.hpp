// The flight recorder: every rank's last runtime.flight_records
// communication operations, written to a file of its own when the job goes
// wrong, so that after a hang "who never arrived?" has an answer.
//
// A fixed ring, allocated once (flight_configure); recording an operation
// writes one slot (no allocation, no lock). The Communicator's common part
// records what every backend posts (comm.cpp): kind, group, peer, tag,
// bytes, the operation's number in its group, when it was posted, when a
// wait on it started, when it completed, and its state.
//
// The ring goes to DIR/rankNNNNN.json (flight_set_output; the format is in
// share/trident/hdf5-layout.md, "Flight records") when a wait passes its
// deadline, when a blocking call's watchdog fires, on any failure exit of
// the CLI, and on SIGUSR2 (the handler only sets a flag; a wait polling its
// operation, the step loop or the watchdog of a blocking call writes it and
// the run goes on). Plain JSON through stdio, not HDF5: the run file and
// the HDF5 library may be what is stuck.
//
// Threads: operations are recorded by the thread that posts them (the main
// thread); the ring is read by that thread, or by the blocking call's
// watchdog while the main thread sits in a library call that posts none.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "trident/comm/comm.hpp"

namespace trident {

// State of a recorded operation.
enum class FlightState : uint8_t { posted = 0, waiting = 1, completed = 2, timed_out = 3 };

// Allocates the ring for `capacity` operations (0: off, nothing recorded)
// and installs the SIGUSR2 handler (also at 0: the signal is then ignored).
// Once per process, before the work.
void flight_configure(int capacity);
// Where the ring goes (the folder; created when first written), this
// process's world rank and the host of every world rank. Empty dir: nowhere
// (nothing is written).
void flight_set_output(const std::string& dir, int world_rank, std::vector<std::string> hosts);
// The folder of a run file's flight records: "out/run.h5" -> "out/run.flight".
std::string flight_dir_of(const std::string& run_file);

// A communicator's group, registered when it is made: its index in the
// file's "groups" (every operation names its group by it).
int flight_register_group(CommKind kind, const std::string& name, int rank,
                          const std::vector<int>& world_ranks);

// One operation posted now; returns its id for the calls below (0: not
// recorded). peer: the other rank's world rank (send, recv) or the root's
// (broadcast, reduce), else -1. seq: its number among its group's
// operations of the same class (collectives, point-to-point).
uint64_t flight_post(int group, CommOp::Kind kind, int peer, int tag, uint64_t bytes, uint64_t seq);
// A call into a library that waits for every rank of the job (a
// BlockingCall: parallel HDF5's collective I/O) starts now: recorded as a
// collective of the whole job ("blocking_call"), waiting from the start;
// its number counts the job's blocking calls. 0 before flight_set_output.
uint64_t flight_blocking_call();
// A wait on it started (the first one counts).
void flight_waiting(uint64_t id);
// It completed, or its wait passed the deadline.
void flight_end(uint64_t id, FlightState state);

// Writes the ring now (reason: one line, why; stopped_s: how long this
// process was stopped (SIGSTOP) and then continued, comm_stopped_s(): a
// rank stopped 1 s or more is marked "was_stopped", since its records past
// the stop say nothing of the others). Returns whether a file was written.
// Safe to call repeatedly: each call replaces the file whole.
bool flight_dump(const std::string& reason, double stopped_s = 0);
// Writes the ring if SIGUSR2 arrived since the last write; cheap otherwise.
void flight_poll();

// For tests: the recorded operations, oldest first, as the file lists them.
struct FlightOp {
  uint64_t id = 0;
  uint64_t bytes = 0;
  uint64_t seq = 0;
  double posted = -1, waiting = -1, completed = -1;  // job clock; -1: not yet
  int32_t group = -1;
  int32_t peer = -1;
  int32_t tag = 0;
  CommOp::Kind kind = CommOp::Kind::barrier;
  FlightState state = FlightState::posted;
  bool blocking_call = false;  // a library call, not a Communicator's operation
};
std::vector<FlightOp> flight_snapshot();
const char* flight_kind_name(CommOp::Kind k);

}  // namespace trident
