// The oracle the Hugging Face Llama-family import tests compare megatrain's logits with: HF's modeling code
// (LlamaRMSNorm, apply_rotary_pos_emb, repeat_kv attention with an optional sliding window) written again in double
// over the HF tensors of a synthetic model, never calling megatrain. The Llama/Mistral and Mixtral tests share its
// attention half; each adds its own feed-forward (a SwiGLU MLP, a sparse MoE block) and its rotary frequencies.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "megatrain/ckpt/hf_model_files.h"

namespace hf_oracle {

struct HfTensor {
  std::vector<int64_t> shape;
  std::vector<float> v;
};
using HfModel = std::map<std::string, HfTensor>;
using Vec = std::vector<double>;

inline Vec matvec(const HfTensor& w, const Vec& x) {  // nn.Linear: y = W x, W [out, in]
  const int64_t out = w.shape[0], in = w.shape[1];
  Vec y(out, 0.0);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) y[o] += double(w.v[o * in + i]) * x[i];
  return y;
}

inline Vec rms_norm(const Vec& x, const HfTensor& w, double eps) {  // LlamaRMSNorm / MixtralRMSNorm
  double ms = 0;
  for (double a : x) ms += a * a;
  ms /= x.size();
  const double r = 1.0 / std::sqrt(ms + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = double(w.v[i]) * (x[i] * r);
  return y;
}

// apply_rotary_pos_emb: x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1), per head of head_dim;
// inv_freq(i) is the i-th of head_dim / 2 inverse frequencies.
inline void rope(Vec& x, int heads, int head_dim, int pos, const std::function<double(int)>& inv_freq) {
  const int half = head_dim / 2;
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < half; ++i) {
      const double ang = pos * inv_freq(i);
      double& a = x[h * head_dim + i];
      double& b = x[h * head_dim + i + half];
      const double x1 = a, x2 = b;
      a = x1 * std::cos(ang) - x2 * std::sin(ang);
      b = x2 * std::cos(ang) + x1 * std::sin(ang);
    }
}

struct AttentionShape {
  int heads, kv_heads, head_dim;
  double eps;
  std::function<double(int)> inv_freq;
  int window =
      0;  // > 0: Mistral's sliding window (transformers' sliding_window_overlay: key s seen from t when s > t - W)
};

// One layer's causal GQA attention over the sequence `x` (the residual stream), input_layernorm first and o_proj
// applied: the residual's increment per position. `p` is the layer's prefix ("model.layers.3.").
inline std::vector<Vec> attention(const HfModel& m, const std::string& p, const std::vector<Vec>& x,
                                  const AttentionShape& s) {
  const int n = static_cast<int>(x.size()), HD = s.head_dim;
  std::vector<Vec> q(n), k(n), v(n), out(n);
  for (int t = 0; t < n; ++t) {
    const Vec h = rms_norm(x[t], m.at(p + "input_layernorm.weight"), s.eps);
    q[t] = matvec(m.at(p + "self_attn.q_proj.weight"), h);
    k[t] = matvec(m.at(p + "self_attn.k_proj.weight"), h);
    v[t] = matvec(m.at(p + "self_attn.v_proj.weight"), h);
    rope(q[t], s.heads, HD, t, s.inv_freq);
    rope(k[t], s.kv_heads, HD, t, s.inv_freq);
  }
  for (int t = 0; t < n; ++t) {
    Vec o(s.heads * HD, 0.0);
    for (int h = 0; h < s.heads; ++h) {
      const int kvh = h / (s.heads / s.kv_heads);  // repeat_kv: each key/value head repeated heads/kv_heads times
      std::vector<double> sc(t + 1);
      double mx = -1e300;
      for (int j = 0; j <= t; ++j) {
        if (s.window > 0 && !(j > t - s.window)) {
          sc[j] = -1e300;
          continue;
        }
        double d = 0;
        for (int i = 0; i < HD; ++i) d += q[t][h * HD + i] * k[j][kvh * HD + i];
        sc[j] = d / std::sqrt(double(HD));
        mx = std::max(mx, sc[j]);
      }
      double z = 0;
      for (double& e : sc) z += (e = e == -1e300 ? 0.0 : std::exp(e - mx));
      for (int j = 0; j <= t; ++j)
        for (int i = 0; i < HD; ++i) o[h * HD + i] += sc[j] / z * v[j][kvh * HD + i];
    }
    out[t] = matvec(m.at(p + "self_attn.o_proj.weight"), o);
  }
  return out;
}

// The largest |ours - oracle| over a sequence's logits; `got` is [T, padded_vocab] (megatrain pads the vocabulary).
inline double worst_logit_error(const float* got, int64_t padded_vocab, const std::vector<Vec>& want) {
  double worst = 0;
  for (size_t t = 0; t < want.size(); ++t)
    for (size_t j = 0; j < want[t].size(); ++j)
      worst = std::max(worst, std::abs(double(got[t * padded_vocab + j]) - want[t][j]));
  return worst;
}

// Every tensor of a safetensors file, as fp32.
inline HfModel read_back(const std::string& path) {
  HfModel m;
  const mt::HfModelFiles f = mt::HfModelFiles::open(path);
  for (auto& n : f.names()) m[n] = {f.tensor(n).shape, f.read_f32(n)};
  return m;
}

}  // namespace hf_oracle
