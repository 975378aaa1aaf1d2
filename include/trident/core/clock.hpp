// One clock for every rank of a job, in seconds.
//
// now_s() = CLOCK_MONOTONIC + this host's offset. The processes of one host
// share CLOCK_MONOTONIC exactly; the offset between hosts (to world rank 0's
// host) is measured once by comm's sync_clock(), which sets it here. Before
// that, and on rank 0's host, the offset is 0. Timelines, benchmarks and the
// profiler read this clock, so readings of different ranks are comparable.
#pragma once

namespace trident {

// This host's CLOCK_MONOTONIC, seconds (no offset).
double monotonic_s();
// The job's clock: monotonic_s() + host_clock_offset().
double now_s();
double host_clock_offset();
// Set once per process by the clock synchronisation (comm's sync_clock).
void set_host_clock_offset(double seconds);

}  // namespace trident
