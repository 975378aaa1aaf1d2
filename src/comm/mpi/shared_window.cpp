// SharedWindow: MPI_Win_allocate_shared with a passive-target epoch open for
// the window's lifetime, and the fence that orders stores and loads.
#include "trident/comm/shared_window.hpp"

#include <sys/statvfs.h>
#include <unistd.h>

#include <cstring>
#include <exception>

#include "mpi_check.hpp"
#include "trident/comm/mpi/mpi_communicator.hpp"
#include "trident/core/error.hpp"

namespace trident {

struct SharedWindow::Window {
  MPI_Win win = MPI_WIN_NULL;
};

SharedWindow::SharedWindow(Communicator& comm, size_t bytes)
    : comm_(comm), win_(std::make_unique<Window>()) {
  const int P = comm.size();
  void* mine = nullptr;
  MPI_CHECK(MPI_Win_allocate_shared(MPI_Aint(bytes), 1, MPI_INFO_NULL, mpi_handles(comm).comm,
                                    &mine, &win_->win));
  base_.resize(size_t(P));
  bytes_.resize(size_t(P));
  for (int r = 0; r < P; ++r) {
    MPI_Aint size = 0;
    int unit = 0;
    void* p = nullptr;
    MPI_CHECK(MPI_Win_shared_query(win_->win, r, &size, &unit, &p));
    base_[size_t(r)] = static_cast<char*>(p);
    bytes_[size_t(r)] = size_t(size);
  }
  // One passive-target epoch for the whole life of the window: loads and
  // stores need no further MPI calls, fence() orders them.
  MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_->win));
}

SharedWindow::~SharedWindow() {
  if (win_->win == MPI_WIN_NULL || std::uncaught_exceptions() > 0) return;
  MPI_Win_unlock_all(win_->win);
  MPI_Win_free(&win_->win);
}

void SharedWindow::fence() {
  MPI_Win_sync(win_->win);
  comm_.barrier();
  MPI_Win_sync(win_->win);
}

bool SharedWindow::node_local(Communicator& comm, std::string* why_not) {
  char host[64] = {};
  gethostname(host, sizeof(host) - 1);
  std::vector<char> all(sizeof(host) * size_t(comm.size()));
  comm.allgather(host, all.data(), sizeof(host));
  for (int r = 0; r < comm.size(); ++r) {
    const char* h = all.data() + sizeof(host) * size_t(r);
    if (std::strncmp(h, host, sizeof(host)) != 0) {
      if (why_not)
        *why_not = "rank " + std::to_string(r) + " of " + comm.name() + " is on host " + h +
                   ", not on " + host;
      return false;
    }
  }
  return true;
}

double SharedWindow::free_bytes() {
  struct statvfs s {};
  if (statvfs("/dev/shm", &s) != 0) return 0.0;
  return double(s.f_bavail) * double(s.f_frsize);
}

}  // namespace trident
