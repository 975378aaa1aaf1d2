// Schedule IR: text form of actions, the lowering pass that adds
// communication, validation, and CSV export/import.
#include "trident/parallel/pp/schedule.hpp"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include "trident/core/error.hpp"

namespace trident::pp {

namespace {

constexpr Op kAllOps[] = {Op::F, Op::B, Op::W, Op::SEND_F, Op::RECV_F, Op::SEND_B, Op::RECV_B};

std::string where_prefix(const std::string& name) { return name.empty() ? "" : name + ": "; }

// Every early post names a RECV of its rank and an action before it.
void validate_early_posts(const Schedule& s, const std::string& pre) {
  if (s.early_posts.empty()) return;
  if (s.early_posts.size() != size_t(s.pp))
    throw InputError(pre + "early receive posts for " + std::to_string(s.early_posts.size()) +
                     " ranks but pp = " + std::to_string(s.pp));
  for (int r = 0; r < s.pp; ++r) {
    const auto& row = s.ranks[size_t(r)];
    for (const auto& e : s.early_posts[size_t(r)]) {
      const auto recv = std::find(row.begin(), row.end(), e.recv);
      const auto at = std::find(row.begin(), row.end(), e.at);
      if (recv == row.end() || (e.recv.op != Op::RECV_F && e.recv.op != Op::RECV_B) || at >= recv)
        throw InputError(pre + "rank " + std::to_string(r) + ": receive " + e.recv.str() +
                         " posted at " + e.at.str() + ", which is not an earlier action");
    }
  }
}

// The number of digits at the front of text.
size_t leading_digits(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
  return i;
}

// Where the digits at the end of text start, no earlier than from.
size_t start_of_trailing_digits(std::string_view text, size_t from) {
  size_t j = text.size();
  while (j > from && text[j - 1] >= '0' && text[j - 1] <= '9') --j;
  return j;
}

}  // namespace

const char* op_name(Op op) {
  switch (op) {
    case Op::F:
      return "F";
    case Op::B:
      return "B";
    case Op::W:
      return "W";
    case Op::SEND_F:
      return "SEND_F";
    case Op::RECV_F:
      return "RECV_F";
    case Op::SEND_B:
      return "SEND_B";
    case Op::RECV_B:
      return "RECV_B";
  }
  return "?";
}

namespace {

// Sets op to the op spelt op_text; false when none is.
bool op_named(std::string_view op_text, Op& op) {
  bool found = false;
  for (Op o : kAllOps) {
    if (op_text == op_name(o)) {
      op = o;
      found = true;
    }
  }
  return found;
}

}  // namespace

std::string Action::str() const {
  return std::to_string(stage) + op_name(op) + std::to_string(microbatch) + (overlapped ? "+" : "");
}

Action parse_action(std::string_view text, const std::string& where) {
  const std::string original(text);
  auto bad = [&](const char* why) -> InputError {
    return InputError(where + ": action '" + original + "': " + why +
                      " (expected <stage><F|B|W|SEND_F|RECV_F|SEND_B|RECV_B><microbatch>, "
                      "e.g. 1F3)");
  };
  const bool overlapped = !text.empty() && text.back() == '+';
  if (overlapped) text.remove_suffix(1);
  const size_t i = leading_digits(text);
  if (i == 0) throw bad("no stage number");
  const size_t j = start_of_trailing_digits(text, i);
  if (j == text.size()) throw bad("no micro-batch number");
  if (i > 6 || text.size() - j > 6) throw bad("number too large");
  std::string_view op_text = text.substr(i, j - i);
  Action a;
  if (!op_named(op_text, a.op)) throw bad("unknown op");
  if (overlapped && a.op != Op::F) throw bad("only an F shares a slot with the next B ('+')");
  a.overlapped = overlapped;
  a.stage = std::stoi(std::string(text.substr(0, i)));
  a.microbatch = std::stoi(std::string(text.substr(j)));
  return a;
}

Placement Placement::from_ranks(std::vector<int> rank_of_stage, int pp, const std::string& where) {
  Placement p;
  p.rank = std::move(rank_of_stage);
  p.chunk.assign(p.rank.size(), 0);
  p.stages.assign(size_t(std::max(pp, 0)), {});
  for (size_t st = 0; st < p.rank.size(); ++st) {
    const int r = p.rank[st];
    if (r < 0 || r >= pp)
      throw InputError(where + ": stage " + std::to_string(st) + " placed on rank " +
                       std::to_string(r) + ", outside [0, " + std::to_string(pp) + ")");
    p.chunk[st] = static_cast<int>(p.stages[size_t(r)].size());
    p.stages[size_t(r)].push_back(static_cast<int>(st));
  }
  for (int r = 0; r < pp; ++r)
    if (p.stages[size_t(r)].size() != p.stages[0].size())
      throw InputError(where + ": rank " + std::to_string(r) + " holds " +
                       std::to_string(p.stages[size_t(r)].size()) + " stages but rank 0 holds " +
                       std::to_string(p.stages[0].size()) + " (every rank holds the same number)");
  return p;
}

Placement Placement::loop(int pp, int vpp) {
  std::vector<int> rank(size_t(pp) * size_t(vpp));
  for (size_t st = 0; st < rank.size(); ++st) rank[st] = static_cast<int>(st) % pp;
  return from_ranks(std::move(rank), pp, "loop placement");
}

Placement Placement::v_shape(int pp) {
  std::vector<int> rank(2 * size_t(pp));
  for (int r = 0; r < pp; ++r) {
    rank[size_t(r)] = r;
    rank[size_t(2 * pp - 1 - r)] = r;
  }
  return from_ranks(std::move(rank), pp, "V placement");
}

std::string Placement::kind() const {
  const int pp = static_cast<int>(stages.size());
  if (pp > 0 && *this == loop(pp, static_cast<int>(rank.size()) / pp)) return "loop";
  if (pp > 0 && rank.size() == 2 * size_t(pp) && *this == v_shape(pp)) return "v";
  return "custom";
}

bool Schedule::has_comm() const {
  for (const auto& row : ranks)
    for (const auto& a : row)
      if (!is_compute(a.op)) return true;
  return false;
}

size_t Schedule::num_actions() const {
  size_t n = 0;
  for (const auto& row : ranks) n += row.size();
  return n;
}

Schedule forward_only_of(const Schedule& in) {
  TRIDENT_CHECK(!in.has_comm(),
                "forward_only_of(): schedule '" + in.name + "' already has communication");
  Schedule out = in;
  out.split_backward = false;
  out.forward_only = true;
  out.early_posts.clear();
  for (auto& row : out.ranks) {
    std::erase_if(row, [](const Action& a) { return a.op != Op::F; });
    for (Action& a : row) a.overlapped = false;
  }
  return out;
}

namespace {

// lower()'s receive before a compute on rank r, where the peer stage is on
// another rank.
void lowered_recv_for(const Schedule& in, int r, const Action& a, std::vector<Action>& row) {
  const int last = in.num_stages() - 1;
  if (a.op == Op::F && a.stage > 0 && in.rank_of(a.stage - 1) != r)
    row.push_back({a.stage, Op::RECV_F, a.microbatch});
  if (a.op == Op::B && a.stage < last && in.rank_of(a.stage + 1) != r)
    row.push_back({a.stage, Op::RECV_B, a.microbatch});
}

// lower()'s compute on rank r and the send after it, where the peer stage is
// on another rank.
void lowered_compute_and_send(const Schedule& in, int r, const Action& a,
                              std::vector<Action>& row) {
  const int last = in.num_stages() - 1;
  row.push_back(a);
  if (a.op == Op::F && a.stage < last && in.rank_of(a.stage + 1) != r)
    row.push_back({a.stage, Op::SEND_F, a.microbatch});
  if (a.op == Op::B && a.stage > 0 && in.rank_of(a.stage - 1) != r)
    row.push_back({a.stage, Op::SEND_B, a.microbatch});
}

}  // namespace

Schedule lower(const Schedule& in) {
  TRIDENT_CHECK(!in.has_comm(), "lower(): schedule '" + in.name + "' already has communication");
  Schedule out = in;
  for (int r = 0; r < in.pp; ++r) {
    const auto& src = in.ranks[r];
    std::vector<Action> row;
    for (size_t i = 0; i < src.size(); ++i) {
      const Action& a = src[i];
      if (a.overlapped) {
        TRIDENT_CHECK(i + 1 < src.size() && src[i + 1].op == Op::B,
                      "lower(): " + a.str() + " on rank " + std::to_string(r) +
                          " shares a slot but no B follows it");
        // One slot: both inputs in before it starts; the F's output is sent
        // while the B computes.
        lowered_recv_for(in, r, a, row);
        lowered_recv_for(in, r, src[i + 1], row);
        lowered_compute_and_send(in, r, a, row);
        lowered_compute_and_send(in, r, src[++i], row);
        continue;
      }
      lowered_recv_for(in, r, a, row);
      lowered_compute_and_send(in, r, a, row);
    }
    out.ranks[r] = std::move(row);
  }
  return out;
}

namespace {

void validate_shape(const Schedule& s, const std::string& pre) {
  if (s.pp < 1 || s.vpp < 1 || s.microbatches < 1)
    throw InputError(pre + "pp, vpp and micro-batches must be >= 1");
  if (static_cast<int>(s.ranks.size()) != s.pp)
    throw InputError(pre + "schedule has " + std::to_string(s.ranks.size()) +
                     " rank rows but pp = " + std::to_string(s.pp));
  if (s.placement.rank.size() != size_t(s.num_stages()) ||
      s.placement.stages.size() != size_t(s.pp))
    throw InputError(pre + "placement covers " + std::to_string(s.placement.rank.size()) +
                     " stages on " + std::to_string(s.placement.stages.size()) +
                     " ranks, not pp * vpp = " + std::to_string(s.num_stages()) + " on " +
                     std::to_string(s.pp));
}

// The checks of validate() over a schedule of valid shape: each action on
// its own (range, owner, uniqueness), then per stage and micro-batch the
// order of F, B, W, where their inputs come from, and the sends.
class ScheduleCheck {
 public:
  ScheduleCheck(const Schedule& s, std::string pre)
      : s_(s),
        pre_(std::move(pre)),
        S_(s.num_stages()),
        M_(s.microbatches),
        pos_(7 * static_cast<size_t>(S_) * size_t(M_), -1) {}

