// The fp32 GEMMs' host parameters (see host_params.hpp; the rules:
// share/trident/cpu-kernels.md#host-parameters).
#include "host_params.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "trident/core/error.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#define TRIDENT_HOST_CPUID 1
#endif

namespace trident::kernels::cpu {
namespace {

// The sizes the constants were tuned on (an AMD Zen 4 / Zen 5 core's L2,
// Zen 4's L1d), for what no source gives.
constexpr int64_t kDefaultL1d = 32 << 10, kDefaultL2 = 1 << 20, kDefaultWays = 8;
constexpr int64_t kPanelCols = 32;  // gemm_direct_nt's panel: K x 32 floats
constexpr int64_t kRowTile = 8;     // rows of the register tile

std::string read_word(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::string w;
  in >> w;
  return w;
}

// "32K", "1024K", "32768K", "2M", "64": bytes; 0 when not a size.
int64_t parse_size(const std::string& s) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || v < 0) return 0;
  const std::string unit(end, s.data() + s.size());
  if (unit.empty()) return v;
  if (unit == "K") return v << 10;
  if (unit == "M") return v << 20;
  return 0;
}

void set_level(HostCaches& c, int level, const std::string& type, int64_t size, int64_t line,
               int64_t ways) {
  if (level == 1 && type == "Data") {
    c.l1d = size;
    c.l1d_ways = ways;
    c.line = line;
  } else if (level == 2 && type != "Instruction") {
    c.l2 = size;
  } else if (level == 3 && type != "Instruction") {
    c.l3 = size;
  }
}

#ifdef TRIDENT_HOST_CPUID
// cpuid's deterministic cache leaf (4 on Intel, 0x8000001D on AMD: the same
// layout), every subleaf until type 0.
HostCaches cpuid_caches(unsigned leaf) {
  HostCaches c;
  for (unsigned i = 0; i < 16; ++i) {
    unsigned a = 0, b = 0, cx = 0, d = 0;
    if (!__get_cpuid_count(leaf, i, &a, &b, &cx, &d) || (a & 31u) == 0) break;
    const int64_t line = (b & 0xFFFu) + 1, parts = ((b >> 12) & 0x3FFu) + 1,
                  ways = ((b >> 22) & 0x3FFu) + 1, sets = int64_t(cx) + 1;
    const unsigned type = a & 31u;
    set_level(c, int((a >> 5) & 7u),
              type == 1   ? "Data"
              : type == 2 ? "Instruction"
                          : "Unified",
              line * parts * ways * sets, line, ways);
  }
  c.source = "cpuid";
  return c;
}

std::string cpuid_vendor() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return "";
  char s[13] = {};
  std::memcpy(s, &b, 4);
  std::memcpy(s + 4, &d, 4);
  std::memcpy(s + 8, &c, 4);
  return s;
}

std::string cpuid_brand() {
  char s[49] = {};
  for (unsigned i = 0; i < 3; ++i) {
    unsigned r[4] = {};
    if (!__get_cpuid(0x80000002u + i, &r[0], &r[1], &r[2], &r[3])) return "";
    std::memcpy(s + 16 * i, r, 16);
  }
  std::string b(s);
  const size_t first = b.find_first_not_of(' '), last = b.find_last_not_of(' ');
  return first == std::string::npos ? "" : b.substr(first, last - first + 1);
}
#endif

HostInfo detect_host() {
  HostInfo h;
  h.caches = read_sysfs_caches("/sys/devices/system/cpu/cpu0/cache");
#ifdef TRIDENT_HOST_CPUID
  h.vendor = cpuid_vendor();
  h.model = cpuid_brand();
#endif
  if (h.caches.l1d == 0 || h.caches.l2 == 0) h.caches = read_cpuid_caches();
  if (h.caches.l1d == 0 || h.caches.l2 == 0) h.caches = HostCaches{0, 0, 0, 0, 0, "defaults"};
  return h;
}

[[noreturn]] void refuse(const std::string& item, const std::string& rule) {
  throw InputError("TRIDENT_CPU_GEMM_BLOCKS: '" + item + "': " + rule +
                   " (keys: direct=BYTES[K|M], kc, mc, prefetch, nt_rows)");
}

// The value of one "key=value" item: a whole number (direct: with an
// optional K or M suffix); refused otherwise.
int64_t value_of(const std::string& item, const std::string& key, const std::string& value) {
  const bool digits = !value.empty() && value.find_first_not_of("0123456789") == std::string::npos;
  const bool sized =
      key == "direct" && !value.empty() && (value.back() == 'K' || value.back() == 'M');
  const std::string num = sized ? value.substr(0, value.size() - 1) : value;
  int64_t v = -1;
  if ((digits || sized) && !num.empty() &&
      num.find_first_not_of("0123456789") == std::string::npos) {
    const auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
    if (ec != std::errc() || v > (int64_t(1) << 40)) v = -1;
  }
  if (v < 0) refuse(item, "the value must be a whole number");
  return sized ? v << (value.back() == 'K' ? 10 : 20) : v;
}

