// Cost model against hand counts: FLOPs and bytes of each action equal the
// formulas of planner.md evaluated by hand for small shapes, the parameter
// count equals the model's own, memory equals a hand count, and a prediction
// without latency equals the schedule's textbook makespan.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <string>

#include "tiny_config.hpp"
#include "trident/kernels/attention.hpp"
#include "trident/kernels/blas.hpp"
#include "trident/kernels/types/gemm_bf16.hpp"
#include "trident/model/transformer.hpp"
#include "trident/parallel/pp/generators.hpp"
#include "trident/plan/cost_model.hpp"
#include "trident/plan/predict.hpp"

using namespace trident;
using namespace trident::plan;

namespace {

// d=8, H=2, Hkv=1, D=4, f=16, V=32, 2 dense layers, seq 16, 2 sequences per
// micro-batch: T = 32 tokens per action.
Config dense_config() {
  Config c =
      testing::tiny_config({.d_model = 8, .heads = 2, .kv_heads = 1, .ffn = 16, .experts = 0},
                           {.seq_len = 16, .micro_batch = 2});
  c.parallel = ParallelConfig{};
  return c;
}

MeshPlan serial_plan(const Config& c) { return mesh_plan_of(c, 1); }

MachineProfile unit_machine() {
  MachineProfile m;
  m.name = "unit";
  m.gemm_flops = 1e9;
  m.attention_flops = 5e8;
  m.memory_Bps = 2e9;
  m.nvlink = m.node = m.network = Link{1e9, 1e-6};
  return m;
}

}  // namespace

TEST_CASE("causal pairs of the busiest CP rank") {
  CHECK(causal_pairs_busiest_rank(16, 1, CpLayout::zigzag) == 136);  // 16*17/2
  // zig-zag, cp=2: chunks of 4; rank 0 holds chunks 0 and 3: 10 + (12*4 + 10) = 68 = 136/2
  CHECK(causal_pairs_busiest_rank(16, 2, CpLayout::zigzag) == 68);
  // contiguous, cp=2: the last rank sees 8x8 earlier pairs and 36 on its diagonal
  CHECK(causal_pairs_busiest_rank(16, 2, CpLayout::contiguous) == 100);
  // zig-zag, cp=4, S=32: chunks of 4; rank 0 (chunks 0 and 7): 10 + (28*4 + 10) = 132 = 528/4
  CHECK(causal_pairs_busiest_rank(32, 4, CpLayout::zigzag) == 132);
  // A window W: query i sees min(i + 1, W) keys. Window 0 or >= seq: causal.
  CHECK(window_pairs_busiest_rank(32, 4, CpLayout::zigzag, 0) == 132);
  CHECK(window_pairs_busiest_rank(32, 4, CpLayout::zigzag, 32) == 132);
  CHECK(window_pairs_busiest_rank(16, 1, CpLayout::zigzag, 4) == 10 + 12 * 4);
  // contiguous cp=2, W=4: rank 1 holds queries 8..15, 4 keys each
  CHECK(window_pairs_busiest_rank(16, 2, CpLayout::contiguous, 4) == 32);
  // zig-zag cp=2 (chunks of 4), W=3: rank 0 holds 0..3 (1+2+3+3) and 12..15
  // (12), 21 pairs; rank 1 holds 4..11, 24 pairs: the busiest
  CHECK(window_pairs_busiest_rank(16, 2, CpLayout::zigzag, 3) == 24);
  // the pairs a query sees, brute force, against the formula on odd sizes
  for (CpLayout l : {CpLayout::zigzag, CpLayout::contiguous})
    for (long long w : {1, 5, 7, 23}) {
      const int cp = 3;
      const long long seq = 42;
      double best = 0;
      for (int r = 0; r < cp; ++r) {
        double n = 0;
        for (long long i = 0; i < seq; ++i) {
          const long long chunk = l == CpLayout::zigzag ? i / (seq / (2 * cp)) : i / (seq / cp);
          const int owner =
              l == CpLayout::zigzag ? int(chunk < cp ? chunk : 2 * cp - 1 - chunk) : int(chunk);
          if (owner == r) n += double(std::min(i + 1, w));
        }
        best = std::max(best, n);
      }
      CHECK(window_pairs_busiest_rank(seq, cp, l, w) == best);
    }
}

TEST_CASE("FLOPs and bytes of F, B and W on a dense chunk equal the hand count") {
  const Config c = dense_config();
  const ChunkCost cc = chunk_cost(c, serial_plan(c), 0);
  const double T = 32, d = 8, f = 16, V = 32;
  const double proj = 2 * T * d * (2 * 2 * 4 + 2 * 1 * 4);  // Q, O: H*D = 8; K, V: Hkv*D = 4
  const double ffn = 6 * T * d * f;
  const double head = 2 * T * d * V;
  CHECK(proj == 12288);
  CHECK(cc.f.gemm_flops == 2 * (proj + ffn) + head);
  CHECK(cc.b.gemm_flops == 2 * (proj + 2 * ffn) + head);
  CHECK(cc.w.gemm_flops == 2 * proj + head);
  const double attn = 2 /*samples*/ * 136 /*pairs*/ * 4 * 2 /*H*/ * 4 /*D*/;
  CHECK(cc.f.attention_flops == 2 * attn);
  CHECK(cc.b.attention_flops == 2 * 2.5 * attn);
  CHECK(cc.w.attention_flops == 0);
  const double attn_mem = 4 * (7 * T * d + 2 * T * (2 + 1) * 4);
  const double ffn_mem = 4 * (7 * T * d + 3 * T * f);
  const double embed_mem = 4 * 2 * T * d, head_mem = 4 * (2 * T * d + 3 * T * V);
  CHECK(cc.f.memory_bytes == 2 * (attn_mem + ffn_mem) + embed_mem + head_mem);
  CHECK(cc.f.memory_bytes == 63488);
  CHECK(cc.b.memory_bytes == 2 * 2 * (attn_mem + ffn_mem) + embed_mem + 4 * 2 * T * d);
  CHECK(cc.boundary_bytes == 0);  // the only stage is the last
  CHECK(cc.f_comm.cp_bytes == 0);
  CHECK(cc.f_comm.ep_bytes == 0);
}

