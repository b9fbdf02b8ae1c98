// One AdamW step of one fp32 tensor in one pass, for MindSpore's ops.Custom (func_type "aot", CPU).
// Each element is computed op by op as migrate/train/optim.py's graph computes it, every operation
// rounded to fp32 in the same order (built with -ffp-contract=off: no fused multiply-add), so the
// result is bit for bit the fourteen-kernel graph's (tests/test_adamw_kernel.py). Elements are
// independent, so the threads change no bit.
// inputs: param, grad, exp_avg, exp_avg_sq (fp32, one shape), scalars (fp32, 8):
//   decay, w1 = 1 - b1, b2, w2 = 1 - b2, neg_step = -lr / (1 - b1^t), bc2_sqrt, eps, use_decay (0 or 1)
// param, exp_avg and exp_avg_sq are written IN PLACE (the Parameters' own buffers, as MindSpore's CPU
// hands them to the kernel): three Assigns after the kernel cost a memory pass each, 0.84 s of a
// 0.97 s step at 126 M parameters. The one output, a float 0, is the token graphs order the step by.
#include <cmath>
#include <cstdint>
#include <cstring>
extern "C" int MigrateAdamW(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                            void *stream, void *extra) {
  if (nparam != 6) return 1;
  for (int i = 0; i < 6; i++) {
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
  int64_t k = 1;
  for (int i = 0; i < ndims[4]; i++) k *= shapes[4][i];
  if (k != 8) return 4;
  float *__restrict__ p = static_cast<float *>(params[0]);
  const float *__restrict__ g = static_cast<const float *>(params[1]);
  float *__restrict__ m = static_cast<float *>(params[2]);
  float *__restrict__ v = static_cast<float *>(params[3]);
  const float *s = static_cast<const float *>(params[4]);
  // x * 1.0f is x exactly: a tensor without weight decay multiplies by one instead of branching
  const float decay = s[7] != 0.0f ? s[0] : 1.0f;
  const float w1 = s[1], b2 = s[2], w2 = s[3], neg_step = s[4], bc2 = s[5], eps = s[6];
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; i++) {
    const float pi = p[i] * decay;
    const float mi = m[i] + w1 * (g[i] - m[i]);
    const float vi = v[i] * b2 + (w2 * g[i]) * g[i];
    const float denom = std::sqrt(vi) / bc2 + eps;
    p[i] = pi + (neg_step * mi) / denom;
    m[i] = mi;
    v[i] = vi;
  }
  static_cast<float *>(params[5])[0] = 0.0f;
  return 0;
}
