// One pass over a pair of float32/float64 arrays: every sum, extreme and count that
// migrate/judge/metrics.py's _Sums accumulates, in float64, chunk by chunk.
//
// Chunks are measured in parallel (OpenMP) and merged in chunk order, so the figures do not
// depend on the thread count. A chunk finite on both sides takes a vectorised path (OpenMP simd
// reductions); a chunk holding NaN or Inf is classed element by element, as _Sums.nonfinite_chunk
// does. Built by migrate/native.py; metrics.py falls back to numpy without it.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr int kPositions = 5;   // metrics.NONFINITE_POSITIONS
constexpr int kNan = 1, kPosInf = 2, kNegInf = 3;

struct Part {
  double na2 = 0, nb2 = 0, dot = 0, sum_abs = 0, sum_sq = 0, max_abs = 0, ref_max = 0, got_max = 0, max_rel = 0;
  int64_t n_finite = 0, max_abs_at = -1, within0 = 0, within1 = 0;
  int64_t nan_ref = 0, nan_got = 0, inf_ref = 0, inf_got = 0, mismatches = 0, same_nonfinite = 0;
  int n_at_ref = 0, n_at_got = 0;
  int64_t at_ref[kPositions], at_got[kPositions];
};

inline int classify(double x) {
  if (std::isnan(x)) return kNan;
  if (std::isinf(x)) return x > 0 ? kPosInf : kNegInf;
  return 0;
}

// Four float64 lanes, element i of a chunk in lane i % 4, each lane summed in element order and the
// lanes added in lane order, held as W-wide vectors (GCC's vector extensions): two 2-wide ones in the
// x86-64 baseline (SSE2), one 4-wide in the AVX2 version picked at load time. Every version groups
// the sums alike, so a figure depends neither on the machine nor on where the arrays start. The
// largest difference's first position is kept per lane (a strictly larger difference moves it), so
// no second pass looks for it. The auto-vectorised loop this replaces (omp simd reductions, one
// accumulator each) ran at 3.3 ns a pair-element.
constexpr int kLanes = 4;
// The helpers below are inlined into one target's function each: no vector crosses a call, so GCC's
// note that 32-byte vectors pass differently with and without AVX does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

template <int W>
struct Vec {
  typedef double D __attribute__((vector_size(W * sizeof(double))));
  typedef int64_t M __attribute__((vector_size(W * sizeof(int64_t))));
};

template <int W, typename T>
__attribute__((always_inline)) inline typename Vec<W>::D load(const T* p) {
  typename Vec<W>::D v;
  for (int k = 0; k < W; ++k) v[k] = static_cast<double>(p[k]);
  return v;
}

// Lanes where m is set from a, the others from b, in bitwise operations.
template <typename D, typename M>
__attribute__((always_inline)) inline D pick(M m, D a, D b) {
  return (D)(((M)a & m) | ((M)b & ~m));
}

template <int W>
struct Acc {
  using D = typename Vec<W>::D;
  D na2{}, nb2{}, dot{}, sum_abs{}, sum_sq{}, max_abs{}, at{}, ref_max{}, got_max{}, max_rel{}, w0{}, w1{};
};

// One step of W lanes (x, y: W elements at positions idx); `live` masks the ragged tail's empty lanes.
template <bool Rel, int W>
__attribute__((always_inline)) inline void step(Acc<W>& s, typename Vec<W>::D x, typename Vec<W>::D y,
                                                typename Vec<W>::D idx, typename Vec<W>::M live, double floor,
                                                double tol0, double tol1) {
  using D = typename Vec<W>::D;
  using M = typename Vec<W>::M;
  const M no_sign = M{} + INT64_MAX;
  const D one = D{} + 1.0;
  const D d = (D)((M)(x - y) & no_sign), ax = (D)((M)x & no_sign), ay = (D)((M)y & no_sign);
  s.na2 += x * x;
  s.nb2 += y * y;
  s.dot += x * y;
  s.sum_abs += d;
  s.sum_sq += d * d;
  const M larger = (d > s.max_abs) & live;
  s.at = pick(larger, idx, s.at);
  s.max_abs = pick(larger, d, s.max_abs);
  s.ref_max = pick(ax > s.ref_max, ax, s.ref_max);
  s.got_max = pick(ay > s.got_max, ay, s.got_max);
  if constexpr (Rel) {
    const D fl = D{} + floor;
    const D r = d / pick(ax > fl, ax, fl);
    s.max_rel = pick(r > s.max_rel, r, s.max_rel);
    s.w0 += (D)((M)one & (r <= tol0) & live);
    s.w1 += (D)((M)one & (r <= tol1) & live);
  }
}

