// trident eval --logits-out (train/eval_logits.hpp).
#include "trident/train/eval_logits.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "trident/core/error.hpp"
#include "trident/io/h5util.hpp"
#include "trident/train/run.hpp"
#include "trident/train/trainer.hpp"

namespace trident::train {
namespace {

// The file's ids as int32 (checked against the vocabulary by the data source).
std::vector<int32_t> read_ids(const Config& cfg) {
  const std::string& path = cfg.data.token_file;
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InputError("--tokens " + path + ": cannot open");
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t w = cfg.data.token_dtype == TokenDType::uint16 ? 2 : 4;
  if (bytes.size() % w != 0)
    throw InputError("--tokens " + path + ": " + std::to_string(bytes.size()) +
                     " bytes is not a whole number of " + config_name(cfg.data.token_dtype) +
                     " ids");
  std::vector<int32_t> ids(bytes.size() / w);
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t v = 0;
    std::memcpy(&v, bytes.data() + i * w, w);
    ids[i] = int32_t(v);
  }
  return ids;
}

// Captured rows of this rank as bytes: sample, the number of its tokens,
// their global positions (its cp share), then their logits.
void pack(std::vector<char>& buf, int64_t sample, const std::vector<int64_t>& pos,
          const std::vector<float>& rows) {
  const int64_t n = int64_t(pos.size());
  const size_t at = buf.size();
  buf.resize(at + 16 + size_t(n) * 8 + rows.size() * 4);
  std::memcpy(buf.data() + at, &sample, 8);
  std::memcpy(buf.data() + at + 8, &n, 8);
  std::memcpy(buf.data() + at + 16, pos.data(), size_t(n) * 8);
  std::memcpy(buf.data() + at + 16 + size_t(n) * 8, rows.data(), rows.size() * 4);
}

void write_dataset(hid_t file, const char* name, hid_t type, hid_t mem_type,
                   const std::vector<hsize_t>& dims, const void* data) {
  h5::Handle space = TRIDENT_H5_SPACE(H5Screate_simple(int(dims.size()), dims.data(), nullptr),
                                      std::string("dataspace of ") + name);
  h5::Handle d =
      TRIDENT_H5_DSET(H5Dcreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                      std::string("create ") + name);
  TRIDENT_H5(H5Dwrite(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data),
             std::string("write ") + name);
}

// Rank 0: the packed captures of every rank into logits [N, S, V] at
// their sequences (first_seq + sample) and global positions.
void place_logits(const std::vector<std::vector<char>>& parts, int64_t first_seq, int64_t S,
                  int64_t V, std::vector<float>& logits) {
  for (const auto& b : parts) {
    for (size_t off = 0; off < b.size();) {
      int64_t sample = 0, n = 0;
      std::memcpy(&sample, b.data() + off, 8);
      std::memcpy(&n, b.data() + off + 8, 8);
      std::vector<int64_t> at(static_cast<size_t>(n));
      std::memcpy(at.data(), b.data() + off + 16, size_t(n) * 8);
      const char* rows = b.data() + off + 16 + size_t(n) * 8;
      off += 16 + size_t(n) * 8 + size_t(n * V) * 4;
      const int64_t seq = first_seq + sample;
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(&logits[size_t((seq * S + at[size_t(i)]) * V)], rows + size_t(i * V) * 4,
                    size_t(V) * 4);
    }
  }
}

// Rank 0: the per-token losses and OUT.h5 (temporary name, then renamed);
// "" or what went wrong.
std::string write_logits_file(const std::string& out_path, const Config& cfg,
                              const std::string& checkpoint, const std::vector<int32_t>& ids,
                              const std::vector<float>& logits, int64_t N, double loss_sum) {
  const int64_t S = cfg.data.seq_len, V = cfg.model.vocab_size;
  std::string error;
  std::vector<float> loss(size_t(N * S));
  std::vector<int32_t> toks(size_t(N * S)), tgts(size_t(N * S));
  for (int64_t k = 0; k < N; ++k)
    for (int64_t t = 0; t < S; ++t) {
      const size_t i = size_t(k * S + t);
      toks[i] = ids[size_t(k * S + t)];
      tgts[i] = ids[size_t(k * S + t + 1)];
      const float* l = &logits[i * size_t(V)];
      double m = l[0];
      for (int64_t v = 1; v < V; ++v) m = std::max(m, double(l[v]));
      double z = 0;
      for (int64_t v = 0; v < V; ++v) z += std::exp(double(l[v]) - m);
      loss[i] = float(m + std::log(z) - double(l[tgts[i]]));
    }
  const std::string tmp = out_path + ".tmp";
  try {
    h5::QuietErrors quiet;
    h5::Handle file(TRIDENT_H5(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
                               "create " + tmp),
                    H5Fclose);
    h5::write_attr(file, "format", "trident-logits");
    h5::write_attr(file, "format_version", int64_t(1));
    h5::write_attr(file, "checkpoint", checkpoint);
    h5::write_attr(file, "config_toml", to_toml(cfg));
    h5::write_attr(file, "mean_loss", loss_sum / double(N * S));
    write_dataset(file, "logits", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT,
                  {hsize_t(N), hsize_t(S), hsize_t(V)}, logits.data());
    write_dataset(file, "loss", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {hsize_t(N), hsize_t(S)},
                  loss.data());
    write_dataset(file, "tokens", H5T_STD_I32LE, H5T_NATIVE_INT32, {hsize_t(N), hsize_t(S)},
                  toks.data());
    write_dataset(file, "targets", H5T_STD_I32LE, H5T_NATIVE_INT32, {hsize_t(N), hsize_t(S)},
                  tgts.data());
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (error.empty() && std::rename(tmp.c_str(), out_path.c_str()) != 0)
    error = "cannot rename " + tmp + " to " + out_path;
  if (!error.empty()) std::remove(tmp.c_str());
  return error;
}

// This rank's logits rows of one evaluated batch, packed for the root.
std::vector<char> packed_logits(const StepResult& r, const std::vector<int64_t>& pos, int64_t V) {
  std::vector<char> mine;
  for (const model::Capture& c : r.captures) {
    if (c.name != "logits") continue;
    const std::vector<int64_t>& at = c.positions.empty() ? pos : c.positions;
    TRIDENT_CHECK(int64_t(c.rows.size()) == int64_t(at.size()) * V,
                  "eval: a logits capture of unexpected length");
    pack(mine, c.sample, at, c.rows);
  }
  return mine;
}

}  // namespace

int eval_logits(const Config& cfg, Communicators& comms, const std::string& checkpoint,
                const std::string& out_path) {
  Communicator& world = *comms.world;
  const int64_t S = cfg.data.seq_len, V = cfg.model.vocab_size;
  const std::vector<int32_t> ids = read_ids(cfg);
  const std::unique_ptr<Trainer> trainer_ptr = make_trainer(cfg, comms);
  Trainer& trainer = *trainer_ptr;
  const int64_t B = trainer.samples_per_step();
  const int64_t N = ids.empty() ? 0 : (int64_t(ids.size()) - 1) / S;
  if (N == 0 || N % B != 0)
    throw InputError("--tokens " + cfg.data.token_file + ": " + std::to_string(ids.size()) +
                     " tokens make " + std::to_string(N) +
                     " sequences of data.seq_len=" + std::to_string(S) +
                     " (+1 target); need a positive multiple of the global batch " +
                     std::to_string(B) + " (data.micro_batch_size x data.num_microbatches x dp)");
  load_checkpoint_everywhere(trainer, checkpoint);
  const bool root = world.rank() == 0;
  std::vector<float> logits;
  if (root) logits.assign(size_t(N * S * V), 0.0f);
  double loss_sum = 0;
  for (int64_t step = 0; step < N / B; ++step) {
    model::CaptureRequest req;
    req.logits = true;
    for (int64_t g = 0; g < B; ++g) req.samples.insert(g);
    const StepResult r = trainer.evaluate(step, &req);
    loss_sum += r.metrics.loss * double(B * S);
    // every rank's packed rows on the root, by rank
    const auto parts =
        gather_bytes_to_root(world, packed_logits(r, trainer.positions(), V), 0, 7411);
    if (root) place_logits(parts, step * B, S, V, logits);
  }
  const std::string error =
      root ? write_logits_file(out_path, cfg, checkpoint, ids, logits, N, loss_sum) : "";
  int failed = error.empty() ? 0 : 1;
  world.allreduce_max(&failed, 1);
  if (failed) throw AgreedError("--logits-out " + out_path + ": " + error, root);
  if (root)
    std::printf("eval: %lld sequences of %lld tokens, mean loss %.6f -> %s\n",
                static_cast<long long>(N), static_cast<long long>(S), loss_sum / double(N * S),
                out_path.c_str());
  return 0;
}

}  // namespace trident::train
