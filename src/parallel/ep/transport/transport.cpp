// make_transport: runtime.ep_transport to a Transport, once per dispatcher.
#include "trident/parallel/ep/transport.hpp"

#include "../row_views.hpp"
#include "trident/comm/shared_window.hpp"
#include "trident/core/error.hpp"
#include "trident/core/overlap.hpp"
#include "trident/kernels/functional.hpp"
#include "trident/kernels/tensor_ops.hpp"

namespace trident::ep {

int64_t row_width(const Tensor& t, int64_t n, const char* what) {
  TRIDENT_CHECK(t.ndim() >= 1 && t.dtype() == DType::f32,
                std::string("ep: ") + what + " must be f32 rows, got " + t.shape_str());
  const int64_t d = t.dim(-1);
  TRIDENT_CHECK(t.numel() == n * d, std::string("ep: ") + what + " " + t.shape_str() +
                                        " does not hold " + std::to_string(n) + " rows of " +
                                        std::to_string(d));
  return d;
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

Tensor Transport::permute(const DispatchPlan& p, const SendRows& src) {
  if (src.index.empty() && p.sent() == src.rows.dim(0)) return src.rows;
  const int64_t d = src.rows.dim(-1);
  kernels::reserve(ctx_, send_, p.sent() * d);
  Tensor rows = first_rows(send_, p.sent(), d);
  kernels::gather_rows(ctx_, src.rows, src.index, rows);
  return rows;
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