template <bool Rel, int W, typename A, typename B>
__attribute__((always_inline)) inline void finite_fast(const A* a, const B* b, int64_t m, double floor, double tol0,
                                                       double tol1, Part& p, bool& finite) {
  using D = typename Vec<W>::D;
  using M = typename Vec<W>::M;
  constexpr int G = kLanes / W;   // vectors per group of kLanes elements: lane g * W + k
  Acc<W> s[G];
  D idx[G];
  for (int g = 0; g < G; ++g)
    for (int k = 0; k < W; ++k) idx[g][k] = g * W + k;
  const M all = M{} - 1;
  const int64_t full = m - m % kLanes;
  for (int64_t i = 0; i < full; i += kLanes) {
    for (int g = 0; g < G; ++g) {
      step<Rel, W>(s[g], load<W>(a + i + g * W), load<W>(b + i + g * W), idx[g], all, floor, tol0, tol1);
      idx[g] += double(kLanes);
    }
  }
  for (int g = 0; g < G; ++g) {   // the tail: its empty lanes read zeros, masked out of counts and positions
    D x{}, y{};
    M live{};
    for (int k = 0; k < W; ++k) {
      const int64_t i = full + g * W + k;
      if (i < m) {
        x[k] = a[i];
        y[k] = b[i];
        live[k] = -1;
      }
    }
    if (full + g * W < m) step<Rel, W>(s[g], x, y, idx[g], live, floor, tol0, tol1);
  }
  double na2 = 0, nb2 = 0, dot = 0, sum_abs = 0, sum_sq = 0, w0 = 0, w1 = 0;
  double max_abs = 0, ref_max = 0, got_max = 0, max_rel = 0;
  for (int g = 0; g < G; ++g) {   // the lanes in order
    for (int k = 0; k < W; ++k) {
      na2 += s[g].na2[k]; nb2 += s[g].nb2[k]; dot += s[g].dot[k];
      sum_abs += s[g].sum_abs[k]; sum_sq += s[g].sum_sq[k]; w0 += s[g].w0[k]; w1 += s[g].w1[k];
      max_abs = s[g].max_abs[k] > max_abs ? s[g].max_abs[k] : max_abs;
      ref_max = s[g].ref_max[k] > ref_max ? s[g].ref_max[k] : ref_max;
      got_max = s[g].got_max[k] > got_max ? s[g].got_max[k] : got_max;
      max_rel = s[g].max_rel[k] > max_rel ? s[g].max_rel[k] : max_rel;
    }
  }
  // NaN/Inf anywhere (or a float64 overflow) leaves a sum of squares non-finite: redo the chunk slowly.
  finite = std::isfinite(na2) && std::isfinite(nb2);
  if (!finite) return;
  int64_t at = m;   // the first position of the largest difference, as numpy's argmax
  for (int g = 0; g < G; ++g) {
    for (int k = 0; k < W; ++k) {
      const int64_t lane = g * W + k;
      const int64_t lane_at = s[g].max_abs[k] > 0 ? static_cast<int64_t>(s[g].at[k]) : lane;  // all 0: its first
      if (lane < m && s[g].max_abs[k] == max_abs && lane_at < at) at = lane_at;
    }
  }
  p.n_finite = m;
  p.na2 = na2; p.nb2 = nb2; p.dot = dot; p.sum_abs = sum_abs; p.sum_sq = sum_sq;
  p.max_abs = max_abs; p.max_abs_at = m ? at : 0; p.ref_max = ref_max; p.got_max = got_max;
  p.max_rel = max_rel; p.within0 = static_cast<int64_t>(w0); p.within1 = static_cast<int64_t>(w1);
}

