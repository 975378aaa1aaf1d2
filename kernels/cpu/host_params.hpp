// The fp32 GEMMs' host parameters (gemm_direct.cpp, linear.cpp): read once
// per process from this CPU's cache sizes, derived by the rules of
// share/trident/cpu-kernels.md#host-parameters, and overridable for
// measuring by TRIDENT_CPU_GEMM_BLOCKS.
//
// The rules reproduce, from an AMD Zen 4 or Zen 5 core's caches (L1d 32 or
// 48 KiB, L2 1 MiB), the constants that were tuned there; on other hosts
// (Intel Xeon: L2 1 to 2 MiB, L1d 48 KiB 12-way on Sapphire Rapids) they
// are a starting point that `trident bench gemm --sweep` measures. No
// parameter changes the order in which one element of C is summed: each is
// one fused multiply-add chain over the whole of K wherever the own kernel
// runs. Two parameters (direct, kc) choose between the own kernel and the
// BLAS's sgemm for a shape, which sums in its own order.
#pragma once
#include <cstdint>
#include <string>

namespace trident::kernels::cpu {

// One CPU's caches (bytes; 0: not known) and name.
struct HostCaches {
  int64_t l1d = 0, l2 = 0, l3 = 0;
  int64_t line = 0;      // coherency line size
  int64_t l1d_ways = 0;  // associativity of the L1d
  std::string source;    // "sysfs", "cpuid" or "defaults" (where the sizes came from)
};

struct HostInfo {
  std::string vendor;  // cpuid's vendor string ("AuthenticAMD", "GenuineIntel"), "" unknown
  std::string model;   // cpuid's brand string, "" unknown
  HostCaches caches;
};

// The caches below `root` in sysfs's layout (root/index*/{level,type,size,
// coherency_line_size,ways_of_associativity}); source "sysfs", or l1d = 0
// where no level-1 data cache is listed there.
HostCaches read_sysfs_caches(const std::string& root);
// The caches cpuid's deterministic cache leaf lists (4 on Intel,
// 0x8000001D on AMD); source "cpuid", or l1d = 0 where it lists none (or on
// a CPU without cpuid).
HostCaches read_cpuid_caches();
// This CPU: sysfs (/sys/devices/system/cpu/cpu0/cache), else cpuid's cache
// leaves, else the Zen 4 sizes the constants were tuned on (source
// "defaults"); read once.
const HostInfo& host_info();

// What the fp32 GEMMs choose by. None changes a result except direct and kc
// (which pick the own kernel or sgemm).
struct GemmParams {
  // A linear layer's GEMM runs the own kernel while each operand is at most
  // this many bytes (else sgemm); 0: sgemm always.
  int64_t direct_bytes = 0;
  // gemm_direct_nt (the forward) builds a K x 32 panel of Wᵀ up to this K
  // (else sgemm).
  int64_t kc = 0;
  // gemm_direct's row block: column blocks run over mc rows of A at a time
  // (a multiple of 8); 0: all rows at once.
  int64_t mc = 0;
  // Rows of a row-major B prefetched ahead of the one the tile reads; 0: no
  // prefetch.
  int64_t prefetch = 0;
  // gemm_direct_nt asks for the next 32 rows of W in shares, one before each
  // nt_rows rows of A (a multiple of 8).
  int64_t nt_rows = 0;
  bool operator==(const GemmParams&) const = default;
};

// The parameters the rules give for these caches (unknown sizes: the Zen 4
// values).
GemmParams derive_gemm_params(const HostCaches& c);
// "direct=1024K,kc=1024,mc=0,prefetch=8,nt_rows=16"
std::string format_gemm_params(const GemmParams& p);
// `base` with the keys of `text` ("key=value,...", the keys of
// format_gemm_params, direct in bytes with an optional K or M suffix)
// replaced; InputError naming TRIDENT_CPU_GEMM_BLOCKS and the rule broken
// for a bad key or value.
GemmParams parse_gemm_params(const std::string& text, const GemmParams& base);

// The parameters in use: derive_gemm_params(host_info().caches) with
// TRIDENT_CPU_GEMM_BLOCKS applied, resolved on the first call (which throws
// InputError for a bad value); set_gemm_params replaces them (the sweep,
// tests: between GEMMs, not while another thread runs one), and
// reset_gemm_params goes back to the first call's.
const GemmParams& gemm_params();
void set_gemm_params(const GemmParams& p);
void reset_gemm_params();
// Whether TRIDENT_CPU_GEMM_BLOCKS was set (the parameters are not derived).
bool gemm_params_overridden();

}  // namespace trident::kernels::cpu
