// cuDNN fused attention through the backend graph API (see cudnn_attention.h for the contract).
//
// The engines behind cuDNN's "fused flash attention" match operation graphs of one fixed pattern; we build that
// pattern by hand with cudnnBackend* calls (no cudnn_frontend). Notation: S is [B, H, T, T] (query rows, key
// columns), every [B,H,T,T] and row-statistic tensor is virtual (never stored) unless marked "stored".
//
// Forward (heuristics mode A picks the fused engine):
//   S0 = matmul(Q [B,H,T,hd], K^T [B,Hkv,hd,T])           K^T is K's strided view with the last two dims swapped;
//                                                          Hkv < H broadcasts kv head h / (H / Hkv) (GQA)
//   S1 = S0 * scale                                        pointwise MUL, scale = 1/sqrt(hd) passed by value
//   S2 = causal(S1), S3 = window(S2)                       the masks below
//   M = max_row(S3); E = exp(S3 - M); Z = sum_row(E)       reductions MAX and ADD to [B,H,T,1]
//   Stats = M + log(Z)                                     stored: our lse [B,H,T] (natural log)
//   P = E / Z                                              bf16 (the engine's second GEMM operand)
//   O = matmul(P, V)                                       stored into `out` [B,T,H*hd] through strides
// Masks (index generation and comparison, which the engines fuse):
//   causal: r = gen_index(axis 2), c = gen_index(axis 3) (INT32); keep = r >= c; S = keep ? S : lowest float
//   window: r, c = gen_index (float); keep = c + W > r; S = keep ? S : -2^30      (only when window > 0)
//   so key c is visible from query r iff r - W < c <= r, our convention.
//   Why float indices for the window when the causal mask uses INT32: these are the ops, types and fill that cuDNN's
//   own frontend emitted for its sliding window before cuDNN 9.21 (float GEN_INDEX, a float window added on axis 3,
//   CMP_GT computing BOOLEAN, -2^30), i.e. a pattern the fused engines are known to match. Newer frontends emit
//   INT32 indices plus an INT32 window; if a future cuDNN refuses this graph, that is the variant to try.
// Backward:
//   Dsum = sum_row(dO * O) * 1                             stored fp32 [B,H,T,1] in our workspace ("softmax sum")
//   S = mask(matmul(Q, K^T) * scale - Stats); P = exp(S)   Stats = the forward's lse
//   dV = matmul(reshape(P)^T, dO)                          P^T as a bf16 [B,H,T,T] view with swapped strides; for
//                                                          GQA a [B,H,T,hd] bf16 virtual then a head-sum reduction
//   dP = matmul(dO, V^T); dS = (dP - Dsum) * P * scale
//   dK = matmul(reshape(dS)^T, Q)                          (GQA: head-sum reduction as for dV)
//   dQacc = matmul(dS, reshape(K^T) = K)                   stored fp32 [B,H,T,hd] in our workspace
//   dQ = identity(dQacc)                                   into dqkv
// Data types: inputs/outputs bf16, Stats and the stored scratch fp32, virtual intermediates fp32 (the masks' index
// tensors INT32/float and the comparisons BOOLEAN), every op computing in fp32.
//
// Plans are cached per (shape, direction). All descriptors of a plan live as long as the plan.
#include "megatrain/kernels/cuda/cudnn_attention.h"

#ifdef MT_HAVE_CUDNN

#include <cudnn.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "megatrain/core/error.h"

namespace mt {
namespace {

using Dims = std::array<int64_t, 4>;

// Unique ids of the stored tensors and by-value scalars (the variant pack's keys); virtual tensors count up from
// kFirstVirtual.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kScale,
  kDO,
  kDQ,
  kDK,
  kDV,
  kSoftmaxSum,
  kDQAccum,
  kCausalFill,
  kWindow,
  kWindowFill,
  kOne,
  kFirstVirtual = 100,
};

constexpr int64_t kByteAlignment = 16;
constexpr size_t kWsAlign = 256;

size_t align_up(size_t n) { return (n + kWsAlign - 1) / kWsAlign * kWsAlign; }

std::string shape_text(const AttnShape& s) {
  return fmt::format("B={} T={} n_head={} n_kv_head={} head_dim={} window={}", s.B, s.T, s.n_head, s.n_kv_head,
                     s.head_dim, s.window);
}

// cuDNN's name for a status plus its last error message (cudnnGetLastErrorString, cuDNN >= 9), which usually says
// which node or attribute it objected to.
std::string status_text(cudnnStatus_t st) {
  std::string s = fmt::format("{} (status {})", cudnnGetErrorString(st), static_cast<int>(st));
  char last[2048] = {};
  cudnnGetLastErrorString(last, sizeof(last));
  if (last[0] != '\0') s += fmt::format("; cuDNN says: {}", last);
  return s;
}

constexpr const char* kHint = "set train.attention = \"flash\" (our kernel) for this shape";

// The by-value scalars of a graph; their addresses go into the variant pack, so a Plan never moves them.
struct Scalars {
  float scale = 1.0f;
  float causal_fill = std::numeric_limits<float>::lowest();
  float window = 0.0f;
  float window_fill = -1073741824.0f;  // -2^30
  float one = 1.0f;
};

// One built plan: every descriptor it was made from (destroyed in reverse order with it), the execution plan, the
// workspace cuDNN asked for, and the stored tensors' uids.
struct Plan {
  std::vector<cudnnBackendDescriptor_t> owned;
  cudnnBackendDescriptor_t exec = nullptr;
  int64_t cudnn_ws = 0;              // bytes
  size_t scratch = 0;                // bytes of our stored fp32 scratch (backward: softmax sum, dQ accumulator)
  std::vector<int64_t> uids;         // the stored tensors and scalars, in the variant pack's order
  std::unique_ptr<Scalars> scalars;  // stable addresses
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    for (auto it = owned.rbegin(); it != owned.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
  }
  size_t workspace() const { return align_up(static_cast<size_t>(cudnn_ws)) + scratch; }
};

struct Tns {
  cudnnBackendDescriptor_t d = nullptr;
  const char* name = "";
};

// Builds one operation graph and its execution plan. Every cuDNN call is checked; a failure names the call, the
// attribute, the node and (through ctx_) the direction and shape.
class Builder {
 public:
  Builder(cudnnHandle_t handle, std::string ctx, Plan& plan) : handle_(handle), ctx_(std::move(ctx)), plan_(plan) {}

