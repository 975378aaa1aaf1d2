// Process start-up and shut-down over MPI, the world communicator, and the
// error path's control communicator: the bounded barrier and the failure
// notice (see comm/process.hpp).
#include "trident/comm/process.hpp"

#include <unistd.h>

#include <csignal>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

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

// The control communicator (a duplicate of the world, so that the error path
// never meets the collectives of ranks still at work) and the receive posted
// on it for failure notices: part of the process-wide MPI state.
constexpr int kNoticeTag = 7777;
MPI_Comm g_control = MPI_COMM_NULL;
MPI_Request g_notice_req = MPI_REQUEST_NULL;
int g_notice[2] = {-1, 0};                    // rank, exit code of the notice in flight
int g_lowest_notice = -1, g_notice_code = 0;  // the lowest failed rank heard of so far
int g_sent_notice[2] = {-1, 0};                // this rank's own notice, while it is sent
std::vector<MPI_Request> g_notice_sends;

// Set when this process is continued after a stop (SIGCONT): its waits then
// pass their deadline through no fault of theirs.
volatile std::sig_atomic_t g_continued = 0;
extern "C" void on_continue(int) { g_continued = 1; }

void post_notice_receive() {
  MPI_Irecv(g_notice, 2, MPI_INT, MPI_ANY_SOURCE, kNoticeTag, g_control, &g_notice_req);
}

// Takes every notice that has arrived; true if any has, ever.
bool drain_notices() {
  if (g_notice_req == MPI_REQUEST_NULL) return g_lowest_notice >= 0;
  int done = 1;
  while (done) {
    done = 0;
    if (MPI_Test(&g_notice_req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
    if (!done) break;
    if (g_lowest_notice < 0 || g_notice[0] < g_lowest_notice) {
      g_lowest_notice = g_notice[0];
      g_notice_code = g_notice[1];
    }
    post_notice_receive();
  }
  return g_lowest_notice >= 0;
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
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &g_control));
  post_notice_receive();
  set_failure_notice_probe(&comm_failure_notice);
  struct sigaction sa {};
  sa.sa_handler = on_continue;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGCONT, &sa, nullptr);
}

bool comm_was_stopped() { return g_continued != 0; }

bool comm_active() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

void comm_finalize() {
  if (!comm_active()) return;
  if (g_notice_req != MPI_REQUEST_NULL) {
    MPI_Cancel(&g_notice_req);
    MPI_Request_free(&g_notice_req);
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
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void comm_notify_failure(int code) {
  if (g_control == MPI_COMM_NULL || !comm_active()) return;
  const int me = comm_world_rank(), n = comm_world_size();
  g_sent_notice[0] = me;
  g_sent_notice[1] = code;
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    g_notice_sends.emplace_back();
    if (MPI_Isend(g_sent_notice, 2, MPI_INT, r, kNoticeTag, g_control, &g_notice_sends.back()) !=
        MPI_SUCCESS)
      g_notice_sends.pop_back();
  }
}

bool comm_failure_notice(int* rank, int* code) {
  if (!drain_notices()) return false;
  *rank = g_lowest_notice;
  *code = g_notice_code;
  return true;
}

bool comm_lower_rank_failed_within(double seconds) {
  const int me = comm_world_rank();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (true) {
    if (drain_notices() && g_lowest_notice < me) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void comm_exit_now(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  // A moment for the notices to leave (a stopped or dead peer never takes its own).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  int done = 0;
  while (!g_notice_sends.empty() && std::chrono::steady_clock::now() < deadline) {
    if (MPI_Testall(int(g_notice_sends.size()), g_notice_sends.data(), &done,
                    MPI_STATUSES_IGNORE) != MPI_SUCCESS || done)
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
