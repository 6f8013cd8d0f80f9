#include "megatrain/perf/cluster.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "megatrain/core/error.h"
#include "megatrain/core/fs.h"

namespace mt::perf {

namespace {

struct Field {
  const char* section;
  const char* key;
  Sourced Cluster::*member;
  double lo, hi;  // allowed range, inclusive
  bool integer;
  bool single_host = false;  // required only with topology "single-host"; elsewhere absent means 0
  bool calibration = false;  // optional everywhere; absent means the neutral default the Cluster struct holds
};

// Every scalar constant of a cluster file. The ranges only refuse what cannot be meant (a negative bandwidth, an
// efficiency above 1); they say nothing about which values are plausible.
const Field kFields[] = {
    {"gpu", "peak_tflops", &Cluster::peak_tflops, 1e-6, 1e6, false},
    {"gpu", "hbm_gbps", &Cluster::hbm_gbps, 1e-3, 1e6, false},
    {"gpu", "memory_gib", &Cluster::memory_gib, 1e-3, 1e6, false},
    {"gpu", "gpus_per_node", &Cluster::gpus_per_node, 1, 1024, true},
    {"gpu", "dtype_bytes", &Cluster::dtype_bytes, 1, 8, true},
    {"gpu", "sm_count", &Cluster::sm_count, 1, 1e6, true},
    {"gpu", "host_cores", &Cluster::host_cores, 1, 1e6, true, true},
    {"intra_node", "nvlink_gbps", &Cluster::nvlink_gbps, 1e-6, 1e6, false},
    {"intra_node", "nvlink_latency_us", &Cluster::nvlink_latency_us, 0, 1e6, false},
    {"network", "nic_gbps", &Cluster::nic_gbps, 1e-6, 1e6, false},
    {"network", "nics_per_node", &Cluster::nics_per_node, 1, 1024, true},
    {"network", "nic_latency_us", &Cluster::nic_latency_us, 0, 1e6, false},
    {"efficiency", "gemm_tile_m", &Cluster::gemm_tile_m, 1, 4096, true},
    {"efficiency", "gemm_tile_n", &Cluster::gemm_tile_n, 1, 4096, true},
    {"efficiency", "attention", &Cluster::attention, 1e-6, 1, false},
    {"efficiency", "attention_fused", &Cluster::attention_fused, 1e-6, 1, false},
    {"efficiency", "memory_bound", &Cluster::memory_bound, 1e-6, 1, false},
    {"efficiency", "kernel_launch_us", &Cluster::kernel_launch_us, 0, 1e6, false},
    {"efficiency", "optimizer_bytes_per_param", &Cluster::optimizer_bytes_per_param, 0, 1e4, false},
    {"stragglers", "node_fraction", &Cluster::straggler_node_fraction, 0, 1, false},
    {"stragglers", "slowdown", &Cluster::straggler_slowdown, 0, 100, false},
    {"stragglers", "gpu_speed_range", &Cluster::gpu_speed_range, 0, 1, false},
    {"scale", "store_op_us", &Cluster::store_op_us, 0, 1e9, false},
    {"scale", "store_async_op_us", &Cluster::store_async_op_us, 0, 1e9, false},
    {"scale", "host_copy_gbps", &Cluster::host_copy_gbps, 1e-6, 1e6, false},
    {"scale", "storage_gbps_per_node", &Cluster::storage_gbps_per_node, 1e-6, 1e6, false},
    {"scale", "storage_read_gbps_per_node", &Cluster::storage_read_gbps_per_node, 1e-6, 1e6, false},
    {"scale", "failure_detect_s", &Cluster::failure_detect_s, 0, 1e9, false},
    {"scale", "node_mtbf_hours", &Cluster::node_mtbf_hours, 1e-6, 1e12, false},
    {"calibration", "gemm_efficiency_scale", &Cluster::gemm_efficiency_scale, 1e-3, 10, false, false, true},
    {"calibration", "nvlink_efficiency", &Cluster::nvlink_efficiency, 1e-3, 10, false, false, true},
    {"calibration", "network_efficiency", &Cluster::network_efficiency, 1e-3, 10, false, false, true},
    {"calibration", "dp_sync_s", &Cluster::dp_sync_s, 0, 1e6, false, false, true},
    {"calibration", "overlap_interference", &Cluster::overlap_interference, 0, 1, false, false, true},
};

const std::set<std::string> kTopologies = {"rail-clos", "single-node", "single-host"};

std::string known_keys(const std::string& section) {
  std::string out;
  for (const Field& f : kFields)
    if (section == f.section) out += (out.empty() ? "" : ", ") + std::string(f.key);
  if (section == "efficiency") out += ", gemm";
  return out;
}

Sourced read_sourced(const toml::node& n, const std::string& where, double lo, double hi, bool integer) {
  const toml::table* t = n.as_table();
  MT_CHECK(t, "{} must be a table {{ value = ..., source = \"...\" }}", where);
  for (auto&& [k, _] : *t)
    MT_CHECK(k.str() == "value" || k.str() == "source", "{}: unknown field '{}' (allowed: value, source)", where,
             k.str());
  Sourced s;
  auto v = (*t)["value"].value<double>();
  MT_CHECK(v.has_value(), "{}: 'value' is missing or not a number", where);
  auto src = (*t)["source"].value<std::string>();
  MT_CHECK(src.has_value() && !src->empty(),
           "{}: 'source' is missing or empty (every constant says where it comes from)", where);
  MT_CHECK(std::isfinite(*v) && *v >= lo && *v <= hi, "{} = {} is out of range [{}, {}]", where, *v, lo, hi);
  MT_CHECK(!integer || *v == std::floor(*v), "{} = {} must be a whole number", where, *v);
  s.value = *v;
  s.source = *src;
  return s;
}

Curve read_curve(const toml::node& n, const std::string& where) {
  const toml::table* t = n.as_table();
  MT_CHECK(t, "{} must be a table {{ x = [...], efficiency = [...], source = \"...\" }}", where);
  for (auto&& [k, _] : *t)
    MT_CHECK(k.str() == "x" || k.str() == "efficiency" || k.str() == "source",
             "{}: unknown field '{}' (allowed: x, efficiency, source)", where, k.str());
  const toml::array* xs = (*t)["x"].as_array();
  const toml::array* ys = (*t)["efficiency"].as_array();
  MT_CHECK(xs && ys && xs->size() == ys->size() && !xs->empty(),
           "{}: 'x' and 'efficiency' must be non-empty arrays of the same length", where);
  Curve c;
  auto src = (*t)["source"].value<std::string>();
  MT_CHECK(src.has_value() && !src->empty(), "{}: 'source' is missing or empty", where);
  c.source = *src;
  for (size_t i = 0; i < xs->size(); ++i) {
    auto x = (*xs)[i].value<double>();
    auto y = (*ys)[i].value<double>();
    MT_CHECK(x && y, "{}: point {} is not a pair of numbers", where, i);
    MT_CHECK(*x > 0 && std::isfinite(*x), "{}: x[{}] = {} must be positive", where, i, *x);
    MT_CHECK(*y > 0 && *y <= 1, "{}: efficiency[{}] = {} must be in (0, 1]", where, i, *y);
    MT_CHECK(c.points.empty() || *x > c.points.back().first, "{}: x must be strictly ascending (x[{}] = {})", where, i,
             *x);
    c.points.emplace_back(*x, *y);
  }
  return c;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

}  // namespace

double Curve::at(double x) const {
  MT_CHECK(!points.empty(), "efficiency curve has no points");
  if (x <= points.front().first) return points.front().second;
  if (x >= points.back().first) return points.back().second;
  auto hi = std::upper_bound(points.begin(), points.end(), x,
                             [](double v, const std::pair<double, double>& p) { return v < p.first; });
  auto lo = hi - 1;
  const double f = (std::log(x) - std::log(lo->first)) / (std::log(hi->first) - std::log(lo->first));
  return lo->second + f * (hi->second - lo->second);
}

double Cluster::network_bytes_per_s() const {
  // Rail-optimised: each GPU drives its own NIC when there are as many NICs as GPUs; otherwise they share.
  return nic_gbps.value * 1e9 * std::min(1.0, nics_per_node.value / gpus_per_node.value) * network_efficiency.value;
}

double Cluster::gemm_efficiency(double flops) const {
  return std::min(1.0, gemm.at(flops) * gemm_efficiency_scale.value);
}

double Cluster::dp_sync_seconds(int dp) const { return dp > 1 ? dp_sync_s.value * std::log2(double(dp)) : 0.0; }

std::vector<std::pair<std::string, Sourced>> Cluster::constants() const {
  std::vector<std::pair<std::string, Sourced>> out;
  for (const Field& f : kFields)
    if (!(f.single_host || f.calibration) || !(this->*f.member).source.empty())
      out.emplace_back(std::string(f.section) + "." + f.key, this->*f.member);
  std::string pts;
  for (auto& [x, y] : gemm.points) pts += fmt::format("{}({:.3g}: {:.2f})", pts.empty() ? "" : " ", x, y);
  out.emplace_back("efficiency.gemm " + pts, Sourced{0, gemm.source});
  return out;
}

Cluster parse_cluster(const std::string& text, const std::string& src) {
  toml::table root;
  try {
    root = toml::parse(text, src);
  } catch (const toml::parse_error& e) {
    fail_as(ErrorKind::Config, "{}: not valid TOML: {}", src, e.description());
  }
  try {
    Cluster c;
    c.path = src;
    std::map<std::string, const toml::table*> sections;
    for (auto&& [k, node] : root) {
      const std::string key(k.str());
      if (key == "name" || key == "topology") continue;
      const toml::table* t = node.as_table();
      MT_CHECK(t && (key == "gpu" || key == "intra_node" || key == "network" || key == "efficiency" ||
                     key == "stragglers" || key == "scale" || key == "calibration"),
               "{}: unknown key '{}' (allowed: name, topology, [gpu], [intra_node], [network], [efficiency], "
               "[stragglers], [scale], [calibration])",
               src, key);
      sections[key] = t;
    }
    auto name = root["name"].value<std::string>();
    MT_CHECK(name && !name->empty(), "{}: 'name' is missing", src);
    c.name = *name;
    auto topo = root["topology"].value<std::string>();
    MT_CHECK(topo && kTopologies.count(*topo),
             "{}: 'topology' must be \"rail-clos\", \"single-node\" or "
             "\"single-host\" (got {})",
             src, topo ? "\"" + *topo + "\"" : std::string("nothing"));
    c.topology = *topo;
    for (auto& [sec, t] : sections)
      for (auto&& [k, _] : *t) {
        const std::string key(k.str());
        bool known = sec == "efficiency" && key == "gemm";
        for (const Field& f : kFields) known = known || (sec == f.section && key == f.key);
        MT_CHECK(known, "{}: unknown key '{}.{}' (known in [{}]: {})", src, sec, key, sec, known_keys(sec));
      }
    for (const Field& f : kFields) {
      const std::string where = fmt::format("{}: {}.{}", src, f.section, f.key);
      auto it = sections.find(f.section);
      const toml::node* n = it == sections.end() ? nullptr : it->second->get(f.key);
      if (!n && f.single_host && c.topology != "single-host") continue;  // stays 0: ranks do not share cores
      if (!n && f.calibration) continue;                                 // stays neutral: not calibrated
      MT_CHECK(n, "{} is missing{}", where,
               f.single_host ? " (a single-host cluster must say how many cores its ranks share)" : "");
      c.*f.member = read_sourced(*n, where, f.lo, f.hi, f.integer);
    }
    auto eff = sections.find("efficiency");
    const toml::node* g = eff == sections.end() ? nullptr : eff->second->get("gemm");
    MT_CHECK(g, "{}: efficiency.gemm is missing", src);
    c.gemm = read_curve(*g, src + ": efficiency.gemm");
    return c;
  } catch (const Error& e) {
    throw Error(e.what(), ErrorKind::Config);
  }
}

Cluster load_cluster(const std::string& path) {
  if (!file_exists(path) || std::filesystem::is_directory(path))
    fail_as(ErrorKind::Config, "cluster file {} does not exist (the shipped ones are in configs/clusters/)", path);
  return parse_cluster(read_text_file(path), path);
}

std::string to_toml(const Cluster& c) {
  std::string out = fmt::format("name = {}\ntopology = {}\n", quote(c.name), quote(c.topology));
  std::string section;
  for (const Field& f : kFields) {
    const Sourced& s = c.*f.member;
    if (f.calibration && s.source.empty()) continue;
    if (section != f.section) {
      section = f.section;
      out += fmt::format("\n[{}]\n", section);
      if (section == "efficiency") {
        std::string xs, ys;
        for (auto& [x, y] : c.gemm.points) {
          xs += fmt::format("{}{:.6g}", xs.empty() ? "" : ", ", x);
          ys += fmt::format("{}{:.4f}", ys.empty() ? "" : ", ", y);
        }
        out += fmt::format("gemm = {{ x = [{}], efficiency = [{}], source = {} }}\n", xs, ys, quote(c.gemm.source));
      }
    }
    if (f.single_host && c.topology != "single-host" && s.source.empty()) continue;
    out += fmt::format("{} = {{ value = {:.6g}, source = {} }}\n", f.key, s.value, quote(s.source));
  }
  return out;
}

}  // namespace mt::perf
