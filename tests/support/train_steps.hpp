// Training a Trainer for N steps in a test and keeping what the tests
// compare (the loss, the gradient norm, the bytes sent under "cp"), and the
// TrainComms of a mesh's communicators.
#pragma once
#include <vector>

#include "trident/topo/topology.hpp"
#include "trident/train/trainer.hpp"

namespace trident::testing {

struct Curve {
  std::vector<double> loss, norm, cp_bytes;  // one per step
};

// Steps 0 .. steps-1 of `t`.
inline Curve train_steps(train::Trainer& t, int steps) {
  Curve c;
  for (int s = 0; s < steps; ++s) {
    const train::StepResult r = t.train_step(s);
    c.loss.push_back(r.metrics.loss);
    c.norm.push_back(r.metrics.grad_norm);
    c.cp_bytes.push_back(r.comm_bytes[size_t(CommKind::cp)]);
  }
  return c;
}

// The groups of `c` as a Trainer takes them (this rank's pp and dp
// coordinates with them; local_rank stays 0: the tests run on the host).
inline train::TrainComms train_comms(const Communicators& c) {
  return train::TrainComms{c.world.get(),          c.pp.get(), c.cp.get(), c.ep.get(), c.dpcp.get(),
                           c.expert_replica.get(), c.me.pp,    c.mesh.pp,  c.me.dp,    c.mesh.dp};
}

}  // namespace trident::testing
