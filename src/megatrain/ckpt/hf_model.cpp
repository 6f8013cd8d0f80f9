#include "megatrain/ckpt/hf_model.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "megatrain/ckpt/hf_gpt2.h"
#include "megatrain/ckpt/hf_llama.h"
#include "megatrain/ckpt/model_weights.h"
#include "megatrain/core/error.h"
#include "megatrain/model/layout.h"

namespace mt {

HfFamily hf_family(const HfModelFiles& m) {
  if (is_hf_llama(m)) return HfFamily::Llama;
  if (const nlohmann::json* t = m.setting("model_type"))
    MT_CHECK(*t == "gpt2",
             "{} describes a {} model; megatrain converts \"gpt2\", \"llama\", \"mistral\" and \"mixtral\"",
             m.config_path(), t->dump());
  for (size_t i = 0; i < m.num_files(); ++i)
    MT_CHECK(!m.file(i).metadata().count("megatrain"),
             "{} is a file of a megatrain checkpoint; pass the checkpoint directory (it holds the manifest)",
             m.file(i).path());
  // GPT-2 files are small enough that HF never splits them; the GPT-2 reader works on one file.
  MT_CHECK(m.num_files() == 1, "{}: a GPT-2 split over {} files is not supported", m.source(), m.num_files());
  return HfFamily::Gpt2;
}

HfFamily hf_family(const ModelConfig& cfg) {
  std::string why_not_gpt2;
  try {
    check_hf_gpt2_convertible(cfg);
    return HfFamily::Gpt2;
  } catch (const Error& e) {
    why_not_gpt2 = e.what();
  }
  try {
    check_hf_llama_convertible(cfg);
    return HfFamily::Llama;
  } catch (const Error& e) {
    fail("this model has neither the GPT-2 nor the Llama layout, the two HF formats megatrain writes:\n  {}\n  {}",
         why_not_gpt2, e.what());
  }
}

ModelConfig hf_model_config(const HfModelFiles& m, int n_head) {
  if (hf_family(m) == HfFamily::Gpt2) return infer_hf_gpt2_config(m.file(0), n_head);
  ModelConfig c = infer_hf_llama_config(m);
  MT_CHECK(n_head <= 0 || n_head == c.n_head, "n_head {} was asked for but {} says num_attention_heads = {}", n_head,
           m.config_path(), c.n_head);
  return c;
}

void import_hf_model(const HfModelFiles& m, const ModelConfig& cfg, ParamStore& store) {
  if (hf_family(m) == HfFamily::Gpt2)
    import_hf_gpt2(m.file(0), cfg, store);
  else
    import_hf_llama(m, cfg, store);
}

void export_hf_model(const ModelConfig& cfg, const ParamStore& store, const std::string& path, DType dtype) {
  if (hf_family(cfg) == HfFamily::Gpt2)
    export_hf_gpt2(cfg, store, path, dtype);
  else
    export_hf_llama(cfg, store, path, dtype);
}

// ---- slices -------------------------------------------------------------------------------------------------


HfSliceReader::HfSliceReader(const HfModelFiles& m, const ModelConfig& cfg) : m_(m), cfg_(cfg), family_(hf_family(m)) {
  check_same_architecture(hf_model_config(m, cfg.n_head), cfg, m.source());
  ParamStore whole;  // our whole model's tensors, full shapes (declared, never allocated)
  declare_gpt_params(cfg, whole);
  std::set<std::string> used;
  for (const ParamInfo& p : whole.infos()) {
    const int64_t R = p.shape[0], C = p.shape.size() >= 2 ? p.shape.back() : 1;  // experts [E, R, C]: E*R rows
    const bool vocab = p.name == "wte.weight" || p.name == "lm_head.weight";
    full_shape_[p.name] = p.shape;
    std::vector<Rows>& runs = rows_[p.name];
    auto need = [&](const std::string& hn, const std::vector<int64_t>& shape, bool at_least_rows = false) {
      if (hn.empty() || !m.has(hn)) {
        if (p.name == "lm_head.weight")
          fail("{}: the config unties the LM head but there is no lm_head.weight", m.source());
        fail("{}: no tensor for parameter '{}'{}", m.source(), p.name, hn.empty() ? "" : " (looked for '" + hn + "')");
      }
      const TensorData& t = m.float_tensor(hn);
      const bool fits = at_least_rows ? t.shape.size() == shape.size() && t.shape[0] >= shape[0] &&
                                            std::equal(t.shape.begin() + 1, t.shape.end(), shape.begin() + 1)
                                      : t.shape == shape;
      MT_CHECK(fits, "{}: tensor '{}' has shape {} but this model ({}) needs {}", m.file_of(hn), hn, t.shape_str(),
               p.name, shape_str(shape));
      used.insert(hn);
      return &t;
    };
    if (family_ == HfFamily::Llama) {
      int64_t at = 0;
      for (const HfRowBlock& b : hf_llama_row_blocks(cfg, p.name)) {
        const std::vector<int64_t> shape = p.shape.size() >= 2 ? std::vector<int64_t>{b.rows, C}
                                                               : std::vector<int64_t>{b.rows};
        runs.push_back({need(b.name, shape), at, b.rows, 0, false});
        at += b.rows;
      }
    } else {
      const HfGpt2Tensor h = hf_gpt2_tensor(m.file(0), p.name);
      if (h.transposed)
        runs.push_back({need(h.name, {C, R}), 0, R, 0, true});
      else if (vocab)
        runs.push_back({need(h.name, {cfg.vocab_size, C}), 0, cfg.vocab_size, 0, false});
      else  // wpe may hold more positions than this run uses: the first ones
        runs.push_back({need(h.name, p.shape, p.name == "wpe.weight"), 0, R, 0, false});
    }
  }
  std::vector<std::string> unused;
  for (const std::string& n : m.names()) {
    if (used.count(n) || (family_ == HfFamily::Llama ? is_hf_llama_buffer(n) : is_hf_gpt2_buffer(n))) continue;
    if (n == "lm_head.weight" && cfg.tied_embeddings) {
      const std::string embed = family_ == HfFamily::Llama ? "model.embed_tokens.weight"
                                                           : rows_.at("wte.weight")[0].t->name;
      MT_CHECK(m.same_values(n, embed), "{}: lm_head.weight differs from {} but the config ties them", m.source(),
               embed);
      continue;
    }
    unused.push_back(n);
  }
  MT_CHECK(unused.empty(), "{}: {} tensor(s) have no place in this model (first: '{}')", m.source(), unused.size(),
           unused.empty() ? "" : unused[0]);
}

const std::vector<HfSliceReader::Rows>& HfSliceReader::rows_of(const std::string& ours) {
  auto it = rows_.find(ours);
  MT_CHECK(it != rows_.end(), "{}: this model has no parameter '{}'", m_.source(), ours);
  return it->second;
}

void HfSliceReader::read(const std::string& ours, const Slice& src, void* dst, const std::vector<int64_t>& dst_shape,
                         const std::vector<int64_t>& dst_start) {
  const size_t nd = src.start.size();
  if (nd > 2 && src.extent.size() == nd && dst_shape.size() == nd && dst_start.size() == nd)
    return read_as_rows(ours, src, dst, dst_shape, dst_start);
  MT_CHECK((nd == 1 || nd == 2) && src.extent.size() == nd && dst_shape.size() == nd && dst_start.size() == nd,
           "HfSliceReader::read: '{}': slice {} of a 1-D or 2-D tensor into a box of rank {}", ours, src.str(),
           dst_shape.size());
  const std::vector<Rows>& runs = rows_of(ours);
  float* out = static_cast<float*>(dst);
  const int64_t cols = nd == 2 ? src.extent[1] : 1, c0 = nd == 2 ? src.start[1] : 0;
  auto out_row = [&](int64_t i) {
    return out + (nd == 2 ? (dst_start[0] + i) * dst_shape[1] + dst_start[1] : dst_start[0] + i);
  };
  if (runs.size() == 1 && runs[0].transposed) {
    // HF [in, out] (GPT-2's Conv1D): our column c is HF's row c, so the slice's rows of it are one contiguous run
    // there: read a column per call, not an element.
    const Rows& run = runs[0];
    const TensorData& t = *run.t;
    const int64_t r0 = src.start[0], n = src.extent[0];
    MT_CHECK(r0 >= run.begin && r0 + n <= run.begin + run.count && c0 >= 0 && c0 + cols <= t.shape[0],
             "HfSliceReader::read: '{}': slice {} outside {}", ours, src.str(), t.shape_str());
    std::vector<float> column(static_cast<size_t>(n));
    for (int64_t j = 0; j < cols; ++j) {
      to_f32(t, (c0 + j) * t.shape[1] + run.hf_row + (r0 - run.begin), n, column.data());
      for (int64_t i = 0; i < n; ++i) out_row(i)[j] = column[static_cast<size_t>(i)];
    }
    return;
  }
  for (int64_t i = 0; i < src.extent[0]; ++i) {
    const int64_t r = src.start[0] + i;
    float* o = out_row(i);
    const Rows* run = nullptr;
    for (const Rows& x : runs)
      if (r >= x.begin && r < x.begin + x.count) run = &x;
    if (!run) {  // the vocabulary's padding rows
      std::fill(o, o + cols, 0.0f);
      continue;
    }
    const TensorData& t = *run->t;
    const int64_t hf_cols = t.shape.size() == 2 ? t.shape[1] : 1;
    MT_CHECK(c0 >= 0 && c0 + cols <= hf_cols, "HfSliceReader::read: '{}': columns {}:{} of {}", ours, c0, c0 + cols,
             hf_cols);
    to_f32(t, (run->hf_row + (r - run->begin)) * hf_cols + c0, cols, o);
  }
}

// A tensor of rank > 2 (the experts' [E, R, C]) is our [E*R, C] rows (the constructor's runs): a slice spanning
// every middle dimension whole, in source and destination, is the 2-D slice of those rows. Such tensors are
// replicated over tp (model/layout.h), so a rank asks for the whole tensor or whole experts.
void HfSliceReader::read_as_rows(const std::string& ours, const Slice& src, void* dst,
                                 const std::vector<int64_t>& dst_shape, const std::vector<int64_t>& dst_start) {
  const size_t nd = src.start.size();
  auto it = full_shape_.find(ours);
  MT_CHECK(it != full_shape_.end() && it->second.size() == nd,
           "HfSliceReader::read: '{}': slice {} of a tensor of "
           "another rank",
           ours, src.str());
  int64_t mid = 1;
  for (size_t d = 1; d + 1 < nd; ++d) {
    const int64_t n = it->second[d];
    MT_CHECK(src.start[d] == 0 && src.extent[d] == n && dst_start[d] == 0 && dst_shape[d] == n,
             "HfSliceReader::read: '{}': slice {} must span dimension {} of {} whole", ours, src.str(), d,
             shape_str(it->second));
    mid *= n;
  }
  const size_t l = nd - 1;
  read(ours, Slice{{src.start[0] * mid, src.start[l]}, {src.extent[0] * mid, src.extent[l]}}, dst,
       {dst_shape[0] * mid, dst_shape[l]}, {dst_start[0] * mid, dst_start[l]});
}

}  // namespace mt
