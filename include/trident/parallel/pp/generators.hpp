// Schedule generators: AFAB (GPipe), 1F1B, interleaved 1F1B, ZB-H1, ZB-V and
// DualPipeV, each a compute-only Schedule (lower() adds the communication).
//
// Names accepted: "afab" (alias "gpipe"), "1f1b", "interleaved", "zb-h1",
// "zb-v", "dualpipev". Rules (checked by make_schedule; the config applies
// the same ones, so the CLI and training accept the same schedules):
//  - pp >= 1, vpp >= 1, microbatches >= 1;
//  - vpp > 1 only for "interleaved", "zb-v" and "dualpipev";
//  - "zb-v" and "dualpipev": vpp = 2 (the V placement: rank r holds stages r
//    and 2 pp - 1 - r);
//  - "dualpipev": microbatches >= 2 pp (its steady phase, one overlapped F+B
//    pair per chunk, needs every stage busy), as in DeepSeek's DualPipeV.
// Interleaved takes any micro-batch count: micro-batches go through the
// chunks in rounds (Megatron's order), m / pp rounds (at least one) of
// ceil or floor m / rounds micro-batches, the larger ones FIRST (PyTorch's
// Interleaved1F1B sizes its rounds alike); the first round's size g sets the
// warm-up ((vpp-1) g + 2 (pp-1-rank) forwards), so at p=4 m=10 rank 0 holds
// 12 activations at its peak, not the 13 of one round of 6 followed by one of
// 4. The alternatives fail: a short group at the end
// deadlocks (pp=4 vpp=3 m=5: rank 0 waits for rank 3's forward while rank 3
// waits for rank 0's backward), and a long group at the end makes a backward
// come due before its forward.
// ZB-V takes any micro-batch count: it is generated for max(m, 2 pp - 1)
// micro-batches (what fills the V) and the actions of the extra ones are
// dropped, which keeps the order of the rest (the sweep tests simulate them).
#pragma once
#include <string>
#include <vector>

#include "trident/core/config.hpp"
#include "trident/parallel/pp/schedule.hpp"

namespace trident::pp {

// Canonical schedule names, in the order the CLI lists them (the order of
// PipelineSchedule, whose config spelling they are).
const std::vector<std::string>& schedule_names();

// The schedule a name says ("gpipe" for afab too), parsed once where a name
// comes in (the CLI's flags; the config parses its own key). InputError
// "schedule 'NAME': unknown (expected ...)" otherwise. The library passes
// the enum; each call below that takes a name parses it and forwards.
PipelineSchedule parse_schedule(const std::string& name);

// The smallest micro-batch count the schedule accepts for pp (and vpp):
// 2 pp for "dualpipev", 1 for the others (see the rules above).
int min_microbatches(PipelineSchedule schedule, int pp, int vpp);
int min_microbatches(const std::string& name, int pp, int vpp);

// The first of the rules above on chunks and micro-batches that a schedule
// with pp ranks, vpp chunks per rank and m micro-batches breaks (pp, vpp
// and m >= 1 are the caller's to check): the one check that make_schedule
// (the CLI's flags) and the config's rules (its keys) each word in their
// own names.
enum class ScheduleRule {
  none,
  vpp_needs_chunked_schedule,  // vpp > 1 with one chunk per rank
  v_needs_two_chunks,          // zb-v / dualpipev with vpp != 2
  too_few_microbatches,        // m < min_microbatches
};
ScheduleRule broken_schedule_rule(PipelineSchedule schedule, int pp, int vpp, int microbatches);

// The compute-only schedule. Throws InputError naming the flag that breaks
// a rule above ("--vpp" / "--microbatches" / "--pp").
Schedule make_schedule(PipelineSchedule schedule, int pp, int microbatches, int vpp = 1);
Schedule make_schedule(const std::string& name, int pp, int microbatches, int vpp = 1);

Schedule afab(int pp, int microbatches);
Schedule one_f_one_b(int pp, int microbatches);
Schedule interleaved_one_f_one_b(int pp, int microbatches, int vpp);
Schedule zero_bubble_h1(int pp, int microbatches);
Schedule zero_bubble_v(int pp, int microbatches);
Schedule dual_pipe_v(int pp, int microbatches);

// Chunks per rank when none is asked for: 2 for the V schedules, else 1.
int default_vpp(PipelineSchedule schedule);
int default_vpp(const std::string& name);

// Where the schedule runs each virtual stage: the V placement for "zb-v"
// and "dualpipev", the loop placement otherwise. The model's layer
// partition and the executor both follow it.
Placement schedule_placement(PipelineSchedule schedule, int pp, int vpp);

// Closed-form bubble of the schedule, where one exists (else a negative value):
// the classic ratio bubble time / ideal time ((p-1)/m for AFAB and 1F1B,
// (p-1)/(v m) interleaved, (p-1)(tF+tB-tW)/(m(tF+tB+tW)) for ZB-H1), and the
// same as a fraction of the makespan (ratio / (1 + ratio)), which is what the
// simulator and the executor measure. Costs as in SimCosts (t_b is the input
// gradient, t_w the weight gradient; non-split schedules run B = t_b + t_w).
// Interleaved has its closed form when microbatches >= pp (the remainder in
// the first group keeps it: the sweep test checks it); ZB-H1 only
// when the pipeline fills (microbatches >= pp) and t_w <= t_f + t_b. ZB-V and
// DualPipeV: (p-1)/(6m) when t_f = t_b = t_w and microbatches >= 2 pp (costs
// of one chunk; other costs: the simulator).
struct ClosedForm {
  double ratio = -1;     // bubble time / ideal time
  double fraction = -1;  // 1 - busy / makespan
  std::string formula;   // "(p-1)/m", ...
  bool exists() const { return ratio >= 0; }
};
ClosedForm closed_form_bubble(const std::string& name, int pp, int microbatches, int vpp,
                              double t_f, double t_b, double t_w);

}  // namespace trident::pp
