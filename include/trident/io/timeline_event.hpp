// One timed action of a rank (a pipeline action, a send or receive, an
// attention ring step): a row of the run file's /timeline/events
// (share/trident/hdf5-layout.md). Its own header, without HDF5, so that the
// code that records events (the pipeline executor) does not include the
// run file.
#pragma once
#include <cstdint>
#include <string>

namespace trident {

struct TimelineEvent {
  int32_t rank = 0;
  int64_t step = 0;
  std::string kind;  // "F","B","W","SEND_F","RECV_F","SEND_B","RECV_B", "ATTN", ...
  int32_t stage = 0, chunk = 0, microbatch = 0;
  double t_begin_s = 0, t_end_s = 0;  // one clock for all ranks (now_s())
};

}  // namespace trident