  void run() {
    for (int r = 0; r < s_.pp; ++r)
      for (size_t i = 0; i < s_.ranks[size_t(r)].size(); ++i) index_action(r, i);
    for (int st = 0; st < S_; ++st)
      for (int mb = 0; mb < M_; ++mb) {
        check_compute(st, mb);
        check_inputs(st, mb);
        if (s_.has_comm()) check_sends(st, mb);
      }
  }

 private:
  // Position of each action on its rank, -1 if absent.
  int& pos(int stage, Op op, int mb) {
    return pos_[(static_cast<size_t>(op) * size_t(S_) + size_t(stage)) * size_t(M_) + size_t(mb)];
  }
  static std::string name(int stage, Op op, int mb) { return Action{stage, op, mb}.str(); }
  // " (rank R)", and where positions on that rank are given, its order
  // around them with those actions bracketed: PyTorch's schedule errors
  // print the whole order with the faulty action marked; this keeps the
  // error one line, kContext actions either side of each, "..." for the rest.
  std::string on(int st, std::initializer_list<int> marked = {}) const {
    const std::string order = order_of(s_.rank_of(st), marked);
    return " (rank " + std::to_string(s_.rank_of(st)) + (order.empty() ? "" : ": " + order) + ")";
  }
  static constexpr int kContext = 3;
  std::string order_of(int r, std::initializer_list<int> marked) const {
    std::vector<int> m;
    for (int p : marked)
      if (p >= 0) m.push_back(p);
    if (m.empty()) return "";
    std::sort(m.begin(), m.end());
    const auto& row = s_.ranks[size_t(r)];
    const int n = int(row.size());
    std::string out;
    int shown = -1;  // the last position printed
    for (size_t k = 0; k < m.size(); ++k) {
      const int lo = std::max({0, m[k] - kContext, shown + 1});
      const int hi = std::min(n - 1, m[k] + kContext);
      if (lo > shown + 1) out += " ...";
      for (int i = lo; i <= hi; ++i) {
        const bool mark = std::binary_search(m.begin(), m.end(), i);
        out += " " + std::string(mark ? "[" : "") + row[size_t(i)].str() + (mark ? "]" : "");
      }
      shown = std::max(shown, hi);
    }
    if (shown + 1 < n) out += " ...";
    return out.substr(1);  // the leading space
  }
  bool prev_remote(int st) const { return st > 0 && s_.rank_of(st - 1) != s_.rank_of(st); }
  bool next_remote(int st) const { return st < S_ - 1 && s_.rank_of(st + 1) != s_.rank_of(st); }
  [[noreturn]] void missing(int st, Op op, int mb) const {
    throw InputError(pre_ + "incomplete schedule: " + name(st, op, mb) + " is missing" + on(st));
  }

