// A Trainer's saves: the owner of each slice, the shard write (at once or on
// a writer thread), the agreement and the commit (see train/checkpoint_saver.hpp).
#include "trident/train/checkpoint_saver.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>

#include "trident/core/clock.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/tensor_ops.hpp"
#include "trident/train/checkpointing.hpp"
#include "trident/train/local_tier.hpp"

namespace trident::train {

struct CheckpointSaver::Owned {
  ShardPiece piece;
  Tensor source;       // the piece's floats: a flat view [piece.numel()]
  std::string buffer;  // a router buffer's name: its source is looked up at each save
};

namespace {

// Test hook: SIGKILL on TRIDENT_TEST_RANK (-1: every rank) in one phase of
// the save of step TRIDENT_TEST_KILL_IN_SAVE_STEP: "staged" (shard files
// created, nothing written), "shards" (every shard durable, the ranks not yet
// agreed) or "index" (agreed, rank 0 about to rename the index).
void kill_hook(const char* phase, int64_t step, int rank) {
  const char* want = std::getenv("TRIDENT_TEST_KILL_IN_SAVE");
  const char* at = std::getenv("TRIDENT_TEST_KILL_IN_SAVE_STEP");
  const char* who = std::getenv("TRIDENT_TEST_RANK");
  if (!want || std::strcmp(want, phase) != 0 || !at || std::atoll(at) != step) return;
  const int r = who ? std::atoi(who) : 0;
  if (r == -1 || r == rank) std::raise(SIGKILL);
}

// A run-unique tag for shard names (rank 0's, agreed once).
std::string make_tag(Communicator& world) {
  char tag[16] = {};
  const auto ns = std::chrono::system_clock::now().time_since_epoch().count();
  std::snprintf(tag, sizeof tag, "%08x",
                unsigned((uint64_t(ns) ^ (uint64_t(::getpid()) << 20)) * 2654435761u));
  return broadcast_string(world, tag, 0);
}

std::string serialise(const std::vector<ShardPiece>& pieces) {
  std::ostringstream s;
  for (const ShardPiece& p : pieces) {
    s << p.name << '\t' << p.begin << '\t' << p.end << '\t' << p.shape.size();
    for (int64_t d : p.shape) s << '\t' << d;
    s << '\n';
  }
  return s.str();
}

std::vector<ShardPiece> deserialise(const std::string& text) {
  std::vector<ShardPiece> out;
  std::istringstream s(text);
  std::string line;
  while (std::getline(s, line)) {
    std::istringstream l(line);
    ShardPiece p;
    size_t nd = 0;
    std::getline(l, p.name, '\t');
    l >> p.begin >> p.end >> nd;
    p.shape.resize(nd);
    for (auto& d : p.shape) l >> d;
    out.push_back(std::move(p));
  }
  return out;
}

// Every rank's pieces on rank 0 (a metadata gather, once per run).
std::vector<std::vector<ShardPiece>> gather_pieces(Communicator& world,
                                                   const std::vector<ShardPiece>& mine) {
  const std::string text = serialise(mine);
  const auto texts =
      gather_bytes_to_root(world, std::vector<char>(text.begin(), text.end()), 0, 7302);
  std::vector<std::vector<ShardPiece>> all(size_t(world.size()));  // empty but on rank 0
  for (size_t r = 0; r < texts.size(); ++r)
    all[r] = r == 0 ? mine : deserialise(std::string(texts[r].begin(), texts[r].end()));
  return all;
}

// The disk bytes that the ranks of this host write in one save: each shard
// checks that much space is free before it writes anything, as they all
// write at once (a file system shared by several hosts is taken as this
// host's alone: such file systems are large).
int64_t node_total(Communicator& world, int64_t mine) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const int64_t me[2] = {int64_t(fnv1a64(host, std::strlen(host))), mine};
  std::vector<int64_t> all(size_t(2 * world.size()));
  world.allgather(me, all.data(), sizeof me);
  int64_t total = 0;
  for (int r = 0; r < world.size(); ++r)
    if (all[size_t(2 * r)] == me[0]) total += all[size_t(2 * r + 1)];
  return total;
}

// The local tier: a shard file framed for its partner, in a buffer of the
// bound both sides compute (8 bytes of length, the file, zeros); a length of
// -1 says the owner could not read it.
std::vector<char> framed_copy(const std::string& path, int64_t bound) {
  std::vector<char> out(size_t(bound), '\0');
  const std::vector<char> bytes = read_file_bytes(path);
  const int64_t n = int64_t(bytes.size());
  if (n + int64_t(sizeof n) > bound)
    throw Error("shard " + path + " is larger than its bound (" + std::to_string(n) + " bytes)");
  std::memcpy(out.data(), &n, sizeof n);
  std::memcpy(out.data() + sizeof n, bytes.data(), bytes.size());
  return out;
}

// What a failed save leaves to resume from, for its message.
std::string what_is_kept(const std::string& dir) {
  const std::vector<std::string> kept = checkpoints_newest_first(dir);
  if (kept.empty()) return " (no earlier checkpoint in " + dir + " to resume from)";
  return " (the previous checkpoint, " + kept.front() + ", is kept)";
}

// output.keep_checkpoints: older complete checkpoints beyond the newest K
// (counting the one just committed) are removed, index first.
void apply_retention(const std::string& dir, int64_t committed_step, int keep) {
  if (keep <= 0) return;
  int kept = 1;  // the committed one
  for (const std::string& p : checkpoints_newest_first(dir)) {
    if (checkpoint_step(p) >= committed_step) continue;
    if (kept < keep) {
      ++kept;
      continue;
    }
    remove_checkpoint(p);
  }
}

}  // namespace

