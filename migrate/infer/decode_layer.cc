// One KV-cache step (s new tokens per row: the prompt, then one per decode step) of a Llama decoder
// layer, and the LM head's product, as MindSpore ops.Custom kernels (func_type "aot", CPU):
// migrate/infer/kernel_decode.py.
//
// Why: batch-1 decode reads every weight once a token; MindSpore's compiled step spent as long
// launching its ~45 kernels a layer as computing them (docs/generate.md). Here a layer is one
// kernel: both RMSNorms, the q/k/v projections, the rotary, the cache write, the attention over the
// cache, o_proj, both residuals and the gated MLP.
//
// The numbers are float32 as HF's eager layer computes them, each product summed in its own order
// (eight lanes per row, then the lanes in order; no FMA: built with -ffp-contract=off), so they
// agree with the op-by-op step within float32 rounding, not bit for bit. The vector clones (AVX2 and
// the x86-64 baseline) group every sum alike, so every machine computes the same bits.
//
// MigrateDecodeLayer inputs, float32 unless named:
//   0 x (b, s, h)   1 attention_norm (h)   2 wq (heads*d, h)   3 wk (kv*d, h)   4 wv (kv*d, h)
//   5 wo (h, heads*d)   6 ffn_norm (h)   7 w1 gate (i, h)   8 w3 up (i, h)   9 w2 down (h, i)
//   10 cos (b, 1, s, d)   11 sin (b, 1, s, d)   12 mask (b, 1, s, L), additive
//   13 k_cache (b, kv, L, d)   14 v_cache (b, kv, L, d): the s tokens' k, v written IN PLACE at slots
//      start .. start + s - 1 (the Parameters' own buffers, as the trainer's AdamW kernel writes its
//      moments); token t attends slots 0 .. start + t (later ones are masked: exp gives them 0)
//   15 start (), int32   16 scalars (2): rms_norm_eps, attention scaling (head_dim ** -0.5)
//   17 output (b, s, h): the layer's output
// MigrateHeadRows inputs: 0 x (b, 1, h)   1 table (vocab, h)   2 output (b, vocab) = x · tableᵀ
// A return other than 0 is a shape or dtype the kernel does not take (MindSpore raises).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {
constexpr int kLanes = 8;
// y[r * n + o] = x[r] · w[o] for R rows from row r0 and outputs o in [lo, hi): each weight row is read
// once for the R rows (decode is memory-bound: the weights are the traffic). R is a constant so the
// R x 8 partial sums stay in vector registers.
template <int R>
__attribute__((always_inline)) inline void RowBlock(const float *__restrict__ x, int64_t r0, int64_t k,
                                                    const float *__restrict__ w, int64_t n, int64_t lo, int64_t hi,
                                                    float *__restrict__ y) {
  for (int64_t o = lo; o < hi; o++) {
    const float *wo = w + o * k;
    float acc[R][kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= k; j += kLanes) {
      for (int r = 0; r < R; r++) {
        const float *xr = x + (r0 + r) * k + j;
#pragma omp simd
        for (int t = 0; t < kLanes; t++) acc[r][t] += xr[t] * wo[j + t];
      }
    }
    for (int r = 0; r < R; r++) {
      float s = 0.0f;
      for (int t = 0; t < kLanes; t++) s += acc[r][t];
      for (int64_t jj = j; jj < k; jj++) s += x[(r0 + r) * k + jj] * wo[jj];
      y[(r0 + r) * n + o] = s;
    }
  }
}

// Every row of x in blocks of 8, 4, 2, 1: the same sums in the same order whatever the block.
// MIGRATE_BASELINE_ONLY: no AVX2 clone (tests/test_kernel_decode.py holds the clones to one result).
#ifndef MIGRATE_BASELINE_ONLY
__attribute__((target_clones("avx2", "default")))
#endif
void Products(const float *__restrict__ x, int64_t rows, int64_t k, const float *__restrict__ w, int64_t n,
              int64_t lo, int64_t hi, float *__restrict__ y) {
  int64_t r0 = 0;
  for (; r0 + 8 <= rows; r0 += 8) RowBlock<8>(x, r0, k, w, n, lo, hi, y);
  if (r0 + 4 <= rows) {
    RowBlock<4>(x, r0, k, w, n, lo, hi, y);
    r0 += 4;
  }
  if (r0 + 2 <= rows) {
    RowBlock<2>(x, r0, k, w, n, lo, hi, y);
    r0 += 2;
  }
  if (r0 < rows) RowBlock<1>(x, r0, k, w, n, lo, hi, y);
}

