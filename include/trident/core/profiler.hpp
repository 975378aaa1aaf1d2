// Profiler sink: where layers report what they did, instead of keeping
// counters and benchmark hooks of their own.
//
// A span is one timed piece of work (kind, pipeline stage, model chunk,
// micro-batch, begin and end on now_s()'s clock); a counter is a named
// amount (bytes, FLOPs, seconds) summed over reports, or a peak. A layer
// that is given a Sink reports to it and reads no clock when it has none.
// The training loop turns spans into /timeline/events; benchmarks read
// totals and per-step spans from a Recorder. GPU spans will come from CUDA
// events through the same calls.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace trident::prof {

struct Span {
  const char* kind = "";                        // a string literal: "F", "ring.forward", ...
  int stage = -1, chunk = -1, microbatch = -1;  // -1: not applicable
  double t_begin_s = 0, t_end_s = 0;
  double seconds() const { return t_end_s - t_begin_s; }
};

class Sink {
 public:
  virtual ~Sink() = default;
  // Around a span's work, outside its clock: a benchmark may make ranks take
  // turns here (with more ranks than cores each span then runs on a free core).
  virtual void enter(const char* kind) {}
  virtual void leave(const char* kind) {}
  virtual void span(const Span& s) = 0;
  virtual void add(const char* counter, double amount) = 0;  // summed
  virtual void peak(const char* counter, double value) = 0;  // the largest kept
};

// Keeps per-kind span totals and the counters, and (keep_spans) every span in
// report order.
class Recorder : public Sink {
 public:
  explicit Recorder(bool keep_spans = true) : keep_spans_(keep_spans) {}
  void span(const Span& s) override;
  void add(const char* counter, double amount) override { counters_[counter] += amount; }
  void peak(const char* counter, double value) override;

  // Seconds in spans of `kind` since the last clear().
  double seconds(const std::string& kind) const;
  // A counter's sum (or peak) since the last clear(); 0 if never reported.
  double counter(const std::string& name) const;
  const std::vector<Span>& spans() const { return spans_; }
  void clear();

 private:
  bool keep_spans_;
  std::vector<Span> spans_;
  std::map<std::string, double> seconds_, counters_;
};

}  // namespace trident::prof