// The layout, and for async saves the staging buffer with its pages touched,
// are made here, once, so that no save's blocking time pays for them.
CheckpointSaver::CheckpointSaver(Trainer& t, RunFile* file,
                                 const std::vector<std::string>* local_hosts)
    : t_(t), file_(file), local_(local_hosts != nullptr) {
  const OutputConfig& o = t.config().output;
  dir_ = o.checkpoint_dir;
  const int me = t.comms().world->rank();
  index_writer_ = me == 0;
  if (local_) {
    const std::vector<std::string>& hosts = *local_hosts;
    dir_ = local_node_dir(o, hosts.at(size_t(me)));
    index_writer_ = std::find(hosts.begin(), hosts.end(), hosts[size_t(me)]) - hosts.begin() == me;
    const std::vector<int> partners = partner_ranks(hosts);
    partner_ = partners[size_t(me)];
    for (size_t r = 0; r < partners.size(); ++r)
      if (partners[r] == me) kept_for_.push_back(int(r));
  }
  if (o.checkpoint_format != CheckpointFormat::sharded) return;
  tag_ = make_tag(*t.comms().world);
  plan();
  if (!o.checkpoint_async && t.device().is_cpu()) return;
  int64_t total = 0;
  for (const Owned& w : owned_) total += w.piece.numel();
  const int64_t cap = std::max<int64_t>(
      1, std::min<int64_t>(total, int64_t(o.checkpoint_staging_mb) * (1 << 20) / 4));
  staging_ = Tensor::empty({cap});
  staging_.fill(0.0f);
}

CheckpointSaver::~CheckpointSaver() {
  if (writer_.joinable()) writer_.join();
  if (!index_tmp_.empty()) std::remove(index_tmp_.c_str());
}

int CheckpointSaver::writing() const {
  const int st = state_.load();
  return st == writing_now || (local_ && st == written && !copies_done_) ? 1 : 0;
}

int CheckpointSaver::failed_code() const {
  if (state_.load() != failed_now) return 0;
  const Communicator& w = *t_.comms().world;
  return w.size() - w.rank();
}

// The slices this rank owns: each kind of the store cut into equal parts
// over its replicas (the sharded optimizer's cut), router buffers in turn.
void CheckpointSaver::plan() {
  const TrainComms& c = t_.comms();
  for (GradReduce kind : {GradReduce::dense, GradReduce::expert, GradReduce::none}) plan_kind(kind);
  plan_buffers();
  std::vector<ShardPiece> mine;
  for (const Owned& o : owned_) mine.push_back(o.piece);
  all_pieces_ = gather_pieces(*c.world, mine);
  if (local_) share_pieces();
  if (local_) own_bound_ = copy_bound(c.world->rank());
  int64_t copies = 0;        // the partner copies this rank keeps
  for (int r : kept_for_) {  // their receive buffers, pages touched once
    incoming_.emplace_back(size_t(copy_bound(r)), '\0');
    copies += shard_file_bytes(all_pieces_.at(size_t(r)));
  }
  node_bytes_ = node_total(*c.world, shard_file_bytes(mine) + copies +
                                         (index_writer_ ? index_file_bytes(all_pieces_) : 0));
}

