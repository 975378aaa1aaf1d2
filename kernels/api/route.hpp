// The routing of every public op to the backend of ctx.device, written once
// for the op files of kernels/api:
//
//   cpu       kernels/cpu
//   emulated  kernels/cpu with the emulated device's guard lifted for the
//             call (core/emulated.hpp), so that device memory is reachable
//             by the kernel and by nothing else
//   cuda      kernels/cuda in a build with the CUDA backend; else an error
//             naming the op
//
// An op's body is `TRIDENT_ROUTE(op, args...);`: it returns what the
// backend's op returns (void included).
#pragma once
#include <string>

#include "trident/core/emulated.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/context.hpp"
#include "trident/kernels/moe.hpp"
#include "trident/kernels/router.hpp"

namespace trident::kernels::detail {

[[noreturn]] inline void no_cuda(const char* op) {
  throw Error(std::string("kernels::") + op +
              ": called with a cuda device, but this build has no CUDA backend");
}

// On the emulated device every memory argument of an op must be device
// memory (or null), as a GPU kernel needs: a host pointer stops the process
// with one line (emulated::host_argument). Scalars and shape structs pass;
// the structs that carry pointers are looked into.
template <class T>
void check_arg(const char* op, int i, T* p) {
  if (p && !emulated::contains(p)) emulated::host_argument(op, i, p);
}
template <class T>
void check_arg(const char*, int, const T&) {}
inline void check_arg(const char* op, int i, const RowSource& r) {
  // segments come only from host shared memory, which no device transport uses
  if (r.segments != 0) emulated::host_argument(op, i, r.base);
  check_arg(op, i, r.rows);
}
inline void check_arg(const char* op, int i, const RouterSaved& s) {
  check_arg(op, i, s.logits);
  check_arg(op, i, s.probs);
  check_arg(op, i, s.lse);
  check_arg(op, i, s.chosen);
  check_arg(op, i, s.weight);
}
inline void check_arg(const char* op, int i, const RouterLossTerms& t) {
  check_arg(op, i, t.sample);
  check_arg(op, i, t.f);
  check_arg(op, i, t.inv_tokens);
}
template <class... Args>
void check_device_args(const Ctx& ctx, const char* op, const Args&... args) {
  if (!ctx.device.is_emulated()) return;
  int i = 0;
  (check_arg(op, ++i, args), ...);
}

// host: the op on kernels/cpu; device: the op on kernels/cuda (a build
// without CUDA passes none).
template <class Host, class Device>
decltype(auto) route(const Ctx& ctx, const char* op, Host&& host, Device&& device) {
  switch (ctx.device.type) {
    case DeviceType::cpu:
      break;
    case DeviceType::emulated: {
      const emulated::Guard lifted;
      return host();
    }
    case DeviceType::cuda:
      if constexpr (std::is_same_v<std::decay_t<Device>, std::nullptr_t>)
        no_cuda(op);
      else
        return device();
  }
  return host();
}

}  // namespace trident::kernels::detail

#ifdef TRIDENT_HAVE_CUDA
#define TRIDENT_ROUTE(op, ...)                                                 \
  ::trident::kernels::detail::check_device_args(ctx, #op, __VA_ARGS__);        \
  return ::trident::kernels::detail::route(                                    \
      ctx, #op, [&]() -> decltype(auto) { return cpu::op(ctx, __VA_ARGS__); }, \
      [&]() -> decltype(auto) { return cuda::op(ctx, __VA_ARGS__); })
#else
#define TRIDENT_ROUTE(op, ...)                                          \
  ::trident::kernels::detail::check_device_args(ctx, #op, __VA_ARGS__); \
  return ::trident::kernels::detail::route(                             \
      ctx, #op, [&]() -> decltype(auto) { return cpu::op(ctx, __VA_ARGS__); }, nullptr)
#endif
