// One AdamW step of one fp32 tensor in one pass, for MindSpore's ops.Custom (func_type "aot", CPU).
// Each element is computed op by op as migrate/train/optim.py's graph computes it, every operation
// rounded to fp32 in the same order (built with -ffp-contract=off: no fused multiply-add), so the
// result is bit for bit the fourteen-kernel graph's (tests/test_adamw_kernel.py). Elements are
// independent, so the threads change no bit.
// inputs: param, grad, exp_avg, exp_avg_sq (fp32, one shape), scalars (fp32, 9, the same for every tensor
//   of a step): w1 = 1 - b1, b2, w2 = 1 - b2, neg_step = -lr / (1 - b1^t), bc2_sqrt, eps, inv_scale, coef,
//   zero_grad (0 or 1); decay (fp32, 1 element: 1 - lr * wd of the tensor's group, 1.0 without decay).
// The shared scalars are one tensor a step and the decay the group's own, so a step stacks no scalars per
// tensor (an 11-scalar Stack per tensor was 5.1 ms of a 72 ms step at the demo size).
// The gradient AdamW uses is gc = (grad * inv_scale) * coef, the two fp32 multiplies of the graph's
// unscale and clip (1.0f where either is off: x * 1.0f is x exactly), so the clip's memory passes
// are folded in here (migrate/train/step/optimizer.py).
// param, exp_avg and exp_avg_sq are written IN PLACE (the Parameters' own buffers, as MindSpore's CPU
// hands them to the kernel): three Assigns after the kernel cost a memory pass each, 0.84 s of a
// 0.97 s step at 126 M parameters. zero_grad 1: grad (an accumulator Parameter) is zeroed in place
// once read, saving the accumulators' zeroing pass.
// The one output, fp32 (1,), is the sum of gc * gc (the clipped norm's square share): summed in double
// over fixed blocks of BLOCK elements, then the blocks in order, so no thread count changes a bit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {
constexpr int64_t BLOCK = 16384;

struct Step {
  float *p, *g, *m, *v;
  float decay, w1, b2, w2, neg_step, bc2, eps, inv_scale, coef;
};

// Elements [lo, hi) stepped; returns their sum of gc * gc. kZero: grad zeroed once read.
template <bool kZero>
double Block(const Step &s, int64_t lo, int64_t hi) {
  float *__restrict__ p = s.p;
  float *__restrict__ g = s.g;
  float *__restrict__ m = s.m;
  float *__restrict__ v = s.v;
  const float decay = s.decay, w1 = s.w1, b2 = s.b2, w2 = s.w2, neg_step = s.neg_step, bc2 = s.bc2, eps = s.eps;
  const float inv_scale = s.inv_scale, coef = s.coef;
  double sq = 0.0;
#pragma omp simd reduction(+ : sq)
  for (int64_t i = lo; i < hi; i++) {
    const float gi = (g[i] * inv_scale) * coef;
    const float pi = p[i] * decay;
    const float mi = m[i] + w1 * (gi - m[i]);
    const float vi = v[i] * b2 + (w2 * gi) * gi;
    const float denom = std::sqrt(vi) / bc2 + eps;
    p[i] = pi + (neg_step * mi) / denom;
    m[i] = mi;
    v[i] = vi;
    sq += static_cast<double>(gi) * static_cast<double>(gi);
    if (kZero) g[i] = 0.0f;
  }
  return sq;
}
}  // namespace

extern "C" int MigrateAdamW(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                            void *stream, void *extra) {
  if (nparam != 7) return 1;
  for (int i = 0; i < 7; i++) {
    if (std::strcmp(dtypes[i], "float32") != 0) return 2;
  }
  int64_t n = 1;
  for (int i = 0; i < ndims[0]; i++) n *= shapes[0][i];
  for (int t = 1; t < 4; t++) {  // grad and the moments have param's shape: never read or write past one
    if (ndims[t] != ndims[0]) return 3;
    for (int i = 0; i < ndims[0]; i++) {
      if (shapes[t][i] != shapes[0][i]) return 3;
    }
  }
  int64_t k = 1, d = 1;
  for (int i = 0; i < ndims[4]; i++) k *= shapes[4][i];
  for (int i = 0; i < ndims[5]; i++) d *= shapes[5][i];
  if (k != 9 || d != 1) return 4;
  const float *s = static_cast<const float *>(params[4]);
  const float decay = static_cast<const float *>(params[5])[0];  // x * 1.0f is x exactly: no decay, no branch
  const Step step{static_cast<float *>(params[0]), static_cast<float *>(params[1]), static_cast<float *>(params[2]),
                  static_cast<float *>(params[3]), decay, s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]};
  const bool zero = s[8] != 0.0f;
  const int64_t blocks = (n + BLOCK - 1) / BLOCK;
  std::vector<double> part(blocks);
#pragma omp parallel for schedule(static) if (blocks > 4)
  for (int64_t b = 0; b < blocks; b++) {
    const int64_t lo = b * BLOCK, hi = std::min(n, lo + BLOCK);
    part[b] = zero ? Block<true>(step, lo, hi) : Block<false>(step, lo, hi);
  }
  double total = 0.0;
  for (int64_t b = 0; b < blocks; b++) total += part[b];
  static_cast<float *>(params[6])[0] = static_cast<float>(total);
  return 0;
}