// The override's keys: the field each sets and the values it takes (min to
// max, a multiple of `step`), with the rule its error names.
struct OverrideKey {
  const char* key;
  int64_t GemmParams::*field;
  int64_t min, max, step;
  const char* rule;
};
constexpr OverrideKey kOverrideKeys[] = {
    {"direct", &GemmParams::direct_bytes, 0, int64_t(1) << 32, 1,
     "direct must be 0 (sgemm always) to 4096M"},
    {"kc", &GemmParams::kc, 1, 65536, 1, "kc must be 1 to 65536"},
    {"mc", &GemmParams::mc, 0, int64_t(1) << 20, kRowTile,
     "mc must be 0 (no row block) or a multiple of 8 up to 1048576"},
    {"prefetch", &GemmParams::prefetch, 0, 64, 1, "prefetch must be 0 (none) to 64 rows"},
    {"nt_rows", &GemmParams::nt_rows, kRowTile, 4096, kRowTile,
     "nt_rows must be a multiple of 8 from 8 to 4096"},
};

// One "key=value" of the override applied to p.
void apply_item(const std::string& item, GemmParams& p) {
  const size_t eq = item.find('=');
  if (eq == std::string::npos) refuse(item, "expected key=value");
  const std::string key = item.substr(0, eq);
  for (const OverrideKey& k : kOverrideKeys) {
    if (key != k.key) continue;
    const int64_t v = value_of(item, key, item.substr(eq + 1));
    if (v < k.min || v > k.max || v % k.step != 0) refuse(item, k.rule);
    p.*k.field = v;
    return;
  }
  refuse(item, "unknown key");
}

struct ParamsState {
  std::once_flag once;
  GemmParams first, now;
  bool overridden = false;
};
ParamsState& state() {
  static ParamsState s;
  return s;
}

void resolve_once() {
  ParamsState& s = state();
  std::call_once(s.once, [&] {
    GemmParams p = derive_gemm_params(host_info().caches);
    const char* v = std::getenv("TRIDENT_CPU_GEMM_BLOCKS");
    if (v != nullptr && *v != '\0') {
      p = parse_gemm_params(v, p);
      s.overridden = true;
    }
    s.first = s.now = p;
  });
}

}  // namespace

HostCaches read_sysfs_caches(const std::string& root) {
  HostCaches c;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
    if (e.path().filename().string().rfind("index", 0) != 0) continue;
    const int64_t level = parse_size(read_word(e.path() / "level"));
    set_level(c, int(level), read_word(e.path() / "type"), parse_size(read_word(e.path() / "size")),
              parse_size(read_word(e.path() / "coherency_line_size")),
              parse_size(read_word(e.path() / "ways_of_associativity")));
  }
  c.source = "sysfs";
  return c;
}

HostCaches read_cpuid_caches() {
#ifdef TRIDENT_HOST_CPUID
  return cpuid_caches(cpuid_vendor() == "AuthenticAMD" ? 0x8000001Du : 4u);
#else
  return HostCaches{0, 0, 0, 0, 0, "cpuid"};
#endif
}

const HostInfo& host_info() {
  static const HostInfo h = detect_host();
  return h;
}

// The rules (cpu-kernels.md#host-parameters):
//   direct   = L2: each operand of the own kernel fits the second-level cache
//              (beyond, it does not block K or N and sgemm is faster);
//   kc       = L2 / 8 / (32 x 4 bytes), in steps of 64: the K x 32 panel of
//              Wᵀ takes an eighth of L2, beside the next block of W that is
//              prefetched into it and the rows of A streaming through;
//   mc       = 0: every A the own kernel takes fits L2 by the first rule;
//   prefetch = the L1d's ways: B's rows, a row stride apart that is often a
//              multiple of 4 KiB, all fall in one L1 set, which holds that
//              many before the row in use is evicted;
//   nt_rows  = 16 (two row tiles per share of the next W block).
GemmParams derive_gemm_params(const HostCaches& c) {
  const int64_t l2 = c.l2 > 0 ? c.l2 : kDefaultL2;
  GemmParams p;
  p.direct_bytes = l2;
  p.kc = std::max<int64_t>(64, l2 / 8 / (kPanelCols * 4) / 64 * 64);
  p.mc = 0;
  const int64_t ways = c.l1d > 0 && c.l1d_ways > 0 ? c.l1d_ways : kDefaultWays;
  p.prefetch = std::clamp<int64_t>(ways, 4, 16);
  p.nt_rows = 2 * kRowTile;
  return p;
}

std::string format_gemm_params(const GemmParams& p) {
  const std::string direct = p.direct_bytes != 0 && p.direct_bytes % (1 << 10) == 0
                                 ? std::to_string(p.direct_bytes >> 10) + "K"
                                 : std::to_string(p.direct_bytes);
  return "direct=" + direct + ",kc=" + std::to_string(p.kc) + ",mc=" + std::to_string(p.mc) +
         ",prefetch=" + std::to_string(p.prefetch) + ",nt_rows=" + std::to_string(p.nt_rows);
}

GemmParams parse_gemm_params(const std::string& text, const GemmParams& base) {
  GemmParams p = base;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    if (item.empty()) refuse(text, "an empty item (expected key=value,key=value...)");
    apply_item(item, p);
    start = comma + 1;
  }
  return p;
}

const GemmParams& gemm_params() {
  resolve_once();
  return state().now;
}

void set_gemm_params(const GemmParams& p) {
  resolve_once();
  state().now = p;
}

void reset_gemm_params() {
  resolve_once();
  state().now = state().first;
}

bool gemm_params_overridden() {
  resolve_once();
  return state().overridden;
}

}  // namespace trident::kernels::cpu