  // The action's stage and micro-batch are in range and its stage is on rank r.
  void check_placed(int r, const Action& a, const std::string& here) const {
    if (a.stage < 0 || a.stage >= S_)
      throw InputError(here + ": stage out of range [0, " + std::to_string(S_) + ")");
    if (a.microbatch < 0 || a.microbatch >= M_)
      throw InputError(here + ": micro-batch out of range [0, " + std::to_string(M_) + ")");
    if (s_.rank_of(a.stage) != r)
      throw InputError(here + ": stage " + std::to_string(a.stage) + " belongs to rank " +
                       std::to_string(s_.rank_of(a.stage)) + " (" + s_.placement.kind() +
                       " placement)");
  }

  void index_action(int r, size_t i) {
    const auto& row = s_.ranks[size_t(r)];
    const Action& a = row[i];
    const std::string here = pre_ + "rank " + std::to_string(r) + ": " + a.str();
    check_placed(r, a, here);
    if (a.overlapped) {
      auto next = std::find_if(row.begin() + long(i) + 1, row.end(),
                               [](const Action& x) { return is_compute(x.op); });
      if (a.op != Op::F || next == row.end() || next->op != Op::B)
        throw InputError(here + ": an overlapped slot is an F followed by a B on the same rank");
    }
    if (a.op == Op::W && !s_.split_backward)
      throw InputError(pre_ + a.str() + ": W in a schedule without a B/W split");
    if (s_.forward_only && a.op != Op::F && a.op != Op::SEND_F && a.op != Op::RECV_F)
      throw InputError(here + ": a forward-only schedule holds only F, SEND_F and RECV_F");
    int& p = pos(a.stage, a.op, a.microbatch);
    if (p >= 0)
      throw InputError(here + " appears twice (" + order_of(r, {p, static_cast<int>(i)}) + ")");
    p = static_cast<int>(i);
  }

