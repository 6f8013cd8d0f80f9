#include "megatrain/train/moe_stats.h"

#include <cstdint>

namespace mt {

namespace {

constexpr int64_t kHalf = int64_t{1} << 24;

// A layer's record: present, forwards, dropped, assignments (each as two halves), aux, z, tokens[E] (two halves).
struct Record {
  int E;
  int64_t size() const { return 2 + 2 + 2 + 2 + 1 + 1 + 2 * int64_t{E}; }
};

void put(float*& p, int64_t v) {
  *p++ = static_cast<float>(v / kHalf);
  *p++ = static_cast<float>(v % kHalf);
}

int64_t get(const float*& p) {
  const int64_t hi = static_cast<int64_t>(p[0]), lo = static_cast<int64_t>(p[1]);
  p += 2;
  return hi * kHalf + lo;
}

}  // namespace

std::vector<MoeLayerStats> gather_moe_stats(const ModelConfig& cfg, std::vector<MoeLayerStats> mine, ProcessGroup* pp) {
  if (!pp || pp->size() == 1 || !cfg.moe()) return mine;
  const Record rec{cfg.moe_experts};
  std::vector<float> v(static_cast<size_t>(rec.size() * cfg.n_layer), 0.0f);
  for (const MoeLayerStats& st : mine) {
    float* p = v.data() + rec.size() * st.layer;
    put(p, 1), put(p, st.forwards), put(p, st.dropped), put(p, st.assignments);
    *p++ = static_cast<float>(st.aux), *p++ = static_cast<float>(st.z);
    for (int64_t t : st.tokens) put(p, t);
  }
  pp->allreduce(f32_view(v.data(), {static_cast<int64_t>(v.size())}))->wait();
  std::vector<MoeLayerStats> all;
  for (int l = 0; l < cfg.n_layer; ++l) {
    const float* p = v.data() + rec.size() * l;
    if (get(p) == 0) continue;  // a dense layer, or no training forward counted
    MoeLayerStats st;
    st.layer = l;
    st.forwards = static_cast<int>(get(p));
    st.dropped = get(p), st.assignments = get(p);
    st.aux = *p++, st.z = *p++;
    st.tokens.resize(cfg.moe_experts);
    for (int64_t& t : st.tokens) t = get(p);
    all.push_back(std::move(st));
  }
  return all;
}

}  // namespace mt