  cudnnBackendDescriptor_t create(cudnnBackendDescriptorType_t type, const char* type_name, const std::string& what) {
    cudnnBackendDescriptor_t d = nullptr;
    const cudnnStatus_t st = cudnnBackendCreateDescriptor(type, &d);
    if (st != CUDNN_STATUS_SUCCESS)
      fail("{}: cudnnBackendCreateDescriptor({}) for {} failed: {}", ctx_, type_name, what, status_text(st));
    plan_.owned.push_back(d);
    return d;
  }

  void set(cudnnBackendDescriptor_t d, const std::string& what, cudnnBackendAttributeName_t attr, const char* attr_name,
           cudnnBackendAttributeType_t type, int64_t count, const void* value) {
    const cudnnStatus_t st = cudnnBackendSetAttribute(d, attr, type, count, value);
    if (st != CUDNN_STATUS_SUCCESS)
      fail("{}: cudnnBackendSetAttribute({}) on {} failed: {}; {}", ctx_, attr_name, what, status_text(st), kHint);
  }

  void finalize(cudnnBackendDescriptor_t d, const std::string& what) {
    const cudnnStatus_t st = cudnnBackendFinalize(d);
    if (st != CUDNN_STATUS_SUCCESS)
      fail("{}: cudnnBackendFinalize on {} failed: {}; {}", ctx_, what, status_text(st), kHint);
  }

#define MT_SET(b, d, what, attr, type, count, value) (b).set((d), (what), attr, #attr, type, count, value)

