// PyTorch's schedule CSV: reading its compute-only and compute+comms files
// into the IR (with its meaning of RECV kept), and writing the compute-only
// form its _load_csv accepts.
#include "trident/parallel/pp/torch_csv.hpp"

#include <algorithm>
#include <cctype>
#include <optional>
#include <sstream>

#include "trident/core/error.hpp"

namespace trident::pp {

namespace {

// One cell of a PyTorch row.
struct TorchCell {
  enum Kind { idle, fsdp, wait_send, compute, send, recv } kind = idle;
  // compute: "F", "I", "B" or "W" per sub-action (two for an overlapped slot);
  // send/recv: one action.
  std::vector<std::pair<std::string, Action>> parts;
};

constexpr const char* kTorchOps =
    "PyTorch's cells are <stage><F|I|B|W|SEND_F|RECV_F|SEND_B|RECV_B|WAIT_SEND_F|WAIT_SEND_B>"
    "<micro-batch>, <stage><UNSHARD|RESHARD|REDUCE_GRAD|WAIT_REDUCE_GRAD> or "
    "(<F>;<B>)OVERLAP_F_B";

bool is_fsdp(const std::string& op) {
  return op == "UNSHARD" || op == "RESHARD" || op == "REDUCE_GRAD" || op == "WAIT_REDUCE_GRAD";
}

// "<stage><op><micro-batch>" with the op among PyTorch's; nullopt if not.
std::optional<std::pair<std::string, Action>> parse_simple(const std::string& cell) {
  size_t i = 0;
  while (i < cell.size() && std::isdigit(static_cast<unsigned char>(cell[i]))) ++i;
  size_t j = cell.size();
  while (j > i && std::isdigit(static_cast<unsigned char>(cell[j - 1]))) --j;
  if (i == 0 || i > 6 || cell.size() - j > 6) return std::nullopt;
  const std::string op = cell.substr(i, j - i);
  static const std::pair<const char*, Op> kOps[] = {
      {"F", Op::F},
      {"I", Op::B},
      {"B", Op::B},
      {"W", Op::W},
      {"SEND_F", Op::SEND_F},
      {"RECV_F", Op::RECV_F},
      {"SEND_B", Op::SEND_B},
      {"RECV_B", Op::RECV_B},
      {"WAIT_SEND_F", Op::SEND_F},  // kind wait_send: the op only names the send
      {"WAIT_SEND_B", Op::SEND_B},
      {"UNSHARD", Op::F},  // FSDP: ignored
      {"RESHARD", Op::F},
      {"REDUCE_GRAD", Op::F},
      {"WAIT_REDUCE_GRAD", Op::F}};
  for (const auto& [name, code] : kOps) {
    if (op != name) continue;
    const bool fsdp = is_fsdp(op);
    if (fsdp != (j == cell.size())) return std::nullopt;  // FSDP cells carry no micro-batch
    Action a{std::stoi(cell.substr(0, i)), code, fsdp ? 0 : std::stoi(cell.substr(j))};
    return std::pair{op, a};
  }
  return std::nullopt;
}

InputError refuse_cell(const std::string& cell, const std::string& where, const std::string& why) {
  return InputError(where + ": cell '" + cell + "': " + why);
}

// "(<F>;<B>)OVERLAP_F_B": one compute slot of an F and a B (or I).
TorchCell parse_overlap_cell(const std::string& cell, const std::string& where) {
  TorchCell c;
  const auto close = cell.find(')');
  if (close == std::string::npos || cell.substr(close + 1) != "OVERLAP_F_B")
    throw refuse_cell(cell, where, std::string("unknown action (") + kTorchOps + ")");
  std::istringstream subs(cell.substr(1, close - 1));
  std::string sub;
  while (std::getline(subs, sub, ';')) {
    auto p = parse_simple(sub);
    if (!p) throw refuse_cell(cell, where, "sub-action '" + sub + "' is not an action");
    c.parts.push_back(*p);
  }
  if (c.parts.size() != 2 || c.parts[0].first != "F" ||
      (c.parts[1].first != "B" && c.parts[1].first != "I"))
    throw refuse_cell(cell, where, "an overlapped slot here is one F then one B or I");
  c.kind = TorchCell::compute;
  return c;
}

// The kind of a cell holding one of PyTorch's ops.
TorchCell::Kind simple_cell_kind(const std::string& op) {
  if (is_fsdp(op)) return TorchCell::fsdp;
  if (op == "WAIT_SEND_F" || op == "WAIT_SEND_B") return TorchCell::wait_send;
  if (op == "SEND_F" || op == "SEND_B") return TorchCell::send;
  if (op == "RECV_F" || op == "RECV_B") return TorchCell::recv;
  return TorchCell::compute;
}

TorchCell parse_cell(const std::string& cell, const std::string& where) {
  TorchCell c;
  if (cell.empty()) return c;
  if (cell.front() == '(') return parse_overlap_cell(cell, where);
  auto p = parse_simple(cell);
  if (!p) throw refuse_cell(cell, where, std::string("unknown action (") + kTorchOps + ")");
  c.kind = simple_cell_kind(p->first);
  c.parts.push_back(*p);
  return c;
}

// A RECV read from a row, waiting to be put before the compute that uses it.
struct PendingRecv {
  Action recv;
  std::optional<Action> posted_at;  // the first action after the cell
  std::string cell, where;
};

// The compute a receive feeds: F for RECV_F, B for RECV_B; a slot's B is
// waited for before the slot's F. Returns the position to insert the RECV at.
size_t consumer_position(const std::vector<Action>& row, const PendingRecv& p) {
  const Op want = p.recv.op == Op::RECV_F ? Op::F : Op::B;
  const auto it = std::find_if(row.begin(), row.end(), [&](const Action& a) {
    return a.op == want && a.stage == p.recv.stage && a.microbatch == p.recv.microbatch;
  });
  if (it == row.end())
    throw InputError(p.where + ": cell '" + p.cell + "': the row never runs the " +
                     (want == Op::F ? "forward" : "backward") + " that uses this receive");
  size_t pos = size_t(it - row.begin());
  if (want == Op::B) {
    // Before the overlapped F this B shares a slot with (sends may stand between).
    size_t k = pos;
    while (k > 0 && !is_compute(row[k - 1].op)) --k;
    if (k > 0 && row[k - 1].overlapped) pos = k - 1;
  }
  return pos;
}

// Appends the IR actions of one compute cell.
void append_compute(const TorchCell& c, bool split, std::vector<Action>& row) {
  for (size_t i = 0; i < c.parts.size(); ++i) {
    const auto& [op, a] = c.parts[i];
    Action x = a;
    x.overlapped = c.parts.size() == 2 && i == 0;
    row.push_back(x);
    if (op == "B" && split) row.push_back({a.stage, Op::W, a.microbatch});
  }
}

// One PyTorch row in the IR; RECVs go before their compute.
std::vector<Action> build_row(const std::vector<TorchCell>& cells,
                              const std::vector<std::string>& texts, const std::string& where,
                              bool split, std::vector<Schedule::EarlyPost>& early) {
  std::vector<Action> row;
  std::vector<PendingRecv> recvs;
  size_t waiting = 0;  // recvs[waiting..] still need their posting action
  for (size_t i = 0; i < cells.size(); ++i) {
    const TorchCell& c = cells[i];
    if (c.kind == TorchCell::idle || c.kind == TorchCell::fsdp || c.kind == TorchCell::wait_send)
      continue;
    if (c.kind == TorchCell::recv) {
      recvs.push_back({c.parts[0].second, std::nullopt, texts[i], where});
      continue;
    }
    const size_t first = row.size();
    if (c.kind == TorchCell::send)
      row.push_back(c.parts[0].second);
    else
      append_compute(c, split, row);
    for (; waiting < recvs.size(); ++waiting) recvs[waiting].posted_at = row[first];
  }
  for (const PendingRecv& p : recvs) {
    const size_t pos = consumer_position(row, p);
    row.insert(row.begin() + long(pos), p.recv);
    // Posted early when its cell stood before an earlier action than the wait.
    if (p.posted_at) {
      const auto at = std::find(row.begin(), row.end(), *p.posted_at);
      if (at < row.begin() + long(pos)) early.push_back({p.recv, *p.posted_at});
    }
  }
  return row;
}

}  // namespace

TorchImport from_torch_csv(const std::string& text, const std::string& source_name) {
  TorchImport out;
  Schedule& s = out.schedule;
  s.name = source_name;
  std::vector<std::vector<TorchCell>> cells;
  std::vector<CsvRow> rows = read_csv_rows(text);
  bool split = false, comms = false;
  int fsdp = 0, waits = 0;
  for (const CsvRow& r : rows) {
    cells.emplace_back();
    for (const std::string& text_cell : r.cells) {
      cells.back().push_back(parse_cell(text_cell, source_name + ":" + std::to_string(r.line_no)));
      const TorchCell& c = cells.back().back();
      for (const auto& part : c.parts) split |= part.first == "I" || part.first == "W";
      comms |= c.kind == TorchCell::send || c.kind == TorchCell::recv;
      fsdp += c.kind == TorchCell::fsdp;
      waits += c.kind == TorchCell::wait_send;
    }
  }
  s.early_posts.resize(rows.size());
  for (size_t r = 0; r < rows.size(); ++r)
    s.ranks.push_back(build_row(cells[r], rows[r].cells,
                                source_name + ":" + std::to_string(rows[r].line_no), split,
                                s.early_posts[r]));
  infer_shape(s, source_name);
  s.split_backward = split;
  if (!comms) s.early_posts.clear();
  if (fsdp > 0)
    out.notes.push_back(source_name + ": ignored " + std::to_string(fsdp) +
                        " FSDP cells (UNSHARD/RESHARD/REDUCE_GRAD/WAIT_REDUCE_GRAD): trident "
                        "has no FSDP");
  if (waits > 0)
    out.notes.push_back(source_name + ": " + std::to_string(waits) +
                        " WAIT_SEND cells kept by the executor itself: a send's buffer lives "
                        "until the send has completed, and no wait on it blocks compute");
  return out;
}

namespace {

// A backward at position k of row: "B" unsplit; split, "I" (its W goes out
// as its own cell), except in an overlapped slot, whose W follows at once
// and goes out inside a full "B". Returns the text and the last position
// consumed.
std::pair<std::string, size_t> torch_backward(const Schedule& s, const std::vector<Action>& row,
                                              size_t k, bool in_slot) {
  const Action& b = row[k];
  size_t n = k + 1;
  while (n < row.size() && !is_compute(row[n].op)) ++n;
  const bool fused = s.split_backward && in_slot && n < row.size() &&
                     row[n] == Action{b.stage, Op::W, b.microbatch};
  const std::string txt = std::to_string(b.stage) + (!s.split_backward || fused ? "B" : "I") +
                          std::to_string(b.microbatch);
  return std::pair{txt, fused ? n : k};
}

// The compute-only cells of one rank's row.
std::vector<std::string> torch_cells(const Schedule& s, const std::vector<Action>& row) {
  std::vector<std::string> cells;
  for (size_t i = 0; i < row.size(); ++i) {
    const Action& a = row[i];
    if (!is_compute(a.op)) continue;
    const std::string mb = std::to_string(a.microbatch), st = std::to_string(a.stage);
    if (a.op == Op::F && a.overlapped) {
      size_t k = i + 1;
      while (!is_compute(row[k].op)) ++k;  // validate(): a B follows
      const auto [b, end] = torch_backward(s, row, k, true);
      cells.push_back("(" + st + "F" + mb + ";" + b + ")OVERLAP_F_B");
      i = end;  // past the B (and the W inside a full "B")
    } else if (a.op == Op::B) {
      cells.push_back(torch_backward(s, row, i, false).first);
    } else {
      cells.push_back(st + (a.op == Op::F ? "F" : a.op == Op::W ? "W" : "B") + mb);
    }
  }
  return cells;
}

}  // namespace

std::string to_torch_csv(const Schedule& s) {
  std::ostringstream o;
  for (const auto& row : s.ranks) {
    const std::vector<std::string> cells = torch_cells(s, row);
    for (size_t i = 0; i < cells.size(); ++i) o << (i ? "," : "") << cells[i];
    o << "\n";
  }
  return o.str();
}

}  // namespace trident::pp