// One finite chunk's figures, per pair of element types; on x86-64 in two versions (GCC's function
// multiversioning picks the AVX2 one where the CPU has it). MIGRATE_BASELINE_ONLY builds the baseline
// alone (tests/test_pair_kernel.py holds the two to one result).
#define MIGRATE_FINITE_CHUNK_AS(TARGET, W, A, B)                                                               \
  TARGET void finite_chunk(const A* a, const B* b, int64_t m, double floor, double tol0, double tol1, Part& p, \
                           bool& finite) {                                                                     \
    if (floor >= 0) finite_fast<true, W>(a, b, m, floor, tol0, tol1, p, finite);                               \
    else finite_fast<false, W>(a, b, m, floor, tol0, tol1, p, finite);                                         \
  }
#if defined(__x86_64__) && !defined(MIGRATE_BASELINE_ONLY)
#define MIGRATE_FINITE_CHUNK(A, B)                                                 \
  MIGRATE_FINITE_CHUNK_AS(__attribute__((target("default"))), 2, A, B)             \
  MIGRATE_FINITE_CHUNK_AS(__attribute__((target("avx2"))), 4, A, B)
#else
#define MIGRATE_FINITE_CHUNK(A, B) MIGRATE_FINITE_CHUNK_AS(, 2, A, B)
#endif
MIGRATE_FINITE_CHUNK(float, float)
MIGRATE_FINITE_CHUNK(float, double)
MIGRATE_FINITE_CHUNK(double, float)
MIGRATE_FINITE_CHUNK(double, double)

template <typename A, typename B>
void with_nonfinite(const A* a, const B* b, int64_t m, double floor, double tol0, double tol1, Part& p) {
  p = Part();
  const bool rel = floor >= 0;
  for (int64_t i = 0; i < m; ++i) {
    const double x = a[i], y = b[i];
    const int cx = classify(x), cy = classify(y);
    if (cx | cy) {
      p.nan_ref += cx == kNan; p.nan_got += cy == kNan;
      p.inf_ref += cx >= kPosInf; p.inf_got += cy >= kPosInf;
      p.mismatches += cx != cy;
      p.same_nonfinite += cx == cy;
      if (cx && p.n_at_ref < kPositions) p.at_ref[p.n_at_ref++] = i;
      if (cy && p.n_at_got < kPositions) p.at_got[p.n_at_got++] = i;
      continue;
    }
    const double d = std::fabs(x - y), ax = std::fabs(x);
    p.n_finite += 1;
    p.na2 += x * x; p.nb2 += y * y; p.dot += x * y;
    p.sum_abs += d; p.sum_sq += d * d;
    if (d > p.max_abs || p.max_abs_at < 0) { p.max_abs = d; p.max_abs_at = i; }
    if (ax > p.ref_max) p.ref_max = ax;
    if (std::fabs(y) > p.got_max) p.got_max = std::fabs(y);
    if (rel) {
      const double r = d / (ax > floor ? ax : floor);
      if (r > p.max_rel) p.max_rel = r;
      p.within0 += r <= tol0;
      p.within1 += r <= tol1;
    }
  }
}

