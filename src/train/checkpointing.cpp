// Trainer <-> checkpoint file, and the stop signals (see train/checkpointing.hpp).
#include "trident/train/checkpointing.hpp"

#include <csignal>

#include "trident/core/error.hpp"

namespace trident::train {
namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

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
  std::vector<CheckpointTensor> mine;
  for (Param* p : t.stage().params()) {
    if (!owns(c, p->reduce)) continue;
    mine.push_back({"param/" + p->name, p->value.shape(), p->value.ptr()});
    mine.push_back({"adam_m/" + p->name, p->value.shape(), t.optimizer().m(p->name).ptr()});
    mine.push_back({"adam_v/" + p->name, p->value.shape(), t.optimizer().v(p->name).ptr()});
  }
  for (auto& [name, tensor] : t.stage().buffers())
    if (owns(c, GradReduce::dense)) mine.push_back({"buffer/" + name, tensor->shape(), tensor->ptr()});
  return write_checkpoint(cfg.output.checkpoint_dir, c.world, meta, mine);
}

int64_t load_checkpoint(Trainer& t, const std::string& path) {
  CheckpointReader r(path);
  const std::string want = model_hash(t.config());
  if (r.meta().model_hash != want)
    throw InputError("checkpoint '" + path + "' belongs to another model: its [model] hash is " +
                     r.meta().model_hash + ", this config's is " + want +
                     " (the [model] table must match the checkpoint's)");
  for (Param* p : t.stage().params()) {
    r.read("param/" + p->name, p->value.shape(), p->value.ptr());
    r.read("adam_m/" + p->name, p->value.shape(), t.optimizer().m(p->name).ptr());
    r.read("adam_v/" + p->name, p->value.shape(), t.optimizer().v(p->name).ptr());
  }
  for (auto& [name, tensor] : t.stage().buffers()) r.read("buffer/" + name, tensor->shape(), tensor->ptr());
  t.stage().buffers_loaded();
  t.optimizer().set_steps_taken(r.meta().optimizer_steps);
  return r.meta().step;
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
