// Process start-up and shut-down over MPI, the world communicator, and the
// error path's control communicator: the bounded barrier and the failure
// notice (see comm/process.hpp).
#include "trident/comm/process.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mpi_check.hpp"
#include "trident/comm/flight_recorder.hpp"
#include "trident/comm/mpi/mpi_communicator.hpp"
#include "trident/core/clock.hpp"

namespace trident {

namespace {

// The launcher's rank variable of this process, or null.
const char* launcher_rank_env() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* s = std::getenv(v)) return s;
  }
  return nullptr;
}

// The control communicator (a duplicate of the world, so that the error path
// never meets the collectives of ranks still at work), the receives posted on
// it for failure notices and probes, and what they brought: part of the
// process-wide MPI state.
constexpr int kNoticeTag = 7777;  // a failure: {rank, exit code, time in µs}
constexpr int kProbeTag = 7778;   // "are you there?", from a rank whose wait failed
constexpr int kAnswerTag = 7779;  // "yes", in answer to a probe
MPI_Comm g_control = MPI_COMM_NULL;
MPI_Request g_notice_req = MPI_REQUEST_NULL, g_probe_req = MPI_REQUEST_NULL;
int64_t g_notice[3] = {-1, 0, 0};  // the notice in flight
int g_probe = 0, g_answer = 1;     // payloads of probes and answers (ignored)
// The earliest failure heard of so far: the cause of the others.
struct Failure {
  int64_t rank = -1, code = 0, t_us = 0;
};
Failure g_first;
int64_t g_sent_notice[3] = {-1, 0, 0};  // this rank's own notice, while it is sent
std::vector<MPI_Request> g_sends;       // notices, probes and answers in flight
// The main thread and the watchdog of blocking calls both use the channel
// (MPI_THREAD_MULTIPLE); one at a time, since its state is shared.
std::recursive_mutex g_control_mutex;

// Set when this process is continued after a stop (SIGCONT): its waits then
// pass their deadline through no fault of theirs.
volatile std::sig_atomic_t g_continued = 0;
// Whether MPI may be called from the watchdog thread too; without it (an MPI
// library that gives less than MPI_THREAD_MULTIPLE) blocking calls keep no
// deadline.
std::atomic<bool> g_thread_multiple{false};
// The watchdog thread's last tick (CLOCK_MONOTONIC, ns; 0: not started) and
// the longest silence of it that a SIGCONT ended: how long this process was
// really stopped (a launcher's SIGCONT to a running process finds a recent
// tick). Lock-free atomics: read and written in the signal handler.
std::atomic<int64_t> g_heartbeat_ns{0};
std::atomic<int64_t> g_stopped_ns{0};
int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}
extern "C" void on_continue(int) {
  g_continued = 1;
  const int64_t beat = g_heartbeat_ns.load(), silent = monotonic_ns() - beat;
  if (beat > 0 && silent > g_stopped_ns.load()) g_stopped_ns.store(silent);
}

int64_t to_us(double seconds) { return int64_t(seconds * 1e6); }

// Failures are ordered by their time on the job's clock, then by rank: the
// earliest is the cause, the later ones its consequences (a peer that left
// makes the next send to it fail).
bool earlier(const Failure& a, int64_t t_us, int64_t rank) {
  return a.rank >= 0 && (a.t_us < t_us || (a.t_us == t_us && a.rank < rank));
}

void post_control_receives() {
  if (g_notice_req == MPI_REQUEST_NULL)
    MPI_Irecv(g_notice, 3, MPI_INT64_T, MPI_ANY_SOURCE, kNoticeTag, g_control, &g_notice_req);
  if (g_probe_req == MPI_REQUEST_NULL)
    MPI_Irecv(&g_probe, 1, MPI_INT, MPI_ANY_SOURCE, kProbeTag, g_control, &g_probe_req);
}

void send_control(const void* buf, int count, MPI_Datatype type, int to, int tag) {
  std::lock_guard<std::recursive_mutex> lock(g_control_mutex);
  g_sends.emplace_back();
  if (MPI_Isend(buf, count, type, to, tag, g_control, &g_sends.back()) != MPI_SUCCESS)
    g_sends.pop_back();
}

