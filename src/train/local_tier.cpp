// The node-local checkpoint tier: directories, partners, the restore
// (see train/local_tier.hpp).
#include "trident/train/local_tier.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "trident/core/error.hpp"
#include "trident/io/checkpoint.hpp"
#include "trident/io/sharded_checkpoint.hpp"

namespace trident::train {
namespace fs = std::filesystem;

std::string local_job_dir(const OutputConfig& o) {
  const char* job = std::getenv("SLURM_JOB_ID");
  return (fs::path(o.local_checkpoint_dir) / ("trident-" + std::string(job && *job ? job : "run")))
      .string();
}

std::string local_node_dir(const OutputConfig& o, const std::string& node_label) {
  std::string name = node_label;
  std::replace(name.begin(), name.end(), '/', '_');
  return (fs::path(local_job_dir(o)) / name).string();
}

std::vector<int> partner_ranks(const std::vector<std::string>& hosts) {
  std::vector<std::string> nodes;  // in order of their first rank
  std::map<std::string, std::vector<int>> ranks_of;
  for (size_t r = 0; r < hosts.size(); ++r) {
    if (!ranks_of.count(hosts[r])) nodes.push_back(hosts[r]);
    ranks_of[hosts[r]].push_back(int(r));
  }
  std::vector<int> partner(hosts.size(), -1);
  if (nodes.size() < 2) return partner;
  for (size_t n = 0; n < nodes.size(); ++n) {
    const std::vector<int>& mine = ranks_of[nodes[n]];
    const std::vector<int>& next = ranks_of[nodes[(n + 1) % nodes.size()]];
    for (size_t j = 0; j < mine.size(); ++j) partner[size_t(mine[j])] = next[j % next.size()];
  }
  return partner;
}

std::vector<char> move_bytes(Communicator& world, int from, int to, std::vector<char> bytes,
                             int tag) {
  const int me = world.rank();
  if (from == to || (me != from && me != to)) return bytes;
  int64_t n = int64_t(bytes.size());
  if (me == from) {
    Request s = world.isend(&n, sizeof n, to, tag);
    world.wait(s);
    if (n > 0) {
      Request b = world.isend(bytes.data(), bytes.size(), to, tag + 1);
      world.wait(b);
    }
    return {};
  }
  Request s = world.irecv(&n, sizeof n, from, tag);
  world.wait(s);
  bytes.assign(size_t(n), '\0');
  if (n > 0) {
    Request b = world.irecv(bytes.data(), bytes.size(), from, tag + 1);
    world.wait(b);
  }
  return bytes;
}

std::vector<char> read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw Error("cannot read " + path);
  std::vector<char> bytes(size_t(in.tellg()));
  in.seekg(0);
  if (!in.read(bytes.data(), std::streamsize(bytes.size()))) throw Error("cannot read " + path);
  return bytes;
}

void write_bytes_durably(const std::string& path, const char* data, size_t n) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot create " + tmp + ": " + std::strerror(errno));
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      const int err = errno;
      ::close(fd);
      std::remove(tmp.c_str());
      throw Error("cannot write " + tmp + ": " + std::strerror(err));
    }
    data += w;
    n -= size_t(w);
  }
  const bool ok = ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error("cannot write " + path + ": " + std::strerror(ok ? errno : err));
  }
}

void remove_local_steps_except(const std::string& dir, int64_t step) {
  std::error_code ec;
  std::vector<fs::path> old;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const int64_t s = checkpoint_step(e.path().string());
    if (s >= 0 && s != step) old.push_back(e.path());
  }
  // indexes first: a step stops being complete before its shards go
  std::stable_partition(old.begin(), old.end(), [](const fs::path& p) {
    return p.filename().string().find(".shard") == std::string::npos;
  });
  for (const fs::path& p : old) fs::remove(p, ec);
}

