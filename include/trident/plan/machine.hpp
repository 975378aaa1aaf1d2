// Machine profile: what one device (or one CPU rank) of a machine computes per
// second and how fast its links carry bytes, the numbers that turn the cost
// model's FLOPs and bytes into seconds.
//
// A profile is a TOML file (share/trident/machines/*.toml, or written by
// `trident plan --calibrate`); share/trident/planner.md lists its keys. Rates
// are per device running alone; a CPU node whose ranks outnumber its cores
// (cores_per_node > 0) shares the cores, which slows every rank by
// ranks_per_node / (cores_per_node x time_slice_efficiency).
#pragma once
#include <string>

namespace trident::plan {

// A link class: how two ranks of a group reach each other.
enum class LinkClass { nvlink, node, network };  // same NVLink domain, same node, across nodes
const char* link_class_name(LinkClass c);

struct Link {
  double bandwidth_Bps = 0;  // bytes per second, one direction, one rank's share
  double latency_s = 0;      // per message
  // An all-reduce's bus bandwidth (nccl-tests' busbw) at the size of the
  // step's gradient reduction, where it differs from a message's rate (the
  // reduction's arithmetic, buffers past the caches); 0: bandwidth_Bps.
  double collective_Bps = 0;
  double reduction_Bps() const { return collective_Bps > 0 ? collective_Bps : bandwidth_Bps; }
  double seconds(double bytes, int messages = 1) const {
    return messages * latency_s + bytes / bandwidth_Bps;
  }
};

struct MachineProfile {
  std::string name;
  std::string source;       // where the figures come from (published, calibrated on ...)
  double memory_bytes = 0;  // per device; the default limit of --memory-gb
  int cores_per_node = 0;   // 0: one device per rank, never oversubscribed
  // Share of a core that a rank waiting for a message still takes when the
  // ranks outnumber the cores (its waits poll between short sleeps);
  // calibration measures it. 0: waiting is free.
  double wait_core_share = 0;
  // Share of their rate the cores keep when more ranks than cores take turns
  // on them (each switch refills caches); calibration measures it. 1: none lost.
  double time_slice_efficiency = 1;
  double gemm_flops = 0;       // dense matrix products, FLOP/s
  double attention_flops = 0;  // attention core (QK^T, softmax, PV), FLOP/s
  double memory_Bps = 0;       // memory-bound ops, bytes read + written per second
  double peak_flops = 0;  // the datasheet's dense peak (for model FLOP utilisation); 0: unknown
  // Share of the rates above that a model's actions reach (allocation,
  // copies and small kernels included); 1: exactly the rates. Calibration
  // measures it on the config's own layers.
  double efficiency = 1;
  Link nvlink, node, network;
  // NICs per node that a collective's rings use at once (NCCL runs a ring
  // per NIC, each crossing the network on its own rail): a collective whose
  // group holds g ranks of each node crosses on min(g, rails) of them. 1:
  // every byte through one rank's share, as a point-to-point transfer.
  double network_rails = 1;
  // Share of a ring step's attention that its K/V transfer can hide behind
  // (the transfer's kernels and the attention share the device); 1: all.
  double ring_overlap = 1;
  double step_overhead_s = 0;  // fixed cost of a step (launches, bookkeeping)
  // Seconds per round (ceil(log2 ranks) rounds) of one of the step's small
  // all-reduces, all ranks in it, divided by the calibration's
  // oversubscription (the prediction multiplies its own back in); 0: two
  // latencies of the world's link per round.
  double collective_round_s = 0;
  // What one blocking exchange costs beyond its bytes when the ranks compute
  // between exchanges (the wait for the slowest peer, a handshake that runs
  // once both sides are in the library, a peer's turn on shared cores):
  // seconds per ring step (the CP ring's K/V and dK/dV steps) and per
  // all-to-all call (Ulysses, the MoE exchange), divided by the
  // calibration's oversubscription like collective_round_s. Calibration
  // measures both; 0: the links' latencies only.
  double ring_step_s = 0;
  double alltoall_s = 0;
  // Fixed seconds per layer and micro-batch of a forward and backward beyond
  // their work at the rates (kernel calls, allocations); calibration fits it
  // from two micro-batch sizes.
  double layer_overhead_s = 0;
  // Seconds per parameter of the step's update (gradient norm and AdamW),
  // with every rank of a node updating at once, as a mesh's ranks do;
  // 0: 36 bytes per parameter at memory_Bps.
  double optimizer_s_per_param = 0;
  // Tokens per micro-batch and rank the efficiency was measured at (0:
  // unknown); the search prefers tied meshes nearest to it.
  double calibrated_tokens = 0;

  const Link& link(LinkClass c) const;
  // How much slower each rank runs when ranks_per_node ranks, all with work,
  // share the cores.
  double oversubscription(int ranks_per_node) const;
};

// Reads a profile; throws InputError with one line "FILE:LINE: key: rule"
// (missing key, unknown key, wrong type, value not > 0).
MachineProfile load_machine(const std::string& path);
MachineProfile parse_machine_text(const std::string& toml_text, const std::string& source_name);
// TOML text that parse_machine_text() reads back to an equal profile.
std::string machine_to_toml(const MachineProfile& m);

}  // namespace trident::plan
