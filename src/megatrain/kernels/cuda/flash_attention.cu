// Flash attention, FlashAttention-2 style, on tensor cores through nvcuda::wmma (bf16 16x16x16, fp32 accumulate).
//
// Why it is shaped this way. Every kernel block owns one 64-row tile (queries in forward, keys in backward) of one
// (batch, head) and runs 4 warps; warp w owns rows [16w, 16w + 16) of that tile, so softmax bookkeeping needs no
// cross-warp traffic. wmma keeps the layout of an accumulator fragment opaque, so whenever we need elementwise work
// on a product (the online softmax, P = exp(S - lse), dS = P * (dP - D)) the warp stores the fragment to shared
// memory in fp32, works on it with plain index math, and loads the result back as bf16. That costs shared-memory
// bandwidth compared with register-level FA2 (mma.sync with a known fragment layout), but every step can be checked
// by reading it, which is what a kernel written without a GPU at hand needs. Tiles of keys (forward) or queries
// (backward) that hold no visible pair are never visited: a window W makes the work O(T * W), not O(T^2).
//
// Math (s = 1/sqrt(hd); all sums over the visible keys j of query i):
//   forward   S_ij = s q_i.k_j,  lse_i = log sum_j exp(S_ij),  P_ij = exp(S_ij - lse_i),  O_i = sum_j P_ij v_j
//             computed online over key tiles: m = running max, l = running sum of exp(S - m), O rescaled by
//             exp(m_old - m_new) whenever the max grows (all in base 2: exp(x) = exp2(x log2 e)).
//   backward  D_i = dO_i . O_i (= sum_j P_ij dP_ij),  dP_ij = dO_i . v_j,  dS_ij = P_ij (dP_ij - D_i)
//             dv_j = sum_i P_ij dO_i,  dk_j = s sum_i dS_ij q_i,  dq_i = s sum_j dS_ij k_j
// Backward runs one block per (batch, kv head, key tile); it loops over the query heads of the GQA group and the
// query tiles that see its keys, keeping dK and dV in registers (wmma accumulators) and adding dq into an fp32
// workspace with atomics; a last kernel converts dq to bf16 into dqkv.
// Deterministic mode (train.deterministic) replaces the dq atomics, whose order of adds varies from run to run, by a
// kernel of its own: one block per (batch, query head, query tile) visits the key tiles in increasing order,
// recomputes S, P, dP and dS for them (as the forward does S) and keeps dQ in registers, writing it once. It does
// the score work of the backward a second time for dq alone: that is its cost.
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "megatrain/kernels/cuda/flash_attention_kernels.h"

