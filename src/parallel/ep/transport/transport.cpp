// make_transport: runtime.ep_transport to a Transport, once per dispatcher.
#include "trident/parallel/ep/transport.hpp"

#include "../row_views.hpp"
#include "trident/comm/shared_window.hpp"
#include "trident/core/error.hpp"
#include "trident/core/overlap.hpp"
#include "trident/kernels/functional.hpp"
#include "trident/kernels/tensor_ops.hpp"

namespace trident::ep {

void gather_send_rows(const kernels::Ctx& ctx, const float* x, int64_t T, const int64_t* index,
                      int64_t n, float* out, int64_t d) {
  kernels::gather_rows(ctx, row_view(ctx, x, T, d), view_of(ctx, index, {n}, DType::i64),
                       row_view(ctx, out, n, d));
}

void copy_floats(const kernels::Ctx& ctx, const float* from, float* to, int64_t n) {
  if (n <= 0 || from == to) return;
  Tensor dst = view_of(ctx, to, {n});
  const Tensor src = view_of(ctx, from, {n});
  // A copy may cross devices; these rows may not (view_of labels them).
  TRIDENT_CHECK(dst.device() == ctx.device && src.device() == ctx.device,
                "ep: a row copy with host memory on " + ctx.device.str());
  kernels::copy(ctx, dst, src);
}

const float* Transport::permute(const DispatchPlan& p, const SendRows& src, int64_t d) {
  if (!src.index) return src.base;
  kernels::reserve(ctx_, send_, p.sent() * d);
  gather_send_rows(ctx_, src.base, p.T, src.index, p.sent(), send_.ptr(), d);
  return send_.ptr();
}

void Transport::finish(Exchange& x) {
  overlap::in_flight();
  x.wait();
}

std::unique_ptr<Transport> make_transport(Communicator* ep, EpTransportChoice choice,
                                          double shm_limit_bytes, const kernels::Ctx& ctx) {
  if (!ep || ep->size() == 1) return make_local_transport(ctx);
  if (choice == EpTransportChoice::alltoallv) return make_alltoallv_transport(*ep, ctx);
  if (!ctx.device.is_cpu()) {
    // The shared windows are host memory; a device's rows go through the
    // communicator (which stages them, or moves them itself).
    const std::string why = "the rows are on " + ctx.device.str() + ", the windows in host memory";
    if (choice == EpTransportChoice::shm)
      throw InputError("runtime.ep_transport = \"shm\": " + why +
                       "; use \"alltoallv\" or \"auto\"");
    auto t = make_alltoallv_transport(*ep, ctx);
    t->set_reason(why);
    return t;
  }
  std::string why;
  if (SharedWindow::node_local(*ep, &why)) return make_shm_transport(*ep, shm_limit_bytes, ctx);
  if (choice == EpTransportChoice::shm)
    throw InputError("runtime.ep_transport = \"shm\": the ep group spans nodes: " + why);
  auto t = make_alltoallv_transport(*ep, ctx);
  t->set_reason(why);
  return t;
}

}  // namespace trident::ep