TEST_CASE("the cost model's parameter count is the model's") {
  for (int experts : {0, 4}) {
    Config c = dense_config();
    c.model.n_experts = experts;
    c.model.top_k = 2;
    c.model.moe_every = 2;
    model::ModelStage stage(c, 0, 1, model::StageComms{});
    double numel = 0;
    for (Param* p : stage.params()) numel += double(p->value.numel());
    CHECK(chunk_cost(c, serial_plan(c), 0).params == numel);
    // beside them, the MoE layer's router bias (E floats and its Param's
    // gradient), in the parameter bytes (train_bf16_native: to the byte)
    CHECK(chunk_cost(c, serial_plan(c), 0).buffers == (experts ? 2 * experts : 0));
  }
  CHECK(chunk_cost(dense_config(), serial_plan(dense_config()), 0).params == 1704);
}

TEST_CASE("communication bytes per action: ring K/V, MoE exchange, stage boundary") {
  Config c = dense_config();
  c.model.n_experts = 4;
  c.model.top_k = 2;
  MeshPlan p = serial_plan(c);
  p.pp = 2, p.cp = 2, p.ep = 2, p.dp = 1;
  const ChunkCost first = chunk_cost(c, p, 0);
  const double T = 16;  // 2 sequences x 16 tokens / cp
  // one layer per stage; per sample: one ring step of K and V (8 tokens x Hkv*D = 4)
  CHECK(first.f_comm.cp_steps == 2);
  CHECK(first.f_comm.cp_bytes == 2 * 4 * 2 * 8 * 4);
  // B: K/V again and the dK/dV accumulators, the last one home after the
  // last step: 2 cp - 1 = 3 blocks, one of them exposed
  CHECK(first.b_comm.cp_bytes == 3 * first.f_comm.cp_bytes);
  CHECK(first.b_comm.cp_tail_bytes == first.f_comm.cp_bytes);
  CHECK(first.b_comm.cp_tail_messages == 2);
  // dispatch + combine of the T k (ep-1)/ep rows that leave the rank
  CHECK(first.f_comm.ep_exchanges == 2);
  CHECK(first.f_comm.ep_bytes == 2 * (T * 2 * 0.5) * 8 * 4);
  CHECK(first.b_comm.ep_bytes == first.f_comm.ep_bytes);
  CHECK(first.boundary_bytes == 4 * T * 8);
  // the busiest expert rank: N = T k ep copies over ep ranks
  const double N = T * 2 * 2, mean = N / 2, sd = std::sqrt(N * 0.25);
  CHECK(moe_imbalance(N, 2) == Approx((mean + sd * std::sqrt(2 * std::log(2.0))) / mean));
  CHECK(moe_imbalance(N, 1) == 1.0);
}

TEST_CASE("memory of a rank equals the hand count") {
  // T = 32, d = 8, H*D = 8, Hkv*D = 4, H = 2, f = 16, V = 32; in floats, per
  // micro-batch: attention x, h1, rstd, q, k, v, o, lse = 512 + 32 + 512 +
  // 256 + 64 = 1376; FFN block x, h, rstd = 544 plus gate, up = 1024; the
  // head's x, h, rstd, dlogits = 512 + 32 + 1024. A dense model keeps
  // nothing outside the allocator.
  Config c = dense_config();
  const double T = 32, d = 8, f = 16, V = 32;
  const double params = 4 * 1704;
  const double tracked_cache = 2 * (1376 + 1568) + 1568, untracked_cache = 0;
  CHECK(chunk_cost(c, serial_plan(c), 0).tracked.cache == 4 * tracked_cache);
  CHECK(chunk_cost(c, serial_plan(c), 0).untracked.cache == 4 * untracked_cache);
  const double cache = 4 * (tracked_cache + untracked_cache);
  CHECK(cache == 29824);
  // F: the logits; B: the incoming gradient, dx and the FFN's dh (3 T d),
  // more than the attention's 4 T d + dout, dq, dk, dv less the FFN cache
  // freed by then (1792 - 1568); a B that runs W at once has freed the
  // head's h and dlogits (256 + 1024) before
  const double t_f = 4 * T * V, t_b = 4 * 3 * T * d;
  CHECK(chunk_cost(c, serial_plan(c), 0).tracked.transient_f == t_f);
  CHECK(chunk_cost(c, serial_plan(c), 0).tracked.transient_b == t_b);
  CHECK(chunk_cost(c, serial_plan(c), 0).tracked.freed_early == 4 * (T * d + T * V));
  {
    // two stages of one layer: stage 0 keeps the output it sends (T d) until
    // the send is seen complete; each posts the next receives ahead (T d);
    // stage 1 allocates the gradient it sends back (T d) when B starts
    MeshPlan two = serial_plan(c);
    two.pp = 2;
    const ChunkCost s0 = chunk_cost(c, two, 0), s1 = chunk_cost(c, two, 1);
    CHECK(s0.tracked.cache == 4 * (1376 + 1568 + 256));
    CHECK(s0.tracked.transient_f == 4 * 256);
    CHECK(s0.tracked.transient_b == 4 * (256 + 768));
    CHECK(s1.tracked.cache == 4 * (1376 + 1568 + 1568));
    CHECK(s1.tracked.transient_f == 4 * (256 + 1024));
    CHECK(s1.tracked.transient_b == 4 * (256 + 256 + 768));
  }
  kernels::AttnShape probe;
  probe.D = 4;
  const double workspace =
      std::max({4 * 2 * T * f, double(kernels::attention_workspace_bytes(probe, true)),
                double(kernels::attention_workspace_bytes(probe, false))});
  for (auto [sched, inflight] : {std::pair{"1f1b", 1}, std::pair{"afab", 3}}) {
    MeshPlan p = serial_plan(c);
    p.microbatches = 3;
    const pp::Schedule s = pp::lower(pp::make_schedule(sched, 1, 3, 1));
    const MemoryEstimate m = memory_of_rank(c, p, 0, s);
    CHECK(m.params == params);
    CHECK(m.grads == params);
    CHECK(m.optimizer == 2 * params);
    // the peak comes at the last F: every cache held, and its temporaries
    CHECK(m.activations == inflight * cache + t_f);
    CHECK(m.comm_buffers == 0);
    CHECK(m.workspace == workspace);
    CHECK(m.untracked == 4 * inflight * untracked_cache);
    CHECK(m.total() == 4 * params + inflight * cache + t_f + workspace);
    CHECK(m.allocator() == m.total() - m.untracked);
  }
  // data parallel: the gradients are reduced in place in the stage's one
  // buffer, so the workspace is the kernels' alone
  MeshPlan dp2 = serial_plan(c);
  dp2.dp = 2;
  const pp::Schedule s = pp::lower(pp::make_schedule("1f1b", 1, 4, 1));
  CHECK(memory_of_rank(c, dp2, 0, s).workspace == workspace);
  // cp = 2 (T = 16, 8 tokens of a sample): each layer's ring keeps five
  // buffers of K and V of one sample's 8 tokens x Hkv*D = 4
  MeshPlan cp2 = serial_plan(c);
  cp2.cp = 2;
  CHECK(memory_of_rank(c, cp2, 0, s).comm_buffers == 4 * 2 * 5 * 2 * 8 * 4);
}

