// The flight recorder's ring and its file (comm/flight_recorder.hpp).
#include "trident/comm/flight_recorder.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <mutex>

#include "trident/core/clock.hpp"

namespace trident {

namespace {

struct Group {
  CommKind kind;
  std::string name;
  int rank;
  std::vector<int> members;
};

struct Recorder {
  std::vector<FlightOp> ring;  // allocated once; slot of id: (id - 1) % size
  std::atomic<uint64_t> next_id{1};
  std::mutex mutex;  // groups, output, and one writer at a time
  std::vector<Group> groups;
  std::string dir;
  int rank = 0;
  std::vector<std::string> hosts;
  int job_group = -1;           // the group of blocking calls: every rank
  uint64_t blocking_calls = 0;  // so far: their sequence numbers
};

Recorder& recorder() {
  static Recorder* r = new Recorder;  // never destroyed: an exit path may still write
  return *r;
}

volatile std::sig_atomic_t g_usr2 = 0;
extern "C" void on_usr2(int) { g_usr2 = 1; }

FlightOp* slot_of(uint64_t id) {
  Recorder& r = recorder();
  if (id == 0 || r.ring.empty()) return nullptr;
  FlightOp& op = r.ring[size_t((id - 1) % r.ring.size())];
  return op.id == id ? &op : nullptr;  // overwritten since: nothing to update
}

void append_escaped(std::string& out, const std::string& s) {
  out += '"';
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", unsigned(c));
      out += b;
    } else {
      out += c;
    }
  }
  out += '"';
}

void append_time(std::string& out, const char* key, double t) {
  char b[64];
  if (t < 0)
    std::snprintf(b, sizeof b, ", \"%s\": null", key);
  else
    std::snprintf(b, sizeof b, ", \"%s\": %.6f", key, t);
  out += b;
}

const char* state_name(FlightState s) {
  switch (s) {
    case FlightState::posted:
      return "posted";
    case FlightState::waiting:
      return "waiting";
    case FlightState::completed:
      return "completed";
    case FlightState::timed_out:
      return "timed_out";
  }
  return "?";
}

void append_op(std::string& out, const FlightOp& op) {
  char b[256];
  std::snprintf(b, sizeof b,
                "{\"id\": %llu, \"kind\": \"%s\", \"group\": %d, \"seq\": %llu, \"peer\": %d, "
                "\"tag\": %d, \"bytes\": %llu, \"state\": \"%s\"",
                static_cast<unsigned long long>(op.id),
                op.blocking_call ? "blocking_call" : flight_kind_name(op.kind), op.group,
                static_cast<unsigned long long>(op.seq), op.peer, op.tag,
                static_cast<unsigned long long>(op.bytes), state_name(op.state));
  out += b;
  append_time(out, "posted", op.posted);
  append_time(out, "waiting", op.waiting);
  append_time(out, "completed", op.completed);
  out += '}';
}

void append_groups(std::string& out, const std::vector<Group>& groups) {
  out += "  \"groups\": [";
  for (size_t g = 0; g < groups.size(); ++g) {
    out += g ? ",\n    " : "\n    ";
    out += "{\"kind\": \"" + std::string(comm_kind_name(groups[g].kind)) + "\", \"name\": ";
    append_escaped(out, groups[g].name);
    out += ", \"rank\": " + std::to_string(groups[g].rank) + ", \"members\": [";
    for (size_t i = 0; i < groups[g].members.size(); ++i)
      out += (i ? ", " : "") + std::to_string(groups[g].members[i]);
    out += "]}";
  }
  out += "],\n";
}

// The whole file (caller holds the mutex).
std::string file_text(const Recorder& r, const std::string& reason, double stopped_s) {
  std::string out = "{\"format\": \"trident-flight\", \"version\": 1,\n  \"rank\": ";
  out += std::to_string(r.rank) + ", \"world_size\": " + std::to_string(r.hosts.size());
  out += ", \"host\": ";
  append_escaped(out, size_t(r.rank) < r.hosts.size() ? r.hosts[size_t(r.rank)] : "");
  out += ", \"pid\": " + std::to_string(::getpid()) + ", \"reason\": ";
  append_escaped(out, reason);
  // a second: longer than a loaded machine keeps a thread from its core
  out += stopped_s >= 1.0 ? ", \"was_stopped\": true" : ", \"was_stopped\": false";
  char stopped[48];
  std::snprintf(stopped, sizeof stopped, ", \"stopped_s\": %.3f", stopped_s);
  out += stopped;
  append_time(out, "written_at", now_s());
  out += ", \"capacity\": " + std::to_string(r.ring.size()) +
         ", \"recorded\": " + std::to_string(r.next_id.load() - 1) + ",\n  \"hosts\": [";
  for (size_t i = 0; i < r.hosts.size(); ++i) {
    out += i ? ", " : "";
    append_escaped(out, r.hosts[i]);
  }
  out += "],\n";
  append_groups(out, r.groups);
  out += "  \"ops\": [";
  bool first = true;
  for (const FlightOp& op : flight_snapshot()) {
    out += first ? "\n    " : ",\n    ";
    first = false;
    append_op(out, op);
  }
  out += "]}\n";
  return out;
}

}  // namespace

