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
  std::vector<int64_t> sizes(size_t(world.size()));
  const int64_t my = int64_t(mine.size());
  world.allgather(&my, sizes.data(), sizeof my);
  std::vector<std::string> all(size_t(world.size()));
  if (world.rank() != 0) {
    if (my > 0) {
      Request r = world.isend(mine.data(), mine.size(), 0, 7304);
      world.wait(r);
    }
    return all;
  }
  std::vector<Request> reqs;
  for (int r = 1; r < world.size(); ++r) {
    all[size_t(r)].resize(size_t(sizes[size_t(r)]));
    if (sizes[size_t(r)] > 0)
      reqs.push_back(world.irecv(all[size_t(r)].data(), all[size_t(r)].size(), r, 7304));
  }
  if (!reqs.empty()) world.wait_all(reqs);
  all[0] = mine;
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

// Rank 0: the newest step whose files all lie on some rank's node, and the
// copies ("T\tfrom\tto\tname") that give every node all of them, the index
// last; "" and why when no step is complete.
std::string plan_restore(const std::vector<DirView>& views, std::string& why) {
  std::map<int64_t, std::vector<std::string>> steps;
  for (const DirView& v : views) steps.insert(v.steps.begin(), v.steps.end());
  std::map<std::string, int> lead;  // a directory's lowest rank
  for (size_t r = 0; r < views.size(); ++r) lead.emplace(views[r].dir, int(r));
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    std::ostringstream plan;
    plan << "S\t" << it->first << '\n';
    std::string missing;
    std::vector<std::string> files(it->second.begin() + 1, it->second.end());
    files.push_back(it->second.front());  // the index last
    for (const std::string& f : files) {
      int holder = -1;
      for (size_t r = 0; r < views.size() && holder < 0; ++r)
        if (views[r].files.count(f)) holder = int(r);
      if (holder < 0) {
        missing = f;
        break;
      }
      for (const auto& [dir, to] : lead)
        if (!views[size_t(to)].files.count(f))
          plan << "T\t" << holder << '\t' << to << '\t' << f << '\n';
    }
    if (missing.empty()) return plan.str();
    if (why.empty())
      why = "local step " + std::to_string(it->first) + " lacks " + missing +
            " on every node that is left (its node and its partner's copy are both gone)";
  }
  if (why.empty()) why = "no committed local step newer than the shared checkpoint";
  return "";
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

}  // namespace

std::string restore_local(Communicator& world, const std::string& my_dir, int64_t newer_than,
                          std::string& why) {
  std::error_code ec;
  fs::create_directories(my_dir, ec);  // a spare's node has none yet
  const std::vector<std::string> texts = gather_texts(world, describe_dir(my_dir, newer_than));
  std::string plan;
  if (world.rank() == 0) {
    std::vector<DirView> views;
    for (const std::string& t : texts) views.push_back(parse_view(t));
    plan = plan_restore(views, why);
  }
  plan = broadcast_string(world, plan, 0);
  why = broadcast_string(world, why, 0);
  if (plan.rfind("S\t", 0) != 0) return "";
  std::vector<std::string> copies;
  int64_t step = -1;
  std::istringstream in(plan);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("S\t", 0) == 0) step = std::stoll(line.substr(2));
    if (line.rfind("T\t", 0) == 0) copies.push_back(line);
  }
  std::string error;
  for (const std::string& c : copies) {
    const std::string e = copy_planned(world, my_dir, c);
    if (error.empty()) error = e;
  }
  const CheckOutcome ok = agree_on_check(world, error.empty(), error);
  if (!ok.all_passed) {
    why = "copying the local step " + std::to_string(step) + " between nodes failed: " + ok.message;
    return "";
  }
  why = std::to_string(copies.size()) + " file(s) copied between nodes";
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
