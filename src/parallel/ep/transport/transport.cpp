// make_transport: runtime.ep_transport to a Transport, once per dispatcher.
#include "trident/parallel/ep/transport.hpp"

#include "trident/comm/shared_window.hpp"
#include "trident/core/error.hpp"
#include "trident/core/overlap.hpp"

namespace trident::ep {

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
