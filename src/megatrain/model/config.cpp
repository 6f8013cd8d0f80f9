#include "megatrain/model/config.h"

#include <array>

#include "megatrain/core/error.h"

namespace mt {

namespace {

// Each kind's spellings, in the enum's order.
constexpr std::array<const char*, 2> kNormNames = {"layernorm", "rmsnorm"};
constexpr std::array<const char*, 2> kMlpNames = {"gelu", "swiglu"};
constexpr std::array<const char*, 2> kPosNames = {"learned", "rope"};
constexpr std::array<const char*, 2> kBlockNames = {"sequential", "parallel"};

template <typename Kind, size_t N>
const char* name_of(const std::array<const char*, N>& names, Kind k) {
  const auto i = static_cast<size_t>(k);
  MT_CHECK(i < N, "invalid kind value {}", i);  // only a cast from a bad integer gets here
  return names[i];
}

template <typename Kind, size_t N>
void parse_of(const std::array<const char*, N>& names, const std::string& key, const std::string& value, Kind& out) {
  std::string allowed;
  for (size_t i = 0; i < N; ++i) {
    if (value == names[i]) {
      out = static_cast<Kind>(i);
      return;
    }
    allowed += fmt::format("{}'{}'", i == 0 ? "" : i + 1 == N ? " or " : ", ", names[i]);
  }
  fail("{} must be {} (got '{}')", key, allowed, value);
}

}  // namespace

const char* kind_name(NormKind k) { return name_of(kNormNames, k); }
const char* kind_name(MlpKind k) { return name_of(kMlpNames, k); }
const char* kind_name(PosKind k) { return name_of(kPosNames, k); }
const char* kind_name(BlockKind k) { return name_of(kBlockNames, k); }

void parse_kind(const std::string& key, const std::string& value, NormKind& out) {
  parse_of(kNormNames, key, value, out);
}
void parse_kind(const std::string& key, const std::string& value, MlpKind& out) {
  parse_of(kMlpNames, key, value, out);
}
void parse_kind(const std::string& key, const std::string& value, PosKind& out) {
  parse_of(kPosNames, key, value, out);
}
void parse_kind(const std::string& key, const std::string& value, BlockKind& out) {
  parse_of(kBlockNames, key, value, out);
}

int ModelConfig::ff_dim() const {
  if (d_ff > 0) return d_ff;
  if (mlp == MlpKind::SwiGlu) return (8 * d_model / 3 + 63) / 64 * 64;
  return 4 * d_model;
}

int ModelConfig::padded_vocab() const {
  int m = vocab_pad_to > 0 ? vocab_pad_to : 1;
  return (vocab_size + m - 1) / m * m;
}

int ModelConfig::padded_vocab(int tp) const {
  int m = (vocab_pad_to > 0 ? vocab_pad_to : 1) * (tp > 0 ? tp : 1);
  return (vocab_size + m - 1) / m * m;
}

void ModelConfig::validate_tp(int tp) const {
  MT_CHECK(tp >= 1, "parallel.tp must be >= 1 (got {})", tp);
  MT_CHECK(n_head % tp == 0, "model.n_head ({}) must be divisible by parallel.tp ({})", n_head, tp);
  MT_CHECK(kv_heads() % tp == 0, "model.n_kv_head ({}) must be divisible by parallel.tp ({})", kv_heads(), tp);
  MT_CHECK(ff_dim() % tp == 0, "the MLP width (model.d_ff = {}) must be divisible by parallel.tp ({})", ff_dim(), tp);
}

void ModelConfig::validate() const {
  MT_CHECK(vocab_size > 0, "model.vocab_size must be positive (got {})", vocab_size);
  MT_CHECK(n_layer > 0, "model.n_layer must be positive (got {})", n_layer);
  MT_CHECK(n_head > 0, "model.n_head must be positive (got {})", n_head);
  MT_CHECK(d_model > 0 && d_model % n_head == 0, "model.d_model ({}) must be a positive multiple of model.n_head ({})",
           d_model, n_head);
  MT_CHECK(kv_heads() > 0 && n_head % kv_heads() == 0, "model.n_head ({}) must be a multiple of model.n_kv_head ({})",
           n_head, kv_heads());
  MT_CHECK(max_seq_len > 0, "model.max_seq_len must be positive (got {})", max_seq_len);
  // norm, mlp, pos and block are enums, checked where their spelling was parsed (parse_kind).
  MT_CHECK(pos != PosKind::Rope || head_dim() % 2 == 0, "model.pos = 'rope' needs an even head dim (got {})",
           head_dim());
  MT_CHECK(window >= 0, "model.window must be >= 0 (got {}); 0 means full causal attention", window);
  MT_CHECK(ff_dim() > 0, "model.d_ff must be positive (got {})", d_ff);
  MT_CHECK(recompute.empty() || static_cast<int>(recompute.size()) == n_layer,
           "model.recompute lists {} layers but the model has {}", recompute.size(), n_layer);
}

int64_t ModelConfig::num_params() const {
  int64_t C = d_model, hd = head_dim(), F = ff_dim(), L = n_layer;
  int64_t qkv = (n_head + 2 * kv_heads()) * hd;
  int64_t fc = mlp == MlpKind::SwiGlu ? 2 * F : F;
  int64_t nb = norm == NormKind::LayerNorm && bias ? 2 : 1;  // norm params per channel
  int64_t n_norms = block == BlockKind::Parallel ? 1 : 2;
  int64_t per_layer = qkv * C + C * n_head * hd + fc * C + C * F + n_norms * nb * C;
  if (bias) per_layer += qkv + C + fc + C;
  int64_t n = L * per_layer + vocab_size * C + nb * C;
  if (pos == PosKind::Learned) n += static_cast<int64_t>(max_seq_len) * C;
  if (!tied_embeddings) n += vocab_size * C;
  return n;
}

double ModelConfig::flops_per_token(int T) const {
  // Matmul parameters touched per token (embedding lookups are not matmuls; the LM head is).
  double C = d_model, hd = head_dim(), F = ff_dim();
  double qkv = (n_head + 2.0 * kv_heads()) * hd;
  double fc = mlp == MlpKind::SwiGlu ? 2 * F : F;
  double per_layer = qkv * C + C * n_head * hd + fc * C + C * F;
  double n_matmul = n_layer * per_layer + static_cast<double>(padded_vocab()) * C;
  // Attention scores and weighted sum: 2 matmuls of (ctx x hd) per head, forward 2*2*ctx*d, x3 for fwd+bwd.
  double ctx = window > 0 && window < T ? window : T;
  // Causal: on average half the context is attended; follow the common convention (PaLM, llm.c) of full T.
  double attn = 12.0 * n_layer * n_head * hd * ctx;
  return 6.0 * n_matmul + attn;
}

}  // namespace mt