  // A tensor: stored (uid given, recorded for the variant pack), by-value scalar, or virtual (uid assigned here).
  Tns tensor(const char* name, int64_t uid, cudnnDataType_t dt, const Dims& dim, const Dims& stride, bool is_virtual,
             bool by_value = false) {
    const std::string what = fmt::format("tensor '{}'", name);
    cudnnBackendDescriptor_t d = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "CUDNN_BACKEND_TENSOR_DESCRIPTOR", what);
    const int64_t align = kByteAlignment;
    MT_SET(*this, d, what, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    MT_SET(*this, d, what, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim.data());
    MT_SET(*this, d, what, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride.data());
    MT_SET(*this, d, what, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    MT_SET(*this, d, what, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    const bool v = is_virtual;
    MT_SET(*this, d, what, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v);
    if (by_value) {
      const bool bv = true;
      MT_SET(*this, d, what, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &bv);
    }
    finalize(d, what);
    if (!is_virtual) plan_.uids.push_back(uid);
    return {d, name};
  }
  Tns stored(const char* name, int64_t uid, cudnnDataType_t dt, const Dims& dim, const Dims& stride) {
    return tensor(name, uid, dt, dim, stride, false);
  }
  Tns scalar(const char* name, int64_t uid) {  // fp32, passed by value (a host pointer in the variant pack)
    return tensor(name, uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }
  Tns virt(const char* name, cudnnDataType_t dt, const Dims& dim, const Dims& stride) {
    return tensor(name, next_virtual_++, dt, dim, stride, true);
  }

  // y = mode(x[, b[, t]]) computing in `prec`; `axis` for GEN_INDEX (and, as cuDNN's frontend does, the window add).
  void pointwise(const char* node, cudnnPointwiseMode_t mode, cudnnDataType_t prec, const Tns& x, const Tns* b,
                 const Tns* t, const Tns& y, std::optional<int64_t> axis = std::nullopt) {
    const std::string what = fmt::format("pointwise node '{}'", node);
    cudnnBackendDescriptor_t pw = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "CUDNN_BACKEND_POINTWISE_DESCRIPTOR",
                                         what);
    MT_SET(*this, pw, what, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    MT_SET(*this, pw, what, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis) MT_SET(*this, pw, what, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &*axis);
    finalize(pw, what + " (its pointwise descriptor)");
    cudnnBackendDescriptor_t op = create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
                                         "CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR", what);
    MT_SET(*this, op, what, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
    MT_SET(*this, op, what, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.d);
    if (b) MT_SET(*this, op, what, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b->d);
    if (t) MT_SET(*this, op, what, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t->d);
    MT_SET(*this, op, what, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.d);
    finalize(op, what);
    ops_.push_back(op);
  }

  // c = a @ b over the last two dims, batched over the first two (a kv-head dim of 1/group broadcasts), fp32 compute.
  void matmul(const char* node, const Tns& a, const Tns& b, const Tns& c) {
    const std::string what = fmt::format("matmul node '{}'", node);
    cudnnBackendDescriptor_t mm = create(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "CUDNN_BACKEND_MATMUL_DESCRIPTOR", what);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    MT_SET(*this, mm, what, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    finalize(mm, what + " (its matmul descriptor)");
    cudnnBackendDescriptor_t op = create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR,
                                         "CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR", what);
    MT_SET(*this, op, what, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a.d);
    MT_SET(*this, op, what, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b.d);
    MT_SET(*this, op, what, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c.d);
    MT_SET(*this, op, what, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm);
    finalize(op, what);
    ops_.push_back(op);
  }

  // y = reduce(x) over the dims where y has extent 1, fp32 compute.
  void reduction(const char* node, cudnnReduceTensorOp_t red, const Tns& x, const Tns& y) {
    const std::string what = fmt::format("reduction node '{}'", node);
    cudnnBackendDescriptor_t rd = create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "CUDNN_BACKEND_REDUCTION_DESCRIPTOR",
                                         what);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    MT_SET(*this, rd, what, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &red);
    MT_SET(*this, rd, what, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    finalize(rd, what + " (its reduction descriptor)");
    cudnnBackendDescriptor_t op = create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR,
                                         "CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR", what);
    MT_SET(*this, op, what, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.d);
    MT_SET(*this, op, what, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.d);
    MT_SET(*this, op, what, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd);
    finalize(op, what);
    ops_.push_back(op);
  }

  // y: x's elements under another view (used for transposes of the last two dims).
  void reshape(const char* node, const Tns& x, const Tns& y) {
    const std::string what = fmt::format("reshape node '{}'", node);
    cudnnBackendDescriptor_t op = create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR,
                                         "CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR", what);
    MT_SET(*this, op, what, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.d);
    MT_SET(*this, op, what, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.d);
    finalize(op, what);
    ops_.push_back(op);
  }

  // Whether the engine of heuristics config `cfg` carries CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC (its results may
  // differ between runs: atomics, typically the backward's dQ accumulation over key tiles).
  bool nondeterministic(cudnnBackendDescriptor_t cfg, int64_t i) {
    const std::string what = fmt::format("the engine of engine config {}", i);
    cudnnBackendDescriptor_t engine = create(CUDNN_BACKEND_ENGINE_DESCRIPTOR, "CUDNN_BACKEND_ENGINE_DESCRIPTOR", what);
    int64_t n = 0;
    cudnnStatus_t st = cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                                                &engine);
    if (st != CUDNN_STATUS_SUCCESS)
      fail("{}: cudnnBackendGetAttribute(CUDNN_ATTR_ENGINECFG_ENGINE) of engine config {} failed: {}", ctx_, i,
           status_text(st));
    std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
    n = 0;
    st = cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                  static_cast<int64_t>(notes.size()), &n, notes.data());
    if (st != CUDNN_STATUS_SUCCESS)
      fail("{}: cudnnBackendGetAttribute(CUDNN_ATTR_ENGINE_NUMERICAL_NOTE) of {} failed: {}", ctx_, what,
           status_text(st));
    const auto end = notes.begin() + std::min<int64_t>(n, static_cast<int64_t>(notes.size()));
    return std::find(notes.begin(), end, CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) != end;
  }

  // The operation graph of the ops added so far, an engine config from heuristics mode A that finalizes into an
  // execution plan, and its workspace size. With `deterministic`, configs whose engine is marked nondeterministic
  // are skipped, and when that leaves none the result is false (no plan; nothing launched). Throws (nothing
  // launched) when cuDNN takes no config otherwise.
  bool build_plan(bool deterministic) {
    const char* what = "the operation graph";
    cudnnBackendDescriptor_t graph = create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR,
                                            "CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR", what);
    MT_SET(*this, graph, what, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
    MT_SET(*this, graph, what, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
           static_cast<int64_t>(ops_.size()), ops_.data());
    {
      const cudnnStatus_t st = cudnnBackendFinalize(graph);
      if (st != CUDNN_STATUS_SUCCESS)
        fail("{}: cuDNN does not accept the attention graph ({} ops): cudnnBackendFinalize on the operation graph "
             "failed: {}; {}",
             ctx_, ops_.size(), status_text(st), kHint);
    }

    const char* hwhat = "the engine heuristics (mode A)";
    cudnnBackendDescriptor_t heur = create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR",
                                           hwhat);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    MT_SET(*this, heur, hwhat, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    MT_SET(*this, heur, hwhat, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    finalize(heur, hwhat);
    int64_t count = 0;
    {
      const cudnnStatus_t st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                        CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr);
      if (st != CUDNN_STATUS_SUCCESS)
        fail("{}: cudnnBackendGetAttribute(CUDNN_ATTR_ENGINEHEUR_RESULTS) (the count) failed: {}; {}", ctx_,
             status_text(st), kHint);
    }
    if (count <= 0) fail("{}: cuDNN's heuristics (mode A) found no engine for the attention graph; {}", ctx_, kHint);
    std::vector<cudnnBackendDescriptor_t> cfgs;
    for (int64_t i = 0; i < count; ++i)
      cfgs.push_back(create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "CUDNN_BACKEND_ENGINECFG_DESCRIPTOR", hwhat));
    int64_t got = 0;
    {
      const cudnnStatus_t st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                        CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfgs.data());
      if (st != CUDNN_STATUS_SUCCESS)
        fail("{}: cudnnBackendGetAttribute(CUDNN_ATTR_ENGINEHEUR_RESULTS) failed: {}; {}", ctx_, status_text(st),
             kHint);
    }
    // Take the first config (heuristics order: the predicted fastest) that finalizes into a plan.
    std::string refusals;
    int64_t skipped = 0;
    for (int64_t i = 0; i < got; ++i) {
      if (deterministic && nondeterministic(cfgs[static_cast<size_t>(i)], i)) {
        ++skipped;
        continue;
      }
      const std::string pwhat = fmt::format("the execution plan of engine config {}", i);
      cudnnBackendDescriptor_t exec = create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
                                             "CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR", pwhat);
      MT_SET(*this, exec, pwhat, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
      MT_SET(*this, exec, pwhat, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
             &cfgs[static_cast<size_t>(i)]);
      const cudnnStatus_t st = cudnnBackendFinalize(exec);
      if (st != CUDNN_STATUS_SUCCESS) {
        refusals += fmt::format("\n  config {}: {}", i, status_text(st));
        continue;
      }
      int64_t ws = 0, n = 0;
      const cudnnStatus_t wst = cudnnBackendGetAttribute(exec, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                         CUDNN_TYPE_INT64, 1, &n, &ws);
      if (wst != CUDNN_STATUS_SUCCESS)
        fail("{}: cudnnBackendGetAttribute(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) failed: {}", ctx_,
             status_text(wst));
      plan_.exec = exec;
      plan_.cudnn_ws = ws;
      return true;
    }
    if (deterministic && skipped == got) return false;
    fail("{}: none of the {} engine configs cuDNN's heuristics proposed finalizes into an execution plan{}; {}:{}",
         ctx_, got, skipped > 0 ? fmt::format(" ({} skipped as nondeterministic: train.deterministic)", skipped) : "",
         kHint, refusals);
  }

 private:
  cudnnHandle_t handle_;
  std::string ctx_;
  Plan& plan_;
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_virtual_ = kFirstVirtual;
};