namespace mt::flash {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int kWarps = 4;  // warp w owns rows [16w, 16w + 16) of the block's 64-row tile
constexpr int kThreads = kWarps * 32;
static_assert(kWarps * 16 == kTile, "each warp owns 16 rows of the tile");
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragAT = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major>;  // A read transposed
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;  // B read transposed
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// What the kernels need of AttnShape (its member functions are host-only).
struct Params {
  int T, H, Hkv, window;
  int64_t qkv_stride;  // elements per qkv row: (H + 2 Hkv) hd
  float scale;         // 1/sqrt(hd)
  float scale_log2;    // scale * log2(e): scores in base-2 units
};

// Token t sees key s: causal (s <= t), inside the window (s > t - W), and t a real row (t < T; then s < T too).
__device__ __forceinline__ bool visible(int t, int s, int T, int W) { return t < T && s <= t && (W == 0 || s > t - W); }

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Copies a kTile x D bf16 tile from global rows (src_stride elements apart) into shared memory (ld elements apart),
// 16 bytes per thread per step; rows >= nvalid (past the sequence end) become zeros, so padded keys contribute
// exact zeros to every product (0 * finite) and never NaN.
template <int D>
__device__ void load_tile(bf16* dst, int ld, const bf16* src, int64_t src_stride, int nvalid) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  for (int i = threadIdx.x; i < kTile * kChunks; i += kThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < nvalid) v = *reinterpret_cast<const uint4*>(src + r * src_stride + c);
    *reinterpret_cast<uint4*>(dst + r * ld + c) = v;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Forward. Shared memory (row strides padded by 16 bytes against bank conflicts; wmma needs ld % 8 == 0 for bf16,
// % 4 for fp32 and 32-byte aligned tile pointers, which every 16-row / 16-column offset below keeps):
//   Q, K, V  bf16 [64][D + 8]   the query tile and the current key/value tile
//   S        f32  [64][64 + 4]  scores of the current key tile
//   P        bf16 [64][64 + 8]  exp(S - m), the A operand of P V
//   O        f32  [64][D + 4]   running output (unnormalised), rescaled in place as the row max grows
template <int D>
struct FwdSmem {
  static constexpr int ldh = D + 8, lds = kTile + 4, ldp = kTile + 8, ldo = D + 4;
  static constexpr size_t q = 0;
  static constexpr size_t k = q + sizeof(bf16) * kTile * ldh;
  static constexpr size_t v = k + sizeof(bf16) * kTile * ldh;
  static constexpr size_t s = v + sizeof(bf16) * kTile * ldh;
  static constexpr size_t p = s + sizeof(float) * kTile * lds;
  static constexpr size_t o = p + sizeof(bf16) * kTile * ldp;
  static constexpr size_t bytes = o + sizeof(float) * kTile * ldo;
  static_assert(k % 128 == 0 && v % 128 == 0 && s % 128 == 0 && p % 128 == 0 && o % 128 == 0, "aligned regions");
};

// grid (ceil(T/64), H, B): one block per (query tile, head, batch).
template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(Params prm, const bf16* __restrict__ qkv, bf16* __restrict__ out, float* __restrict__ lse) {
  using L = FwdSmem<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem + L::q);
  bf16* Ks = reinterpret_cast<bf16*>(smem + L::k);
  bf16* Vs = reinterpret_cast<bf16*>(smem + L::v);
  float* Ss = reinterpret_cast<float*>(smem + L::s);
  bf16* Ps = reinterpret_cast<bf16*>(smem + L::p);
  float* Os = reinterpret_cast<float*>(smem + L::o);

  // Causal tiles late in the sequence see the most keys: start them first so the tail of the grid is short ones.
  const int qb = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int T = prm.T, W = prm.window;
  const int kvh = h / (prm.H / prm.Hkv);
  const int q0 = qb * kTile;
  const bf16* seq = qkv + static_cast<int64_t>(b) * T * prm.qkv_stride;  // row 0 of this batch entry

  load_tile<D>(Qs, L::ldh, seq + static_cast<int64_t>(q0) * prm.qkv_stride + h * D, prm.qkv_stride, T - q0);
  for (int i = lane; i < 16 * D; i += 32) Os[(warp * 16 + i / D) * L::ldo + i % D] = 0.0f;
  // Running max (base-2 units) and running sum of the warp's 16 rows; every lane holds the same values (the
  // butterfly reductions below leave the result in all lanes), so they live in registers.
  float m_run[16], l_run[16];
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    m_run[r] = -INFINITY;
    l_run[r] = 0.0f;
  }

  int kt_first, kt_last;
  key_tiles_of_query_tile(T, W, qb, kt_first, kt_last);
  for (int kt = kt_first; kt <= kt_last; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // every warp is done with the previous K, V (and, the first time, Q is not yet needed)
    const bf16* krow = seq + static_cast<int64_t>(k0) * prm.qkv_stride;
    load_tile<D>(Ks, L::ldh, krow + (prm.H + kvh) * D, prm.qkv_stride, T - k0);
    load_tile<D>(Vs, L::ldh, krow + (prm.H + prm.Hkv + kvh) * D, prm.qkv_stride, T - k0);
    __syncthreads();  // Q, K, V visible to all warps

    // S[rows of warp][0:64] = Q_w K^T. K^T as the B operand: element (d, j) = Ks[j][d], i.e. column-major.
    for (int j = 0; j < kTile / 16; ++j) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        FragA a;
        FragBT bt;
        wmma::load_matrix_sync(a, Qs + (warp * 16) * L::ldh + kk * 16, L::ldh);
        wmma::load_matrix_sync(bt, Ks + (j * 16) * L::ldh + kk * 16, L::ldh);
        wmma::mma_sync(acc, a, bt, acc);
      }
      wmma::store_matrix_sync(Ss + (warp * 16) * L::lds + j * 16, acc, L::lds, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax, one row at a time across the warp: lane handles key columns lane and lane + 32.
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const int row = warp * 16 + r, t = q0 + row;
      const float x0 = visible(t, k0 + lane, T, W) ? Ss[row * L::lds + lane] * prm.scale_log2 : -INFINITY;
      const float x1 = visible(t, k0 + lane + 32, T, W) ? Ss[row * L::lds + lane + 32] * prm.scale_log2 : -INFINITY;
      const float m_new = fmaxf(m_run[r], warp_max(fmaxf(x0, x1)));
      // A row with nothing visible yet has m_new = -inf; subtracting 0 instead keeps exp2 at exactly 0 (not NaN).
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float p0 = exp2f(x0 - m_use), p1 = exp2f(x1 - m_use);
      const float alpha = exp2f(m_run[r] - m_use);  // rescales what was accumulated under the old max
      l_run[r] = l_run[r] * alpha + warp_sum(p0 + p1);
      m_run[r] = m_new;
      Ps[row * L::ldp + lane] = __float2bfloat16(p0);
      Ps[row * L::ldp + lane + 32] = __float2bfloat16(p1);
      for (int c = lane; c < D; c += 32) Os[row * L::ldo + c] *= alpha;
    }
    __syncwarp();

