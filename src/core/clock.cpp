// The job's clock: CLOCK_MONOTONIC (one clock for every process of a host,
// unlike the MPI wall-clock timer, whose origin Open MPI takes per process) plus the
// host's offset measured by comm's clock synchronisation.
#include "trident/core/clock.hpp"

#include <ctime>

namespace trident {

namespace {
double g_host_offset = 0.0;  // process-wide, written once at start-up
}  // namespace

double monotonic_s() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

double now_s() { return monotonic_s() + g_host_offset; }

double host_clock_offset() { return g_host_offset; }

void set_host_clock_offset(double seconds) { g_host_offset = seconds; }

}  // namespace trident