// Views of the packed layouts (elements). W: the qkv row width.
struct Layout {
  int64_t B, T, H, Hkv, D, W, OW;
  explicit Layout(const AttnShape& s)
      : B(s.B), T(s.T), H(s.n_head), Hkv(s.n_kv_head), D(s.head_dim), W(s.qkv_width()),
        OW(int64_t{s.n_head} * s.head_dim) {}
  Dims q_dim() const { return {B, H, T, D}; }
  Dims kv_dim() const { return {B, Hkv, T, D}; }
  Dims kvT_dim() const { return {B, Hkv, D, T}; }
  Dims packed_stride() const { return {T * W, D, W, 1}; }   // a head of a qkv / dqkv row
  Dims packedT_stride() const { return {T * W, D, 1, W}; }  // the same with the last two dims swapped
  Dims o_stride() const { return {T * OW, D, OW, 1}; }      // out / dout
  Dims st_dim() const { return {B, H, T, 1}; }              // row statistics = lse [B, H, T]
  Dims st_stride() const { return {H * T, T, 1, 1}; }
  Dims s_dim() const { return {B, H, T, T}; }  // scores
  Dims s_stride() const { return {H * T * T, T * T, T, 1}; }
  Dims sT_stride() const { return {H * T * T, T * T, 1, T}; }  // scores transposed (a view)
  Dims full_dim() const { return {B, H, T, D}; }               // per query head, packed
  Dims full_stride() const { return {H * T * D, T * D, D, 1}; }
};

// The causal mask, then the window mask when s.window > 0, applied to scores x; returns the masked scores.
Tns add_masks(Builder& g, const Layout& L, const AttnShape& s, const Tns& x) {
  const Tns row = g.virt("causal_row", CUDNN_DATA_INT32, L.s_dim(), L.s_stride());
  g.pointwise("causal_row_index", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, x, nullptr, nullptr, row, 2);
  const Tns col = g.virt("causal_col", CUDNN_DATA_INT32, L.s_dim(), L.s_stride());
  g.pointwise("causal_col_index", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, x, nullptr, nullptr, col, 3);
  const Tns keep = g.virt("causal_keep", CUDNN_DATA_BOOLEAN, L.s_dim(), L.s_stride());
  g.pointwise("causal_row_ge_col", CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, &col, nullptr, keep);
  const Tns fill = g.scalar("causal_fill", kCausalFill);
  const Tns masked = g.virt("causal_masked", CUDNN_DATA_FLOAT, L.s_dim(), L.s_stride());
  g.pointwise("causal_select", CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, x, &fill, &keep, masked);
  if (s.window <= 0) return masked;

  const Tns wrow = g.virt("window_row", CUDNN_DATA_FLOAT, L.s_dim(), L.s_stride());
  g.pointwise("window_row_index", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, masked, nullptr, nullptr, wrow, 2);
  const Tns wcol = g.virt("window_col", CUDNN_DATA_FLOAT, L.s_dim(), L.s_stride());
  g.pointwise("window_col_index", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, masked, nullptr, nullptr, wcol, 3);
  const Tns w = g.scalar("window", kWindow);
  const Tns colw = g.virt("window_col_plus_w", CUDNN_DATA_FLOAT, L.s_dim(), L.s_stride());
  g.pointwise("window_col_plus_w", CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, wcol, &w, nullptr, colw, 3);
  const Tns wkeep = g.virt("window_keep", CUDNN_DATA_BOOLEAN, L.s_dim(), L.s_stride());
  g.pointwise("window_col_plus_w_gt_row", CUDNN_POINTWISE_CMP_GT, CUDNN_DATA_BOOLEAN, colw, &wrow, nullptr, wkeep);
  const Tns wfill = g.scalar("window_fill", kWindowFill);
  const Tns out = g.virt("window_masked", CUDNN_DATA_FLOAT, L.s_dim(), L.s_stride());
  g.pointwise("window_select", CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, masked, &wfill, &wkeep, out);
  return out;
}