    // O_w += P_w V, accumulating straight into the fp32 O tile (loaded as the accumulator, stored back).
    for (int j = 0; j < D / 16; ++j) {
      FragC acc;
      wmma::load_matrix_sync(acc, Os + (warp * 16) * L::ldo + j * 16, L::ldo, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        FragA a;
        FragB bm;
        wmma::load_matrix_sync(a, Ps + (warp * 16) * L::ldp + kk * 16, L::ldp);
        wmma::load_matrix_sync(bm, Vs + (kk * 16) * L::ldh + j * 16, L::ldh);
        wmma::mma_sync(acc, a, bm, acc);
      }
      wmma::store_matrix_sync(Os + (warp * 16) * L::ldo + j * 16, acc, L::ldo, wmma::mem_row_major);
    }
    __syncwarp();
  }

  // out = O / l (bf16), lse = m ln2 + ln l (natural log). Every real row saw at least itself, so l >= 1.
  const int64_t oc = static_cast<int64_t>(prm.H) * D;
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    const int row = warp * 16 + r, t = q0 + row;
    if (t >= T) continue;
    const float inv = l_run[r] > 0.0f ? 1.0f / l_run[r] : 0.0f;
    bf16* orow = out + (static_cast<int64_t>(b) * T + t) * oc + h * D;
    for (int c = lane; c < D; c += 32) orow[c] = __float2bfloat16(Os[row * L::ldo + c] * inv);
    if (lane == 0) lse[(static_cast<int64_t>(b) * prm.H + h) * T + t] = m_run[r] * kLn2 + logf(l_run[r]);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Backward, step 1: D[b, h, t] = dout[b, t, h, :] . out[b, t, h, :] in fp32; one warp per (b, t, h) row.
// Rows r = (b T + t) H + h are contiguous hd-wide slices of out and dout.
__global__ void flash_backward_dot_kernel(int rows, int T, int H, int hd, const bf16* __restrict__ out,
                                          const bf16* __restrict__ dout, float* __restrict__ Dvec) {
  const int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (r >= rows) return;
  const bf16* o = out + static_cast<int64_t>(r) * hd;
  const bf16* g = dout + static_cast<int64_t>(r) * hd;
  float acc = 0.0f;
  for (int c = lane; c < hd; c += 32) acc += __bfloat162float(o[c]) * __bfloat162float(g[c]);
  acc = warp_sum(acc);
  const int h = r % H, bt = r / H, t = bt % T, b = bt / T;
  if (lane == 0) Dvec[(static_cast<int64_t>(b) * H + h) * T + t] = acc;
}

// Backward, step 2. Shared memory:
//   K, V, Q, dO  bf16 [64][D + 8]   the block's key/value tile; the current query tile of head h and its dout
//   St, dPt      f32  [64][64 + 4]  S^T and dP^T (rows = keys, columns = queries: warp w owns keys 16w..16w+15)
//   Pt, dSt      bf16 [64][64 + 8]  P^T and dS^T, A operands of dV += P^T dO, dK += dS^T Q; dS^T read
//                                    column-major is dS, the A operand of dQ = dS K
//   X            f32  kWarps x [16][16] per-warp staging of one accumulator fragment (dq atomics, final dk/dv)
//   lse2, Dq     f32  [64]          lse * log2(e) and D of the current query tile's rows
template <int D>
struct BwdSmem {
  static constexpr int ldh = D + 8, lds = kTile + 4, ldp = kTile + 8;
  static constexpr size_t k = 0;
  static constexpr size_t v = k + sizeof(bf16) * kTile * ldh;
  static constexpr size_t q = v + sizeof(bf16) * kTile * ldh;
  static constexpr size_t dout = q + sizeof(bf16) * kTile * ldh;
  static constexpr size_t st = dout + sizeof(bf16) * kTile * ldh;
  static constexpr size_t dpt = st + sizeof(float) * kTile * lds;
  static constexpr size_t pt = dpt + sizeof(float) * kTile * lds;
  static constexpr size_t dst = pt + sizeof(bf16) * kTile * ldp;
  static constexpr size_t x = dst + sizeof(bf16) * kTile * ldp;
  static constexpr size_t lse2 = x + sizeof(float) * kWarps * 256;
  static constexpr size_t dq = lse2 + sizeof(float) * kTile;
  static constexpr size_t bytes = dq + sizeof(float) * kTile;
  static_assert(v % 128 == 0 && q % 128 == 0 && dout % 128 == 0 && st % 128 == 0 && dpt % 128 == 0 && pt % 128 == 0 &&
                    dst % 128 == 0 && x % 128 == 0 && lse2 % 128 == 0,
                "aligned regions");
};

