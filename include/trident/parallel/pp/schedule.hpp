// Pipeline schedules as data: per-rank lists of small actions.
//
// A compute-only schedule holds F (forward), B (backward; the input gradient
// only when the schedule splits backward) and W (weight gradient) actions.
// lower() adds the communication: SEND_F/RECV_F carry a stage's output to the
// next virtual stage, SEND_B/RECV_B carry the input gradient back. The same
// lists are validated, simulated, executed, exported to CSV and imported from
// hand-written CSV.
//
// Virtual stages 0 .. pp * vpp - 1 run in order: stage 0 reads the data, the
// last computes the loss. Which rank runs a stage is the schedule's Placement
// (data, not a formula): the loop placement of Megatron's interleaving puts
// stage s on rank s % pp, the V placement of ZB-V and DualPipeV puts stages r
// and 2 pp - 1 - r on rank r. A stage's chunk is its index among its rank's
// stages in ascending order. An action names the stage it runs on:
// "1F3" is stage 1's forward of micro-batch 3, "0SEND_B2" is stage 0 sending
// the input gradient of micro-batch 2 to stage -1 (never happens: stage 0 has
// no predecessor), "2RECV_F5" is stage 2 receiving its input for micro-batch 5
// from stage 1. Sends are non-blocking; a receive blocks until its data is in.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace trident::pp {

enum class Op : uint8_t { F, B, W, SEND_F, RECV_F, SEND_B, RECV_B };

const char* op_name(Op op);  // "F", ..., "RECV_B": the text form and the timeline kind
inline bool is_compute(Op op) { return op == Op::F || op == Op::B || op == Op::W; }

struct Action {
  int stage = 0;  // virtual stage the action runs on (its rank: Schedule::rank_of)
  Op op = Op::F;
  int microbatch = 0;
  // On an F: it shares one slot with the next B on its rank (DualPipeV's
  // overlapped F+B). lower() puts both receives before the slot and the F's
  // send between the two computes, so the F's output travels while the B
  // computes; the executor runs that order as it stands.
  bool overlapped = false;

  // Compact text form: "<stage><OP><microbatch>", with a trailing "+" on an
  // overlapped F ("0F3+").
  std::string str() const;
  bool operator==(const Action&) const = default;
};

// Parses the compact text form; throws InputError naming `where` on bad text.
Action parse_action(std::string_view text, const std::string& where);

// Stage -> rank map. Every rank holds the same number of stages (vpp).
struct Placement {
  std::vector<int> rank;                 // rank[stage]
  std::vector<int> chunk;                // chunk[stage]: index among its rank's stages
  std::vector<std::vector<int>> stages;  // stages[rank][chunk], ascending

  static Placement loop(int pp, int vpp);  // stage s on rank s % pp
  static Placement v_shape(int pp);        // rank r: stages r and 2 pp - 1 - r
  // From rank[stage]; InputError naming `where` unless every rank in [0, pp)
  // holds the same number of stages.
  static Placement from_ranks(std::vector<int> rank_of_stage, int pp, const std::string& where);
  // "loop", "v" or "custom": how the CSV header and the reports name it.
  std::string kind() const;
  bool operator==(const Placement&) const = default;
};

struct Schedule {
  std::string name;  // "afab", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipev", or a file name
  int pp = 1;
  int vpp = 1;
  int microbatches = 1;
  bool split_backward = false;  // true: B is the input gradient and W actions exist
  bool forward_only = false;    // true: F actions only (evaluation), no B or W
  Placement placement = Placement::loop(1, 1);
  std::vector<std::vector<Action>> ranks;  // ranks[r]: rank r's actions in execution order
  // Receives posted before their RECV action, as PyTorch's RECV means it
  // (post here, wait at the compute): on rank r, each `recv` is posted when
  // the action `at` (earlier in ranks[r]) starts. The RECV itself stays the
  // wait. Empty, or one list per rank.
  struct EarlyPost {
    Action recv, at;
    bool operator==(const EarlyPost&) const = default;
  };
  std::vector<std::vector<EarlyPost>> early_posts;

  int num_stages() const { return pp * vpp; }
  int rank_of(int stage) const { return placement.rank.at(size_t(stage)); }
  int chunk_of(int stage) const { return placement.chunk.at(size_t(stage)); }
  int stage_of(int rank, int chunk) const {
    return placement.stages.at(size_t(rank)).at(size_t(chunk));
  }
  bool has_comm() const;  // lowered (any SEND/RECV present)
  size_t num_actions() const;
};

// The forwards of a compute-only schedule, in its order on every rank, as a
// forward-only schedule (evaluation: no backward, nothing kept for one).
// Dropping B and W removes only waits, so a feasible schedule stays feasible.
Schedule forward_only_of(const Schedule& compute_only);

// Adds SEND/RECV actions to a compute-only schedule. For every F (and B) whose
// consumer stage lives on another rank the producer gets a SEND right after
// the compute, and the consumer gets the matching RECV immediately before the
// compute that needs it. Sends never block, so the lowered schedule waits only
// where the compute order itself must wait: it deadlocks exactly when the
// compute order is infeasible, which simulate() reports. Neighbouring stages
// on the same rank (pp = 1) hand over in memory and get no actions.
Schedule lower(const Schedule& compute_only);

// Checks that the schedule is complete and locally consistent; throws
// InputError with one line naming the first problem:
//  - every action on the rank that owns its stage, stage and micro-batch in range;
//  - each (stage, micro-batch) has exactly one F and one B, and one W iff
//    split_backward (none otherwise); forward_only: one F, no B, W, SEND_B
//    or RECV_B;
//  - on its rank, F comes after its input is there (RECV_F, or the previous
//    stage's F on the same rank), B after F and after its output gradient is
//    there, W after B, a SEND after the compute that produced its data;
//  - (lowered schedules) every SEND has exactly one matching RECV on the peer
//    and vice versa.
// Deadlocks between ranks are found by simulate(), not here.
void validate(const Schedule& s);

// CSV: one line per rank, one action per cell ("0F0,0F1,0SEND_F0,..."), after
// a comment line "# trident schedule NAME pp=P vpp=V microbatches=M
// placement=K". Import reads lines that do not start with '#'; pp is the
// number of rows, vpp and the micro-batch count come from the largest stage
// and micro-batch named, split_backward from the presence of W, and the
// placement from the row each stage's actions are on (loop for a stage that
// no row names). A stage named on two rows is an InputError. Import does not
// validate.
std::string to_csv(const Schedule& s);
Schedule from_csv(const std::string& text, const std::string& source_name);

// The rows of a schedule CSV: lines that are neither empty nor '#' comments,
// split at commas, cells trimmed (an empty cell stays, as "").
struct CsvRow {
  int line_no = 0;
  std::vector<std::string> cells;
};
std::vector<CsvRow> read_csv_rows(const std::string& text);

// Fills pp (the rows), vpp and micro-batches (the largest stage and
// micro-batch named), split_backward (any W) and the placement (the row
// each stage's actions are on; loop for a stage no row names) of a schedule
// read from rows. InputError naming `source` for a stage on two rows.
void infer_shape(Schedule& s, const std::string& source);
void write_csv_file(const Schedule& s, const std::string& path);  // InputError if unwritable
Schedule read_csv_file(const std::string& path);                  // InputError if unreadable
// The file's text, and writing one (InputErrors naming --import / --export).
std::string read_schedule_file(const std::string& path);
void write_schedule_file(const std::string& path, const std::string& text);

// Per-rank action lists as text, one line per rank ("rank 0: 0F0 0F1 ...").
std::string format_actions(const Schedule& s);

}  // namespace trident::pp