  // F, B (and W) are all there, in that order.
  void check_compute(int st, int mb) {
    const int f = pos(st, Op::F, mb), b = pos(st, Op::B, mb), w = pos(st, Op::W, mb);
    if (f < 0) missing(st, Op::F, mb);
    if (s_.forward_only) return;
    if (b < 0) missing(st, Op::B, mb);
    if (s_.split_backward && w < 0) missing(st, Op::W, mb);
    if (b < f)
      throw InputError(pre_ + name(st, Op::B, mb) + " runs before " + name(st, Op::F, mb) +
                       on(st, {b, f}));
    if (s_.split_backward && w < b)
      throw InputError(pre_ + name(st, Op::W, mb) + " runs before " + name(st, Op::B, mb) +
                       on(st, {w, b}));
  }

  // Where F's input and B's output gradient come from.
  void check_inputs(int st, int mb) {
    check_forward_input(st, mb);
    check_backward_input(st, mb);
  }

  // F's input: received before it, or the previous stage's F ran before it.
  void check_forward_input(int st, int mb) {
    const bool lowered = s_.has_comm();
    const int f = pos(st, Op::F, mb);
    if (st > 0) {
      if (prev_remote(st)) {
        const int rf = pos(st, Op::RECV_F, mb);
        if (lowered && rf < 0) missing(st, Op::RECV_F, mb);
        if (lowered && rf > f)
          throw InputError(pre_ + name(st, Op::F, mb) + " runs before its input arrives (" +
                           name(st, Op::RECV_F, mb) + ")" + on(st, {f, rf}));
      } else if (pos(st - 1, Op::F, mb) > f) {
        throw InputError(pre_ + name(st, Op::F, mb) + " runs before " + name(st - 1, Op::F, mb) +
                         on(st, {f, pos(st - 1, Op::F, mb)}));
      }
    }
  }

