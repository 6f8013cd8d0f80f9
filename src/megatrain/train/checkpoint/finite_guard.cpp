#include "megatrain/train/checkpoint/finite_guard.h"

#include <fmt/format.h>

#include <vector>

#include "megatrain/core/error.h"
#include "megatrain/optim/optimizer.h"
#include "megatrain/parallel/data_parallel.h"
#include "megatrain/train/finite.h"

namespace mt {

std::string non_finite_value(const RankHoldings& h) {
  const ParamStore& ps = h.model.params();
  auto scan = [](const char* what, const std::string& name, const float* x, int64_t n, int64_t base = 0) {
    const int64_t i = first_non_finite(x, n);
    return i < 0 ? std::string() : fmt::format("{} '{}' (element {}: {})", what, name, base + i, x[i]);
  };
  for (int i = 0; i < static_cast<int>(ps.size()); ++i) {
    const std::string& name = ps.info(i).name;
    const int64_t n = static_cast<int64_t>(ps.info(i).numel);
    std::string bad = scan("parameter", name, ps.param(i).f32(), n);
    if (bad.empty() && h.opt) bad = scan("optimizer moment m of", name, h.opt->m(i).f32(), n);
    if (bad.empty() && h.opt) bad = scan("optimizer moment v of", name, h.opt->v(i).f32(), n);
    if (!bad.empty()) return bad;
  }
  for (DataParallel* zero : h.zero_instances()) {
    for (const DataParallel::MomentSlice& ms : zero->moment_slices()) {
      const std::string& name = ps.info(ms.tensor).name;
      const int64_t n = static_cast<int64_t>(ms.end - ms.begin), base = static_cast<int64_t>(ms.begin);
      std::string bad = scan("optimizer moment m of", name, ms.m, n, base);
      if (bad.empty()) bad = scan("optimizer moment v of", name, ms.v, n, base);
      if (!bad.empty()) return bad;
    }
  }
  return "";
}

void refuse_non_finite(const RankHoldings& h, Agreement& agreement, int step, bool staged_finite) {
  const std::string bad = staged_finite ? std::string() : non_finite_value(h);
  const char* keep = "the checkpoint is not written (the latest checkpoint is still the last good one)";
  if (!h.mesh) {
    if (!bad.empty())
      fail_as(ErrorKind::NonFinite, "step {}: {} holds a non-finite value: the weights diverged; {}", step, bad, keep);
    return;
  }
  const std::vector<int> ranks = agreement.which_ranks(!bad.empty());  // every rank's flag, everywhere
  if (!bad.empty())
    fail_as(ErrorKind::NonFinite, "step {}: rank {}: {} holds a non-finite value: the weights diverged; {}", step,
            h.mesh->rank(), bad, keep);
  if (!ranks.empty())
    fail_as(ErrorKind::NonFinite,
            "step {}: rank(s) {} hold non-finite values (their errors name the tensors): the "
            "weights diverged; {}",
            step, fmt::join(ranks, ", "), keep);
}

}  // namespace mt
