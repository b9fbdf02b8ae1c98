// Fused float32 CPU kernels of the bundled models' training graph, for MindSpore's ops.Custom
// (func_type "aot"): migrate/models/fused_ops.py binds each forward to its backward.
//
// Why: at small widths a MindSpore CPU kernel costs ~20-50 us whatever its size, and an RMSNorm's
// forward and backward were about 18 of them (x², mean, +eps, rsqrt, two products; the gradient's
// products, sums, tile and rsqrt gradient), the attention softmax's backward three (its row sum over
// [b, heads, s, s] alone 0.4 ms), the rotary of q or k about seven each way (halves sliced, negated,
// joined, two products, a sum). With these kernels the demo's training step runs 949 kernels, not
// 1,435 (39 ms of kernel time, not 56; MindSpore's profiler over bench/ms_floor.py).
//
// The numbers are float32 computed as HF's eager torch computes them, each sum in its own fixed order
// (eight float lanes per row, then the lanes in order; no FMA: built with -ffp-contract=off), so they
// agree with the op-by-op graph within float32 rounding, not bit for bit (the rotary's are bit for bit:
// products and sums of two, as the graph rounds them). One thread each: OpenMP's team, spinning once
// its region ends, took the cores from MindSpore's own kernel threads (the demo's step ran slower
// fused than op by op until the kernels ran alone).
//
//   MigrateRmsNorm      x (rows.., h), weight (h), eps (1)          -> y = weight * (x * rsqrt(mean(x²) + eps))
//   MigrateRmsNormGrad  x, weight, eps, dy                          -> dx (x's shape), dweight (h)
//   MigrateSoftmaxGrad  y = softmax(x) over the last axis, dy        -> dx = (dy - sum(dy * y)) * y
//   MigrateRotary       x (b, heads, s, d), cos, sin (s·d or b·s·d)  -> x * cos + rotate_half(x) * sin
//   MigrateRotaryGrad   dy, cos, sin                                 -> dx (its transpose: rotate_half's backward)
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {
constexpr int kLanes = 8;

// sum(a[j] * b[j]) over [0, n): eight float lanes, then the lanes in order, then the tail.
inline float LaneDot(const float *a, const float *b, int64_t n) {
  float acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int t = 0; t < kLanes; t++) acc[t] += a[j + t] * b[j + t];
  }
  float sum = 0.0f;
  for (int t = 0; t < kLanes; t++) sum += acc[t];
  for (; j < n; j++) sum += a[j] * b[j];
  return sum;
}

// 1 / sqrt(mean(x²) + eps) of one row: torch.rsqrt's two roundings (sqrt, then the division).
inline float RowInverseRms(const float *x, int64_t h, float eps) {
  return 1.0f / std::sqrt(LaneDot(x, x, h) / static_cast<float>(h) + eps);
}

int64_t Elements(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  return n;
}

bool AllFloat32(int nparam, const char **dtypes) {
  for (int i = 0; i < nparam; i++) {
    if (std::strcmp(dtypes[i], "float32") != 0) return false;
  }
  return true;
}

bool SameShape(int a, int b, const int *ndims, int64_t **shapes) {
  if (ndims[a] != ndims[b]) return false;
  for (int i = 0; i < ndims[a]; i++) {
    if (shapes[a][i] != shapes[b][i]) return false;
  }
  return true;
}

// x's last axis is h, weight holds h elements, eps one.
bool NormShapes(const int *ndims, int64_t **shapes, int64_t *rows, int64_t *h) {
  if (ndims[0] < 1) return false;
  *h = shapes[0][ndims[0] - 1];
  if (*h < 1 || Elements(ndims[1], shapes[1]) != *h || Elements(ndims[2], shapes[2]) != 1) return false;
  *rows = Elements(ndims[0], shapes[0]) / *h;
  return true;
}
}  // namespace

extern "C" int MigrateRmsNorm(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                              void *stream, void *extra) {
  if (nparam != 4 || !AllFloat32(4, dtypes) || !SameShape(0, 3, ndims, shapes)) return 1;
  int64_t rows, h;
  if (!NormShapes(ndims, shapes, &rows, &h)) return 2;
  const float *x = static_cast<const float *>(params[0]);
  const float *w = static_cast<const float *>(params[1]);
  const float eps = static_cast<const float *>(params[2])[0];
  float *y = static_cast<float *>(params[3]);
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * h;
    float *yr = y + r * h;
    const float inv = RowInverseRms(xr, h, eps);
    for (int64_t j = 0; j < h; j++) yr[j] = w[j] * (xr[j] * inv);  // HF: weight * (x * rsqrt)
  }
  return 0;
}

