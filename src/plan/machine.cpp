// Machine profiles: the TOML keys as one table (key, unit scale, where the
// value goes), so that parsing, writing and the error messages share it.
#include "trident/plan/machine.hpp"

#include <toml++/toml.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "trident/core/error.hpp"

namespace trident::plan {
namespace {

// One numeric key: "section.key", the factor from the file's unit to SI, and
// where the value lives in a profile.
struct NumericKey {
  const char* key;
  double scale;
  double MachineProfile::*field;
  Link MachineProfile::*link = nullptr;  // set: field is ignored, link_field is used
  double Link::*link_field = nullptr;
  bool optional = false;     // may be left out (keeps MachineProfile's default)
  bool may_be_zero = false;  // latencies and overheads; rates must be > 0
  bool share = false;        // a share of one core: at most 1
};

const std::vector<NumericKey>& numeric_keys() {
  using M = MachineProfile;
  static const std::vector<NumericKey> keys = {
      {"machine.memory_gb", 1e9, &M::memory_bytes},
      {"machine.wait_core_share", 1, &M::wait_core_share, nullptr, nullptr, true, true, true},
      {"machine.time_slice_efficiency", 1, &M::time_slice_efficiency, nullptr, nullptr, true, false,
       true},
      {"compute.gemm_tflops", 1e12, &M::gemm_flops},
      {"compute.attention_tflops", 1e12, &M::attention_flops},
      {"compute.memory_gb_per_s", 1e9, &M::memory_Bps},
      {"compute.peak_tflops", 1e12, &M::peak_flops, nullptr, nullptr, true, true},
      {"compute.efficiency", 1, &M::efficiency, nullptr, nullptr, true},
      {"compute.optimizer_ns_per_param", 1e-9, &M::optimizer_s_per_param, nullptr, nullptr, true,
       true},
      {"compute.calibrated_tokens", 1, &M::calibrated_tokens, nullptr, nullptr, true, true},
      {"compute.ring_overlap", 1, &M::ring_overlap, nullptr, nullptr, true, true, true},
      {"link.nvlink.bandwidth_gb_per_s", 1e9, nullptr, &M::nvlink, &Link::bandwidth_Bps},
      {"link.nvlink.latency_us", 1e-6, nullptr, &M::nvlink, &Link::latency_s, false, true},
      {"link.nvlink.collective_gb_per_s", 1e9, nullptr, &M::nvlink, &Link::collective_Bps, true,
       true},
      {"link.node.bandwidth_gb_per_s", 1e9, nullptr, &M::node, &Link::bandwidth_Bps},
      {"link.node.latency_us", 1e-6, nullptr, &M::node, &Link::latency_s, false, true},
      {"link.node.collective_gb_per_s", 1e9, nullptr, &M::node, &Link::collective_Bps, true, true},
      {"link.network.bandwidth_gb_per_s", 1e9, nullptr, &M::network, &Link::bandwidth_Bps},
      {"link.network.latency_us", 1e-6, nullptr, &M::network, &Link::latency_s, false, true},
      {"link.network.collective_gb_per_s", 1e9, nullptr, &M::network, &Link::collective_Bps, true,
       true},
      {"link.network.rails", 1, &M::network_rails, nullptr, nullptr, true},
      {"overhead.step_us", 1e-6, &M::step_overhead_s, nullptr, nullptr, true, true},
      {"overhead.layer_us", 1e-6, &M::layer_overhead_s, nullptr, nullptr, true, true},
      {"overhead.collective_round_us", 1e-6, &M::collective_round_s, nullptr, nullptr, true, true},
      {"overhead.ring_step_us", 1e-6, &M::ring_step_s, nullptr, nullptr, true, true},
      {"overhead.alltoall_us", 1e-6, &M::alltoall_s, nullptr, nullptr, true, true},

  };
  return keys;
}

double& slot(MachineProfile& m, const NumericKey& k) {
  return k.link ? (m.*(k.link)).*(k.link_field) : m.*(k.field);
}
double slot(const MachineProfile& m, const NumericKey& k) {
  return k.link ? (m.*(k.link)).*(k.link_field) : m.*(k.field);
}

std::string where(const std::string& file, const toml::node& n) {
  const auto line = n.source().begin.line;
  return line ? file + ":" + std::to_string(line) : file;
}

// Every leaf key of the file as "a.b.c" with its node, for the unknown-key check.
void leaves(const toml::table& t, const std::string& prefix,
            std::map<std::string, const toml::node*>& out) {
  for (const auto& [k, v] : t) {
    const std::string name =
        prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const auto* sub = v.as_table())
      leaves(*sub, name, out);
    else
      out[name] = &v;
  }
}

std::string number_text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

}  // namespace