void build_forward(Builder& g, const AttnShape& s) {
  const Layout L(s);
  const Tns q = g.stored("Q", kQ, CUDNN_DATA_BFLOAT16, L.q_dim(), L.packed_stride());
  const Tns kT = g.stored("K^T", kK, CUDNN_DATA_BFLOAT16, L.kvT_dim(), L.packedT_stride());
  const Tns v = g.stored("V", kV, CUDNN_DATA_BFLOAT16, L.kv_dim(), L.packed_stride());
  const Tns scale = g.scalar("scale", kScale);

  const Tns s0 = g.virt("S", CUDNN_DATA_FLOAT, L.s_dim(), L.s_stride());
  g.matmul("Q@K^T", q, kT, s0);
  const Tns s1 = g.virt("S*scale", CUDNN_DATA_FLOAT, L.s_dim(), L.s_stride());
  g.pointwise("scale", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s0, &scale, nullptr, s1);
  const Tns sm = add_masks(g, L, s, s1);

  const Tns mx = g.virt("row_max", CUDNN_DATA_FLOAT, L.st_dim(), L.st_stride());
  g.reduction("row_max", CUDNN_REDUCE_TENSOR_MAX, sm, mx);
  const Tns sub = g.virt("S-max", CUDNN_DATA_FLOAT, L.s_dim(), L.s_stride());
  g.pointwise("sub_max", CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, sm, &mx, nullptr, sub);
  const Tns e = g.virt("exp(S-max)", CUDNN_DATA_FLOAT, L.s_dim(), L.s_stride());
  g.pointwise("exp", CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, sub, nullptr, nullptr, e);
  const Tns z = g.virt("row_sum", CUDNN_DATA_FLOAT, L.st_dim(), L.st_stride());
  g.reduction("row_sum", CUDNN_REDUCE_TENSOR_ADD, e, z);
  const Tns logz = g.virt("log(row_sum)", CUDNN_DATA_FLOAT, L.st_dim(), L.st_stride());
  g.pointwise("log", CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, z, nullptr, nullptr, logz);
  const Tns stats = g.stored("Stats (lse)", kStats, CUDNN_DATA_FLOAT, L.st_dim(), L.st_stride());
  g.pointwise("stats", CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, mx, &logz, nullptr, stats);
  const Tns p = g.virt("P", CUDNN_DATA_BFLOAT16, L.s_dim(), L.s_stride());
  g.pointwise("softmax_div", CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, e, &z, nullptr, p);

  const Tns o = g.stored("O", kO, CUDNN_DATA_BFLOAT16, L.q_dim(), L.o_stride());
  g.matmul("P@V", p, v, o);
}

