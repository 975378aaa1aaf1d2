// Trainer <-> checkpoint file, and the stop signals (see train/checkpointing.hpp).
#include "trident/train/checkpointing.hpp"

#include <algorithm>
#include <csignal>
#include <set>
#include <vector>

#include "trident/core/error.hpp"
#include "trident/kernels/tensor_ops.hpp"
#include "trident/parallel/dp/zero.hpp"

namespace trident::train {
namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

// A tensor's elements where the host reads them: itself on the host, else
// an explicit copy (kept in `hold` until the checkpoint is written).
const float* on_host(const kernels::Ctx& ctx, const Tensor& t, std::vector<Tensor>& hold) {
  if (t.device().is_cpu()) return t.ptr();
  hold.push_back(kernels::to_host(ctx, t));
  return hold.back().ptr();
}

// One read of a load: elements [begin, end) of tensor `name` (flat) into
// dst, which holds end - begin elements.
struct TensorRead {
  std::string name;
  std::vector<int64_t> shape;
  int64_t begin, end;
  Tensor dst;
};

// What a load reads on this rank, in order: its stage's parameters whole; of
// the moments only the part this rank keeps (the sharded optimizer's), by
// element range: no rank reads another's state; its buffers whole.
std::vector<TensorRead> reads_of(Trainer& t) {
  std::vector<TensorRead> out;
  for (Param* p : t.stage().params())
    out.push_back({"param/" + p->name, p->value.shape(), 0, p->value.numel(), p->value});
  const dp::Sharding& s = t.sharding();
  for (const ParamStore::Entry& e : t.param_store().entries()) {
    const size_t k = size_t(e.param->reduce);
    const int64_t lo = std::max(e.offset, s.owned[k].begin);
    const int64_t hi = std::min(e.offset + e.numel, s.owned[k].end);
    if (lo >= hi) continue;
    const int64_t at = s.base[k] + (lo - s.owned[k].begin), n = hi - lo;
    for (auto [kind, moments] :
         {std::pair{"adam_m/", &t.optimizer().m()}, {"adam_v/", &t.optimizer().v()}})
      out.push_back({kind + e.param->name, e.param->value.shape(), lo - e.offset, hi - e.offset,
                     moments->view(at, {n})});
  }
  for (auto& [name, tensor] : t.stage().buffers())
    out.push_back({"buffer/" + name, tensor->shape(), 0, tensor->numel(), *tensor});
  return out;
}

// One read, through a host copy when dst is on a device.
void read_into(CheckpointReader& r, const kernels::Ctx& ctx, TensorRead& x) {
  if (x.dst.device().is_cpu()) return r.read_range(x.name, x.shape, x.begin, x.end, x.dst.ptr());
  Tensor host = Tensor::empty(x.dst.shape());
  r.read_range(x.name, x.shape, x.begin, x.end, host.ptr());
  kernels::copy(ctx, x.dst, host);
}

bool owns(const TrainComms& c, GradReduce r) {
  if (r == GradReduce::expert) return !c.expert_replica || c.expert_replica->rank() == 0;
  return !c.dpcp || c.dpcp->rank() == 0;
}

}  // namespace

std::string save_checkpoint(Trainer& t, int64_t steps_done) {
  const Config& cfg = t.config();
  const TrainComms& c = t.comms();
  CheckpointMeta meta;
  meta.step = steps_done;
  meta.optimizer_steps = t.optimizer().steps_taken();
  meta.model_hash = model_hash(cfg);
  meta.config_toml = to_toml(cfg);
  meta.world_size = c.world ? c.world->size() : 1;
  // The moments in the store's layout, whole: with a sharded optimizer each
  // rank holds a part of them, so the parts are gathered first.
  const ParamStore& store = t.param_store();
  Tensor m = kernels::empty(t.ctx(), {store.numel()}), v = kernels::empty(t.ctx(), {store.numel()});
  dp::gather_owned(store, t.sharding(), t.optimizer().m(), m, t.ctx());
  dp::gather_owned(store, t.sharding(), t.optimizer().v(), v, t.ctx());
  std::vector<CheckpointTensor> mine;
  std::vector<Tensor> hold;
  const kernels::Ctx& ctx = t.ctx();
  for (Param* p : t.stage().params()) {
    if (!owns(c, p->reduce)) continue;
    const auto& shape = p->value.shape();
    const int64_t off = store.entry(p).offset;
    mine.push_back({"param/" + p->name, shape, on_host(ctx, p->value, hold)});
    mine.push_back({"adam_m/" + p->name, shape, on_host(ctx, m.view(off, shape), hold)});
    mine.push_back({"adam_v/" + p->name, shape, on_host(ctx, v.view(off, shape), hold)});
  }
  for (auto& [name, tensor] : t.stage().buffers())
    if (owns(c, GradReduce::dense))
      mine.push_back({"buffer/" + name, tensor->shape(), on_host(ctx, *tensor, hold)});
  return write_checkpoint(cfg.output.checkpoint_dir, c.world, meta, mine);
}

namespace {

// The run's config with the checkpoint's RoPE keys: RoPE has no
// parameters, and changing its base or scaling on a trained model is how a
// context is extended, so those keys may differ from the checkpoint's.
Config with_checkpoint_rope(const Config& cfg, const CheckpointMeta& meta) {
  Config c = cfg;
  Config saved;
  try {
    saved = parse_config_text(meta.config_toml, "checkpoint config");
  } catch (const InputError&) {
    return c;  // unreadable: the hash comparison decides alone
  }
  c.model.rope_theta = saved.model.rope_theta;
  c.model.rope_scaling = saved.model.rope_scaling;
  c.model.rope_factor = saved.model.rope_factor;
  c.model.rope_low_freq_factor = saved.model.rope_low_freq_factor;
  c.model.rope_high_freq_factor = saved.model.rope_high_freq_factor;
  c.model.rope_original_max_positions = saved.model.rope_original_max_positions;
  return c;
}

}  // namespace

int64_t load_checkpoint(Trainer& t, const std::string& path) {
  CheckpointReader r(path);
  const std::string want = model_hash(t.config());
  if (r.meta().model_hash != want &&
      r.meta().model_hash != model_hash(with_checkpoint_rope(t.config(), r.meta())))
    throw InputError("checkpoint '" + path + "' belongs to another model: its [model] hash is " +
                     r.meta().model_hash + ", this config's is " + want +
                     " (the [model] table must match the checkpoint's)");
  for (TensorRead& x : reads_of(t)) read_into(r, t.ctx(), x);
  t.stage().buffers_loaded();
  t.optimizer().set_steps_taken(r.meta().optimizer_steps);
  return r.meta().step;
}

std::vector<std::string> checkpoint_shards_read(Trainer& t, const std::string& index_path) {
  CheckpointReader r(index_path);
  std::set<std::string> names;
  for (const TensorRead& x : reads_of(t))
    for (std::string& n : r.shards_of(x.name, x.shape, x.begin, x.end)) names.insert(std::move(n));
  return {names.begin(), names.end()};
}

void install_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

int stop_signal_received() { return int(g_stop_signal); }

void raise_stop_flag(int sig) { g_stop_signal = sig; }

}  // namespace trident::train