  // B's output gradient: received before it, or the next stage's B ran
  // before it.
  void check_backward_input(int st, int mb) {
    const bool lowered = s_.has_comm();
    const int b = pos(st, Op::B, mb);
    if (st < S_ - 1 && !s_.forward_only) {
      if (next_remote(st)) {
        const int rb = pos(st, Op::RECV_B, mb);
        if (lowered && rb < 0) missing(st, Op::RECV_B, mb);
        if (lowered && rb > b)
          throw InputError(pre_ + name(st, Op::B, mb) +
                           " runs before its output gradient arrives (" + name(st, Op::RECV_B, mb) +
                           ")" + on(st, {b, rb}));
      } else if (pos(st + 1, Op::B, mb) > b) {
        throw InputError(pre_ + name(st, Op::B, mb) + " runs before " + name(st + 1, Op::B, mb) +
                         on(st, {b, pos(st + 1, Op::B, mb)}));
      }
    }
  }

  // Sends after the compute that produced the data, each matched by the peer.
  void check_sends(int st, int mb) {
    check_send(st, mb, next_remote(st), {Op::SEND_F, Op::F, Op::RECV_B}, "next");
    if (!s_.forward_only)
      check_send(st, mb, prev_remote(st), {Op::SEND_B, Op::B, Op::RECV_F}, "previous");
  }

  // One direction: the send, the compute that produces what it sends, and
  // the receive that comes back from the same neighbour.
  struct SendSide {
    Op send, compute, recv_back;
  };
  void check_send(int st, int mb, bool remote, SendSide op, const char* neighbour) {
    const int sent = pos(st, op.send, mb);
    if (remote) {
      if (sent < 0) missing(st, op.send, mb);
      if (sent < pos(st, op.compute, mb))
        throw InputError(pre_ + name(st, op.send, mb) + " before " + name(st, op.compute, mb) +
                         on(st, {sent, pos(st, op.compute, mb)}));
    } else if (sent >= 0 || pos(st, op.recv_back, mb) >= 0) {
      throw InputError(pre_ + name(st, sent >= 0 ? op.send : op.recv_back, mb) +
                       ": no peer rank (" + neighbour +
                       " stage is on the same rank or does not exist)" + on(st));
    }
  }

