// Activation captures: from each rank's local rows to global-order datasets
// in the run file (see write_activations in train/trainer.hpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include "trident/core/error.hpp"
#include "trident/train/trainer.hpp"

namespace trident::train {
namespace {

const std::vector<std::string> kKnown = {"q", "k", "v", "attn_out", "router_logits"};

int name_index(const std::string& n) {
  return int(std::find(kKnown.begin(), kKnown.end(), n) - kKnown.begin());
}

// [heads, head_dim] or [n_experts] after [S, seq]
std::vector<int64_t> trailing_shape(const ModelConfig& m, const std::string& name) {
  if (name == "q" || name == "attn_out") return {m.n_heads, m.head_dim()};
  if (name == "k" || name == "v") return {m.n_kv_heads, m.head_dim()};
  return {m.n_experts};
}

}  // namespace

void validate_activation_request(const Config& cfg, int64_t global_batch) {
  const auto& o = cfg.output;
  for (int l : o.activation_layers)
    if (l < 0 || l >= cfg.model.n_layers)
      throw InputError("output.activation_layers: layer " + std::to_string(l) +
                       " does not exist (model.n_layers = " + std::to_string(cfg.model.n_layers) +
                       ")");
  for (int s : o.activation_samples)
    if (s < 0 || s >= global_batch)
      throw InputError("output.activation_samples: sample " + std::to_string(s) +
                       " is outside the global batch of " + std::to_string(global_batch) +
                       " sequences");
  for (const auto& n : o.activations)
    if (name_index(n) >= int(kKnown.size()))
      throw InputError("output.activations: unknown activation '" + n +
                       "' (known: q, k, v, attn_out, router_logits)");
  for (int st : o.activation_steps)
    if (st < 0) throw InputError("output.activation_steps: steps are counted from 0");
}

namespace {

// This rank's captures as one message: its positions once, then per capture
// layer, name index, sample, width, row count, the count of the capture's
// own positions (0: the rank's) and those positions, and the rows.
std::vector<char> pack_captures(const std::vector<int64_t>& positions,
                                const std::vector<model::Capture>& mine) {
  std::vector<char> buf;
  auto put = [&](const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    buf.insert(buf.end(), c, c + n);
  };
  const int64_t np = int64_t(positions.size());
  put(&np, 8);
  put(positions.data(), positions.size() * 8);
  for (const auto& c : mine) {
    const int64_t head[6] = {c.layer, name_index(c.name),     c.sample,
                             c.width, int64_t(c.rows.size()), int64_t(c.positions.size())};
    put(head, sizeof head);
    put(c.positions.data(), c.positions.size() * 8);
    put(c.rows.data(), c.rows.size() * sizeof(float));
  }
  return buf;
}

using GlobalCaptures =
    std::map<std::pair<int, int>, std::vector<float>>;  // (layer, name) -> [S, seq, width]

// Puts one rank's message (pack_captures) into the global arrays.
void unpack_captures(const std::vector<char>& p, const Config& cfg, GlobalCaptures& full) {
  const int64_t seq = cfg.data.seq_len;
  const auto& samples = cfg.output.activation_samples;
  size_t off = 0;
  auto get = [&](void* dst, size_t n) {
    std::memcpy(dst, p.data() + off, n);
    off += n;
  };
  int64_t n = 0;
  get(&n, 8);
  std::vector<int64_t> pos(static_cast<size_t>(n));
  get(pos.data(), size_t(n) * 8);
  while (off < p.size()) {
    int64_t h[6];
    get(h, sizeof h);
    // A sample with its own layout (parallel.cp_layout = "docs") brings its
    // rows' positions; the others use the rank's.
    std::vector<int64_t> own(static_cast<size_t>(h[5]));
    get(own.data(), own.size() * 8);
    const std::vector<int64_t>& at = own.empty() ? pos : own;
    std::vector<float> rows(static_cast<size_t>(h[4]));
    get(rows.data(), rows.size() * sizeof(float));
    const int64_t width = h[3];
    const int64_t s = std::find(samples.begin(), samples.end(), int(h[2])) - samples.begin();
    auto& dst = full[{int(h[0]), int(h[1])}];
    if (dst.empty())
      dst.assign(size_t(int64_t(samples.size()) * seq * width),
                 std::numeric_limits<float>::quiet_NaN());
    TRIDENT_CHECK(int64_t(at.size()) * width == int64_t(rows.size()),
                  "activation capture: rows and positions of different lengths");
    for (size_t i = 0; i < at.size(); ++i)
      std::copy_n(rows.data() + int64_t(i) * width, width, dst.data() + (s * seq + at[i]) * width);
  }
}

// Every rank's captures assembled on rank 0 (empty elsewhere).
GlobalCaptures gather_captures(const Config& cfg, Communicator* world,
                               const std::vector<char>& buf) {
  const int size = world ? world->size() : 1, rank = world ? world->rank() : 0;
  std::vector<int64_t> sizes(static_cast<size_t>(size), 0);
  const int64_t my = int64_t(buf.size());
  if (size > 1)
    world->allgather(&my, sizes.data(), sizeof my);
  else
    sizes[0] = my;
  GlobalCaptures full;
  if (rank != 0) {
    Request r = world->isend(buf.data(), buf.size(), 0, 7302);
    world->wait(r);
    return full;
  }
  std::vector<std::vector<char>> parts(static_cast<size_t>(size));
  parts[0] = buf;
  std::vector<Request> reqs;
  for (int r = 1; r < size; ++r) {
    parts[size_t(r)].resize(size_t(sizes[size_t(r)]));
    reqs.push_back(world->irecv(parts[size_t(r)].data(), parts[size_t(r)].size(), r, 7302));
  }
  if (!reqs.empty()) world->wait_all(reqs);
  for (const auto& p : parts) unpack_captures(p, cfg, full);
  return full;
}

}  // namespace

void write_activations(RunFile& file, const Config& cfg, Communicator* world, int64_t step,
                       const std::vector<int64_t>& positions,
                       const std::vector<model::Capture>& mine) {
  const GlobalCaptures full = gather_captures(cfg, world, pack_captures(positions, mine));
  const bool lead = !world || world->rank() == 0;
  const int64_t seq = cfg.data.seq_len;
  const std::vector<int> ids(cfg.output.activation_samples.begin(),
                             cfg.output.activation_samples.end());
  std::vector<int64_t> all_pos(static_cast<size_t>(seq));
  for (int64_t i = 0; i < seq; ++i) all_pos[size_t(i)] = i;
  for (int layer : cfg.output.activation_layers) {
    for (const auto& name : cfg.output.activations) {
      if (name == "router_logits" && !cfg.model.is_moe_layer(layer)) continue;
      std::vector<int64_t> shape = {int64_t(ids.size()), seq};
      for (int64_t d : trailing_shape(cfg.model, name)) shape.push_back(d);
      const float* local = nullptr;
      std::vector<int64_t> gp;
      if (lead) {
        auto it = full.find({layer, name_index(name)});
        TRIDENT_CHECK(it != full.end(), "activation " + name + " of layer " +
                                            std::to_string(layer) +
                                            " was not captured by any rank");
        local = it->second.data();
        gp = all_pos;
      }
      file.write_activation(int(step), layer, name, shape, ids, local, gp);
    }
  }
}

}  // namespace trident::train