TEST_CASE("memory: bf16 keeps a copy of each GEMM weight and the native GEMM's buffers") {
  // train.precision = "bf16": 2 bytes per weight a GEMM reads (wq, wk, wv,
  // wo, the FFN's three, the head) with the parameters, or on the native
  // CPU path no copy and the weights packed, 4 bytes each outside the
  // allocator; the SwiGLU's scratch of 2.5 T x f floats (gate and up f32,
  // h bf16); the packing buffers in the workspace. Moments, gradients and
  // a single checkpoint's gathered copies stay the fp32 masters'.
  Config c = dense_config();
  c.model.ffn_hidden = 16384;  // the SwiGLU's scratch outweighs the attention's
  c.output.checkpoint_format = CheckpointFormat::single;
  const MeshPlan p = serial_plan(c);
  const pp::Schedule s = pp::lower(pp::make_schedule("1f1b", 1, 4, 1));
  const MemoryEstimate fp32 = memory_of_rank(c, p, 0, s);
  c.train.precision = Precision::bf16;
  const double d = 8, f = 16384, V = c.model.vocab_size, T = 2 * 16, layers = c.model.n_layers;
  const double gemm_weights = layers * (2 * 8 * d + 2 * 4 * d + 3 * d * f) + V * d;
  const double packing = double(kernels::gemm_bf16_buffer_bytes(int64_t(f), 0));
  const double packed =
      double(kernels::gemm_bf16_packed_weight_bytes(32, 32)) / 1024 * gemm_weights;
  CHECK(fp32.workspace == 4 * 2 * T * f);
  CHECK(fp32.packed_weights == 0);
  kernels::set_cpu_bf16_path("auto");
  const bool native = kernels::cpu_bf16_packs_weights();
  for (const std::string path : {"staged", "native"}) {
    if (path == "native" && !native) continue;  // no AVX512-BF16: staged only
    INFO("CPU bf16 path " << path);
    kernels::set_cpu_bf16_path(path);
    const MemoryEstimate bf16 = memory_of_rank(c, p, 0, s);
    const double copies = path == "native" ? 0 : 2 * gemm_weights;
    const double forms = copies == 0 ? packed : 0;
    CHECK(bf16.param_copies == copies);
    CHECK(bf16.params == fp32.params + copies);
    CHECK(bf16.grads == fp32.grads);
    CHECK(bf16.optimizer == fp32.optimizer);
    CHECK(bf16.activations < fp32.activations);  // bf16 activations (the case below)
    CHECK(bf16.workspace == 4 * 2.5 * T * f + packing);
    CHECK(bf16.packed_weights == forms);
    CHECK(bf16.untracked == fp32.untracked + packing + forms);
    CHECK(bf16.comm_buffers == fp32.comm_buffers);
    CHECK(bf16.total() == fp32.total() + copies + bf16.activations - fp32.activations +
                              bf16.workspace - fp32.workspace + forms);
  }
  // A run on another device keeps the copies whatever the CPU path (only
  // the CPU packs: PackedBf16Weight packs CPU tensors).
  for (const Backend b : {Backend::cuda, Backend::emulated}) {
    Config g = c;
    g.runtime.backend = b;
    const MemoryEstimate bf16 = memory_of_rank(g, p, 0, s);
    CHECK(bf16.param_copies == 2 * gemm_weights);
    CHECK(bf16.packed_weights == 0);
  }
  kernels::set_cpu_bf16_path("");
}

