// Profiler sink's Recorder (see core/profiler.hpp).
#include "trident/core/profiler.hpp"

#include <algorithm>

namespace trident::prof {

void Recorder::span(const Span& s) {
  seconds_[s.kind] += s.seconds();
  if (keep_spans_) spans_.push_back(s);
}

void Recorder::peak(const char* counter, double value) {
  auto [it, fresh] = counters_.try_emplace(counter, value);
  if (!fresh) it->second = std::max(it->second, value);
}

double Recorder::seconds(const std::string& kind) const {
  auto it = seconds_.find(kind);
  return it == seconds_.end() ? 0.0 : it->second;
}

double Recorder::counter(const std::string& name) const {
  auto it = counters_.find(name);
  return it == counters_.end() ? 0.0 : it->second;
}

void Recorder::clear() {
  spans_.clear();
  seconds_.clear();
  counters_.clear();
}

}  // namespace trident::prof