// One kind's slices: this rank's equal part of the kind's range, cut along
// the parameters, with their moments.
void CheckpointSaver::plan_kind(GradReduce kind) {
  const TrainComms& c = t_.comms();
  const ParamStore& store = t_.param_store();
  const dp::Sharding& s = t_.sharding();
  const size_t k = size_t(kind);
  Communicator* g = kind == GradReduce::expert ? c.expert_replica : c.dpcp;
  const int64_t parts = g ? g->size() : 1, me = g ? g->rank() : 0;
  const ParamStore::Range full = store.range(kind);
  const int64_t part = (full.size() + parts - 1) / parts;
  const int64_t mine_b = full.begin + me * part, mine_e = std::min(full.end, mine_b + part);
  for (const ParamStore::Entry& e : store.entries()) {
    if (e.param->reduce != kind) continue;
    const int64_t lo = std::max(mine_b, e.offset), hi = std::min(mine_e, e.offset + e.numel);
    if (lo >= hi) continue;
    TRIDENT_CHECK(lo >= s.owned[k].begin && hi <= s.owned[k].end,
                  "checkpoint: " + e.param->name + " lies outside this rank's moments");
    const int64_t at = s.base[k] + (lo - s.owned[k].begin), n = hi - lo;
    const ShardPiece p{"", e.param->value.shape(), lo - e.offset, hi - e.offset};
    owned_.push_back({{"param/" + e.param->name, p.shape, p.begin, p.end},
                      e.param->value.view(p.begin, {n}),
                      ""});
    owned_.push_back({{"adam_m/" + e.param->name, p.shape, p.begin, p.end},
                      t_.optimizer().m().view(at, {n}),
                      ""});
    owned_.push_back({{"adam_v/" + e.param->name, p.shape, p.begin, p.end},
                      t_.optimizer().v().view(at, {n}),
                      ""});
  }
}

// Router buffers go to the dp x cp replicas in turn.
void CheckpointSaver::plan_buffers() {
  const TrainComms& c = t_.comms();
  const int64_t parts = c.dpcp ? c.dpcp->size() : 1, me = c.dpcp ? c.dpcp->rank() : 0;
  int64_t i = 0;
  for (auto& [name, tensor] : t_.stage().buffers())
    if (i++ % parts == me)
      owned_.push_back({{"buffer/" + name, tensor->shape(), 0, tensor->numel()}, Tensor(), name});
}

// The local tier: every node writes its own index, so rank 0's list of
// every rank's pieces goes to every rank (once per run).
void CheckpointSaver::share_pieces() {
  Communicator& world = *t_.comms().world;
  std::string text;
  if (world.rank() == 0)
    for (const auto& pieces : all_pieces_) text += serialise(pieces) + "#\n";
  text = broadcast_string(world, text, 0);
  all_pieces_.clear();
  for (size_t a = 0, b; (b = text.find("#\n", a)) != std::string::npos; a = b + 2)
    all_pieces_.push_back(deserialise(text.substr(a, b - a)));
}

void CheckpointSaver::save(int64_t steps_done) {
  if (pending_step_ >= 0) finish();
  if (t_.config().output.checkpoint_format == CheckpointFormat::single)
    return save_single(steps_done);
  start_sharded(steps_done);
  if (t_.config().output.checkpoint_async) return;
  finish();
}

void CheckpointSaver::save_single(int64_t steps_done) {
  const double t0 = now_s();
  const std::string path = save_checkpoint(t_, steps_done);
  const double took = now_s() - t0;
  double mine[2] = {took, took};
  t_.comms().world->allreduce_max(mine, 2);
  Communicator& world = *t_.comms().world;
  if (world.rank() == 0)
    apply_retention(t_.config().output.checkpoint_dir, steps_done,
                    t_.config().output.keep_checkpoints);
  CheckpointRecord rec{steps_done, mine[0], mine[1], 0, 0, 0};
  std::error_code ec;
  if (world.rank() == 0)
    rec.bytes = int64_t(std::filesystem::file_size(path, ec));  // rank 0's row is written
  if (file_) file_->append_checkpoint(rec);
  last_path_ = path;
  last_step_ = steps_done;
}