TEST_CASE("memory: bf16 stores the activations its GEMMs read in bf16") {
  // model::GemmPrecision::activation: under bf16, h1, q, k, v, o, the dense
  // FFN's h, gate and up, the experts' gate and up and the head's h are 2
  // bytes a value, and the MoE layer keeps a bf16 copy of its expert-side
  // input rows (2 bytes a value more); x, rstd, lse, the gradients, the
  // logits and the MoE layer's other tensors stay fp32. The cache and the
  // split backward's stash against fp32's, by hand (d=8, H=2, Hkv=1, D=4,
  // f=16, V=32, T=32, 2 layers: dense, then with moe_every=2 the second one
  // MoE, whose h does not change; its R = T k = 64 expert-side rows).
  for (int experts : {0, 4}) {
    Config c = dense_config();
    c.model.n_experts = experts;
    c.model.top_k = 2;
    c.model.moe_every = 2;
    const MeshPlan p = serial_plan(c);
    const ChunkCost fp32 = chunk_cost(c, p, 0);
    c.train.precision = Precision::bf16;
    const ChunkCost bf16 = chunk_cost(c, p, 0);
    const double T = 32, d = 8, f = 16, qkvo = 2 * T * 2 * 4 + 2 * T * 1 * 4;
    const double attn = T * d + qkvo, dense_ffn = T * d + 2 * T * f, head = T * d;
    const double R = T * 2, experts_ffn = 2 * R * f - R * d;  // halved gate, up; the bf16 rows
    const double halved =
        2 * attn + (experts ? 1 : 2) * dense_ffn + (experts ? experts_ffn : 0) + head;  // values
    CHECK(fp32.tracked.cache - bf16.tracked.cache == 2 * halved);
    // the stash: h1 and o per layer, and the head's h
    CHECK(fp32.tracked.stash - bf16.tracked.stash == 2 * (2 * (T * d + T * 2 * 4) + head));
    CHECK(fp32.tracked.freed_early - bf16.tracked.freed_early == 2 * head);
    CHECK(fp32.untracked.cache == bf16.untracked.cache);
  }
}

TEST_CASE("memory: the checkpoint at the run's end by format") {
  // A single file gathers AdamW's m and v of the rank's parameters (2 x
  // params, held once the activations are freed); a sharded checkpoint
  // copies nothing; an async one keeps a staging buffer of the rank's share
  // of parameters and moments (cut over dp x cp), at most
  // output.checkpoint_staging_mb, for the whole run.
  Config c = dense_config();
  c.model.vocab_size = 4096;  // parameters that outweigh the activations
  c.model.d_model = 64;
  MeshPlan p = serial_plan(c);
  p.dp = 2;
  const pp::Schedule s = pp::lower(pp::make_schedule("1f1b", 1, 4, 1));
  c.output.checkpoint_format = CheckpointFormat::single;
  const MemoryEstimate single = memory_of_rank(c, p, 0, s);
  c.output.checkpoint_format = CheckpointFormat::sharded;
  const MemoryEstimate sharded = memory_of_rank(c, p, 0, s);
  CHECK(single.activations == 2 * single.params);
  CHECK(sharded.activations < single.activations);
  CHECK(sharded.workspace == single.workspace);
  c.output.checkpoint_async = true;
  const MemoryEstimate async = memory_of_rank(c, p, 0, s);
  CHECK(async.workspace == sharded.workspace + 3 * sharded.params / 2);
  c.output.checkpoint_staging_mb = 1;  // smaller than the share
  REQUIRE(3 * sharded.params / 2 > 1048576.0);
  CHECK(memory_of_rank(c, p, 0, s).workspace == sharded.workspace + 1048576.0);
}

TEST_CASE("activation peak follows the order of F, B and W") {
  // one rank, two micro-batches: F0 F1 B0 B1 (W0 W1 when split); cache 10,
  // stash 4, F temporaries 1, B temporaries 2
  pp::Schedule s;
  s.pp = 1;
  s.vpp = 1;
  s.microbatches = 2;
  s.placement = pp::Placement::loop(1, 1);
  s.ranks = {{{0, pp::Op::F, 0}, {0, pp::Op::F, 1}, {0, pp::Op::B, 0}, {0, pp::Op::B, 1}}};
  const std::vector<ChunkMemory> m{{10, 4, 1, 2}};
  CHECK(activation_peak(s, 0, m) == 22);  // B0 with both caches held
  s.split_backward = true;
  s.ranks[0].push_back({0, pp::Op::W, 0});
  s.ranks[0].push_back({0, pp::Op::W, 1});
  CHECK(activation_peak(s, 0, m) == 22);
  // B0 before F1: the first cache has become the stash when F1 runs
  s.ranks = {{{0, pp::Op::F, 0},
              {0, pp::Op::B, 0},
              {0, pp::Op::F, 1},
              {0, pp::Op::B, 1},
              {0, pp::Op::W, 0},
              {0, pp::Op::W, 1}}};
  CHECK(activation_peak(s, 0, m) == 16);  // B1: stash 4 + cache 10 + 2
}

TEST_CASE("memory follows the schedule's placement of stages") {
  Config c = dense_config();
  c.model.n_layers = 4;
  MeshPlan p = serial_plan(c);
  p.pp = 2, p.vpp = 2;
  auto params_of = [&](int rank) { return memory_lower_bound(c, p, rank).params / 4; };
  p.schedule = PipelineSchedule::interleaved;  // loop: rank 0 holds stages 0 and 2
  CHECK(params_of(0) == chunk_cost(c, p, 0).params + chunk_cost(c, p, 2).params);
  p.schedule = PipelineSchedule::zb_v;  // V: rank 0 holds stages 0 and 3 (embedding and head)
  CHECK(params_of(0) == chunk_cost(c, p, 0).params + chunk_cost(c, p, 3).params);
  CHECK(params_of(1) == chunk_cost(c, p, 1).params + chunk_cost(c, p, 2).params);
  const Prediction pr = predict(c, p, ClusterShape{1, 2, 2}, unit_machine());
  CHECK(pr.memory_pp_rank == 0);
  CHECK(pr.step_time_s > 0);
}