void build_backward(Builder& g, const AttnShape& s) {
  const Layout L(s);
  const bool gqa = s.n_head != s.n_kv_head;
  const Tns q = g.stored("Q", kQ, CUDNN_DATA_BFLOAT16, L.q_dim(), L.packed_stride());
  const Tns kT = g.stored("K^T", kK, CUDNN_DATA_BFLOAT16, L.kvT_dim(), L.packedT_stride());
  const Tns vT = g.stored("V^T", kV, CUDNN_DATA_BFLOAT16, L.kvT_dim(), L.packedT_stride());
  const Tns o = g.stored("O", kO, CUDNN_DATA_BFLOAT16, L.q_dim(), L.o_stride());
  const Tns dO = g.stored("dO", kDO, CUDNN_DATA_BFLOAT16, L.q_dim(), L.o_stride());
  const Tns stats = g.stored("Stats (lse)", kStats, CUDNN_DATA_FLOAT, L.st_dim(), L.st_stride());
  const Tns scale = g.scalar("scale", kScale);
  const Tns one = g.scalar("one", kOne);

  // Dsum = rowsum(dO * O), stored (the engines read it back per key tile).
  const Tns dOO = g.virt("dO*O", CUDNN_DATA_FLOAT, L.full_dim(), L.full_stride());
  g.pointwise("dO*O", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dO, &o, nullptr, dOO);
  const Tns dsum0 = g.virt("rowsum(dO*O)", CUDNN_DATA_FLOAT, L.st_dim(), L.st_stride());
  g.reduction("rowsum(dO*O)", CUDNN_REDUCE_TENSOR_ADD, dOO, dsum0);
  const Tns dsum = g.stored("softmax_sum", kSoftmaxSum, CUDNN_DATA_FLOAT, L.st_dim(), L.st_stride());
  g.pointwise("softmax_sum", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dsum0, &one, nullptr, dsum);

  // P = exp(mask(Q K^T * scale - lse)).
  const Tns s0 = g.virt("S", CUDNN_DATA_FLOAT, L.s_dim(), L.s_stride());
  g.matmul("Q@K^T", q, kT, s0);
  const Tns s1 = g.virt("S*scale", CUDNN_DATA_FLOAT, L.s_dim(), L.s_stride());
  g.pointwise("scale", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s0, &scale, nullptr, s1);
  const Tns s2 = g.virt("S*scale-lse", CUDNN_DATA_FLOAT, L.s_dim(), L.s_stride());
  g.pointwise("sub_lse", CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, s1, &stats, nullptr, s2);
  const Tns sm = add_masks(g, L, s, s2);
  const Tns p = g.virt("P", CUDNN_DATA_FLOAT, L.s_dim(), L.s_stride());
  g.pointwise("exp", CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, sm, nullptr, nullptr, p);

  // dV = P^T dO (summed over the query heads of a kv head).
  const Tns pT = g.virt("P^T", CUDNN_DATA_BFLOAT16, L.s_dim(), L.sT_stride());
  g.reshape("P^T", p, pT);
  const Tns dV = g.stored("dV", kDV, CUDNN_DATA_BFLOAT16, L.kv_dim(), L.packed_stride());
  if (!gqa) {
    g.matmul("P^T@dO", pT, dO, dV);
  } else {
    const Tns dVh = g.virt("dV per query head", CUDNN_DATA_BFLOAT16, L.full_dim(), L.full_stride());
    g.matmul("P^T@dO", pT, dO, dVh);
    g.reduction("dV head sum", CUDNN_REDUCE_TENSOR_ADD, dVh, dV);
  }

  // dS = (dO V^T - Dsum) * P * scale.
  const Tns dP = g.virt("dP", CUDNN_DATA_FLOAT, L.s_dim(), L.s_stride());
  g.matmul("dO@V^T", dO, vT, dP);
  const Tns d1 = g.virt("dP-Dsum", CUDNN_DATA_FLOAT, L.s_dim(), L.s_stride());
  g.pointwise("sub_softmax_sum", CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, dP, &dsum, nullptr, d1);
  const Tns d2 = g.virt("(dP-Dsum)*P", CUDNN_DATA_FLOAT, L.s_dim(), L.s_stride());
  g.pointwise("mul_P", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, d1, &p, nullptr, d2);
  const Tns dS = g.virt("dS", CUDNN_DATA_FLOAT, L.s_dim(), L.s_stride());
  g.pointwise("mul_scale", CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, d2, &scale, nullptr, dS);

  // dK = dS^T Q (summed over the query heads of a kv head).
  const Tns dST = g.virt("dS^T", CUDNN_DATA_BFLOAT16, L.s_dim(), L.sT_stride());
  g.reshape("dS^T", dS, dST);
  const Tns dK = g.stored("dK", kDK, CUDNN_DATA_BFLOAT16, L.kv_dim(), L.packed_stride());
  if (!gqa) {
    g.matmul("dS^T@Q", dST, q, dK);
  } else {
    const Tns dKh = g.virt("dK per query head", CUDNN_DATA_BFLOAT16, L.full_dim(), L.full_stride());
    g.matmul("dS^T@Q", dST, q, dKh);
    g.reduction("dK head sum", CUDNN_REDUCE_TENSOR_ADD, dKh, dK);
  }

  // dQ = dS K, accumulated in fp32 (stored), then converted into dqkv.
  const Tns k = g.virt("K", CUDNN_DATA_FLOAT, L.kv_dim(), L.packed_stride());
  g.reshape("K", kT, k);
  const Tns dQacc = g.stored("dQ_accum", kDQAccum, CUDNN_DATA_FLOAT, L.full_dim(), L.full_stride());
  g.matmul("dS@K", dS, k, dQacc);
  const Tns dQ = g.stored("dQ", kDQ, CUDNN_DATA_BFLOAT16, L.q_dim(), L.packed_stride());
  g.pointwise("dQ", CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, dQacc, nullptr, nullptr, dQ);
}

#undef MT_SET

using Key = std::array<int, 8>;  // B, T, n_head, n_kv_head, head_dim, window, backward, deterministic

}  // namespace

struct CudnnAttention::Impl {
  cudnnHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  // A plan whose exec is null: deterministic was asked for and every engine cuDNN proposed is nondeterministic.
  std::map<Key, std::unique_ptr<Plan>> plans;
  bool deterministic = false;
  void* ws = nullptr;
  size_t ws_bytes = 0;

  ~Impl() {
    if (stream) cudaStreamSynchronize(stream);
    plans.clear();
    if (ws) cudaFree(ws);
    if (handle) cudnnDestroy(handle);
  }

  static std::string context(const AttnShape& s, bool bwd) {
    return fmt::format("cuDNN attention {} ({})", bwd ? "backward" : "forward", shape_text(s));
  }

  // Shape limits of cuDNN's fused bf16 engines, checked up front for a clear message (cuDNN would refuse later).
  static void check_shape(const AttnShape& s, bool bwd) {
    MT_CHECK(s.B > 0 && s.T > 0 && s.n_head > 0 && s.n_kv_head > 0 && s.head_dim > 0 && s.window >= 0 &&
                 s.n_head % s.n_kv_head == 0,
             "{}: not a valid attention shape", context(s, bwd));
    MT_CHECK(s.head_dim % 8 == 0 && s.head_dim <= 256,
             "{}: cuDNN's fused attention needs head_dim a multiple of 8 and at most 256; {}", context(s, bwd), kHint);
  }

