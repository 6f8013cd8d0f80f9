#include "megatrain/launch/gpu_checks.h"

#include <fmt/format.h>

#include <algorithm>

namespace mt::launch {
namespace {

constexpr double kOfDatasheet = 0.6;   // of the datasheet's rate (header: why)
constexpr double kOfPeers = 0.85;      // of the node's median GPU
constexpr double kMinHostGbps = 10.0;  // pinned copies over the GPU's PCIe link

double median(std::vector<double> v) {
  v.erase(std::remove(v.begin(), v.end(), 0.0), v.end());
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A rate against a floor from the datasheet (or an absolute one) and against the node's median.
CheckResult rate_check(const GpuHealth& g, const char* what, const char* unit, double value, double floor,
                       const std::string& floor_source, double peers_median, int gpus) {
  CheckResult c;
  c.name = fmt::format("gpu{}_{}", g.index, what);
  c.unit = unit;
  c.value = value;
  if (value <= 0) {
    c.pass = true;
    c.ran = false;
    c.detail = fmt::format("GPU {} ({}): not measured", g.index, g.name);
    return c;
  }
  std::vector<std::string> why;
  if (floor > 0 && value < floor) why.push_back(fmt::format("under {:.0f} {} ({})", floor, unit, floor_source));
  if (gpus > 1 && peers_median > 0 && value < kOfPeers * peers_median)
    why.push_back(fmt::format("{:.0f}% of the node's median GPU ({:.0f} {}; the floor is {:.0f}%)",
                              100 * value / peers_median, peers_median, unit, 100 * kOfPeers));
  c.pass = why.empty();
  c.detail = fmt::format("GPU {} ({}): {:.0f} {}{}{}", g.index, g.name, value, unit, c.pass ? "" : ": ",
                         fmt::join(why, "; "));
  return c;
}

// NVML's findings, or a check that says they were not read.
CheckResult not_read(const GpuHealth& g, const char* what) {
  CheckResult c;
  c.name = fmt::format("gpu{}_{}", g.index, what);
  c.ran = false;
  c.pass = true;
  c.detail = fmt::format("GPU {} ({}): not measured (NVML was not read{}{})", g.index, g.name,
                         g.nvml_why.empty() ? "" : ": ", g.nvml_why);
  return c;
}

CheckResult memory_errors(const GpuHealth& g) {
  if (!g.nvml_read) return not_read(g, "memory_errors");
  CheckResult c;
  c.name = fmt::format("gpu{}_memory_errors", g.index);
  c.unit = "errors";
  c.value = double(g.ecc_uncorrected_volatile + g.retired_pages_pending);
  std::vector<std::string> bad;
  if (g.ecc_uncorrected_volatile > 0)
    bad.push_back(fmt::format("{} uncorrectable ECC error(s) since the driver loaded", g.ecc_uncorrected_volatile));
  if (g.retired_pages_pending > 0) bad.push_back(fmt::format("{} page retirement(s) pending", g.retired_pages_pending));
  if (g.row_remap_pending) bad.push_back("a row remap pending (the GPU needs a reset)");
  if (g.row_remap_failure) bad.push_back("a failed row remap (the GPU needs service)");
  c.pass = bad.empty();
  c.detail = fmt::format("GPU {} ({}): {}", g.index, g.name,
                         c.pass ? "no memory errors" : fmt::format("{}", fmt::join(bad, "; ")));
  return c;
}

CheckResult clocks(const GpuHealth& g) {
  if (!g.nvml_read) return not_read(g, "clocks");
  CheckResult c;
  c.name = fmt::format("gpu{}_clocks", g.index);
  c.unit = "C";
  c.value = g.temperature_c;
  std::vector<std::string> bad, said;
  for (const std::string& e : g.clock_events)
    (e == "hw_slowdown" || e == "hw_thermal_slowdown" || e == "hw_power_brake" ? bad : said).push_back(e);
  if (g.slowdown_temperature_c > 0 && g.temperature_c >= g.slowdown_temperature_c)
    bad.push_back(fmt::format("{} C, at or above its slowdown threshold {} C", g.temperature_c,
                              g.slowdown_temperature_c));
  c.pass = bad.empty();
  c.detail = fmt::format("GPU {} ({}): {}{}", g.index, g.name,
                         c.pass ? fmt::format("{} C, no hardware slowdown", g.temperature_c)
                                : fmt::format("slowed down: {}", fmt::join(bad, "; ")),
                         said.empty() ? "" : fmt::format(" (also: {})", fmt::join(said, ", ")));
  return c;
}

CheckResult self_test(const GpuHealth& g) {
  CheckResult c;
  c.name = fmt::format("gpu{}_self_test", g.index);
  c.ran = g.self_test_ran;
  c.pass = !g.self_test_ran || g.self_test_exact;
  c.value = c.pass ? 1 : 0;
  c.detail = fmt::format("GPU {} ({}): {}", g.index, g.name,
                         !g.self_test_ran    ? "not run"
                         : g.self_test_exact ? "a GEMM with a known result gave it bit for bit"
                                             : "a GEMM with a known result gave a WRONG RESULT");
  return c;
}

}  // namespace

double datasheet_hbm_gbps(const std::string& name) {
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  // NVIDIA's datasheets (SXM parts): H200 4.8 TB/s, H100 3.35 TB/s (PCIe 2.0), A100 80GB 2.0 TB/s (40GB 1.56).
  if (has("H200")) return 4800;
  if (has("H100")) return has("PCIe") ? 2000 : 3350;
  if (has("A100")) return has("40GB") ? 1555 : 2039;
  return 0;
}

double datasheet_nvlink_gbps(const std::string& name) {
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  // NVIDIA's datasheets give the total of both directions: 900 GB/s (H100/H200 SXM, NVLink 4), 600 (A100 SXM).
  if (has("PCIe")) return 0;
  if (has("H200") || has("H100")) return 450;
  if (has("A100")) return 300;
  return 0;
}

CheckResult judge_gpu_allreduce(const NodeAllreduceResult& r, const std::string& name) {
  constexpr double kOfNvlink = 0.4;  // header: why
  CheckResult c;
  c.name = "gpus_allreduce";
  c.unit = "GB/s";
  c.value = r.busbw_gbps;
  if (!r.ran) {
    c.ran = false;
    c.pass = true;
    c.detail = fmt::format("{} GPUs ({}): not measured ({})", r.gpus, name, r.why);
    return c;
  }
  const double link = datasheet_nvlink_gbps(name), floor = kOfNvlink * link;
  std::vector<std::string> why;
  if (!r.exact) why.push_back("a WRONG RESULT (every element must be exact)");
  if (floor > 0 && r.busbw_gbps < floor)
    why.push_back(fmt::format("under {:.0f} GB/s ({:.0f}% of its NVLink's {:.0f} GB/s a direction)", floor,
                              100 * kOfNvlink, link));
  c.pass = why.empty();
  c.detail = fmt::format("{} GPUs ({}): all-reduce bus bandwidth {:.0f} GB/s{}{}{}", r.gpus, name, r.busbw_gbps,
                         r.exact ? ", exact" : "", c.pass ? "" : ": ", fmt::join(why, "; "));
  if (c.pass && floor == 0) c.detail += " (no NVLink figure for this part: judged on exactness only)";
  return c;
}

std::vector<CheckResult> judge_gpus(const std::vector<GpuHealth>& gpus) {
  std::vector<double> gemm, hbm, host;
  for (const GpuHealth& g : gpus) {
    gemm.push_back(g.gemm_tflops);
    hbm.push_back(g.hbm_gbps);
    host.push_back(std::min(g.h2d_gbps, g.d2h_gbps));
  }
  const int n = int(gpus.size());
  std::vector<CheckResult> out;
  for (const GpuHealth& g : gpus) {
    out.push_back(rate_check(g, "gemm", "TFLOP/s", g.gemm_tflops, kOfDatasheet * g.datasheet_tflops,
                             fmt::format("{:.0f}% of its datasheet's {:.0f}", 100 * kOfDatasheet, g.datasheet_tflops),
                             median(gemm), n));
    out.push_back(rate_check(g, "hbm_bandwidth", "GB/s", g.hbm_gbps, kOfDatasheet * g.datasheet_hbm_gbps,
                             fmt::format("{:.0f}% of its datasheet's {:.0f}", 100 * kOfDatasheet, g.datasheet_hbm_gbps),
                             median(hbm), n));
    out.push_back(rate_check(g, "host_bandwidth", "GB/s", std::min(g.h2d_gbps, g.d2h_gbps), kMinHostGbps,
                             "a healthy PCIe 4.0 x16 link moves ~25", median(host), n));
    out.push_back(self_test(g));
    out.push_back(memory_errors(g));
    out.push_back(clocks(g));
  }
  return out;
}

}  // namespace mt::launch