TEST_CASE("a prediction prices each action at the machine's rates") {
  const Config c = dense_config();
  const MeshPlan p = serial_plan(c);
  const MachineProfile m = unit_machine();
  const ChunkCost cc = chunk_cost(c, p, 0);
  auto sec = [&](const Work& w) {
    return w.gemm_flops / 1e9 + w.attention_flops / 5e8 + w.memory_bytes / 2e9;
  };
  const Prediction pr = predict(c, p, ClusterShape{1, 1, 1}, m);
  CHECK(pr.t_f == Approx(sec(cc.f)));
  CHECK(pr.t_b == Approx(sec(cc.b)));
  CHECK(pr.t_w == Approx(sec(cc.w)));
  // one rank: the micro-batches back to back, then the optimizer (36 B per parameter)
  const double optimizer = 36 * 1704 / 2e9;
  CHECK(pr.step_time_s == Approx(4 * (pr.t_f + pr.t_b + pr.t_w) + optimizer));
  CHECK(pr.split.compute == Approx(4 * (pr.t_f + pr.t_b + pr.t_w)));
  CHECK(pr.split.bubble == Approx(0).margin(1e-12));
  CHECK(pr.tokens_per_s == Approx(4 * 2 * 16 / pr.step_time_s));
  // a model that reaches half the benchmark rates takes twice as long per action
  MachineProfile half = m;
  half.efficiency = 0.5;
  CHECK(predict(c, p, ClusterShape{1, 1, 1}, half).t_b == Approx(2 * pr.t_b));
  // two ranks sharing one core: each action keeps its own time (a waiting
  // rank yields its core), but the pipeline takes its compute over the core
  MachineProfile shared = m;
  shared.cores_per_node = 1;
  const Prediction alone = predict(c, p, ClusterShape{1, 1, 1}, shared);
  CHECK(alone.step_time_s == Approx(pr.step_time_s));
  MeshPlan two = p;
  two.dp = 2;
  two.microbatches = 2;
  const Prediction dp2 = predict(c, two, ClusterShape{1, 2, 2}, shared);
  const double per = pr.t_f + pr.t_b + pr.t_w;
  CHECK(dp2.t_f == Approx(pr.t_f));
  CHECK(dp2.split.cores == Approx(2 * per));  // 2 ranks x 2 micro-batches on one core, less 2 x per
  // after the pipeline every rank works at once: optimizer and the 6 agreements
  // (2 x log2(2) latencies each) at half speed
  CHECK(dp2.split.other == Approx(2 * (optimizer + 6 * 2 * 1e-6)));
  CHECK(dp2.step_time_s == Approx(4 * per + dp2.split.dp + dp2.split.other));
}

namespace {
// Seconds of F + B + W of virtual stage vs at unit_machine()'s rates.
double stage_seconds(const Config& c, const MeshPlan& p, int vs) {
  const ChunkCost cc = chunk_cost(c, p, vs);
  auto sec = [&](const Work& w) {
    return w.gemm_flops / 1e9 + w.attention_flops / 5e8 + w.memory_bytes / 2e9;
  };
  return sec(cc.f) + sec(cc.b) + sec(cc.w);
}
}  // namespace

TEST_CASE("without latency, 1F1B on two stages takes m x the slower stage + the other") {
  // Each stage's actions cost its own work: stage 1 (the head) is the
  // slower; stage 0 runs its first F before stage 1 can start and its last
  // B after stage 1 has ended, so the step is m s1 + s0 (the textbook
  // (m + p - 1) x per when the stages are equal).
  Config c = dense_config();
  c.model.n_layers = 4;
  MachineProfile m = unit_machine();
  m.nvlink = m.node = m.network = Link{1e30, 0};
  for (int micro : {2, 4, 8}) {
    MeshPlan p = serial_plan(c);
    p.pp = 2;
    p.microbatches = micro;
    const Prediction pr = predict(c, p, ClusterShape{1, 2, 2}, m);
    const double s0 = stage_seconds(c, p, 0), s1 = stage_seconds(c, p, 1);
    REQUIRE(s0 < s1);
    CHECK(pr.t_f + pr.t_b + pr.t_w == Approx(s1));
    const double most = std::max(chunk_cost(c, p, 0).params, chunk_cost(c, p, 1).params);
    const double optimizer = 36 * most / 2e9;  // the rank with the most parameters
    CHECK(pr.step_time_s == Approx(micro * s1 + s0 + optimizer));
    CHECK(pr.split.bubble == Approx(s0));
    CHECK(pr.peak_inflight == 2);
  }
}

TEST_CASE("parallel.pp_layout: each stage holds its layers, priced and simulated as laid out") {
  Config c = dense_config();
  c.model.n_layers = 6;
  c.model.vocab_size = 256;  // the head costs more than a layer
  MachineProfile m = unit_machine();
  m.nvlink = m.node = m.network = Link{1e30, 0};
  MeshPlan even = serial_plan(c);
  even.pp = 2;
  even.microbatches = 8;
  MeshPlan uneven = even;
  uneven.pp_layout = {4, 2};
  CHECK(chunk_cost(c, uneven, 0).layers == 4);
  CHECK(chunk_cost(c, uneven, 1).layers == 2);
  CHECK(chunk_cost(c, even, 0).layers == 3);
  // the layers' parameters follow them; the model's counts are the model's
  {
    Config with = c;
    with.parallel.pp = 2;
    with.parallel.pp_layout = {4, 2};
    model::ModelStage st(with, 0, 2, model::StageComms{});
    double numel = 0;
    for (Param* q : st.params()) numel += double(q->value.numel());
    CHECK(chunk_cost(c, uneven, 0).params == numel);
  }
  // the config's layout comes into the plan and back out of it
  Config laid = c;
  laid.parallel.pp = 2;
  laid.parallel.pp_layout = {4, 2};
  CHECK(mesh_plan_of(laid, 2).pp_layout == std::vector<int>{4, 2});
  CHECK(with_plan(c, uneven).parallel.pp_layout == std::vector<int>{4, 2});
  CHECK(uneven.str().find("layout=4,2") != std::string::npos);
  // 1F1B on two stages: m x the slower stage + the other (see above)
  for (const MeshPlan& p : {even, uneven}) {
    const Prediction pr = predict(c, p, ClusterShape{1, 2, 2}, m);
    const double s0 = stage_seconds(c, p, 0), s1 = stage_seconds(c, p, 1);
    const double most = std::max(chunk_cost(c, p, 0).params, chunk_cost(c, p, 1).params);
    CHECK(pr.step_time_s == Approx(8 * std::max(s0, s1) + std::min(s0, s1) + 36 * most / 2e9));
  }
  // moving a layer off the head's stage makes the step shorter; moving one
  // onto it, longer
  MeshPlan balanced = even, heavy = even;
  balanced.pp_layout = {4, 2};
  heavy.pp_layout = {2, 4};
  const double t_even = predict(c, even, ClusterShape{1, 2, 2}, m).step_time_s;
  CHECK(predict(c, heavy, ClusterShape{1, 2, 2}, m).step_time_s > t_even);
  CHECK(predict(c, balanced, ClusterShape{1, 2, 2}, m).step_time_s < t_even);
}

