#include "megatrain/kernels/cpu/blas_core_choice.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>

namespace mt {
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool in(const std::string& name, std::initializer_list<const char*> names) {
  const std::string l = lower(name);
  return std::any_of(names.begin(), names.end(), [&](const char* n) { return l == n; });
}

// What the CPU's best instruction set is called, for the reason.
std::string best_isa(const CpuFeatures& c) {
  if (c.avx512f) return "AVX-512";
  if (c.avx2 && c.fma) return "AVX2 and FMA";
  if (c.avx2) return "AVX2";
  return c.avx ? "AVX" : "no AVX";
}

}  // namespace

std::vector<std::string> blas_core_candidates(const CpuFeatures& c) {
  std::vector<std::string> out;
  if (c.avx512f && c.avx512cd && c.avx512bw && c.avx512dq && c.avx512vl && c.avx2 && c.fma) out.push_back("SkylakeX");
  if (c.avx2 && c.fma) {
    if (c.amd)
      out.insert(out.end(), {"Zen", "Haswell"});
    else
      out.insert(out.end(), {"Haswell", "Zen"});
  }
  if (c.avx) out.push_back("Sandybridge");
  return out;
}

bool is_blas_fallback_core(const std::string& name) {
  // OpenBLAS's x86-64 cores without AVX kernels: the generic Prescott it falls back to for a processor it does not
  // know, and the older ones a CPU id can map to.
  return in(name, {"unknown", "katmai", "coppermine", "northwood", "prescott", "banias", "atom", "core2", "penryn",
                   "dunnington", "nehalem", "athlon", "opteron", "opteron_sse3", "barcelona", "nano", "bobcat"});
}

bool is_known_blas_core(const std::string& name) {
  return is_blas_fallback_core(name) || in(name, {"sandybridge", "bulldozer", "piledriver", "haswell", "steamroller",
                                                  "excavator", "zen", "skylakex", "cooperlake", "sapphirerapids"});
}

BlasCoreDecision decide_blas_core(const BlasCoreInputs& in) {
  BlasCoreDecision d;
  if (in.user_set) {
    d.reason = fmt::format("OPENBLAS_CORETYPE={} set by the user", in.user_coretype);
    if (!is_known_blas_core(in.user_coretype)) {
      d.reason += " (not a core name OpenBLAS knows)";
      d.warning = fmt::format(
          "OPENBLAS_CORETYPE={} is not a core name OpenBLAS 0.3.21 knows (e.g. SkylakeX, Haswell, Zen, Sandybridge, "
          "Prescott); kept as set: OpenBLAS then picks its kernels as if it were unset",
          in.user_coretype);
    }
    return d;
  }
  if (!is_blas_fallback_core(in.reported)) {
    d.reason = fmt::format("OpenBLAS's choice for this CPU");
    return d;
  }
  const std::vector<std::string> candidates = blas_core_candidates(in.cpu);
  const std::string fell = fmt::format("OpenBLAS fell back to {} on a CPU with {}", in.reported, best_isa(in.cpu));
  if (candidates.empty()) {
    d.reason = fmt::format("OpenBLAS's choice ({} on a CPU with no AVX: nothing better to try)", in.reported);
    return d;
  }
  std::vector<std::string> failed;
  for (const std::string& c : candidates) {
    auto t = in.tests.find(c);
    if (t == in.tests.end()) return {BlasCoreAction::Test, c, fell + "; testing " + c, ""};
    if (t->second == BlasSelfTest::Failed) {
      failed.push_back(c);
      continue;
    }
    d.action = BlasCoreAction::Use;
    d.core = c;
    d.reason = fmt::format("{}; {} passed the self-test{}", fell, c,
                           failed.empty() ? "" : fmt::format(" ({} failed it)", fmt::join(failed, ", ")));
    return d;
  }
  d.reason = fmt::format("{}; kept: every better core failed the self-test ({})", fell, fmt::join(failed, ", "));
  return d;
}

std::string blas_core_note(const std::string& core, const std::string& reason) { return core + "|" + reason; }

std::string blas_core_note_reason(const std::string& note, const std::string& coretype) {
  const size_t bar = note.find('|');
  if (bar == std::string::npos || note.substr(0, bar) != coretype) return "";
  return note.substr(bar + 1);
}

}  // namespace mt