  const Schedule& s_;
  const std::string pre_;
  const int S_, M_;
  std::vector<int> pos_;
};

}  // namespace

void validate(const Schedule& s) {
  const std::string pre = where_prefix(s.name);
  validate_shape(s, pre);
  ScheduleCheck(s, pre).run();
  validate_early_posts(s, pre);
}

std::string to_csv(const Schedule& s) {
  std::ostringstream o;
  o << "# trident schedule " << s.name << " pp=" << s.pp << " vpp=" << s.vpp
    << " microbatches=" << s.microbatches << " placement=" << s.placement.kind() << "\n";
  for (const auto& row : s.ranks) {
    for (size_t i = 0; i < row.size(); ++i) o << (i ? "," : "") << row[i].str();
    o << "\n";
  }
  return o.str();
}

std::vector<CsvRow> read_csv_rows(const std::string& text) {
  std::vector<CsvRow> rows;
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const auto first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    CsvRow row{line_no, {}};
    std::istringstream cells(line);
    std::string cell;
    while (std::getline(cells, cell, ',')) {
      const auto b = cell.find_first_not_of(" \t"), e = cell.find_last_not_of(" \t");
      row.cells.push_back(b == std::string::npos ? "" : cell.substr(b, e - b + 1));
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

void infer_shape(Schedule& s, const std::string& source) {
  if (s.ranks.empty()) throw InputError(source + ": no schedule rows (one line per rank)");
  s.pp = static_cast<int>(s.ranks.size());
  int max_stage = -1, max_mb = -1;
  std::map<int, int> stage_row;  // stage -> the row (rank) that first names it
  for (int r = 0; r < s.pp; ++r) {
    for (const Action& a : s.ranks[size_t(r)]) {
      const auto [it, fresh] = stage_row.emplace(a.stage, r);
      if (!fresh && it->second != r)
        throw InputError(source + ": rank " + std::to_string(r) + ": " + a.str() + ": stage " +
                         std::to_string(a.stage) + " belongs to rank " +
                         std::to_string(it->second) + " (a stage runs on one rank)");
      max_stage = std::max(max_stage, a.stage);
      max_mb = std::max(max_mb, a.microbatch);
      if (a.op == Op::W) s.split_backward = true;
    }
  }
  s.vpp = std::max(1, (max_stage + s.pp) / s.pp);
  s.microbatches = std::max(1, max_mb + 1);
  std::vector<int> rank_of_stage(size_t(s.num_stages()));
  for (int st = 0; st < s.num_stages(); ++st) {
    const auto it = stage_row.find(st);
    rank_of_stage[size_t(st)] = it != stage_row.end() ? it->second : st % s.pp;
  }
  s.placement = Placement::from_ranks(std::move(rank_of_stage), s.pp, source);
}

Schedule from_csv(const std::string& text, const std::string& source_name) {
  Schedule s;
  s.name = source_name;
  for (const CsvRow& line : read_csv_rows(text)) {
    std::vector<Action> row;
    for (const std::string& cell : line.cells)
      if (!cell.empty())  // empty cell: padding
        row.push_back(parse_action(cell, source_name + ":" + std::to_string(line.line_no)));
    s.ranks.push_back(std::move(row));
  }
  infer_shape(s, source_name);
  return s;
}

void write_schedule_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  if (!f) throw InputError("--export " + path + ": cannot open for writing");
  f << text;
  if (!f) throw InputError("--export " + path + ": write failed");
}

std::string read_schedule_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw InputError("--import " + path + ": cannot open for reading");
  std::stringstream buf;
  buf << f.rdbuf();
  return buf.str();
}

void write_csv_file(const Schedule& s, const std::string& path) {
  write_schedule_file(path, to_csv(s));
}

Schedule read_csv_file(const std::string& path) { return from_csv(read_schedule_file(path), path); }

std::string format_actions(const Schedule& s) {
  std::ostringstream o;
  for (int r = 0; r < s.pp; ++r) {
    o << "rank " << r << ":";
    for (const Action& a : s.ranks[r]) o << " " << a.str();
    o << "\n";
  }
  return o.str();
}

}  // namespace trident::pp
