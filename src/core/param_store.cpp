// The parameters of a stage in one allocation (see core/param_store.hpp).
#include "trident/core/param_store.hpp"

#include <set>
#include <string>

#include "trident/core/allocator.hpp"
#include "trident/core/error.hpp"

namespace trident {

ParamStore::ParamStore(const std::vector<Param*>& params, Allocator& alloc, const CopyFn& copy,
                       const FillFn& fill, std::array<int64_t, 3> range_multiple) {
  std::set<const Param*> seen;
  for (const Param* p : params) {
    TRIDENT_CHECK(p != nullptr, "ParamStore: a null parameter");
    TRIDENT_CHECK(seen.insert(p).second, "ParamStore: parameter " + p->name + " listed twice");
    TRIDENT_CHECK(p->value.dtype() == DType::f32 && p->grad.numel() == p->value.numel(),
                  "ParamStore: parameter " + p->name + " is not an f32 value with its gradient");
  }
  // No padding between parameters: a kind's range holds exactly the elements
  // (and so the reduction sums) that packing that kind in parameter order gave.
  for (GradReduce kind : {GradReduce::dense, GradReduce::expert, GradReduce::none}) {
    const int64_t multiple = range_multiple[size_t(kind)];
    TRIDENT_CHECK(multiple >= 1, "ParamStore: range multiple " + std::to_string(multiple));
    Range& r = ranges_[size_t(kind)];
    r.begin = numel_;
    for (Param* p : params)
      if (p->reduce == kind) {
        index_[p] = entries_.size();
        entries_.push_back(Entry{p, numel_, p->value.numel()});
        numel_ += p->value.numel();
      }
    numel_ = r.begin + (numel_ - r.begin + multiple - 1) / multiple * multiple;
    r.end = numel_;
  }
  // The construction-time gradients are zeros that nobody has read: dropping
  // them first keeps the stage's peak at what it was before the move.
  for (Param* p : params) p->grad = Tensor();
  {
    MemKindScope kind(MemKind::parameters);
    values_ = Tensor::empty({numel_}, alloc);
  }
  fill(values_, 0.0f);  // the padding
  for (const Entry& e : entries_) {
    Tensor v = values_.view(e.offset, e.param->value.shape());
    copy(v, e.param->value);
    e.param->value = v;  // releases the parameter's own value tensor
  }
  {
    MemKindScope kind(MemKind::gradients);
    grads_ = Tensor::empty({numel_}, alloc);
  }
  fill(grads_, 0.0f);
  for (const Entry& e : entries_) e.param->grad = grads_.view(e.offset, e.param->value.shape());
}

std::vector<Param*> ParamStore::params() const {
  std::vector<Param*> ps;
  ps.reserve(entries_.size());
  for (const Entry& e : entries_) ps.push_back(e.param);
  return ps;
}

const ParamStore::Entry& ParamStore::entry(const Param* p) const {
  const auto it = index_.find(p);
  TRIDENT_CHECK(
      it != index_.end(),
      "ParamStore: parameter " + (p ? p->name : std::string("(null)")) + " is not in the store");
  return entries_[it->second];
}

Tensor ParamStore::values(GradReduce kind) const {
  const Range r = range(kind);
  return r.size() > 0 ? values_.view(r.begin, {r.size()}) : Tensor();
}

Tensor ParamStore::grads(GradReduce kind) const {
  const Range r = range(kind);
  return r.size() > 0 ? grads_.view(r.begin, {r.size()}) : Tensor();
}

}  // namespace trident