template <typename A, typename B>
void measure(const A* a, const B* b, int64_t n, int64_t chunk, double floor, double tol0, double tol1,
             double* out_f, int64_t* out_i) {
  const int64_t chunks = n ? (n + chunk - 1) / chunk : 0;
  std::vector<Part> parts(chunks);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * chunk, m = (lo + chunk < n ? lo + chunk : n) - lo;
    bool finite = false;
    finite_chunk(a + lo, b + lo, m, floor, tol0, tol1, parts[c], finite);
    if (!finite) with_nonfinite(a + lo, b + lo, m, floor, tol0, tol1, parts[c]);
  }
  Part t;   // merged in chunk order, as _Sums takes them
  for (int64_t c = 0; c < chunks; ++c) {
    const Part& p = parts[c];
    const int64_t lo = c * chunk;
    t.n_finite += p.n_finite;
    t.na2 += p.na2; t.nb2 += p.nb2; t.dot += p.dot; t.sum_abs += p.sum_abs; t.sum_sq += p.sum_sq;
    if (p.max_abs_at >= 0 && (p.max_abs > t.max_abs || t.max_abs_at < 0)) {
      t.max_abs = p.max_abs; t.max_abs_at = lo + p.max_abs_at;
    }
    if (p.ref_max > t.ref_max) t.ref_max = p.ref_max;
    if (p.got_max > t.got_max) t.got_max = p.got_max;
    if (p.max_rel > t.max_rel) t.max_rel = p.max_rel;
    t.within0 += p.within0; t.within1 += p.within1;
    t.nan_ref += p.nan_ref; t.nan_got += p.nan_got; t.inf_ref += p.inf_ref; t.inf_got += p.inf_got;
    t.mismatches += p.mismatches; t.same_nonfinite += p.same_nonfinite;
    for (int k = 0; k < p.n_at_ref && t.n_at_ref < kPositions; ++k) t.at_ref[t.n_at_ref++] = lo + p.at_ref[k];
    for (int k = 0; k < p.n_at_got && t.n_at_got < kPositions; ++k) t.at_got[t.n_at_got++] = lo + p.at_got[k];
  }
  const double f[] = {t.na2, t.nb2, t.dot, t.sum_abs, t.sum_sq, t.max_abs, t.ref_max, t.got_max, t.max_rel};
  std::memcpy(out_f, f, sizeof f);
  const int64_t i[] = {t.n_finite, t.max_abs_at, t.within0, t.within1, t.nan_ref, t.nan_got, t.inf_ref,
                       t.inf_got, t.mismatches, t.same_nonfinite, t.n_at_ref, t.n_at_got};
  std::memcpy(out_i, i, sizeof i);
  std::memcpy(out_i + 12, t.at_ref, sizeof(int64_t) * t.n_at_ref);
  std::memcpy(out_i + 12 + kPositions, t.at_got, sizeof(int64_t) * t.n_at_got);
}

template <typename A, typename B>
void abs_total(const A* a, const B* b, int64_t n, int64_t chunk, double* total, int64_t* count) {
  // sum |a| over the positions finite on both sides (the relative figures' scale), chunk sums
  // added in chunk order so that the thread count does not move the last bits
  const int64_t chunks = n ? (n + chunk - 1) / chunk : 0;
  std::vector<double> sums(chunks);
  std::vector<int64_t> counts(chunks);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * chunk, hi = lo + chunk < n ? lo + chunk : n;
    double s = 0;
    int64_t k = 0;
#pragma omp simd reduction(+ : s, k)
    for (int64_t i = lo; i < hi; ++i) {
      const double x = a[i], y = b[i];
      const bool both = std::isfinite(x) && std::isfinite(y);
      s += both ? std::fabs(x) : 0.0;
      k += both;
    }
    sums[c] = s;
    counts[c] = k;
  }
  double s = 0;
  int64_t k = 0;
  for (int64_t c = 0; c < chunks; ++c) { s += sums[c]; k += counts[c]; }
  *total = s;
  *count = k;
}

}  // namespace

extern "C" {

// a64/b64: 1 when that array is float64, 0 when float32. floor < 0: no relative figures.
// out_f: 9 doubles; out_i: 12 counts, then 5 + 5 non-finite positions (see the Part field order).
int migrate_pair_sums(const void* a, int a64, const void* b, int b64, int64_t n, int64_t chunk, double floor,
                      double tol0, double tol1, double* out_f, int64_t* out_i) {
  if (chunk < 1) return 1;
  if (a64 && b64) measure((const double*)a, (const double*)b, n, chunk, floor, tol0, tol1, out_f, out_i);
  else if (a64) measure((const double*)a, (const float*)b, n, chunk, floor, tol0, tol1, out_f, out_i);
  else if (b64) measure((const float*)a, (const double*)b, n, chunk, floor, tol0, tol1, out_f, out_i);
  else measure((const float*)a, (const float*)b, n, chunk, floor, tol0, tol1, out_f, out_i);
  return 0;
}

int migrate_abs_total(const void* a, int a64, const void* b, int b64, int64_t n, int64_t chunk, double* total,
                      int64_t* count) {
  if (chunk < 1) return 1;
  if (a64 && b64) abs_total((const double*)a, (const double*)b, n, chunk, total, count);
  else if (a64) abs_total((const double*)a, (const float*)b, n, chunk, total, count);
  else if (b64) abs_total((const float*)a, (const double*)b, n, chunk, total, count);
  else abs_total((const float*)a, (const float*)b, n, chunk, total, count);
  return 0;
}

}