namespace {

// Every rank's text on rank 0 (others get nothing).
std::vector<std::string> gather_texts(Communicator& world, const std::string& mine) {
  const auto parts =
      gather_bytes_to_root(world, std::vector<char>(mine.begin(), mine.end()), 0, 7304);
  std::vector<std::string> all(parts.size());
  for (size_t r = 0; r < parts.size(); ++r) all[r].assign(parts[r].begin(), parts[r].end());
  return all;
}

// What one node directory holds: committed indexes (step -> their files,
// index first) and the files present.
struct DirView {
  std::string dir;
  std::map<int64_t, std::vector<std::string>> steps;
  std::set<std::string> files;
};

std::string describe_dir(const std::string& dir, int64_t newer_than) {
  std::ostringstream s;
  s << "D\t" << dir << '\n';
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.find(".tmp") != std::string::npos || checkpoint_step(name) < 0) continue;
    s << "F\t" << name << '\n';
    const int64_t step = checkpoint_step(name);
    if (step <= newer_than || name != fs::path(checkpoint_path(dir, step)).filename().string())
      continue;
    for (const std::string& f : checkpoint_files(e.path().string()))
      s << "N\t" << step << '\t' << fs::path(f).filename().string() << '\n';
  }
  return s.str();
}

DirView parse_view(const std::string& text) {
  DirView v;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    std::string kind, a, b;
    std::getline(l, kind, '\t');
    std::getline(l, a, '\t');
    std::getline(l, b, '\t');
    if (kind == "D") v.dir = a;
    if (kind == "F") v.files.insert(a);
    if (kind == "N") v.steps[std::stoll(a)].push_back(b);
  }
  return v;
}

// Rank 0: the newest step whose files (index and shards) all lie on some
// rank's node, as "step\tindex name"; "" and why when no step is complete.
std::string newest_complete(const std::vector<DirView>& views, std::string& why) {
  std::map<int64_t, std::vector<std::string>> steps;
  for (const DirView& v : views) steps.insert(v.steps.begin(), v.steps.end());
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    std::string missing;
    for (const std::string& f : it->second) {
      bool held = false;
      for (const DirView& v : views) held = held || v.files.count(f) > 0;
      if (!held && missing.empty()) missing = f;
    }
    if (missing.empty()) return std::to_string(it->first) + '\t' + it->second.front();
    if (why.empty())
      why = "local step " + std::to_string(it->first) + " lacks " + missing +
            " on every node that is left (its node and its partner's copy are both gone)";
  }
  if (why.empty()) why = "no committed local step newer than the shared checkpoint";
  return "";
}

// Rank 0: the copies ("T\tfrom\tto\tname", to: the receiving directory's
// lowest rank) that give rank r's node directory the files wanted[r] it
// lacks, each file once a directory, from a rank whose directory holds it.
std::string plan_copies(const std::vector<DirView>& views,
                        const std::vector<std::vector<std::string>>& wanted) {
  std::map<std::string, int> lead;  // a directory's lowest rank
  for (size_t r = 0; r < views.size(); ++r) lead.emplace(views[r].dir, int(r));
  std::set<std::pair<std::string, std::string>> planned;  // (directory, file)
  std::ostringstream plan;
  for (size_t r = 0; r < views.size(); ++r)
    for (const std::string& f : wanted[r]) {
      if (views[r].files.count(f) || !planned.insert({views[r].dir, f}).second) continue;
      int holder = -1;
      for (size_t h = 0; h < views.size() && holder < 0; ++h)
        if (views[h].files.count(f)) holder = int(h);
      plan << "T\t" << holder << '\t' << lead.at(views[r].dir) << '\t' << f << '\n';
    }
  return plan.str();
}

// One planned copy: the holder sends the file, the receiving node's lead
// writes it under a temporary name and renames it. Returns an error or "".
std::string copy_planned(Communicator& world, const std::string& my_dir, const std::string& line) {
  std::istringstream l(line);
  std::string kind, name;
  int from = -1, to = -1;
  l >> kind >> from >> to >> name;
  std::string error;
  std::vector<char> bytes;
  if (world.rank() == from) try {
      bytes = read_file_bytes((fs::path(my_dir) / name).string());
    } catch (const std::exception& e) {
      error = e.what();
    }
  bytes = move_bytes(world, from, to, std::move(bytes), 7306);
  if (world.rank() != to) return error;
  try {
    const std::string path = (fs::path(my_dir) / name).string(), tmp = path + ".tmp";
    write_file_durably(tmp, bytes);
    fs::rename(tmp, path);
  } catch (const std::exception& e) {
    error = e.what();
  }
  return error;
}