TEST_CASE("the gradient all-reduce runs at the link's collective rate where one is measured") {
  Config c = dense_config();
  MachineProfile m = unit_machine();
  m.nvlink = m.node = m.network = Link{1e8, 1e-6};
  MeshPlan p = serial_plan(c);
  p.dp = 4;
  const ClusterShape shape{1, 4, 4};
  const Prediction msg = predict(c, p, shape, m);
  const double bytes = 4 * chunk_cost(c, p, 0).params;
  CHECK(msg.dp_reduction_s == Approx(2.0 * 3 * 1e-6 + 2.0 * 3 / 4 * bytes / 1e8));
  // a measured bus bandwidth at a quarter of the message rate: the bytes'
  // share of the reduction takes four times as long, the latencies the same
  m.nvlink.collective_Bps = m.node.collective_Bps = m.network.collective_Bps = 0.25e8;
  const Prediction slow = predict(c, p, shape, m);
  CHECK(slow.dp_reduction_s == Approx(2.0 * 3 * 1e-6 + 2.0 * 3 / 4 * bytes / 0.25e8));
  CHECK(slow.step_time_s - msg.step_time_s ==
        Approx(slow.dp_reduction_s - msg.dp_reduction_s).epsilon(1e-9));
  // it does not touch what is not a reduction (one rank: no all-reduce)
  const MeshPlan one = serial_plan(c);
  MachineProfile plain = m;
  plain.nvlink.collective_Bps = plain.node.collective_Bps = plain.network.collective_Bps = 0;
  CHECK(predict(c, one, ClusterShape{1, 1, 1}, m).step_time_s ==
        predict(c, one, ClusterShape{1, 1, 1}, plain).step_time_s);
}

TEST_CASE(
    "train.grad_bucket_mb: the reduction hides behind the last backward, never its last bucket") {
  Config c = dense_config();
  c.model.n_layers = 4;
  MachineProfile m = unit_machine();
  m.nvlink = m.node = m.network = Link{1e7, 1e-6};  // a slow link: the reduction matters
  MeshPlan p = serial_plan(c);
  p.dp = 4;
  const ClusterShape shape{1, 4, 4};
  const Prediction after = predict(c, p, shape, m);
  CHECK(after.split.dp == Approx(after.dp_reduction_s));
  CHECK(after.split.dp > 0);
  const double grad_bytes = 4 * chunk_cost(c, p, 0).params;
  const double backward = after.t_b + after.t_w;  // one rank, one chunk
  for (double mb : {1e-3, 4e-3, 1.0}) {
    MeshPlan b = p;
    b.grad_bucket_mb = mb;
    const Prediction pr = predict(c, b, shape, m);
    const double buckets = std::max(1.0, std::ceil(grad_bytes / (mb * 1048576.0)));
    CHECK(pr.dp_reduction_s == Approx(after.dp_reduction_s));
    const double exposed = std::max(after.split.dp / buckets, after.split.dp - backward);
    CHECK(pr.split.dp == Approx(exposed));
    CHECK(pr.step_time_s == Approx(after.step_time_s - (after.split.dp - exposed)));
  }
  // one bucket holds every gradient: nothing hides
  MeshPlan one = p;
  one.grad_bucket_mb = 1.0;
  CHECK(predict(c, one, shape, m).split.dp == Approx(after.split.dp));
  // more ranks than cores: the reduction's copies take the backward's cores
  MachineProfile shared = m;
  shared.cores_per_node = 2;
  MeshPlan small = p;
  small.grad_bucket_mb = 1e-3;
  const Prediction s0 = predict(c, p, shape, shared), s1 = predict(c, small, shape, shared);
  CHECK(s1.split.dp == Approx(s0.split.dp));
  CHECK(s1.step_time_s == Approx(s0.step_time_s));
  // the config's key reaches the plan
  Config keyed = c;
  keyed.train.grad_bucket_mb = 2;
  CHECK(mesh_plan_of(keyed, 1).grad_bucket_mb == 2);
}

TEST_CASE("a fixed cost per layer and a measured update rate add to the step") {
  const Config c = dense_config();  // 2 layers, 1704 parameters, 4 micro-batches
  const MeshPlan p = serial_plan(c);
  MachineProfile m = unit_machine();
  const Prediction base = predict(c, p, ClusterShape{1, 1, 1}, m);
  m.layer_overhead_s = 3e-6;
  m.optimizer_s_per_param = 2e-9;
  const Prediction pr = predict(c, p, ClusterShape{1, 1, 1}, m);
  CHECK(pr.t_f == Approx(base.t_f + 2 * 1e-6));  // a third of 2 layers x 3 us
  CHECK(pr.t_b == Approx(base.t_b + 2 * 2e-6));
  CHECK(pr.t_w == Approx(base.t_w));
  CHECK(pr.split.other == Approx(1704 * 2e-9));  // one rank: no agreements
  CHECK(pr.step_time_s == Approx(4 * (pr.t_f + pr.t_b + pr.t_w) + 1704 * 2e-9));
}