// grid (ceil(T/64), Hkv, B): one block per (key tile, kv head, batch).
// Why one long kernel (~155 lines, the longest function in src/): the dK/dV accumulators live in registers for the
// whole sweep over query tiles, and every phase of the sweep (load Q/dO, S = QK^T, P, dP, dS, dV += P^T dO,
// dK += dS^T Q, dQ atomics) reads and writes them and the shared-memory tiles in between barriers; split into
// functions, the phases would pass those fragments by reference and the reader would lose the one place that
// shows the order of barriers each phase relies on.
template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_backward_kernel(Params prm, const bf16* __restrict__ qkv, const bf16* __restrict__ dout,
                          const float* __restrict__ lse, const float* __restrict__ Dvec, float* __restrict__ dq_acc,
                          bf16* __restrict__ dqkv) {
  using L = BwdSmem<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Ks = reinterpret_cast<bf16*>(smem + L::k);
  bf16* Vs = reinterpret_cast<bf16*>(smem + L::v);
  bf16* Qs = reinterpret_cast<bf16*>(smem + L::q);
  bf16* dOs = reinterpret_cast<bf16*>(smem + L::dout);
  float* St = reinterpret_cast<float*>(smem + L::st);
  float* dPt = reinterpret_cast<float*>(smem + L::dpt);
  bf16* Pt = reinterpret_cast<bf16*>(smem + L::pt);
  bf16* dSt = reinterpret_cast<bf16*>(smem + L::dst);
  float* X = reinterpret_cast<float*>(smem + L::x) + (threadIdx.x / 32) * 256;  // this warp's 16 x 16 staging
  float* lse2_s = reinterpret_cast<float*>(smem + L::lse2);
  float* D_s = reinterpret_cast<float*>(smem + L::dq);

  const int kb = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int T = prm.T, W = prm.window, H = prm.H;
  const int group = H / prm.Hkv;
  const int k0 = kb * kTile;
  const int64_t oc = static_cast<int64_t>(H) * D;  // dout row width
  const bf16* seq = qkv + static_cast<int64_t>(b) * T * prm.qkv_stride;

  const bf16* krow = seq + static_cast<int64_t>(k0) * prm.qkv_stride;
  load_tile<D>(Ks, L::ldh, krow + (H + kvh) * D, prm.qkv_stride, T - k0);
  load_tile<D>(Vs, L::ldh, krow + (H + prm.Hkv + kvh) * D, prm.qkv_stride, T - k0);

  // dK, dV of the warp's 16 keys, all D columns: D/16 accumulator fragments each, summed over every query head of
  // the group and every query tile, so they never leave registers until the end.
  FragC dK[D / 16], dV[D / 16];
#pragma unroll
  for (int j = 0; j < D / 16; ++j) {
    wmma::fill_fragment(dK[j], 0.0f);
    wmma::fill_fragment(dV[j], 0.0f);
  }

  int qt_first, qt_last;
  query_tiles_of_key_tile(T, W, kb, qt_first, qt_last);
  for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
    for (int qt = qt_first; qt <= qt_last; ++qt) {
      const int q0 = qt * kTile;
      __syncthreads();  // every warp is done with the previous Q, dO, dS^T
      load_tile<D>(Qs, L::ldh, seq + static_cast<int64_t>(q0) * prm.qkv_stride + h * D, prm.qkv_stride, T - q0);
      load_tile<D>(dOs, L::ldh, dout + (static_cast<int64_t>(b) * T + q0) * oc + h * D, oc, T - q0);
      if (threadIdx.x < kTile) {
        const int t = q0 + threadIdx.x;
        const int64_t i = (static_cast<int64_t>(b) * H + h) * T + t;
        lse2_s[threadIdx.x] = t < T ? lse[i] * kLog2e : 0.0f;
        D_s[threadIdx.x] = t < T ? Dvec[i] : 0.0f;
      }
      __syncthreads();

      // S^T_w = K_w Q^T and dP^T_w = V_w dO^T (rows: the warp's keys; columns: the 64 queries). Q^T and dO^T as
      // B operands: element (d, i) = Qs[i][d], column-major.
      for (int j = 0; j < kTile / 16; ++j) {
        FragC s_acc, dp_acc;
        wmma::fill_fragment(s_acc, 0.0f);
        wmma::fill_fragment(dp_acc, 0.0f);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          FragA a;
          FragBT bt;
          wmma::load_matrix_sync(a, Ks + (warp * 16) * L::ldh + kk * 16, L::ldh);
          wmma::load_matrix_sync(bt, Qs + (j * 16) * L::ldh + kk * 16, L::ldh);
          wmma::mma_sync(s_acc, a, bt, s_acc);
          wmma::load_matrix_sync(a, Vs + (warp * 16) * L::ldh + kk * 16, L::ldh);
          wmma::load_matrix_sync(bt, dOs + (j * 16) * L::ldh + kk * 16, L::ldh);
          wmma::mma_sync(dp_acc, a, bt, dp_acc);
        }
        wmma::store_matrix_sync(St + (warp * 16) * L::lds + j * 16, s_acc, L::lds, wmma::mem_row_major);
        wmma::store_matrix_sync(dPt + (warp * 16) * L::lds + j * 16, dp_acc, L::lds, wmma::mem_row_major);
      }
      __syncwarp();

      // P^T = exp(S^T s - lse) on visible pairs (0 elsewhere), dS^T = P^T (dP^T - D); the warp's 16 x 64 entries.
      for (int i = lane; i < 16 * kTile; i += 32) {
        const int row = warp * 16 + i / kTile, c = i % kTile;
        const int key = k0 + row, t = q0 + c;
        float p = 0.0f, ds = 0.0f;
        if (visible(t, key, T, W)) {
          p = exp2f(St[row * L::lds + c] * prm.scale_log2 - lse2_s[c]);
          ds = p * (dPt[row * L::lds + c] - D_s[c]);
        }
        Pt[row * L::ldp + c] = __float2bfloat16(p);
        dSt[row * L::ldp + c] = __float2bfloat16(ds);
      }
      __syncwarp();

      // dV_w += P^T_w dO,  dK_w += dS^T_w Q (the scale s is applied once at the end).
#pragma unroll
      for (int j = 0; j < D / 16; ++j) {
#pragma unroll
        for (int kk = 0; kk < kTile / 16; ++kk) {
          FragA a;
          FragB bm;
          wmma::load_matrix_sync(a, Pt + (warp * 16) * L::ldp + kk * 16, L::ldp);
          wmma::load_matrix_sync(bm, dOs + (kk * 16) * L::ldh + j * 16, L::ldh);
          wmma::mma_sync(dV[j], a, bm, dV[j]);
          wmma::load_matrix_sync(a, dSt + (warp * 16) * L::ldp + kk * 16, L::ldp);
          wmma::load_matrix_sync(bm, Qs + (kk * 16) * L::ldh + j * 16, L::ldh);
          wmma::mma_sync(dK[j], a, bm, dK[j]);
        }
      }
      // Deterministic mode (dq_acc null): dq comes from flash_backward_dq_kernel_det instead.
      if (dq_acc == nullptr) continue;
      __syncthreads();  // all of dS^T written before any warp reads other warps' keys below

      // dq (queries 16w..16w+15 of the tile) += s dS K. dS as the A operand: element (i, key) = dSt[key][i],
      // column-major. Each 16 x 16 product goes through X to fp32 atomics on the workspace (other key tiles add
      // to the same rows).
      for (int j = 0; j < D / 16; ++j) {
        FragC acc;
        wmma::fill_fragment(acc, 0.0f);
#pragma unroll
        for (int kk = 0; kk < kTile / 16; ++kk) {
          FragAT at;
          FragB bm;
          wmma::load_matrix_sync(at, dSt + (kk * 16) * L::ldp + warp * 16, L::ldp);
          wmma::load_matrix_sync(bm, Ks + (kk * 16) * L::ldh + j * 16, L::ldh);
          wmma::mma_sync(acc, at, bm, acc);
        }
        wmma::store_matrix_sync(X, acc, 16, wmma::mem_row_major);
        __syncwarp();
        for (int e = lane; e < 256; e += 32) {
          const int t = q0 + warp * 16 + e / 16;
          if (t < T) atomicAdd(dq_acc + (static_cast<int64_t>(b) * T + t) * oc + h * D + j * 16 + e % 16, X[e]);
        }
        __syncwarp();  // X is rewritten by the next fragment
      }
    }
  }

  // dk = s dK, dv = dV into dqkv (bf16), rows of real keys only; every key row of every kv head is written by
  // exactly one block, so dqkv's k and v parts need no zeroing.
  bf16* drow = dqkv + static_cast<int64_t>(b) * T * prm.qkv_stride;