  Plan& plan(const AttnShape& s, bool bwd) {
    check_shape(s, bwd);
    const Key key{s.B, s.T, s.n_head, s.n_kv_head, s.head_dim, s.window, bwd ? 1 : 0, deterministic ? 1 : 0};
    if (auto it = plans.find(key); it != plans.end()) return *it->second;
    auto p = std::make_unique<Plan>();
    p->scalars = std::make_unique<Scalars>();
    p->scalars->scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    p->scalars->window = static_cast<float>(s.window);
    Builder g(handle, context(s, bwd), *p);
    if (bwd) {
      build_backward(g, s);
      const size_t rows = size_t(s.B) * s.n_head * s.T;
      p->scratch = align_up(rows * sizeof(float)) + align_up(rows * s.head_dim * sizeof(float));
    } else {
      build_forward(g, s);
    }
    if (!g.build_plan(deterministic)) p->scratch = 0;  // no engine qualifies: kept as such, exec null
    return *plans.emplace(key, std::move(p)).first->second;
  }

  // The plan of s, which must exist: a direction with no deterministic engine is an error naming the problem
  // (CudaOps asks has_deterministic() first and runs our flash kernel instead).
  Plan& runnable(const AttnShape& s, bool bwd) {
    Plan& p = plan(s, bwd);
    MT_CHECK(p.exec != nullptr,
             "{}: train.deterministic asks for an engine whose results repeat bit for bit, and every engine config "
             "cuDNN's heuristics proposed is marked CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC; {}",
             context(s, bwd), kHint);
    return p;
  }

  // Grows the workspace to `need` bytes (waiting for the stream first: queued executions may still use it).
  void ensure_workspace(size_t need) {
    if (need <= ws_bytes) return;
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (before growing the workspace)");
    if (ws) check(cudaFree(ws), "cudaFree (workspace)");
    ws = nullptr;
    ws_bytes = 0;
    check(cudaMalloc(&ws, need), fmt::format("cudaMalloc of the {}-byte workspace", need).c_str());
    ws_bytes = need;
  }

  static void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) fail_as(ErrorKind::Device, "cuDNN attention: {} failed: {}", what, cudaGetErrorString(e));
  }

  // Runs `p` with the stored tensors' pointers given by `ptr(uid)`.
  template <typename PtrOf>
  void execute(const Plan& p, const AttnShape& s, bool bwd, PtrOf&& ptr) {
    std::vector<void*> data;
    data.reserve(p.uids.size());
    for (int64_t uid : p.uids) data.push_back(ptr(uid));
    const std::string ctx = context(s, bwd);
    cudnnBackendDescriptor_t vp = nullptr;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    if (st != CUDNN_STATUS_SUCCESS)
      fail("{}: cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR) failed: {}", ctx, status_text(st));
    struct Guard {
      cudnnBackendDescriptor_t d;
      ~Guard() { cudnnBackendDestroyDescriptor(d); }
    } guard{vp};
    auto set = [&](cudnnBackendAttributeName_t a, const char* name, cudnnBackendAttributeType_t t, int64_t n,
                   const void* v) {
      const cudnnStatus_t r = cudnnBackendSetAttribute(vp, a, t, n, v);
      if (r != CUDNN_STATUS_SUCCESS)
        fail("{}: cudnnBackendSetAttribute({}) on the variant pack failed: {}", ctx, name, status_text(r));
    };
    void* workspace = ws;
    set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, "CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS", CUDNN_TYPE_INT64,
        static_cast<int64_t>(p.uids.size()), p.uids.data());
    set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, "CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS", CUDNN_TYPE_VOID_PTR,
        static_cast<int64_t>(data.size()), data.data());
    set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, "CUDNN_ATTR_VARIANT_PACK_WORKSPACE", CUDNN_TYPE_VOID_PTR, 1, &workspace);
    st = cudnnBackendFinalize(vp);
    if (st != CUDNN_STATUS_SUCCESS)
      fail("{}: cudnnBackendFinalize on the variant pack failed: {}", ctx, status_text(st));
    st = cudnnBackendExecute(handle, p.exec, vp);
    if (st != CUDNN_STATUS_SUCCESS) fail("{}: cudnnBackendExecute failed: {}", ctx, status_text(st));
  }
};

bool CudnnAttention::available() { return true; }

CudnnAttention::CudnnAttention(cudaStream_t stream) : impl_(std::make_unique<Impl>()) {
  impl_->stream = stream;
  cudnnStatus_t st = cudnnCreate(&impl_->handle);
  if (st != CUDNN_STATUS_SUCCESS) {
    impl_->handle = nullptr;
    fail("cuDNN attention: cudnnCreate failed: {} (is a GPU visible and libcudnn {} usable?)", status_text(st),
         version());
  }
  st = cudnnSetStream(impl_->handle, stream);
  if (st != CUDNN_STATUS_SUCCESS) fail("cuDNN attention: cudnnSetStream failed: {}", status_text(st));
}

CudnnAttention::~CudnnAttention() = default;

std::string CudnnAttention::version() {
  const size_t v = cudnnGetVersion();
  return fmt::format("cuDNN {}.{}.{}", v / 10000, (v % 10000) / 100, v % 100);
}

size_t CudnnAttention::workspace_bytes() const { return impl_->ws_bytes; }

void CudnnAttention::set_deterministic(bool on) { impl_->deterministic = on; }

bool CudnnAttention::has_deterministic(const AttnShape& s, bool backward) {
  return impl_->plan(s, backward).exec != nullptr;
}