TEST_CASE("recompute: what each mode keeps, recomputes and holds in B, by hand") {
  // dense_config: T = 32, d = 8, two layers on one stage; in floats, a layer
  // keeps 1376 (attention) + 1568 (FFN), the head 1568; Td = 256
  const Config c = dense_config();
  const MeshPlan none = serial_plan(c);
  const ChunkCost base = chunk_cost(c, none, 0);
  const double Td = 256, dqkv = 32 * (2 * 8 + 2 * 4);
  SECTION("full: a layer keeps its input; B reruns its forward") {
    MeshPlan p = none;
    p.recompute = Recompute::full;
    const ChunkCost cc = chunk_cost(c, p, 0);
    CHECK(cc.tracked.cache == 4 * (2 * Td + 1568));
    // the layers' forward once more in B: everything F does but the embedding and head
    const ChunkCost one = chunk_cost(c, none, 0);
    const double head_f = 2 * 32 * 8 * 32, embed_mem = 4 * 2 * Td,
                 head_mem = 4 * (2 * Td + 3 * 32 * 32);
    CHECK(cc.b.gemm_flops == one.b.gemm_flops + one.f.gemm_flops - head_f);
    CHECK(cc.b.attention_flops == one.b.attention_flops + one.f.attention_flops);
    CHECK(cc.b.memory_bytes == one.b.memory_bytes + one.f.memory_bytes - embed_mem - head_mem);
    CHECK(cc.f.gemm_flops == one.f.gemm_flops);
    CHECK(cc.reruns == 2);
    // B of the last layer: its whole cache but the input comes back (1120 +
    // 1568), then the FFN phase's 3 Td
    CHECK(cc.tracked.transient_b == 4 * (1120 + 1568 + 3 * Td));
    // F: the last layer's whole cache until its F ends, more than the logits (1024)
    CHECK(cc.tracked.transient_f == 4 * (1120 + 1568));
    CHECK(cc.tracked.stash == base.tracked.stash);  // W needs the same inputs
  }
  SECTION("selective: the two RMSNorm outputs and the SwiGLU gate and up per dense layer") {
    MeshPlan p = none;
    p.recompute = Recompute::selective;
    const ChunkCost cc = chunk_cost(c, p, 0);
    const double gate_up = 2 * 32 * 16;  // T x f each
    CHECK(cc.tracked.cache == base.tracked.cache - 4 * 2 * (2 * Td + gate_up));
    // per layer: the norms read x and write h (2 x 2 Td), the SwiGLU forward
    // once more (its 3 GEMMs, the gating pass over 3 T f, its input and output)
    CHECK(cc.b.memory_bytes == base.b.memory_bytes + 2 * 4 * (2 * 2 * Td + 3 * 32 * 16 + 2 * Td));
    CHECK(cc.b.gemm_flops == base.b.gemm_flops + 2 * 6 * 32 * 8 * 16);
    CHECK(cc.f.gemm_flops == base.f.gemm_flops);
    CHECK(cc.reruns == 0);
    // B of the last layer: h1, h, gate and up again, then the FFN phase's 3 Td
    CHECK(cc.tracked.transient_b == 4 * (2 * Td + gate_up + 3 * Td));
  }
  SECTION("selective on MoE layers: the experts' gate and up, R x moe_ffn_hidden each") {
    Config m = c;
    m.model.n_experts = 4;
    m.model.top_k = 2;
    m.model.moe_ffn_hidden = 24;  // not ffn_hidden (16): the experts' own size
    const MeshPlan plain_plan = serial_plan(m);
    const ChunkCost plain = chunk_cost(m, plain_plan, 0);
    MeshPlan p = plain_plan;
    p.recompute = Recompute::selective;
    const ChunkCost cc = chunk_cost(m, p, 0);
    const double R = 32 * 2, fe = 24;  // one rank: every copy of T k is local
    CHECK(cc.tracked.cache == plain.tracked.cache - 4 * 2 * (2 * Td + 2 * R * fe));
    CHECK(cc.b.gemm_flops == plain.b.gemm_flops + 2 * 6 * R * 8 * fe);
    CHECK(cc.b.memory_bytes ==
          plain.b.memory_bytes + 2 * 4 * (2 * 2 * Td + 3 * R * fe + 2 * R * 8));
    CHECK(cc.f.gemm_flops == plain.f.gemm_flops);
    CHECK(cc.moe_reruns == 0);
  }
  SECTION("recompute_layers = 1: only the first layer; B's peak is the last layer's, as none") {
    MeshPlan p = none;
    p.recompute = Recompute::full;
    p.recompute_layers = 1;
    const ChunkCost cc = chunk_cost(c, p, 0);
    CHECK(cc.tracked.cache == 4 * (Td + 1376 + 1568 + 1568));
    CHECK(cc.reruns == 1);
    CHECK(cc.tracked.transient_b == base.tracked.transient_b);
    CHECK(base.tracked.transient_b == 4 * 3 * Td);
    CHECK(4 * (4 * Td + dqkv - 1568) < base.tracked.transient_b);  // the attention phase
  }
  SECTION("full under cp and ep: the rerun forward exchanges again") {
    Config m = c;
    m.model.n_experts = 4;
    m.model.top_k = 2;
    MeshPlan p = serial_plan(m);
    p.pp = 2, p.cp = 2, p.ep = 2;
    const ChunkCost plain = chunk_cost(m, p, 0);
    p.recompute = Recompute::full;
    const ChunkCost cc = chunk_cost(m, p, 0);
    CHECK(cc.b_comm.cp_bytes == plain.b_comm.cp_bytes + plain.f_comm.cp_bytes);
    CHECK(cc.b_comm.cp_steps == plain.b_comm.cp_steps + plain.f_comm.cp_steps);
    CHECK(cc.b_comm.cp_tail_bytes == plain.b_comm.cp_tail_bytes);
    CHECK(cc.moe_reruns == plain.moe_layers);
    CHECK(cc.b_comm.ep_bytes == plain.b_comm.ep_bytes + plain.f_comm.ep_bytes);
    CHECK(cc.b_comm.ep_exchanges == 2 * plain.f_comm.ep_exchanges);
    // the MoE layer's host vectors come back for its B too
    CHECK(cc.untracked.cache == 0);
    CHECK(cc.untracked.transient_b == plain.untracked.cache);
  }
}