#pragma unroll
  for (int j = 0; j < D / 16; ++j) {
    wmma::store_matrix_sync(X, dK[j], 16, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 256; e += 32) {
      const int key = k0 + warp * 16 + e / 16;
      if (key < T)
        drow[static_cast<int64_t>(key) * prm.qkv_stride + (H + kvh) * D + j * 16 + e % 16] =
            __float2bfloat16(X[e] * prm.scale);
    }
    __syncwarp();
    wmma::store_matrix_sync(X, dV[j], 16, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 256; e += 32) {
      const int key = k0 + warp * 16 + e / 16;
      if (key < T)
        drow[static_cast<int64_t>(key) * prm.qkv_stride + (H + prm.Hkv + kvh) * D + j * 16 + e % 16] =
            __float2bfloat16(X[e]);
    }
    __syncwarp();
  }
}

// Backward, step 3: dqkv[b, t, q part] = s * dq_acc[b, t, :] in bf16 (q part = the first H*hd columns of a row).
__global__ void flash_backward_dq_kernel(int64_t n, int64_t oc, int64_t qkv_stride, float scale,
                                         const float* __restrict__ dq_acc, bf16* __restrict__ dqkv) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t bt = i / oc, c = i % oc;
    dqkv[bt * qkv_stride + c] = __float2bfloat16(dq_acc[i] * scale);
  }
}

