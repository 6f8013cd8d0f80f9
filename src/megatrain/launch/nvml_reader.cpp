#include "megatrain/launch/nvml_reader.h"

#include <dlfcn.h>
#include <fmt/format.h>

namespace mt::launch {
namespace {

// The few NVML declarations used (nvml.h's, by value: the ABI of these calls is stable since NVML's _v2 entry
// points; the header is not in this project's toolkit image).
using nvmlReturn = int;  // NVML_SUCCESS = 0; any other value: the call failed or is not supported
using nvmlDevice = void*;
constexpr nvmlReturn kSuccess = 0;
constexpr int kTemperatureGpu = 0;              // NVML_TEMPERATURE_GPU
constexpr int kThresholdSlowdown = 1;           // NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
constexpr int kUncorrected = 1, kVolatile = 0;  // NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC

// nvmlClocksEventReason* bits, named as gpu_checks.h's clock_events.
constexpr struct {
  unsigned long long bit;
  const char* name;
} kClockEvents[] = {{0x1, "idle"},
                    {0x2, "applications_clocks_setting"},
                    {0x4, "sw_power_cap"},
                    {0x8, "hw_slowdown"},
                    {0x10, "sync_boost"},
                    {0x20, "sw_thermal_slowdown"},
                    {0x40, "hw_thermal_slowdown"},
                    {0x80, "hw_power_brake"},
                    {0x100, "display_clock_setting"}};

struct Nvml {
  void* lib = nullptr;
  nvmlReturn (*init)() = nullptr;
  nvmlReturn (*shutdown)() = nullptr;
  const char* (*error_string)(nvmlReturn) = nullptr;
  nvmlReturn (*by_pci)(const char*, nvmlDevice*) = nullptr;
  nvmlReturn (*temperature)(nvmlDevice, int, unsigned*) = nullptr;
  nvmlReturn (*threshold)(nvmlDevice, int, unsigned*) = nullptr;
  nvmlReturn (*clock_events)(nvmlDevice, unsigned long long*) = nullptr;
  nvmlReturn (*ecc)(nvmlDevice, int, int, unsigned long long*) = nullptr;
  nvmlReturn (*retired_pending)(nvmlDevice, int*) = nullptr;
  nvmlReturn (*remapped_rows)(nvmlDevice, unsigned*, unsigned*, unsigned*, unsigned*) = nullptr;

  template <typename F>
  void sym(F& f, const char* name, const char* older = nullptr) {
    f = reinterpret_cast<F>(::dlsym(lib, name));
    if (!f && older) f = reinterpret_cast<F>(::dlsym(lib, older));
  }
  std::string say(nvmlReturn r) const { return error_string ? error_string(r) : fmt::format("NVML error {}", r); }
};

}  // namespace

bool read_nvml(const std::string& pci_bus_id, GpuHealth& g, std::string* why) {
  if (pci_bus_id.empty()) {
    *why = "the GPU's PCI bus id is not known";
    return false;
  }
  Nvml n;
  n.lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!n.lib) {
    *why = fmt::format("NVML (libnvidia-ml.so.1, from the driver) could not be opened: {}", ::dlerror());
    return false;
  }
  n.sym(n.init, "nvmlInit_v2");
  n.sym(n.shutdown, "nvmlShutdown");
  n.sym(n.error_string, "nvmlErrorString");
  n.sym(n.by_pci, "nvmlDeviceGetHandleByPciBusId_v2");
  n.sym(n.temperature, "nvmlDeviceGetTemperature");
  n.sym(n.threshold, "nvmlDeviceGetTemperatureThreshold");
  n.sym(n.clock_events, "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons");
  n.sym(n.ecc, "nvmlDeviceGetTotalEccErrors");
  n.sym(n.retired_pending, "nvmlDeviceGetRetiredPagesPendingStatus");
  n.sym(n.remapped_rows, "nvmlDeviceGetRemappedRows");
  bool ok = false;
  if (!n.init || !n.shutdown || !n.by_pci || !n.temperature || !n.clock_events) {
    *why = "NVML lacks nvmlInit_v2, nvmlDeviceGetHandleByPciBusId_v2, the temperature or the clock-event reasons";
  } else if (nvmlReturn r = n.init(); r != kSuccess) {
    *why = fmt::format("nvmlInit_v2: {}", n.say(r));
  } else {
    GpuHealth got = g;
    nvmlDevice dev = nullptr;
    unsigned t = 0;
    unsigned long long reasons = 0;
    if (nvmlReturn r = n.by_pci(pci_bus_id.c_str(), &dev); r != kSuccess) {
      *why = fmt::format("NVML has no GPU at PCI bus id {}: {}", pci_bus_id, n.say(r));
    } else if (nvmlReturn r2 = n.temperature(dev, kTemperatureGpu, &t); r2 != kSuccess) {
      *why = fmt::format("nvmlDeviceGetTemperature: {}", n.say(r2));
    } else if (nvmlReturn r3 = n.clock_events(dev, &reasons); r3 != kSuccess) {
      *why = fmt::format("the clock-event reasons: {}", n.say(r3));
    } else {
      got.temperature_c = int(t);
      unsigned slow = 0;
      if (n.threshold && n.threshold(dev, kThresholdSlowdown, &slow) == kSuccess)
        got.slowdown_temperature_c = int(slow);
      got.clock_events.clear();
      for (const auto& e : kClockEvents)
        if (reasons & e.bit) got.clock_events.push_back(e.name);
      unsigned long long ecc = 0;
      if (n.ecc && n.ecc(dev, kUncorrected, kVolatile, &ecc) == kSuccess) got.ecc_uncorrected_volatile = (long long)ecc;
      int pending = 0;  // nvmlEnableState_t
      if (n.retired_pending && n.retired_pending(dev, &pending) == kSuccess) got.retired_pages_pending = pending;
      unsigned corr = 0, unc = 0, remap_pending = 0, failed = 0;
      if (n.remapped_rows && n.remapped_rows(dev, &corr, &unc, &remap_pending, &failed) == kSuccess) {
        got.row_remap_pending = remap_pending != 0;
        got.row_remap_failure = failed != 0;
      }
      got.nvml_read = true;
      g = got;
      ok = true;
    }
    n.shutdown();
  }
  ::dlclose(n.lib);
  return ok;
}

}  // namespace mt::launch