// Collective: rank 0's plan made on every rank; the first error of any rank
// (agreed) or "". Adds the copies made to `copied`.
std::string copy_plan(Communicator& world, const std::string& my_dir, const std::string& plan,
                      size_t& copied) {
  std::istringstream in(broadcast_string(world, plan, 0));
  std::string error;
  for (std::string line; std::getline(in, line);) {
    const std::string e = copy_planned(world, my_dir, line);
    if (error.empty()) error = e;
    ++copied;
  }
  const CheckOutcome ok = agree_on_check(world, error.empty(), error);
  return ok.all_passed ? "" : ok.message;
}

// Collective: every rank's list of the shards it reads from the index
// (shards_read), on rank 0 in `wanted` by rank; the first error (agreed) or "".
std::string list_shards_read(Communicator& world, const std::string& index,
                             const ShardsRead& shards_read,
                             std::vector<std::vector<std::string>>& wanted) {
  std::string mine, error;
  try {
    for (const std::string& f : shards_read(index)) mine += f + '\n';
  } catch (const std::exception& e) {
    error = e.what();
  }
  const CheckOutcome ok = agree_on_check(world, error.empty(), error);
  if (!ok.all_passed) return ok.message;
  for (const std::string& text : gather_texts(world, mine)) {
    std::istringstream in(text);
    wanted.emplace_back();
    for (std::string line; std::getline(in, line);) wanted.back().push_back(line);
  }
  return "";
}

// Rank 0's view of every rank's node directory (others: empty).
std::vector<DirView> gather_views(Communicator& world, const std::string& my_dir,
                                  int64_t newer_than) {
  std::vector<DirView> views;
  for (const std::string& t : gather_texts(world, describe_dir(my_dir, newer_than)))
    views.push_back(parse_view(t));
  return views;
}

}  // namespace

std::string restore_local(Communicator& world, const std::string& my_dir, int64_t newer_than,
                          const ShardsRead& shards_read, std::string& why) {
  std::error_code ec;
  fs::create_directories(my_dir, ec);  // a spare's node has none yet
  const bool root = world.rank() == 0;
  const std::vector<DirView> views = gather_views(world, my_dir, newer_than);
  const std::string chosen = broadcast_string(world, root ? newest_complete(views, why) : "", 0);
  why = broadcast_string(world, why, 0);
  if (chosen.empty()) return "";
  const int64_t step = std::stoll(chosen.substr(0, chosen.find('\t')));
  const std::string at = "local step " + std::to_string(step);
  // the index first, to every node: it says which shards each rank reads
  const std::vector<std::vector<std::string>> index(views.size(),
                                                    {chosen.substr(chosen.find('\t') + 1)});
  size_t copied = 0;
  std::string error = copy_plan(world, my_dir, root ? plan_copies(views, index) : "", copied);
  if (error.empty()) {  // then each node the shards its ranks read that it lacks
    std::vector<std::vector<std::string>> wanted;
    error = list_shards_read(world, checkpoint_path(my_dir, step), shards_read, wanted);
    if (error.empty())
      error = copy_plan(world, my_dir, root ? plan_copies(views, wanted) : "", copied);
  }
  if (!error.empty()) {
    why = "copying the " + at + " between nodes failed: " + error;
    return "";
  }
  why =
      std::to_string(copied) + " file(s) copied between nodes, each node the shards its ranks read";
  return checkpoint_path(my_dir, step);
}

void clean_local_tier(Communicator& world, const OutputConfig& o,
                      const std::vector<std::string>& hosts) {
  if (o.local_checkpoint_dir.empty()) return;
  const int me = world.rank();
  const bool lead = std::find(hosts.begin(), hosts.end(), hosts[size_t(me)]) - hosts.begin() == me;
  std::error_code ec;
  if (lead) fs::remove_all(local_node_dir(o, hosts[size_t(me)]), ec);
  world.barrier();
  if (me == 0) fs::remove(local_job_dir(o), ec);  // only when empty: another node's may remain
}

}  // namespace trident::train