// Backward, deterministic dq (replacing the atomics of step 2 and the conversion of step 3). Shared memory:
//   Q, dO, K, V  bf16 [64][D + 8]   the block's query tile of head h and its dout; the current key/value tile
//   S, dP        f32  [64][64 + 4]  scores and dO V^T of the current key tile (warp w owns queries 16w..16w+15)
//   dS           bf16 [64][64 + 8]  P (dP - D), the A operand of dQ += dS K
//   X            f32  kWarps x [16][16] per-warp staging of one accumulator fragment (the final dq)
//   lse2, Dq     f32  [64]          lse * log2(e) and D of the tile's rows
template <int D>
struct DqSmem {
  static constexpr int ldh = D + 8, lds = kTile + 4, ldp = kTile + 8;
  static constexpr size_t q = 0;
  static constexpr size_t dout = q + sizeof(bf16) * kTile * ldh;
  static constexpr size_t k = dout + sizeof(bf16) * kTile * ldh;
  static constexpr size_t v = k + sizeof(bf16) * kTile * ldh;
  static constexpr size_t s = v + sizeof(bf16) * kTile * ldh;
  static constexpr size_t dp = s + sizeof(float) * kTile * lds;
  static constexpr size_t ds = dp + sizeof(float) * kTile * lds;
  static constexpr size_t x = ds + sizeof(bf16) * kTile * ldp;
  static constexpr size_t lse2 = x + sizeof(float) * kWarps * 256;
  static constexpr size_t dvec = lse2 + sizeof(float) * kTile;
  static constexpr size_t bytes = dvec + sizeof(float) * kTile;
  static_assert(dout % 128 == 0 && k % 128 == 0 && v % 128 == 0 && s % 128 == 0 && dp % 128 == 0 && ds % 128 == 0 &&
                    x % 128 == 0 && lse2 % 128 == 0,
                "aligned regions");
};

// grid (ceil(T/64), H, B): one block per (query tile, query head, batch). dq_i = s sum_j dS_ij k_j over the key
// tiles in increasing order, each tile's 64 keys added by the tensor cores in a fixed order: the same sums every
// run. dS is rounded to bf16 before the product, as step 2 rounds it for dK.
template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_backward_dq_kernel_det(Params prm, const bf16* __restrict__ qkv, const bf16* __restrict__ dout,
                                 const float* __restrict__ lse, const float* __restrict__ Dvec,
                                 bf16* __restrict__ dqkv) {
  using L = DqSmem<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem + L::q);
  bf16* dOs = reinterpret_cast<bf16*>(smem + L::dout);
  bf16* Ks = reinterpret_cast<bf16*>(smem + L::k);
  bf16* Vs = reinterpret_cast<bf16*>(smem + L::v);
  float* Ss = reinterpret_cast<float*>(smem + L::s);
  float* dPs = reinterpret_cast<float*>(smem + L::dp);
  bf16* dSs = reinterpret_cast<bf16*>(smem + L::ds);
  float* X = reinterpret_cast<float*>(smem + L::x) + (threadIdx.x / 32) * 256;
  float* lse2_s = reinterpret_cast<float*>(smem + L::lse2);
  float* D_s = reinterpret_cast<float*>(smem + L::dvec);

  const int qb = gridDim.x - 1 - blockIdx.x;  // the tiles that see the most keys first, as in forward
  const int h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int T = prm.T, W = prm.window, H = prm.H;
  const int kvh = h / (H / prm.Hkv);
  const int q0 = qb * kTile;
  const int64_t oc = static_cast<int64_t>(H) * D;
  const bf16* seq = qkv + static_cast<int64_t>(b) * T * prm.qkv_stride;

  load_tile<D>(Qs, L::ldh, seq + static_cast<int64_t>(q0) * prm.qkv_stride + h * D, prm.qkv_stride, T - q0);
  load_tile<D>(dOs, L::ldh, dout + (static_cast<int64_t>(b) * T + q0) * oc + h * D, oc, T - q0);
  if (threadIdx.x < kTile) {
    const int t = q0 + threadIdx.x;
    const int64_t i = (static_cast<int64_t>(b) * H + h) * T + t;
    lse2_s[threadIdx.x] = t < T ? lse[i] * kLog2e : 0.0f;
    D_s[threadIdx.x] = t < T ? Dvec[i] : 0.0f;
  }
  FragC dQ[D / 16];