TEST_CASE("sharded optimizer: AdamW state over the replicas, the update over the shard") {
  Config c = dense_config();
  c.model.n_experts = 4;
  c.model.top_k = 2;
  MeshPlan p = serial_plan(c);
  p.dp = 2, p.cp = 2, p.ep = 2;
  const pp::Schedule s = pp::lower(pp::make_schedule("1f1b", 1, 4, 1));
  const MemoryEstimate whole = memory_of_rank(c, p, 0, s);
  const ChunkCost cc = chunk_cost(c, p, 0);
  p.sharding = OptimizerSharding::dp;
  const MemoryEstimate sharded = memory_of_rank(c, p, 0, s);
  const double dense = 4 * (cc.params - cc.expert_params), expert = 4 * cc.expert_params;
  CHECK(whole.optimizer == 2 * (dense + expert));
  // dense over dp x cp = 4 ranks, experts over their (dp x cp) / ep = 2 replicas
  CHECK(sharded.optimizer == Approx(2 * (dense / 4 + expert / 2)));
  CHECK(sharded.params == whole.params);
  CHECK(sharded.grads == whole.grads);
  CHECK(sharded.activations == whole.activations);
  // the same communication, a quarter (and a half) of the update
  MachineProfile m = unit_machine();
  m.optimizer_s_per_param = 1e-3;
  const ClusterShape shape{1, 4, 4};
  MeshPlan q = serial_plan(c);
  q.dp = 4;
  const Prediction a = predict(c, q, shape, m);
  q.sharding = OptimizerSharding::dp;
  const Prediction b = predict(c, q, shape, m);
  CHECK(b.split.dp == a.split.dp);
  const double params = chunk_cost(c, q, 0).params;
  CHECK(a.split.other - b.split.other == Approx(1e-3 * params * 3 / 4));
}

TEST_CASE("a gradient all-reduce across nodes runs a ring per NIC (rails)") {
  // dp = 16 over 2 nodes of 8: 8 of the group's ranks per node; 4-byte
  // gradients of the whole model
  const Config c = dense_config();
  MeshPlan p = serial_plan(c);
  p.dp = 16;
  const ClusterShape two{2, 8, 8};
  MachineProfile m = unit_machine();
  m.network = Link{1e8, 0};
  m.nvlink = m.node = Link{1e10, 0};
  const double bytes = 4 * chunk_cost(c, p, 0).params, ring = 2.0 * 15 / 16 * bytes;
  CHECK(predict(c, p, two, m).split.dp == Approx(ring / 1e8));  // one rank's share
  m.network_rails = 8;
  // 1/8 of each ring's bytes cross on each of 8 NICs; 7/8 stay on NVLink
  CHECK(predict(c, p, two, m).split.dp == Approx(ring / (8 * 1e8)));
  m.network_rails = 4;  // fewer NICs than ranks on a node
  CHECK(predict(c, p, two, m).split.dp == Approx(ring / (4 * 1e8)));
  m.network_rails = 8;
  m.nvlink = m.node = Link{2e8, 0};  // inside the node is now the slower part
  CHECK(predict(c, p, two, m).split.dp == Approx(ring * 7 / (8 * 2e8)));
  // inside one node the rails change nothing
  MeshPlan q = p;
  q.dp = 8;
  const ClusterShape one{1, 8, 8};
  MachineProfile single = m;
  single.network_rails = 1;
  CHECK(predict(c, q, one, m).split.dp == predict(c, q, one, single).split.dp);
}

TEST_CASE("the step's small all-reduces: a measured round where the profile has one") {
  const Config c = dense_config();
  MeshPlan p = serial_plan(c);
  p.dp = 4;
  const ClusterShape shape{1, 4, 4};
  MachineProfile m = unit_machine();  // latency 1 us
  const double by_latency = predict(c, p, shape, m).split.other;
  m.collective_round_s = 1e-3;
  // 6 agreements (no MoE layer), ceil(log2 4) = 2 rounds each: 1 ms instead of 2 us per round
  CHECK(predict(c, p, shape, m).split.other - by_latency == Approx(6 * 2 * (1e-3 - 2e-6)));
}

TEST_CASE("dualpipev's overlapped slots hide EP exchange time in the prediction") {
  Config c = dense_config();
  c.model.n_experts = 4;
  c.model.top_k = 2;
  c.model.n_layers = 4;
  c.data.num_microbatches = 8;
  MeshPlan p = mesh_plan_of(c, 4);
  p.pp = 2, p.vpp = 2, p.cp = 1, p.ep = 2, p.dp = 2, p.microbatches = 8;
  p.schedule = PipelineSchedule::dualpipev;
  const ClusterShape one_node{1, 4, 4};
  MachineProfile m = unit_machine();
  m.nvlink = m.node = m.network = Link{1e7, 1e-4};  // a slow link: the exchange matters
  const Prediction on = predict(c, p, one_node, m);
  c.runtime.ep_overlap = false;
  const Prediction off = predict(c, p, one_node, m);
  CHECK(off.ep_hidden_s == 0);
  REQUIRE(on.ep_hidden_s > 0);
  // the hidden time comes off the step, and off the exposed ep share
  CHECK(off.step_time_s - on.step_time_s == Approx(on.ep_hidden_s));
  CHECK(off.split.ep - on.split.ep == Approx(on.ep_hidden_s));
  // at most what the slots' exchanges take: each F or B of the slowest
  // stage once per micro-batch and chunk
  CHECK(on.ep_hidden_s <= p.microbatches * p.vpp * (on.t_f + on.t_b));
  // a schedule without overlapped slots hides nothing
  c.runtime.ep_overlap = true;
  p.schedule = PipelineSchedule::zb_v;
  CHECK(predict(c, p, one_node, m).ep_hidden_s == 0);
}