// The outputs [0, n) split among the team's threads (call inside a parallel region).
void SharedProducts(const float *x, int64_t rows, int64_t k, const float *w, int64_t n, float *y) {
#pragma omp for schedule(static)
  for (int64_t c = 0; c < (n + 63) / 64; c++) Products(x, rows, k, w, n, c * 64, std::min(n, c * 64 + 64), y);
}

// HF LlamaRMSNorm in float32: x * rsqrt(mean(x²) + eps), then times the weight.
void RmsNorm(const float *x, const float *weight, int64_t h, float eps, float *out) {
  float acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= h; j += kLanes) {
    for (int t = 0; t < kLanes; t++) acc[t] += x[j + t] * x[j + t];
  }
  float sq = 0.0f;
  for (int t = 0; t < kLanes; t++) sq += acc[t];
  for (; j < h; j++) sq += x[j] * x[j];
  const float inv = 1.0f / std::sqrt(sq / static_cast<float>(h) + eps);
  for (int64_t i = 0; i < h; i++) out[i] = weight[i] * (x[i] * inv);
}

// HF apply_rotary_pos_emb on one head (d values): x·cos + rotate_half(x)·sin.
void Rotate(float *x, const float *cos, const float *sin, int64_t d) {
  const int64_t half = d / 2;
  float rotated[1024];
  for (int64_t i = 0; i < half; i++) rotated[i] = -x[half + i];
  for (int64_t i = half; i < d; i++) rotated[i] = x[i - half];
  for (int64_t i = 0; i < d; i++) x[i] = x[i] * cos[i] + rotated[i] * sin[i];
}

int64_t Count(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  return n;
}

bool AllFloat32(int nparam, const char **dtypes, int skip) {
  for (int i = 0; i < nparam; i++) {
    if (i != skip && std::strcmp(dtypes[i], "float32") != 0) return false;
  }
  return true;
}
}  // namespace