#pragma unroll
  for (int j = 0; j < D / 16; ++j) wmma::fill_fragment(dQ[j], 0.0f);

  int kt_first, kt_last;
  key_tiles_of_query_tile(T, W, qb, kt_first, kt_last);
  for (int kt = kt_first; kt <= kt_last; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // every warp is done with the previous K (and, the first time, Q, dO, lse, D are written)
    const bf16* krow = seq + static_cast<int64_t>(k0) * prm.qkv_stride;
    load_tile<D>(Ks, L::ldh, krow + (H + kvh) * D, prm.qkv_stride, T - k0);
    load_tile<D>(Vs, L::ldh, krow + (H + prm.Hkv + kvh) * D, prm.qkv_stride, T - k0);
    __syncthreads();

    // S_w = Q_w K^T and dP_w = dO_w V^T (K^T, V^T as B operands: column-major reads of Ks, Vs).
    for (int j = 0; j < kTile / 16; ++j) {
      FragC s_acc, dp_acc;
      wmma::fill_fragment(s_acc, 0.0f);
      wmma::fill_fragment(dp_acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        FragA a;
        FragBT bt;
        wmma::load_matrix_sync(a, Qs + (warp * 16) * L::ldh + kk * 16, L::ldh);
        wmma::load_matrix_sync(bt, Ks + (j * 16) * L::ldh + kk * 16, L::ldh);
        wmma::mma_sync(s_acc, a, bt, s_acc);
        wmma::load_matrix_sync(a, dOs + (warp * 16) * L::ldh + kk * 16, L::ldh);
        wmma::load_matrix_sync(bt, Vs + (j * 16) * L::ldh + kk * 16, L::ldh);
        wmma::mma_sync(dp_acc, a, bt, dp_acc);
      }
      wmma::store_matrix_sync(Ss + (warp * 16) * L::lds + j * 16, s_acc, L::lds, wmma::mem_row_major);
      wmma::store_matrix_sync(dPs + (warp * 16) * L::lds + j * 16, dp_acc, L::lds, wmma::mem_row_major);
    }
    __syncwarp();

    // dS = P (dP - D) on visible pairs, 0 elsewhere; the warp's 16 x 64 entries.
    for (int i = lane; i < 16 * kTile; i += 32) {
      const int row = warp * 16 + i / kTile, c = i % kTile;
      const int t = q0 + row, key = k0 + c;
      float ds = 0.0f;
      if (visible(t, key, T, W)) {
        const float p = exp2f(Ss[row * L::lds + c] * prm.scale_log2 - lse2_s[row]);
        ds = p * (dPs[row * L::lds + c] - D_s[row]);
      }
      dSs[row * L::ldp + c] = __float2bfloat16(ds);
    }
    __syncwarp();

    // dQ_w += dS_w K (the scale s is applied once at the end).
#pragma unroll
    for (int j = 0; j < D / 16; ++j) {
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        FragA a;
        FragB bm;
        wmma::load_matrix_sync(a, dSs + (warp * 16) * L::ldp + kk * 16, L::ldp);
        wmma::load_matrix_sync(bm, Ks + (kk * 16) * L::ldh + j * 16, L::ldh);
        wmma::mma_sync(dQ[j], a, bm, dQ[j]);
      }
    }
  }

  // dq = s dQ into dqkv's q part (bf16), real query rows only.
  bf16* drow = dqkv + static_cast<int64_t>(b) * T * prm.qkv_stride;
#pragma unroll
  for (int j = 0; j < D / 16; ++j) {
    wmma::store_matrix_sync(X, dQ[j], 16, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 256; e += 32) {
      const int t = q0 + warp * 16 + e / 16;
      if (t < T)
        drow[static_cast<int64_t>(t) * prm.qkv_stride + h * D + j * 16 + e % 16] = __float2bfloat16(X[e] * prm.scale);
    }
    __syncwarp();
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Launchers.

Params make_params(const Problem& p) {
  Params k;
  k.T = p.T;
  k.H = p.H;
  k.Hkv = p.Hkv;
  k.window = p.window;
  k.qkv_stride = int64_t{p.H + 2 * p.Hkv} * p.hd;
  k.scale = 1.0f / std::sqrt(static_cast<float>(p.hd));  // as the CPU reference computes it
  k.scale_log2 = k.scale * kLog2e;
  return k;
}

unsigned tiles(int T) { return static_cast<unsigned>((T + kTile - 1) / kTile); }

template <int D>
Status forward_hd(cudaStream_t stream, const Problem& p, const bf16* qkv, bf16* out, float* lse) {
  constexpr size_t smem = FwdSmem<D>::bytes;  // > 48 KiB: the kernel must opt in
  cudaError_t e = cudaFuncSetAttribute(flash_forward_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem));
  if (e != cudaSuccess) return {e, "cudaFuncSetAttribute(flash_forward_kernel, MaxDynamicSharedMemorySize)"};
  const dim3 grid(tiles(p.T), p.H, p.B);
  flash_forward_kernel<D><<<grid, kThreads, smem, stream>>>(make_params(p), qkv, out, lse);
  e = cudaGetLastError();
  if (e != cudaSuccess) return {e, "launching flash_forward_kernel"};
  return {};
}