void CheckpointSaver::start_sharded(int64_t steps_done) {
  const double t0 = now_s();
  const Config& cfg = t_.config();
  Communicator& world = *t_.comms().world;
  const std::string& dir = dir_;
  CheckpointMeta meta;
  meta.step = steps_done;
  meta.optimizer_steps = t_.optimizer().steps_taken();
  meta.model_hash = model_hash(cfg);
  meta.config_toml = to_toml(cfg);
  meta.world_size = world.size();
  pending_step_ = steps_done;
  pending_path_ = checkpoint_path(dir, steps_done);
  if (local_) post_copy_receives();
  error_.clear();
  bytes_ = 0;
  write_s_ = 0;
  state_ = writing_now;
  try {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw Error("cannot create directory " + dir + ": " + ec.message());
    for (auto& [name, tensor] : t_.stage().buffers())  // refreshed from their layers
      for (Owned& o : owned_)
        if (o.buffer == name) o.source = tensor->view(0, {tensor->numel()});
    write_waves(t0, meta);
  } catch (const std::exception& e) {
    error_ = e.what();
    shard_.reset();
    state_ = failed_now;
  }
  blocking_s_ = now_s() - t0;
}

// This rank's shard file (and rank 0's temporary index): HDF5 metadata.
void CheckpointSaver::open_files(const CheckpointMeta& meta) {
  const std::string& dir = dir_;
  const int rank = t_.comms().world->rank();
  std::vector<ShardPiece> pieces;
  for (const Owned& o : owned_) pieces.push_back(o.piece);
  const std::string shard =
      (std::filesystem::path(dir) / shard_file_name(meta.step, tag_, rank)).string();
  shard_ = std::make_unique<ShardFile>(shard, meta, tag_, rank, std::move(pieces), node_bytes_);
  if (index_writer_) index_tmp_ = write_index_tmp(dir, meta, tag_, all_pieces_);
  kill_hook("staged", meta.step, rank);
}

// Sync on the host: straight from the tensors. Otherwise through the
// staging buffer in waves; the last wave of an async save goes to the
// writer, and when it is the only one, so does creating the files: training
// then waits for the copy into the staging buffer alone.
void CheckpointSaver::write_waves(double t0, const CheckpointMeta& meta) {
  const Config& cfg = t_.config();
  const bool async = cfg.output.checkpoint_async;
  segments_.clear();
  if (!async && t_.device().is_cpu()) {
    open_files(meta);
    for (size_t i = 0; i < owned_.size(); ++i)
      shard_->append(i, owned_[i].source.ptr(), owned_[i].piece.numel());
    return writer_body(segments_.size(), t0, nullptr);
  }
  cut_segments();
  size_t wave = 0;
  while (wave < segments_.size()) {
    size_t end = wave + 1;
    while (end < segments_.size() && segments_[end].at != 0) ++end;
    for (size_t j = wave; j < end; ++j) {
      const Segment& sg = segments_[j];
      Tensor dst = staging_.view(sg.at, {sg.n});
      kernels::copy(t_.ctx(), dst, owned_[sg.piece].source.view(sg.from, {sg.n}));
    }
    if (end == segments_.size() && async) {
      const bool open_there = !shard_;
      writer_ = std::thread([this, wave, t0, meta, open_there] {
        writer_body(wave, t0, open_there ? &meta : nullptr);
      });
      return;
    }
    if (!shard_) open_files(meta);
    for (size_t j = wave; j < end; ++j)
      shard_->append(segments_[j].piece, staging_.ptr() + segments_[j].at, segments_[j].n);
    wave = end;
  }
  writer_body(segments_.size(), t0, nullptr);
}

// The owned pieces cut into segments of the staging buffer; a segment at 0
// starts a new wave.
void CheckpointSaver::cut_segments() {
  const int64_t cap = staging_.numel();
  int64_t at = 0;
  for (size_t i = 0; i < owned_.size(); ++i)
    for (int64_t from = 0; from < owned_[i].piece.numel();) {
      if (at == cap) at = 0;  // a new wave
      const int64_t n = std::min(owned_[i].piece.numel() - from, cap - at);
      segments_.push_back({i, from, n, at});
      from += n;
      at += n;
    }
}