extern "C" int MigrateDecodeLayer(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                  void *stream, void *extra) {
  if (nparam != 18) return 1;
  if (!AllFloat32(nparam, dtypes, 15) || std::strcmp(dtypes[15], "int32") != 0) return 2;
  if (ndims[0] != 3 || ndims[13] != 4 || ndims[2] != 2 || ndims[7] != 2) return 3;
  const int64_t b = shapes[0][0], s = shapes[0][1], h = shapes[0][2], rows = b * s;
  const int64_t kv = shapes[13][1], L = shapes[13][2], d = shapes[13][3];
  const int64_t qo = shapes[2][0], heads = qo / std::max<int64_t>(d, 1), inter = shapes[7][0], kvo = kv * d;
  auto is = [&](int t, std::initializer_list<int64_t> want) {
    if (ndims[t] != static_cast<int>(want.size())) return false;
    int i = 0;
    for (int64_t v : want) {
      if (shapes[t][i++] != v) return false;
    }
    return true;
  };
  if (d <= 0 || d % 2 || d > 1024 || qo % d || kv <= 0 || heads <= 0 || heads % kv || b <= 0 || s <= 0 ||
      !is(1, {h}) || !is(2, {qo, h}) || !is(3, {kvo, h}) || !is(4, {kvo, h}) || !is(5, {h, qo}) || !is(6, {h}) || !is(7, {inter, h}) ||
      !is(8, {inter, h}) || !is(9, {h, inter}) || !is(10, {b, 1, s, d}) || !is(11, {b, 1, s, d}) ||
      !is(12, {b, 1, s, L}) || !is(14, {b, kv, L, d}) || Count(ndims[15], shapes[15]) != 1 ||
      Count(ndims[16], shapes[16]) != 2 || !is(17, {b, s, h}))
    return 3;
  auto in = [&](int i) { return static_cast<const float *>(params[i]); };
  const float *x = in(0), *attn_norm = in(1), *wq = in(2), *wk = in(3), *wv = in(4), *wo = in(5);
  const float *ffn_norm = in(6), *w1 = in(7), *w3 = in(8), *w2 = in(9), *cos = in(10), *sin = in(11);
  const float *mask = in(12);
  float *k_cache = static_cast<float *>(params[13]);
  float *v_cache = static_cast<float *>(params[14]);
  const int64_t start = static_cast<const int32_t *>(params[15])[0];
  const float eps = in(16)[0], scaling = in(16)[1];
  float *out = static_cast<float *>(params[17]);
  if (start < 0 || start + s > L) return 4;
  const int64_t rep = heads / kv, most = start + s;  // the slots the last token attends

  // one row per token: row rr = r * s + t is batch row r's token t
  std::vector<float> normed(rows * h), q(rows * qo), k(rows * kvo), v(rows * kvo), attn(rows * qo), mid(rows * h);
  std::vector<float> gate(rows * inter), up(rows * inter);
#pragma omp parallel
  {
    std::vector<float> probs(most);  // one attention row at a time per thread (a long prompt: rows x slots)
#pragma omp for schedule(static)
    for (int64_t rr = 0; rr < rows; rr++) RmsNorm(x + rr * h, attn_norm, h, eps, normed.data() + rr * h);
    SharedProducts(normed.data(), rows, h, wq, qo, q.data());
    SharedProducts(normed.data(), rows, h, wk, kvo, k.data());
    SharedProducts(normed.data(), rows, h, wv, kvo, v.data());
#pragma omp for schedule(static)
    for (int64_t rr = 0; rr < rows; rr++) {
      const int64_t r = rr / s, t = rr % s;
      for (int64_t hd = 0; hd < heads; hd++) Rotate(q.data() + rr * qo + hd * d, cos + rr * d, sin + rr * d, d);
      for (int64_t g = 0; g < kv; g++) {
        Rotate(k.data() + rr * kvo + g * d, cos + rr * d, sin + rr * d, d);
        const int64_t at = ((r * kv + g) * L + start + t) * d;
        std::memcpy(k_cache + at, k.data() + rr * kvo + g * d, d * sizeof(float));
        std::memcpy(v_cache + at, v.data() + rr * kvo + g * d, d * sizeof(float));
      }
    }
    // Eager attention per (row, query head) against its kv head g = head / rep (HF's repeat_kv):
    // scores = q·kᵀ · scaling + mask, softmax in float32, then probs·v.
#pragma omp for schedule(static)
    for (int64_t rh = 0; rh < rows * heads; rh++) {
      const int64_t rr = rh / heads, r = rr / s, hd = rh % heads, g = hd / rep;
      const int64_t slots = start + rr % s + 1;  // later slots are masked: exp gives them 0
      const float *qh = q.data() + rr * qo + hd * d;
      const float *keys = k_cache + (r * kv + g) * L * d;
      const float *values = v_cache + (r * kv + g) * L * d;
      const float *row_mask = mask + rr * L;
      float *p = probs.data();
      float top = -INFINITY;
      for (int64_t slot = 0; slot < slots; slot++) {
        float acc[kLanes] = {};
        for (int64_t j = 0; j < d; j += kLanes) {
          for (int t = 0; t < kLanes && j + t < d; t++) acc[t] += qh[j + t] * keys[slot * d + j + t];
        }
        float dot = 0.0f;
        for (int t = 0; t < kLanes; t++) dot += acc[t];
        p[slot] = dot * scaling + row_mask[slot];
        top = std::max(top, p[slot]);
      }
      float total = 0.0f;
      for (int64_t slot = 0; slot < slots; slot++) {
        p[slot] = std::exp(p[slot] - top);
        total += p[slot];
      }
      float *o = attn.data() + rr * qo + hd * d;
      for (int64_t j = 0; j < d; j++) o[j] = 0.0f;
      for (int64_t slot = 0; slot < slots; slot++) {
        const float w = p[slot] / total;
        for (int64_t j = 0; j < d; j++) o[j] += w * values[slot * d + j];
      }
    }
    SharedProducts(attn.data(), rows, qo, wo, h, mid.data());
#pragma omp for schedule(static)
    for (int64_t rr = 0; rr < rows; rr++) {
      for (int64_t i = 0; i < h; i++) mid[rr * h + i] += x[rr * h + i];  // the attention's residual
      RmsNorm(mid.data() + rr * h, ffn_norm, h, eps, normed.data() + rr * h);
    }
    SharedProducts(normed.data(), rows, h, w1, inter, gate.data());
    SharedProducts(normed.data(), rows, h, w3, inter, up.data());
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows * inter; i++) {
      const float g = gate[i];
      gate[i] = (g / (1.0f + std::exp(-g))) * up[i];  // SiLU(gate) * up
    }
    SharedProducts(gate.data(), rows, inter, w2, h, out);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows * h; i++) out[i] += mid[i];  // the MLP's residual
  }
  return 0;
}

extern "C" int MigrateHeadRows(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                               void *stream, void *extra) {
  if (nparam != 3) return 1;
  if (!AllFloat32(nparam, dtypes, -1)) return 2;
  if (ndims[0] != 3 || ndims[1] != 2 || ndims[2] != 2 || shapes[1][1] != shapes[0][2] ||
      shapes[2][0] != shapes[0][0] || shapes[2][1] != shapes[1][0])
    return 3;
  const int64_t b = shapes[0][0], h = shapes[0][2], vocab = shapes[1][0];
  const float *x = static_cast<const float *>(params[0]);
  const float *table = static_cast<const float *>(params[1]);
  float *out = static_cast<float *>(params[2]);
  if (shapes[0][1] != 1) return 3;
#pragma omp parallel
  SharedProducts(x, b, h, table, vocab, out);
  return 0;
}