template <int D>
Status dq_det_hd(cudaStream_t stream, const Problem& p, const bf16* qkv, const bf16* dout, const float* lse,
                 const float* Dvec, bf16* dqkv) {
  constexpr size_t smem = DqSmem<D>::bytes;
  cudaError_t e = cudaFuncSetAttribute(flash_backward_dq_kernel_det<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem));
  if (e != cudaSuccess) return {e, "cudaFuncSetAttribute(flash_backward_dq_kernel_det, MaxDynamicSharedMemorySize)"};
  const dim3 grid(tiles(p.T), p.H, p.B);
  flash_backward_dq_kernel_det<D><<<grid, kThreads, smem, stream>>>(make_params(p), qkv, dout, lse, Dvec, dqkv);
  e = cudaGetLastError();
  if (e != cudaSuccess) return {e, "launching flash_backward_dq_kernel_det"};
  return {};
}

template <int D>
Status backward_hd(cudaStream_t stream, const Problem& p, const bf16* qkv, const bf16* dout, const float* lse,
                   const float* Dvec, float* dq_acc, bf16* dqkv) {
  constexpr size_t smem = BwdSmem<D>::bytes;
  cudaError_t e = cudaFuncSetAttribute(flash_backward_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem));
  if (e != cudaSuccess) return {e, "cudaFuncSetAttribute(flash_backward_kernel, MaxDynamicSharedMemorySize)"};
  const dim3 grid(tiles(p.T), p.Hkv, p.B);
  flash_backward_kernel<D><<<grid, kThreads, smem, stream>>>(make_params(p), qkv, dout, lse, Dvec, dq_acc, dqkv);
  e = cudaGetLastError();
  if (e != cudaSuccess) return {e, "launching flash_backward_kernel"};
  return {};
}

}  // namespace

Status launch_forward(cudaStream_t stream, const Problem& p, const bf16* qkv, bf16* out, float* lse) {
  return p.hd == 64 ? forward_hd<64>(stream, p, qkv, out, lse) : forward_hd<128>(stream, p, qkv, out, lse);
}

Status launch_backward(cudaStream_t stream, const Problem& p, const bf16* qkv, const bf16* out, const bf16* dout,
                       const float* lse, bf16* dqkv, float* dq_acc, float* Dvec, bool deterministic) {
  const int64_t oc = int64_t{p.H} * p.hd, n = int64_t{p.B} * p.T * oc;
  cudaError_t e = cudaSuccess;
  if (deterministic) {
    dq_acc = nullptr;  // step 2 skips its dq atomics
  } else {
    e = cudaMemsetAsync(dq_acc, 0, static_cast<size_t>(n) * sizeof(float), stream);
    if (e != cudaSuccess) return {e, "cudaMemsetAsync(flash attention dq accumulator)"};
  }

  const int rows = p.B * p.T * p.H;
  constexpr int kDotWarps = 8;
  flash_backward_dot_kernel<<<(rows + kDotWarps - 1) / kDotWarps, kDotWarps * 32, 0, stream>>>(rows, p.T, p.H, p.hd,
                                                                                               out, dout, Dvec);
  e = cudaGetLastError();
  if (e != cudaSuccess) return {e, "launching flash_backward_dot_kernel"};

  const Status st = p.hd == 64 ? backward_hd<64>(stream, p, qkv, dout, lse, Dvec, dq_acc, dqkv)
                               : backward_hd<128>(stream, p, qkv, dout, lse, Dvec, dq_acc, dqkv);
  if (st.err != cudaSuccess) return st;
  if (deterministic)
    return p.hd == 64 ? dq_det_hd<64>(stream, p, qkv, dout, lse, Dvec, dqkv)
                      : dq_det_hd<128>(stream, p, qkv, dout, lse, Dvec, dqkv);

  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65536));
  flash_backward_dq_kernel<<<blocks, 256, 0, stream>>>(n, oc, int64_t{p.H + 2 * p.Hkv} * p.hd, make_params(p).scale,
                                                       dq_acc, dqkv);
  e = cudaGetLastError();
  if (e != cudaSuccess) return {e, "launching flash_backward_dq_kernel"};
  return {};
}

}  // namespace mt::flash