void CudnnAttention::reserve(const AttnShape& s) {
  // A direction without a plan (deterministic, no engine qualifies) needs no workspace here.
  const size_t need = std::max(impl_->plan(s, false).workspace(), impl_->plan(s, true).workspace());
  impl_->ensure_workspace(need);
}

void CudnnAttention::forward(const AttnShape& s, const __nv_bfloat16* qkv, __nv_bfloat16* out, float* lse) {
  MT_CHECK(qkv && out && lse, "{}: a null pointer (qkv {}, out {}, lse {})", Impl::context(s, false),
           static_cast<const void*>(qkv), static_cast<void*>(out), static_cast<void*>(lse));
  Plan& p = impl_->runnable(s, false);
  impl_->ensure_workspace(p.workspace());
  Scalars& c = *p.scalars;
  auto* x = const_cast<__nv_bfloat16*>(qkv);  // cuDNN's variant pack takes void*; inputs are only read
  const int64_t koff = int64_t{s.n_head} * s.head_dim, voff = int64_t{s.n_head + s.n_kv_head} * s.head_dim;
  impl_->execute(p, s, false, [&](int64_t uid) -> void* {
    switch (uid) {
      case kQ: return x;
      case kK: return x + koff;
      case kV: return x + voff;
      case kO: return out;
      case kStats: return lse;
      case kScale: return &c.scale;
      case kCausalFill: return &c.causal_fill;
      case kWindow: return &c.window;
      case kWindowFill: return &c.window_fill;
      default: fail("{}: no pointer for tensor uid {} (a bug)", Impl::context(s, false), uid);
    }
  });
}

void CudnnAttention::backward(const AttnShape& s, const __nv_bfloat16* qkv, const __nv_bfloat16* out,
                              const __nv_bfloat16* dout, const float* lse, __nv_bfloat16* dqkv) {
  MT_CHECK(qkv && out && dout && lse && dqkv, "{}: a null pointer among qkv, out, dout, lse, dqkv",
           Impl::context(s, true));
  Plan& p = impl_->runnable(s, true);
  impl_->ensure_workspace(p.workspace());
  Scalars& c = *p.scalars;
  auto* x = const_cast<__nv_bfloat16*>(qkv);
  const int64_t koff = int64_t{s.n_head} * s.head_dim, voff = int64_t{s.n_head + s.n_kv_head} * s.head_dim;
  char* scratch = static_cast<char*>(impl_->ws) + align_up(static_cast<size_t>(p.cudnn_ws));
  void* softmax_sum = scratch;
  void* dq_accum = scratch + align_up(size_t(s.B) * s.n_head * s.T * sizeof(float));
  // The fused backward engines add dQ into dQ_accum tile by tile (atomics over key tiles); before cuDNN 9.6 zeroing
  // it is the caller's job (cudnn-frontend memsets it), and stale values from the last call would be summed in.
  // One memset of B*H*T*hd floats, on the stream the execution runs on, is cheap against the attention itself.
  Impl::check(cudaMemsetAsync(dq_accum, 0, size_t(s.B) * s.n_head * s.T * s.head_dim * sizeof(float), impl_->stream),
              "cudaMemsetAsync (dQ accumulator)");
  impl_->execute(p, s, true, [&](int64_t uid) -> void* {
    switch (uid) {
      case kQ: return x;
      case kK: return x + koff;
      case kV: return x + voff;
      case kO: return const_cast<__nv_bfloat16*>(out);
      case kDO: return const_cast<__nv_bfloat16*>(dout);
      case kStats: return const_cast<float*>(lse);
      case kDQ: return dqkv;
      case kDK: return dqkv + koff;
      case kDV: return dqkv + voff;
      case kSoftmaxSum: return softmax_sum;
      case kDQAccum: return dq_accum;
      case kScale: return &c.scale;
      case kOne: return &c.one;
      case kCausalFill: return &c.causal_fill;
      case kWindow: return &c.window;
      case kWindowFill: return &c.window_fill;
      default: fail("{}: no pointer for tensor uid {} (a bug)", Impl::context(s, true), uid);
    }
  });
}

}  // namespace mt

#else  // built without cuDNN: the class exists so that callers compile; using it says why it cannot work.

#include "megatrain/core/error.h"

namespace mt {

struct CudnnAttention::Impl {};

namespace {
[[noreturn]] void no_cudnn() {
  fail("cuDNN attention: this megatrain was built without cuDNN (CMake found no libcudnn next to the CUDA "
       "toolkit); use attention = \"flash\" or rebuild with cuDNN installed");
}
}  // namespace

bool CudnnAttention::available() { return false; }
CudnnAttention::CudnnAttention(cudaStream_t) { no_cudnn(); }
CudnnAttention::~CudnnAttention() = default;
std::string CudnnAttention::version() { return "cuDNN (not in this build)"; }
size_t CudnnAttention::workspace_bytes() const { return 0; }
void CudnnAttention::set_deterministic(bool) {}
bool CudnnAttention::has_deterministic(const AttnShape&, bool) { no_cudnn(); }
void CudnnAttention::reserve(const AttnShape&) { no_cudnn(); }
void CudnnAttention::forward(const AttnShape&, const __nv_bfloat16*, __nv_bfloat16*, float*) { no_cudnn(); }
void CudnnAttention::backward(const AttnShape&, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                              const float*, __nv_bfloat16*) {
  no_cudnn();
}

}  // namespace mt

#endif  // MT_HAVE_CUDNN
