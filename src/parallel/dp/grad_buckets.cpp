// Bucketed gradient reduction overlapped with the backward (see
// parallel/dp/grad_buckets.hpp).
#include "trident/parallel/dp/grad_buckets.hpp"

#include <algorithm>
#include <string>

#include "trident/core/error.hpp"

namespace trident::dp {

GradBuckets::GradBuckets(const ParamStore& store, const Sharding& s, Communicator* dpcp,
                         Communicator* expert_replica, double bucket_mb, int microbatches,
                         BeforeReduce before_reduce)
    : store_(store),
      sharding_(s),
      group_{dpcp, expert_replica, nullptr},
      microbatches_(microbatches),
      before_reduce_(std::move(before_reduce)) {
  TRIDENT_CHECK(bucket_mb > 0 && microbatches > 0,
                "GradBuckets: bucket size and micro-batches must be positive");
  const auto cap = int64_t(bucket_mb * 1024.0 * 1024.0 / sizeof(float));
  for (GradReduce kind : {GradReduce::dense, GradReduce::expert}) {
    Communicator* g = group_[size_t(kind)];
    if (!g || g->size() == 1) continue;
    const ParamStore::Range full = store.range(kind);
    std::vector<ParamStore::Entry> entries;
    for (const auto& e : store.entries())
      if (e.param->reduce == kind) entries.push_back(e);
    if (entries.empty()) continue;
    // From the range's end (padding included) towards its begin: the order
    // in which the backward completes the stage's parameters.
    Bucket b;
    b.kind = kind;
    b.range.end = full.end;
    for (size_t i = entries.size(); i-- > 0;) {
      b.params.push_back(entries[i].param);
      b.range.begin = i == 0 ? full.begin : entries[i].offset;
      if (i == 0 || b.range.size() >= cap) {
        buckets_.push_back(std::move(b));
        b = Bucket{};
        b.kind = kind;
        b.range.end = entries[i].offset;
      }
    }
  }
  for (size_t i = 0; i < buckets_.size(); ++i)
    for (const Param* p : buckets_[i].params) bucket_of_[p] = i;
  begin_step();
}

void GradBuckets::begin_step() {
  for (Bucket& b : buckets_) {
    TRIDENT_CHECK(b.requests.empty(), "GradBuckets: a step began before the last one finished");
    b.pending = int64_t(b.params.size()) * microbatches_;
    b.posted = false;
  }
}

void GradBuckets::ready(const std::vector<Param*>& ps) {
  std::vector<size_t> now;
  for (const Param* p : ps) {
    const auto it = bucket_of_.find(p);
    if (it == bucket_of_.end()) continue;  // not reduced, or a group of one
    Bucket& b = buckets_[it->second];
    TRIDENT_CHECK(b.pending > 0,
                  "GradBuckets: " + p->name + " reported more often than there are micro-batches");
    if (--b.pending == 0) now.push_back(it->second);
  }
  // Several buckets complete together: post them in one order on every rank.
  std::sort(now.begin(), now.end());
  for (size_t i : now) post(buckets_[i]);
  progress();
}

void GradBuckets::post(Bucket& b) {
  if (b.posted) return;
  b.posted = true;
  if (before_reduce_) before_reduce_(b.params);
  Communicator* g = group_[size_t(b.kind)];
  Tensor all = store_.grads();  // a handle on the store's buffer
  float* grads = all.ptr();
  Communicator* shard_group = sharding_.group[size_t(b.kind)];
  if (!shard_group) {
    b.requests.push_back(
        g->iallreduce_sum(grads + b.range.begin, size_t(b.range.size()), SumOrder::rank));
    return;
  }
  // Owner r holds elements [full.begin + r*n, full.begin + (r+1)*n); the
  // bucket overlaps consecutive owners, each receiving its part's sum.
  const ParamStore::Range full = store_.range(b.kind);
  const int64_t n = full.size() / shard_group->size();
  for (int r = 0; r < shard_group->size(); ++r) {
    const int64_t lo = std::max(b.range.begin, full.begin + r * n);
    const int64_t hi = std::min(b.range.end, full.begin + (r + 1) * n);
    if (lo < hi)
      b.requests.push_back(
          shard_group->ireduce_sum(grads + lo, size_t(hi - lo), r, SumOrder::rank));
  }
}

void GradBuckets::progress() {
  for (Bucket& b : buckets_)
    for (Request& r : b.requests) group_[size_t(b.kind)]->test(r);
}

void GradBuckets::finish() {
  for (Bucket& b : buckets_) post(b);
  for (Bucket& b : buckets_) {
    for (Request& r : b.requests) group_[size_t(b.kind)]->wait(r);
    b.requests.clear();
  }
}

}  // namespace trident::dp