// y = w * n, n = x * r, r = (mean(x²) + eps)^-1/2:
//   dw = sum over rows of dy * n;   dx = r * (dn - n * sum(dn * n) / h), dn = dy * w.
extern "C" int MigrateRmsNormGrad(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                  void *stream, void *extra) {
  if (nparam != 6 || !AllFloat32(6, dtypes) || !SameShape(0, 3, ndims, shapes) || !SameShape(0, 4, ndims, shapes))
    return 1;
  int64_t rows, h;
  if (!NormShapes(ndims, shapes, &rows, &h) || Elements(ndims[5], shapes[5]) != h) return 2;
  const float *x = static_cast<const float *>(params[0]);
  const float *w = static_cast<const float *>(params[1]);
  const float eps = static_cast<const float *>(params[2])[0];
  const float *dy = static_cast<const float *>(params[3]);
  float *dx = static_cast<float *>(params[4]);
  float *dw = static_cast<float *>(params[5]);
  std::vector<float> n(h);
  for (int64_t j = 0; j < h; j++) dw[j] = 0.0f;
  for (int64_t r = 0; r < rows; r++) {  // dw summed over the rows in order
    const float *xr = x + r * h, *dyr = dy + r * h;
    float *dxr = dx + r * h;
    const float ir = RowInverseRms(xr, h, eps);
    for (int64_t j = 0; j < h; j++) n[j] = xr[j] * ir;
    for (int64_t j = 0; j < h; j++) dw[j] += dyr[j] * n[j];
    for (int64_t j = 0; j < h; j++) dxr[j] = dyr[j] * w[j];  // dn, in dx's row until overwritten
    const float mean_dn_n = LaneDot(dxr, n.data(), h) / static_cast<float>(h);
    for (int64_t j = 0; j < h; j++) dxr[j] = ir * (dxr[j] - n[j] * mean_dn_n);
  }
  return 0;
}

extern "C" int MigrateSoftmaxGrad(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                  void *stream, void *extra) {
  if (nparam != 3 || !AllFloat32(3, dtypes) || !SameShape(0, 1, ndims, shapes) || !SameShape(0, 2, ndims, shapes))
    return 1;
  if (ndims[0] < 1 || shapes[0][ndims[0] - 1] < 1) return 2;
  const int64_t n = shapes[0][ndims[0] - 1];
  const int64_t rows = Elements(ndims[0], shapes[0]) / n;
  const float *y = static_cast<const float *>(params[0]);
  const float *dy = static_cast<const float *>(params[1]);
  float *dx = static_cast<float *>(params[2]);
  for (int64_t r = 0; r < rows; r++) {
    const float *yr = y + r * n, *dyr = dy + r * n;
    float *dxr = dx + r * n;
    const float s = LaneDot(dyr, yr, n);
    for (int64_t j = 0; j < n; j++) dxr[j] = (dyr[j] - s) * yr[j];
  }
  return 0;
}

namespace {
// x (b, heads, s, d) and the tables' batch stride (0: one (s, d) table for every row; s·d: a table
// per row, as a KV-cache step's per-row positions give), or false where the shapes do not fit.
bool RotaryShapes(int x, int cos, int sin, const int *ndims, int64_t **shapes, int64_t dims[4], int64_t *stride) {
  if (ndims[x] != 4) return false;
  for (int i = 0; i < 4; i++) dims[i] = shapes[x][i];
  const int64_t table = dims[2] * dims[3], c = Elements(ndims[cos], shapes[cos]);
  if (dims[3] % 2 != 0 || c != Elements(ndims[sin], shapes[sin])) return false;
  if (ndims[cos] < 2 || shapes[cos][ndims[cos] - 1] != dims[3] || shapes[cos][ndims[cos] - 2] != dims[2]) return false;
  if (c == table) {
    *stride = 0;
  } else if (c == dims[0] * table) {
    *stride = table;
  } else {
    return false;
  }
  return true;
}

// sign -1: the transpose (the gradient): x·cos + rotate_halfᵀ(x·sin), rotate_halfᵀ(v) = [v2, -v1].
template <int kSign>
void Rotate(const float *x, const float *cos, const float *sin, const int64_t dims[4], int64_t stride, float *y) {
  const int64_t b = dims[0], heads = dims[1], s = dims[2], d = dims[3], half = d / 2;
  for (int64_t i = 0; i < b; i++) {
    const float *ci = cos + i * stride, *si = sin + i * stride;
    for (int64_t h = 0; h < heads; h++) {
      for (int64_t t = 0; t < s; t++) {
        const int64_t row = ((i * heads + h) * s + t) * d;
        const float *xr = x + row, *c = ci + t * d, *sn = si + t * d;
        float *yr = y + row;
        if (kSign > 0) {  // HF: x * cos + cat(-x2, x1) * sin, each product rounded, then the sum
          for (int64_t j = 0; j < half; j++) yr[j] = xr[j] * c[j] + (-xr[j + half]) * sn[j];
          for (int64_t j = half; j < d; j++) yr[j] = xr[j] * c[j] + xr[j - half] * sn[j];
        } else {          // the graph's backward: dy * cos plus the slices of dy * sin moved back
          for (int64_t j = 0; j < half; j++) yr[j] = xr[j] * c[j] + xr[j + half] * sn[j + half];
          for (int64_t j = half; j < d; j++) yr[j] = xr[j] * c[j] + -(xr[j - half] * sn[j - half]);
        }
      }
    }
  }
}

template <int kSign>
int RotaryKernel(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes) {
  if (nparam != 4 || !AllFloat32(4, dtypes) || !SameShape(0, 3, ndims, shapes)) return 1;
  int64_t dims[4], stride;
  if (!RotaryShapes(0, 1, 2, ndims, shapes, dims, &stride)) return 2;
  Rotate<kSign>(static_cast<const float *>(params[0]), static_cast<const float *>(params[1]),
                static_cast<const float *>(params[2]), dims, stride, static_cast<float *>(params[3]));
  return 0;
}
}  // namespace

extern "C" int MigrateRotary(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                             void *stream, void *extra) {
  return RotaryKernel<1>(nparam, params, ndims, shapes, dtypes);
}

extern "C" int MigrateRotaryGrad(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                                 void *stream, void *extra) {
  return RotaryKernel<-1>(nparam, params, ndims, shapes, dtypes);
}