// Takes every notice that has arrived and answers every probe; true if a
// notice has arrived, ever.
bool drain_control() {
  std::lock_guard<std::recursive_mutex> lock(g_control_mutex);
  if (g_control == MPI_COMM_NULL) return g_first.rank >= 0;
  for (int done = 1; done && g_notice_req != MPI_REQUEST_NULL;) {
    if (MPI_Test(&g_notice_req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) break;
    if (g_first.rank < 0 ||
        earlier({g_notice[0], g_notice[1], g_notice[2]}, g_first.t_us, g_first.rank))
      g_first = {g_notice[0], g_notice[1], g_notice[2]};
    g_notice_req = MPI_REQUEST_NULL;
    post_control_receives();
  }
  for (int done = 1; done && g_probe_req != MPI_REQUEST_NULL;) {
    MPI_Status st;
    if (MPI_Test(&g_probe_req, &done, &st) != MPI_SUCCESS || !done) break;
    g_probe_req = MPI_REQUEST_NULL;
    send_control(&g_answer, 1, MPI_INT, st.MPI_SOURCE, kAnswerTag);
    post_control_receives();
  }
  return g_first.rank >= 0;
}

// The blocking call in progress on the main thread (outermost of nested
// ones) and the watchdog that keeps its deadline. Never destroyed: the
// watchdog thread runs until the process ends.
struct Blocking {
  std::mutex mutex;
  std::string what;
  double deadline = 0, timeout_s = 0;
  int depth = 0;
  bool fired = false;
  BlockingCallExpired expired = nullptr;
  uint64_t flight = 0;  // the outermost call's flight record
};
Blocking& blocking() {
  static Blocking* b = new Blocking;
  return *b;
}

std::string seconds_text(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%gs", s);
  return b;
}

// Every 50 ms: while a blocking call runs, answer probes and take notices
// for it (a notice ends this rank quietly, as in a Communicator's wait);
// past its deadline, hand it to the error path, which ends the process.
[[noreturn]] void watchdog_loop() {
  Blocking& b = blocking();
  while (true) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    g_heartbeat_ns.store(monotonic_ns());
    std::string message, what;
    {
      std::lock_guard<std::mutex> lock(b.mutex);
      if (b.depth == 0 || !g_thread_multiple) continue;
      what = b.what;
      // The main thread is inside the library call (and cannot leave it
      // while this lock is held): this thread may write the flight records.
      flight_poll();
      if (monotonic_s() > b.deadline && b.expired) {
        b.fired = true;
        flight_end(b.flight, FlightState::timed_out);
        message = b.what + " did not finish within " + seconds_text(b.timeout_s) +
                  " (it waits for every rank of the job)";
      }
    }
    int rank = 0, code = 0;
    if (comm_failure_notice(&rank, &code)) {
      flight_dump("rank " + std::to_string(rank) + " failed (exit " + std::to_string(code) +
                      ") while this rank was in " + what,
                  comm_stopped_s());
      std::this_thread::sleep_for(std::chrono::seconds(1));  // the reporter prints first
      comm_exit_now(code);
    }
    if (!message.empty()) {
      flight_dump(message, comm_stopped_s());
      blocking().expired(message);
    }
  }
}

}  // namespace

BlockingCall::BlockingCall(const std::string& what, double timeout_s) {
  static std::once_flag started;
  std::call_once(started, [] { std::thread(watchdog_loop).detach(); });
  Blocking& b = blocking();
  std::lock_guard<std::mutex> lock(b.mutex);
  if (b.depth++ > 0) return;
  b.what = what;
  b.timeout_s = timeout_s;
  b.deadline = monotonic_s() + timeout_s;
  b.flight = flight_blocking_call();
}

BlockingCall::~BlockingCall() {
  Blocking& b = blocking();
  std::unique_lock<std::mutex> lock(b.mutex);
  if (--b.depth == 0) flight_end(b.flight, FlightState::completed);
  // Past its deadline the watchdog ends the process: the call's result is no
  // longer this thread's to use.
  while (b.fired) {
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::seconds(1));
    lock.lock();
  }
}

void set_blocking_call_expired(BlockingCallExpired handler) {
  std::lock_guard<std::mutex> lock(blocking().mutex);
  blocking().expired = handler;
}

int comm_launcher_rank() {
  const char* s = launcher_rank_env();
  return s ? std::atoi(s) : 0;
}

bool comm_launched() { return launcher_rank_env() != nullptr; }

void comm_init(int* argc, char*** argv) {
  int provided = 0;
  // Multiple: the watchdog of blocking calls uses the control channel while
  // the main thread waits inside a library.
  MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  g_thread_multiple = provided == MPI_THREAD_MULTIPLE;
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &g_control));
  post_control_receives();
  set_failure_notice_probe(&comm_failure_notice);
  struct sigaction sa {};
  sa.sa_handler = on_continue;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGCONT, &sa, nullptr);
}

