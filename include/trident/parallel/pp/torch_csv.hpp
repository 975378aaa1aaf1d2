// PyTorch's schedule CSV (torch.distributed.pipelining, _dump_csv/_load_csv):
// one row per rank, one action per cell, no header.
//
// Cells PyTorch writes and what they become here:
//  - "2F0" forward; "2I0" input gradient (B of a split schedule); "2W0"
//    weight gradient; "2B0" full backward (B, and in a split schedule its W
//    right after it); "(0F1;7B0)OVERLAP_F_B" an overlapped F+B slot.
//  - "2SEND_F0", "2SEND_B0": the send, where it stands.
//  - "2RECV_F0", "2RECV_B0": PyTorch posts the receive there and waits for it
//    at the compute that uses the data. The RECV moves to just before that
//    compute (before the slot, for a slot's B), and the receive is posted
//    early (Schedule::early_posts) at the action that followed the cell.
//  - "2WAIT_SEND_F0", "2WAIT_SEND_B0": PyTorch retires the send there (its
//    buffer may then be reused). The executor keeps every send's buffer until
//    the send has completed and never blocks compute on it, so the meaning
//    holds without the cell; dropped, with one note. (Dropping a wait never
//    adds a deadlock.)
//  - "1UNSHARD", "1RESHARD", "1REDUCE_GRAD", "1WAIT_REDUCE_GRAD" (FSDP):
//    ignored, with one note.
//  - "": an idle step; skipped.
// Anything else (an unknown action, a RECV whose compute the row never runs,
// a slot that is not one F and one backward) is refused with an InputError
// naming the file, line, cell and reason.
#pragma once
#include <string>
#include <vector>

#include "trident/parallel/pp/schedule.hpp"

namespace trident::pp {

struct TorchImport {
  Schedule schedule;               // compute-only (no SEND/RECV cells) or lowered
  std::vector<std::string> notes;  // one line each, for the user
};

TorchImport from_torch_csv(const std::string& text, const std::string& source_name);

// The compute-only form PyTorch's _load_csv(format="compute_only") reads: B of
// a split schedule as "I", an overlapped slot as "(F;B)OVERLAP_F_B" (its W,
// which follows at once, inside the full "B"), no SEND/RECV. ZB-V comes out
// cell for cell as PyTorch's ScheduleZBVZeroBubble writes it.
std::string to_torch_csv(const Schedule& s);

}  // namespace trident::pp