const char* link_class_name(LinkClass c) {
  switch (c) {
    case LinkClass::nvlink:
      return "nvlink";
    case LinkClass::node:
      return "node";
    case LinkClass::network:
      return "network";
  }
  return "?";
}

const Link& MachineProfile::link(LinkClass c) const {
  return c == LinkClass::nvlink ? nvlink : c == LinkClass::node ? node : network;
}

double MachineProfile::oversubscription(int ranks_per_node) const {
  if (cores_per_node <= 0 || ranks_per_node <= cores_per_node) return 1.0;
  return double(ranks_per_node) / (cores_per_node * time_slice_efficiency);
}

namespace {

// The document's tree, or a one-line error naming the file and line.
toml::table parse_toml(const std::string& text, const std::string& file) {
  try {
    return toml::parse(text, std::string_view(file));
  } catch (const toml::parse_error& e) {
    const auto line = e.source().begin.line;
    std::string what(e.description());
    for (char& c : what)
      if (c == '\n') c = ' ';
    throw InputError(file + (line ? ":" + std::to_string(line) : "") +
                     ": TOML syntax error: " + what);
  }
}

using Leaves = std::map<std::string, const toml::node*>;

void take_text(Leaves& found, const std::string& file, const char* key, std::string& out) {
  auto it = found.find(key);
  if (it == found.end()) return;
  if (!it->second->is_string())
    throw InputError(where(file, *it->second) + ": " + key + ": must be a string");
  out = *it->second->value<std::string>();
  found.erase(it);
}

void take_cores(Leaves& found, const std::string& file, MachineProfile& m) {
  auto it = found.find("machine.cores_per_node");
  if (it == found.end()) return;
  const auto v = it->second->value<int64_t>();
  if (!it->second->is_integer() || *v < 0)
    throw InputError(where(file, *it->second) +
                     ": machine.cores_per_node: must be an integer >= 0");
  m.cores_per_node = int(*v);
  found.erase(it);
}

// The rule a numeric key's value must keep, as the error line says it.
std::string numeric_rule(const NumericKey& k) {
  if (k.share) return k.may_be_zero ? "from 0 to 1" : "> 0 and <= 1";
  return k.may_be_zero ? ">= 0" : "> 0";
}

void take_numeric(Leaves& found, const std::string& file, const NumericKey& k, MachineProfile& m) {
  auto it = found.find(k.key);
  if (it == found.end()) {
    if (k.optional) return;
    throw InputError(file + ": " + k.key + ": missing (every profile sets it; see planner.md)");
  }
  const auto v = it->second->value<double>();  // integers convert too
  const bool ok = it->second->is_number() && v && std::isfinite(*v) && *v >= 0 &&
                  (*v != 0 || k.may_be_zero) && (!k.share || *v <= 1);
  if (!ok)
    throw InputError(where(file, *it->second) + ": " + k.key + ": must be a number " +
                     numeric_rule(k));
  slot(m, k) = *v * k.scale;
  found.erase(it);
}

}  // namespace

MachineProfile parse_machine_text(const std::string& text, const std::string& file) {
  const toml::table root = parse_toml(text, file);
  Leaves found;
  leaves(root, "", found);
  MachineProfile m;
  take_text(found, file, "machine.name", m.name);
  take_text(found, file, "machine.source", m.source);
  take_cores(found, file, m);
  for (const NumericKey& k : numeric_keys()) take_numeric(found, file, k, m);
  if (!found.empty()) {
    const auto& [key, node] = *found.begin();
    throw InputError(where(file, *node) + ": " + key + ": unknown key");
  }
  if (m.name.empty()) throw InputError(file + ": machine.name: missing");
  return m;
}

MachineProfile load_machine(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot read the machine profile");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_machine_text(ss.str(), path);
}

std::string machine_to_toml(const MachineProfile& m) {
  std::ostringstream o;
  auto quoted = [](const std::string& s) {
    std::string q = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') q += '\\';
      if (static_cast<unsigned char>(c) >= 0x20) q += c;
    }
    return q + "\"";
  };
  o << "# trident machine profile (share/trident/planner.md)\n";
  std::string section;
  auto open = [&](const std::string& key) {
    const std::string sec = key.substr(0, key.rfind('.'));
    if (sec != section) {
      o << (section.empty() ? "" : "\n") << "[" << sec << "]\n";
      section = sec;
    }
    return key.substr(key.rfind('.') + 1);
  };
  o << "[machine]\n";
  section = "machine";
  o << "name = " << quoted(m.name) << "\n";
  if (!m.source.empty()) o << "source = " << quoted(m.source) << "\n";
  o << "cores_per_node = " << m.cores_per_node << "\n";
  for (const NumericKey& k : numeric_keys()) {
    const double v = slot(m, k) / k.scale;
    const std::string leaf = open(k.key);
    o << leaf << " = " << number_text(v) << "\n";
  }
  return o.str();
}

}  // namespace trident::plan