// Segments [first, end) from the staging buffer, then the shard made
// durable; with `open`, the files are created here first.
void CheckpointSaver::writer_body(size_t first, double t0, const CheckpointMeta* open) {
  try {
    if (open) open_files(*open);
    for (size_t j = first; j < segments_.size(); ++j)
      shard_->append(segments_[j].piece, staging_.ptr() + segments_[j].at, segments_[j].n);
    shard_->finish();
    bytes_ = shard_->bytes();
    if (local_ && partner_ >= 0) outgoing_ = framed_copy(shard_->path(), own_bound_);
    write_s_ = now_s() - t0;
    kill_hook("shards", pending_step_, t_.comms().world->rank());
    state_ = written;
  } catch (const std::exception& e) {
    error_ = e.what();
    state_ = failed_now;
  }
}

void CheckpointSaver::finish() {
  if (pending_step_ < 0) return;
  if (writer_.joinable()) writer_.join();
  progress_copies(true);
  int flags[2] = {0, failed_code()};
  t_.comms().world->allreduce_max(flags, 2);
  settle(flags[0], flags[1]);
}

void CheckpointSaver::settle(int any_writing, int failed) {
  if (pending_step_ < 0) return;
  Communicator& world = *t_.comms().world;
  const std::string& dir = dir_;
  if (failed > 0) {
    if (writer_.joinable()) writer_.join();
    const int reporter = world.size() - failed;
    const std::string msg = "checkpoint " + pending_path_ + ": " +
                            (error_.empty() ? "not written" : error_) + what_is_kept(dir);
    shard_.reset();  // an unfinished shard is removed
    if (!index_tmp_.empty()) std::remove(index_tmp_.c_str());
    index_tmp_.clear();
    pending_step_ = -1;
    state_ = idle;
    throw AgreedError(msg, world.rank() == reporter);
  }
  if (any_writing) return;
  commit();
}

// The local tier: the copies this rank keeps are received into buffers of
// their shards' bound (made with the layout), posted when the save starts
// (no size goes first).
void CheckpointSaver::post_copy_receives() {
  Communicator& world = *t_.comms().world;
  copy_reqs_.clear();
  copies_done_ = false;
  copies_sent_ = false;
  sent_ = false;
  for (size_t i = 0; i < kept_for_.size(); ++i) {
    copy_reqs_.push_back(world.irecv(incoming_[i].data(), incoming_[i].size(), kept_for_[i], 7311));
  }
}

// The local tier, on the main thread at each step boundary (and, waiting,
// at finish): once this rank's shard is durable its bytes go to the partner
// without waiting; once every copy has arrived and gone out, the copies are
// written durably on the writer thread (temporary name, rename). Until then
// the save counts as writing; an error fails it like a shard write. The
// time spent here at step boundaries is the save's blocking time.
void CheckpointSaver::progress_copies(bool wait) {
  if (!local_ || pending_step_ < 0 || copies_done_ || writer_running() || copies_sent_) {
    if (wait && writer_.joinable()) writer_.join();
    return;
  }
  const double t0 = now_s();
  send_copy();
  if (!copies_arrived(wait)) return void(blocking_s_ += now_s() - t0);
  copy_reqs_.clear();
  copies_sent_ = true;
  if (writer_.joinable()) writer_.join();  // done: it wrote the shard
  start_copy_writer();
  if (wait) writer_.join();
  // an async save's wait at the next save is not its blocking time (as a
  // shared async save's writer, joined there, is not); a sync save's is
  if (!wait || !t_.config().output.checkpoint_async) blocking_s_ += now_s() - t0;
}

// This rank's copy to its partner, once per save (not waited for here).
void CheckpointSaver::send_copy() {
  Communicator& world = *t_.comms().world;
  if (!sent_ && partner_ >= 0) {
    if (outgoing_.size() != size_t(own_bound_)) {  // the save failed: say so to the partner
      const int64_t none = -1;
      outgoing_.assign(size_t(own_bound_), '\0');
      std::memcpy(outgoing_.data(), &none, sizeof none);
    }
    copy_reqs_.push_back(world.isend(outgoing_.data(), outgoing_.size(), partner_, 7311));
  }
  sent_ = true;
}