const char* flight_kind_name(CommOp::Kind k) {
  switch (k) {
    case CommOp::Kind::send:
      return "send";
    case CommOp::Kind::recv:
      return "recv";
    case CommOp::Kind::allreduce:
      return "allreduce";
    case CommOp::Kind::broadcast:
      return "broadcast";
    case CommOp::Kind::allgather:
      return "allgather";
    case CommOp::Kind::alltoallv:
      return "alltoallv";
    case CommOp::Kind::barrier:
      return "barrier";
    case CommOp::Kind::reduce_scatter:
      return "reduce_scatter";
    case CommOp::Kind::reduce:
      return "reduce";
  }
  return "?";
}

void flight_configure(int capacity) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.ring.assign(size_t(capacity > 0 ? capacity : 0), FlightOp{});
  r.next_id = 1;
  // Installed even when off: SIGUSR2 then does nothing, rather than end the
  // process (its default action).
  struct sigaction sa {};
  sa.sa_handler = on_usr2;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR2, &sa, nullptr);
}

void flight_set_output(const std::string& dir, int world_rank, std::vector<std::string> hosts) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.dir = dir;
  r.rank = world_rank;
  r.hosts = std::move(hosts);
  if (r.job_group >= 0 || r.hosts.empty()) return;
  std::vector<int> all(r.hosts.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = int(i);
  r.groups.push_back({CommKind::world, "the job's blocking library calls", world_rank, all});
  r.job_group = int(r.groups.size()) - 1;
}

std::string flight_dir_of(const std::string& run_file) {
  const std::string ext = ".h5";
  const bool h5 = run_file.size() > ext.size() &&
                  run_file.compare(run_file.size() - ext.size(), ext.size(), ext) == 0;
  return (h5 ? run_file.substr(0, run_file.size() - ext.size()) : run_file) + ".flight";
}

int flight_register_group(CommKind kind, const std::string& name, int rank,
                          const std::vector<int>& world_ranks) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.groups.push_back({kind, name, rank, world_ranks});
  return int(r.groups.size()) - 1;
}

uint64_t flight_post(int group, CommOp::Kind kind, int peer, int tag, uint64_t bytes,
                     uint64_t seq) {
  Recorder& r = recorder();
  if (r.ring.empty()) return 0;
  const uint64_t id = r.next_id.fetch_add(1, std::memory_order_relaxed);
  FlightOp& op = r.ring[size_t((id - 1) % r.ring.size())];
  op = FlightOp{};
  op.bytes = bytes;
  op.seq = seq;
  op.posted = now_s();
  op.group = group;
  op.peer = peer;
  op.tag = tag;
  op.kind = kind;
  op.id = id;
  return id;
}

uint64_t flight_blocking_call() {
  Recorder& r = recorder();
  if (r.job_group < 0) return 0;
  const uint64_t id = flight_post(r.job_group, CommOp::Kind::barrier, -1, 0, 0, r.blocking_calls++);
  if (FlightOp* op = slot_of(id)) op->blocking_call = true;
  flight_waiting(id);
  return id;
}

void flight_waiting(uint64_t id) {
  FlightOp* op = slot_of(id);
  if (!op || op->waiting >= 0) return;
  op->waiting = now_s();
  if (op->state == FlightState::posted) op->state = FlightState::waiting;
}

void flight_end(uint64_t id, FlightState state) {
  FlightOp* op = slot_of(id);
  if (!op) return;
  if (state == FlightState::completed) op->completed = now_s();
  op->state = state;
}

std::vector<FlightOp> flight_snapshot() {
  Recorder& r = recorder();
  std::vector<FlightOp> out;
  const uint64_t next = r.next_id.load(std::memory_order_relaxed);
  const uint64_t n = r.ring.size();
  if (n == 0) return out;
  for (uint64_t id = next > n ? next - n : 1; id < next; ++id) {
    const FlightOp& op = r.ring[size_t((id - 1) % n)];
    if (op.id == id) out.push_back(op);
  }
  return out;
}

bool flight_dump(const std::string& reason, double stopped_s) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.dir.empty() || r.ring.empty()) return false;
  if (::mkdir(r.dir.c_str(), 0777) != 0 && errno != EEXIST) return false;
  char name[32];
  std::snprintf(name, sizeof name, "/rank%05d.json", r.rank);
  const std::string path = r.dir + name, tmp = path + ".tmp";
  const std::string text = file_text(r, reason, stopped_s);
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return false;
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !written) return false;
  return std::rename(tmp.c_str(), path.c_str()) == 0;  // a reader never sees half a file
}

void flight_poll() {
  if (!g_usr2) return;
  g_usr2 = 0;
  flight_dump("SIGUSR2");
}

}  // namespace trident
