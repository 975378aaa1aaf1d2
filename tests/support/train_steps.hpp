// Training a Trainer for N steps in a test and keeping what the tests
// compare (the loss, the gradient norm, the bytes sent under "cp"), and the
// TrainComms of a mesh's communicators (train/run.hpp's).
#pragma once
#include <vector>

#include "trident/topo/topology.hpp"
#include "trident/train/run.hpp"
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

// The groups of a mesh as a Trainer takes them: train::run's own.
using train::train_comms;

}  // namespace trident::testing