bool comm_was_stopped() { return g_continued != 0; }

double comm_stopped_s() { return double(g_stopped_ns.load()) * 1e-9; }

bool comm_active() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

void comm_finalize() {
  // Under the channel's lock to the end: the watchdog thread may be testing
  // the control receives (drain_control) at this moment, and an MPI call
  // racing MPI_Finalize crashes inside the transport. Once g_control is null
  // the watchdog makes no MPI call again.
  std::lock_guard<std::recursive_mutex> lock(g_control_mutex);
  if (!comm_active()) return;
  for (MPI_Request* r : {&g_notice_req, &g_probe_req}) {
    if (*r == MPI_REQUEST_NULL) continue;
    MPI_Cancel(r);
    MPI_Request_free(r);
  }
  if (g_control != MPI_COMM_NULL) MPI_Comm_free(&g_control);
  MPI_Finalize();
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
  const MPI_Comm comm = g_control != MPI_COMM_NULL ? g_control : MPI_COMM_WORLD;
  if (MPI_Ibarrier(comm, &req) != MPI_SUCCESS) return false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int done = 0;
  while (true) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return true;
    drain_control();
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void comm_notify_failure(int code, double t_fail) {
  std::lock_guard<std::recursive_mutex> lock(g_control_mutex);
  if (g_control == MPI_COMM_NULL || !comm_active()) return;
  const int me = comm_world_rank(), n = comm_world_size();
  g_sent_notice[0] = me;
  g_sent_notice[1] = code;
  g_sent_notice[2] = to_us(t_fail);
  for (int r = 0; r < n; ++r)
    if (r != me) send_control(g_sent_notice, 3, MPI_INT64_T, r, kNoticeTag);
}

bool comm_failure_notice(int* rank, int* code) {
  if (!drain_control()) return false;
  *rank = int(g_first.rank);
  *code = int(g_first.code);
  return true;
}

bool comm_earlier_failure_within(double t_fail, double seconds, int* code) {
  const int64_t me = comm_world_rank(), t = to_us(t_fail);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (true) {
    drain_control();
    if (earlier(g_first, t, me)) {
      *code = int(g_first.code);
      return true;
    }
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

std::vector<int> comm_silent_ranks(double seconds) {
  std::vector<int> silent;
  std::lock_guard<std::recursive_mutex> lock(g_control_mutex);
  if (g_control == MPI_COMM_NULL || !comm_active()) return silent;
  const int me = comm_world_rank(), n = comm_world_size();
  std::vector<char> answered(size_t(n), 0);
  answered[size_t(me)] = 1;
  for (int r = 0; r < n; ++r)
    if (r != me) send_control(&g_probe, 1, MPI_INT, r, kProbeTag);
  int got = 0, missing = n - 1;
  MPI_Request req = MPI_REQUEST_NULL;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (missing > 0 && std::chrono::steady_clock::now() < deadline) {
    drain_control();  // others may be probing too, and must hear an answer
    if (req == MPI_REQUEST_NULL)
      MPI_Irecv(&got, 1, MPI_INT, MPI_ANY_SOURCE, kAnswerTag, g_control, &req);
    int done = 0;
    MPI_Status st;
    if (MPI_Test(&req, &done, &st) != MPI_SUCCESS) break;
    if (!done) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    req = MPI_REQUEST_NULL;
    if (!answered[size_t(st.MPI_SOURCE)]) --missing;
    answered[size_t(st.MPI_SOURCE)] = 1;
  }
  if (req != MPI_REQUEST_NULL) {
    MPI_Cancel(&req);
    MPI_Request_free(&req);
  }
  for (int r = 0; r < n; ++r)
    if (!answered[size_t(r)]) silent.push_back(r);
  return silent;
}

void comm_exit_now(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  // A moment for the notices to leave (a stopped or dead peer never takes its own).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  std::lock_guard<std::recursive_mutex> lock(g_control_mutex);  // the watchdog adds sends too
  int done = 0;
  while (comm_active() && !g_sends.empty() && std::chrono::steady_clock::now() < deadline) {
    if (MPI_Testall(int(g_sends.size()), g_sends.data(), &done, MPI_STATUSES_IGNORE) !=
            MPI_SUCCESS ||
        done)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ::_exit(code);
}

std::unique_ptr<Communicator> world_communicator(double timeout_s) {
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, CommKind::world, "world", timeout_s,
                                           false);
}

}  // namespace trident