// Whether every copy has arrived and gone out: with `wait`, waits for them
// (true); otherwise tests them.
bool CheckpointSaver::copies_arrived(bool wait) {
  Communicator& world = *t_.comms().world;
  if (wait) {
    if (!copy_reqs_.empty()) world.wait_all(copy_reqs_);
    return true;
  }
  for (Request& r : copy_reqs_)
    if (!world.test(r)) return false;
  return true;
}

// The copies go to disk on the writer thread, as the shard did.
void CheckpointSaver::start_copy_writer() {
  writer_ = std::thread([this] {
    try {
      if (state_.load() == written)
        for (size_t i = 0; i < kept_for_.size(); ++i) keep_copy(kept_for_[i], incoming_[i]);
    } catch (const std::exception& e) {
      error_ = e.what();
      state_ = failed_now;
    }
    copies_done_ = true;
  });
}

// A received copy (8 bytes of length, then the shard file) written durably.
void CheckpointSaver::keep_copy(int owner, const std::vector<char>& framed) {
  int64_t n = -1;
  std::memcpy(&n, framed.data(), sizeof n);
  const std::string path =
      (std::filesystem::path(dir_) / shard_file_name(pending_step_, tag_, owner)).string();
  if (n < 0 || size_t(n) + sizeof n > framed.size())
    throw Error("partner copy of rank " + std::to_string(owner) + "'s shard " + path +
                ": its owner could not read it");
  write_bytes_durably(path, framed.data() + sizeof n, size_t(n));
}

int64_t CheckpointSaver::copy_bound(int rank) const {
  return shard_file_bytes(all_pieces_.at(size_t(rank))) + int64_t(sizeof(int64_t));
}

// The index renamed into place (rank 0; the local tier: each node's lowest
// rank, after the partner copies) and the directory tidied. Returns the
// error, the same on every rank.
std::string CheckpointSaver::commit_files() {
  Communicator& world = *t_.comms().world;
  const OutputConfig& o = t_.config().output;
  std::string error;
  if (index_writer_) {
    try {
      kill_hook("index", pending_step_, world.rank());
      commit_index(index_tmp_, pending_path_);
      if (local_) {
        remove_local_steps_except(dir_, pending_step_);
      } else {
        remove_unindexed_shards(dir_, pending_step_);
        apply_retention(dir_, pending_step_, o.keep_checkpoints);
      }
    } catch (const std::exception& e) {
      error = (local_ ? "local checkpoint " : "checkpoint ") + pending_path_ + ": " + e.what() +
              (local_ ? "" : what_is_kept(dir_));
    }
  }
  index_tmp_.clear();
  if (!local_) return broadcast_string(world, error, 0);
  return agree_on_check(world, error.empty(), error).message;
}

// Every shard (and, for the local tier, every partner copy) is durable: one
// small agreement on the figures, then the index goes into place.
void CheckpointSaver::commit() {
  if (writer_.joinable()) writer_.join();
  Communicator& world = *t_.comms().world;
  const Config& cfg = t_.config();
  std::vector<double> all(size_t(3 * world.size()));
  const double mine[3] = {blocking_s_, write_s_, double(bytes_)};
  world.allgather(mine, all.data(), sizeof mine);
  const std::string error = commit_files();
  const int64_t step = pending_step_;
  pending_step_ = -1;
  shard_.reset();
  state_ = idle;
  if (!error.empty()) throw AgreedError(error, world.rank() == 0);
  CheckpointRecord rec{step, 0, 0, 0, 0, cfg.output.checkpoint_async ? 1 : 0, local_ ? 1 : 0};
  for (int r = 0; r < world.size(); ++r) {
    rec.blocking_s = std::max(rec.blocking_s, all[size_t(3 * r)]);
    if (all[size_t(3 * r + 1)] > rec.write_s) {
      rec.write_s = all[size_t(3 * r + 1)];
      rec.slowest_rank = r;
    }
    rec.bytes += int64_t(all[size_t(3 * r + 2)]);
  }
  if (file_) file_->append_checkpoint(rec);
  last_path_ = pending_path_;
  last_step_ = step;
}

}  // namespace trident::train
