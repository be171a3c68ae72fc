// CPU kernels for the segmented PCSD weights. See pcsd_kernels.h for the contract.
//
// Two implementations of the same math:
//   * segment_weights (portable scalar): a backward sweep with O(1) sliding fp64 window sums;
//     the fallback on every CPU and the second reference of the tests;
//   * simd::segment_weights_avx2: 8 consecutive tokens per vector, direct windowed sums, built
//     with target attributes and chosen at run time when the CPU has AVX2 and FMA.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <thread>
#include <vector>

#include "pcsd_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PCSD_X86 1
#include <immintrin.h>
#else
#define PCSD_X86 0
#endif

namespace pcsd {
namespace {

// Longest window the AVX2 kernel takes; its cost grows with n_max (direct sums), while the scalar
// kernel's sliding sums cost O(1) per token, so very long windows stay with the scalar kernel.
constexpr int kSimdMaxWindow = 32;

inline double sigmoid(double x) {
  if (x >= 0) {
    return 1.0 / (1.0 + std::exp(-x));
  }
  const double e = std::exp(x);
  return e / (1.0 + e);
}

inline double clip01(double x) { return x < 0.0 ? 0.0 : (x > 1.0 ? 1.0 : x); }

// Adds |g| of the valid tokens of [t, end) to *abs_sum (fp64, in order) and counts them into
// *valid; returns kNonFiniteGap with *err_index at the first non-finite valid gap, else kOk.
// The scalar kernel's scale pass, and the AVX2 scale pass's tail.
template <bool kMask>
inline int masked_abs_sum(const float* __restrict g, const uint8_t* __restrict mk, int64_t t,
                          int64_t end, double* abs_sum, int64_t* valid, int64_t* err_index) {
  for (; t < end; ++t) {
    if (kMask && mk[t] == 0) continue;
    const float v = g[t];
    if (!std::isfinite(v)) {
      *err_index = t;
      return kNonFiniteGap;
    }
    *abs_sum += std::fabs(static_cast<double>(v));
    ++*valid;
  }
  return kOk;
}

// One segment, swept backwards so that every window sum is updated in O(1) per token:
// moving from window [i+1, i+1+N) to [i, i+N) adds token i at offset 0, shifts every other offset
// by one and drops the token at offset N. Offsets stay small (< N), counts and offset sums are
// exact integers, and the only floating sums are of gaps, so accumulated rounding stays at the
// level of a direct fp64 sum. Empty windows reset their decayed sums to exact zeros.
// Returns kOk or kNonFiniteGap. Specialised on whether a mask and statistics are present.
template <bool kMask, bool kStats>
int segment_weights(const float* __restrict g, const uint8_t* __restrict mk, int64_t begin,
                    int64_t end, const PcsdParams& p, float* __restrict w, float* __restrict ad,
                    float* __restrict rr, float* __restrict sl, float* __restrict et,
                    int64_t* err_index) {
  const int64_t len = end - begin;
  if (len == 0) return kOk;
  // Response-level scale, and the finiteness check of valid gaps.
  double abs_sum = 0.0;
  int64_t valid = 0;
  if (masked_abs_sum<kMask>(g, mk, begin, end, &abs_sum, &valid, err_index) != kOk) return kNonFiniteGap;
  const double scale = (valid > 0 ? abs_sum / static_cast<double>(valid) : 0.0) + p.eps_scale;
  const double inv_scale = 1.0 / scale;
  const double inv_tau = 1.0 / (p.tau_high - p.tau_low);
  const int64_t nl = p.n_max, ns = std::min(p.n_min, p.n_max);  // short window within the long one
  const double a = p.alpha, a_nl = std::pow(a, static_cast<double>(nl)),
               a_ns = std::pow(a, static_cast<double>(ns));
  const double nld = static_cast<double>(nl);

  const double gamma = p.gamma, beta = p.beta_gate, eps_slope = p.eps_slope, tau_low = p.tau_low;
  const bool use_adaptive = p.adaptive, use_trend = p.trend;
  auto m_at = [&](int64_t t) -> int64_t { return kMask ? (mk[t] != 0) : 1; };
  auto x_at = [&](int64_t t) -> double {  // gap, 0 where masked
    return (kMask && mk[t] == 0) ? 0.0 : static_cast<double>(g[t]);
  };

  // Long window: count, sum, sum of squares, sum of j, sum of j^2, sum of j*x, decayed sums.
  int64_t c = 0, sj = 0, sjj = 0, cs = 0;
  double s1 = 0.0, s2 = 0.0, sjx = 0.0, num_l = 0.0, den_l = 0.0, num_s = 0.0, den_s = 0.0;
  for (int64_t t = end - 1; t >= begin; --t) {
    // Shift offsets of the current window by one (sums over (j + 1)).
    sjj += 2 * sj + c;
    sj += c;
    sjx += s1;
    const int64_t mi = m_at(t);
    const double xi = x_at(t);
    // Add token t at offset 0.
    c += mi;
    s1 += xi;
    s2 += xi * xi;
    num_l = xi + a * num_l;
    den_l = static_cast<double>(mi) + a * den_l;
    num_s = xi + a * num_s;
    den_s = static_cast<double>(mi) + a * den_s;
    cs += mi;
    // Drop the token that left the long window (now at offset n_max).
    const int64_t out_l = t + nl;
    if (out_l < end) {
      const int64_t mo = m_at(out_l);
      const double xo = x_at(out_l);
      c -= mo;
      s1 -= xo;
      s2 -= xo * xo;
      sj -= mo * nl;
      sjj -= mo * nl * nl;
      sjx -= xo * nld;
      num_l -= a_nl * xo;
      den_l -= a_nl * static_cast<double>(mo);
    }
    const int64_t out_s = t + ns;
    if (out_s < end) {
      const int64_t mo = m_at(out_s);
      num_s -= a_ns * x_at(out_s);
      den_s -= a_ns * static_cast<double>(mo);
      cs -= mo;
    }
    if (c == 0) {  // exact zeros: no drift survives an empty window
      s1 = s2 = sjx = num_l = den_l = 0.0;
    }
    if (cs == 0) num_s = den_s = 0.0;

    double r = 0.0, slope = 0.0;
    const double dbar_s = (cs > 0 && den_s > 0.0) ? num_s / den_s : 0.0;
    const double dbar_l = (c > 0 && den_l > 0.0) ? num_l / den_l : 0.0;
    if (c > 0) {
      const double inv_c = 1.0 / static_cast<double>(c);
      const double mean = s1 * inv_c;
      if (use_adaptive) {
        const double var = std::max(0.0, s2 * inv_c - mean * mean);
        r = clip01((var - tau_low) * inv_tau);
      }
      if (c >= 2) {
        const double sjd = static_cast<double>(sj);
        const double sxx = static_cast<double>(sjj) - sjd * sjd * inv_c;
        const double sxy = sjx - sjd * s1 * inv_c;
        slope = sxy / (sxx + eps_slope);
      }
    }
    const double adaptive = (1.0 - r) * dbar_s + r * dbar_l;
    const double eta = use_trend ? clip01(1.0 - gamma * std::max(0.0, -slope * inv_scale)) : 1.0;
    w[t] = mi ? static_cast<float>(sigmoid(beta * adaptive) * eta) : 0.0f;
    if (kStats) {
      ad[t] = static_cast<float>(adaptive);
      rr[t] = static_cast<float>(r);
      sl[t] = static_cast<float>(slope);
      et[t] = static_cast<float>(eta);
    }
  }
  return kOk;
}


// =================================================================================================
// AVX2 + FMA kernel. Compiled with function-level target attributes and entered only after a run
// time CPU check, so the module needs no -march flag and stays portable.
//
// Layout: every segment is cut into chunks of kChunk tokens. A chunk (plus the n_max - 1 tokens
// its windows reach into, never past the segment end) is copied once into a per-thread scratch:
// masked gaps as doubles and as floats (0 at masked positions, selected, so NaN/Inf there never
// enter a sum) and the mask as floats, zero-padded. A segment of one chunk gets its scale (mean
// |g|) and finiteness check from that copy; a longer one from a pass of its own. Lane l of a
// vector is token i + l; window offset j reads the scratch at i + j, so the 8 windows of a vector
// slide through registers with one unaligned load per offset, and padding zeros truncate windows
// at the segment end. The sums are direct windowed sums (no running sums, hence no drift along
// long segments):
//   float  (exact or positive terms): count c, sum j, sum j^2, decayed denominators;
//   double (data, where cancellation lives): sum x, sum x^2, sum j x, decayed numerators.
// For the paper's window (n_max = 8, n_min = 1) the data sums of an 8-token window are joined
// from two 4-token windows, and consecutive vectors share one of them. The cancelling
// differences (c^2 var, c sxy) are formed in double as multiples of the count, rounded once to
// float, and the rest (divisions, clips, exp, sigmoid) runs on 8 float lanes.
// Why double for the data sums: with float sums the kernel misses the tests' accuracy bound
// (|kernel - ref64| <= 2 |ref32 - ref64| + 1e-6 (1 + |ref64|)) on gaps of magnitude ~1e3, where
// random-sign sums cancel; the mask-only sums have no cancellation and stay in float.
// While a chunk is computed, the inputs and outputs of the next one are prefetched.
// Vectors whose windows read at most one hole (an invalid token, or the segment end: found from a
// bit per token) skip the mask sums and the divisions by them: per-lane constants for each hole
// position (and none) are made once per call. With a random 5 % mask that is about 80 % of the
// vectors; the rest (two holes or more, segment ends) form the mask sums. (Measured before the
// one-hole constants: taking the mask-sum path always, or sorting a chunk's vectors into a
// full and a partial list first, were both slower than the mispredicted branch.)
// =================================================================================================
#if PCSD_X86
namespace simd {

#define PCSD_AVX2_FN __attribute__((target("avx2,fma")))
// Per-segment steps inlined into the segment function (saves calls and stack realignment).
#define PCSD_AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) inline

constexpr int64_t kChunk = 2048;  // tokens per chunk (multiple of 8)

// Per-call constants, each stored as a whole vector so that the arithmetic takes it as a memory
// operand (no broadcast instruction per use).
struct alignas(32) V8f {
  float v[8];
  void set(float x) { std::fill(v, v + 8, x); }
};
struct alignas(32) V4d {
  double v[4];
  void set(double x) { std::fill(v, v + 4, x); }
};

// Constants of the 8 windows of a vector with at most one hole (see Consts::lanes).
struct alignas(32) LaneConsts {
  double c[8], sj[8];  // count and sum of offsets of the valid tokens (lanes 0-3, 4-7)
  float var_scale[8];  // inv_tau / c^2
  float inv_sxxc[8];   // 1 / (c sxx + c eps_slope), 0 with fewer than two valid tokens
  float inv_den_l[8], inv_den_s[8];  // 1 / decayed denominators (0 for an empty one)
  uint32_t valid0[8];  // all ones where the lane's own token is valid
};

struct Consts {
  int n, ns;
  bool adaptive, trend;
  double eps_scale;
  // Per window offset j: j, j^2, the decay weight a^j of the long window and of the short one
  // (0 from j = n_min on), in double for the data sums and in float for the mask sums.
  V4d jd[kSimdMaxWindow], dec[kSimdMaxWindow], dec_s[kSimdMaxWindow];
  V8f jf[kSimdMaxWindow], jjf[kSimdMaxWindow], dec_f[kSimdMaxWindow], dec_sf[kSimdMaxWindow];
  V8f inv_tau, tau_low_inv_tau, neg_beta, eps_slope;
  double gamma;
  // Per-lane constants of the 8 windows of a vector whose n + 7 tokens hold at most one hole
  // (an invalid token, or one past the segment end) at position d: lanes[d], and lanes[n + 7]
  // for none. The common case (about 80 % of the vectors with a random 5 % mask).
  LaneConsts lanes[kSimdMaxWindow + 8];
};

Consts make_consts(const PcsdParams& p) {
  Consts k{};
  k.n = static_cast<int>(p.n_max);
  k.ns = static_cast<int>(std::min(p.n_min, p.n_max));
  k.adaptive = p.adaptive;
  k.trend = p.trend;
  k.eps_scale = p.eps_scale;
  double a = 1.0, sj = 0.0, sjj = 0.0, den_l = 0.0, den_s = 0.0;
  for (int j = 0; j < k.n; ++j) {
    const float af = static_cast<float>(a), asf = j < k.ns ? af : 0.0f;
    k.jd[j].set(j);
    k.jf[j].set(static_cast<float>(j));
    k.jjf[j].set(static_cast<float>(j * j));
    k.dec[j].set(a);
    k.dec_s[j].set(j < k.ns ? a : 0.0);
    k.dec_f[j].set(af);
    k.dec_sf[j].set(asf);
    sj += j;
    sjj += static_cast<double>(j) * j;
    den_l += af;
    den_s += asf;
    a *= p.alpha;
  }
  const double inv_tau = 1.0 / (p.tau_high - p.tau_low);
  const double eps_slope = static_cast<float>(p.eps_slope);  // the float the partial path uses
  k.inv_tau.set(static_cast<float>(inv_tau));
  k.tau_low_inv_tau.set(static_cast<float>(p.tau_low * inv_tau));
  k.gamma = p.gamma;
  k.neg_beta.set(static_cast<float>(-p.beta_gate));
  k.eps_slope.set(static_cast<float>(eps_slope));
  for (int d = 0; d <= k.n + 7; ++d) {
    LaneConsts& L = k.lanes[d];
    for (int l = 0; l < 8; ++l) {
      const int j = d - l;  // offset of the hole in lane l's window
      const bool hole = j >= 0 && j < k.n;
      const double c = k.n - hole, lsj = sj - (hole ? j : 0), lsjj = sjj - (hole ? j * j : 0);
      const double dl = den_l - (hole ? k.dec_f[j].v[0] : 0.0f);
      const double ds = den_s - (hole ? k.dec_sf[j].v[0] : 0.0f);
      L.c[l] = c;
      L.sj[l] = lsj;
      L.var_scale[l] = c > 0 ? static_cast<float>(inv_tau / (c * c)) : 0.0f;
      // c sxx = c sum j^2 - (sum j)^2 (exact integers) and c eps_slope, as in the partial path
      const double sxxc = c * lsjj - lsj * lsj;
      L.inv_sxxc[l] = c >= 2 ? static_cast<float>(1.0 / (sxxc + eps_slope * c)) : 0.0f;
      L.inv_den_l[l] = dl > 0 ? static_cast<float>(1.0 / dl) : 0.0f;
      L.inv_den_s[l] = ds > 0 ? static_cast<float>(1.0 / ds) : 0.0f;
      L.valid0[l] = d == l ? 0u : ~0u;
    }
  }
  return k;
}

PCSD_AVX2_FN inline __m256 ld(const V8f& c) { return _mm256_load_ps(c.v); }
PCSD_AVX2_FN inline __m256d ld(const V4d& c) { return _mm256_load_pd(c.v); }

// exp(x) for x in [-87.33654, 87], the caller's clamp (ln(FLT_MIN) ~ -87.3365: no denormals).
// Range reduction x = n ln2 + r with ln2 split in two parts and a degree-6 polynomial for exp(r)
// on |r| <= ln2/2 (the classic Cephes expf coefficients). n is rounded by adding 1.5 * 2^23 + 127
// (the float's last place is then 1): its low mantissa bits hold the biased exponent n + 127, so
// shifting them into place builds 2^n. Error measured by tests/test_ops.py (a few ulp at most).
PCSD_AVX2_FN inline __m256 exp_in_range(__m256 x) {
  const __m256 magic = _mm256_set1_ps(12583039.0f);  // 1.5 * 2^23 + 127
  const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), magic);
  const __m256 fx = _mm256_sub_ps(t, magic);
  __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(t), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

constexpr float kExpMin = -87.33654f, kExpMax = 87.0f;

// exp(x) for x <= 0 (x below ln(FLT_MIN) returns FLT_MIN-sized values instead of denormals,
// an absolute error < 1.2e-38).
PCSD_AVX2_FN inline __m256 exp_nonpositive(__m256 x) {
  return exp_in_range(_mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kExpMin)), _mm256_setzero_ps()));
}

// sigmoid(z) = 1 / (1 + exp(-z)), from neg_z = -z: exp(-z) is clamped to [FLT_MIN, e^87], so
// the result stays a normal float (>= 1.6e-38, an absolute error < 1.7e-38 for z < -87) and the
// relative error is that of exp plus two roundings.
PCSD_AVX2_FN inline __m256 sigmoid_of_neg(__m256 neg_z) {
  const __m256 x = _mm256_min_ps(_mm256_max_ps(neg_z, _mm256_set1_ps(kExpMin)), _mm256_set1_ps(kExpMax));
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp_in_range(x)));
}

// 8 mask bytes at p as all-ones float lanes (all ones without a mask).
template <bool kMask>
PCSD_AVX2_FN inline __m256 valid8(const uint8_t* p) {
  if (!kMask) return _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(b, _mm256_setzero_si256()));
}

// Running fp64 sum of |g| over the valid tokens of a segment, 8 masked gaps (0 where invalid)
// at a time: the response-level scale. A non-finite valid gap makes the sum non-finite, so the
// finiteness check costs nothing per token (abs_sum_finish rescans to name the position).
struct AbsSum {
  __m256d lo, hi;
};

PCSD_AVX2_FN inline AbsSum abs_sum_init() { return {_mm256_setzero_pd(), _mm256_setzero_pd()}; }

PCSD_AVX2_FN inline void abs_sum_add(AbsSum* a, __m256d x_lo, __m256d x_hi) {
  const __m256d abs_mask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffLL));
  a->lo = _mm256_add_pd(a->lo, _mm256_and_pd(x_lo, abs_mask));
  a->hi = _mm256_add_pd(a->hi, _mm256_and_pd(x_hi, abs_mask));
}

// The segment [begin, end) went through abs_sum_add up to t, with `valid` valid tokens there.
// Adds the scalar tail and stores the mean |g| over the valid tokens (0 without any), or returns
// kNonFiniteGap with *err_index at the first non-finite valid gap.
template <bool kMask>
PCSD_AVX2_INLINE int abs_sum_finish(const AbsSum& a, const float* __restrict g,
                                     const uint8_t* __restrict mk, int64_t begin, int64_t t,
                                     int64_t end, int64_t valid, double* mean_abs,
                                     int64_t* err_index) {
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(a.lo, a.hi));
  double abs_sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  if (!std::isfinite(abs_sum)) {  // a non-finite valid gap in [begin, t): find the first
    double unused = 0.0;
    int64_t unused_valid = 0;
    masked_abs_sum<kMask>(g, mk, begin, t, &unused, &unused_valid, err_index);
    return kNonFiniteGap;
  }
  if (masked_abs_sum<kMask>(g, mk, t, end, &abs_sum, &valid, err_index) != kOk) return kNonFiniteGap;
  *mean_abs = valid > 0 ? abs_sum / static_cast<double>(valid) : 0.0;
  return kOk;
}

PCSD_AVX2_FN inline __m256d lo_pd(__m256 v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }
PCSD_AVX2_FN inline __m256d hi_pd(__m256 v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }

// Pass over one segment: mean |g| over its valid tokens, and the finiteness check. Returns kOk
// or kNonFiniteGap with *err_index at the first offending position. Used for segments longer
// than a chunk (shorter ones get it from fill_chunk).
template <bool kMask>
PCSD_AVX2_FN int segment_scale(const float* __restrict g, const uint8_t* __restrict mk,
                               int64_t begin, int64_t end, double* mean_abs, int64_t* err_index) {
  AbsSum acc = abs_sum_init();
  int64_t valid = 0, t = begin;
  for (; t + 8 <= end; t += 8) {
    const __m256 vm = valid8<kMask>(mk + t);
    const __m256 x = _mm256_and_ps(_mm256_loadu_ps(g + t), vm);
    abs_sum_add(&acc, lo_pd(x), hi_pd(x));
    valid += __builtin_popcount(static_cast<unsigned>(_mm256_movemask_ps(vm)));
  }
  return abs_sum_finish<kMask>(acc, g, mk, begin, t, end, valid, mean_abs, err_index);
}

// Per-thread scratch, allocated once per call and thread (never per token).
struct Scratch {
  std::vector<double> x;  // masked gaps of the chunk and its window reach, zero padded
  std::vector<float> xf;  // the same in float
  std::vector<float> m;   // 1.0f at valid tokens, zero padded
  std::vector<uint8_t> bits;  // bit l of bits[q] = token 8 q + l is valid (zero padded)
  explicit Scratch(int n)
      : x(static_cast<size_t>(kChunk + n + 16)), xf(x.size()), m(x.size()), bits(x.size() / 8 + 16) {}
  // The holes (invalid tokens, or past the segment end) among the n + 7 tokens that the windows
  // of the 8 tokens at offset k (a multiple of 8) read: bit i for token k + i.
  uint64_t holes(int64_t k, int n) const {
    uint64_t b;
    std::memcpy(&b, bits.data() + k / 8, sizeof(b));
    return ~b & ((uint64_t{1} << (n + 7)) - 1);  // n + 7 <= 39 bits
  }
};

// The scratch's buffers, for the copy (which writes them through these alone).
struct ScratchOut {
  double* __restrict xd;
  float* __restrict xf;
  float* __restrict mf;
  uint8_t* __restrict vb;
};

// Puts tokens q .. q + 7 (gaps v, all-ones lanes vm where valid) into the scratch; kScale: adds
// them to the segment's |gap| sum.
template <bool kScale>
PCSD_AVX2_INLINE void put8(const ScratchOut& o, int64_t q, __m256 v, __m256 vm, AbsSum* acc) {
  const __m256 xv = _mm256_and_ps(v, vm);
  const __m256d x_lo = lo_pd(xv), x_hi = hi_pd(xv);
  if (kScale) abs_sum_add(acc, x_lo, x_hi);
  o.vb[q / 8] = static_cast<uint8_t>(_mm256_movemask_ps(vm));
  _mm256_storeu_ps(o.mf + q, _mm256_and_ps(_mm256_set1_ps(1.0f), vm));
  _mm256_storeu_ps(o.xf + q, xv);
  _mm256_storeu_pd(o.xd + q, x_lo);
  _mm256_storeu_pd(o.xd + q + 4, x_hi);
}

// Copies tokens [t0, t0 + need) into the scratch and zeroes the scratch up to `upto`.
// kScale: [t0, t0 + need) is a whole segment, whose mean |g| is computed on the way into
// *mean_abs (with the finiteness check: returns kNonFiniteGap, else kOk).
template <bool kMask, bool kScale>
PCSD_AVX2_INLINE int fill_chunk(const float* __restrict g, const uint8_t* __restrict mk, int64_t t0,
                                int64_t need, int64_t upto, Scratch& sc, double* mean_abs,
                                int64_t* err_index) {
  const ScratchOut o{sc.x.data(), sc.xf.data(), sc.m.data(), sc.bits.data()};
  AbsSum acc = abs_sum_init();
  int64_t q = 0;
  for (; q + 8 <= need; q += 8) {
    put8<kScale>(o, q, _mm256_loadu_ps(g + t0 + q), valid8<kMask>(mk + t0 + q), &acc);
  }
  if (q < need) {  // the last 1..7 tokens as one vector; nothing at or past `need` is read
    const int rem = static_cast<int>(need - q);
    const __m256i in =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(rem), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256 vm = _mm256_castsi256_ps(in);
    if (kMask) {
      uint64_t bytes = 0;
      if (need >= 8) {  // the 8 bytes ending at `need`, shifted down to the tail's
        std::memcpy(&bytes, mk + t0 + need - 8, sizeof(bytes));
        bytes >>= 8 * (8 - rem);
      } else {
        for (int i = 0; i < rem; ++i) bytes |= static_cast<uint64_t>(mk[t0 + q + i]) << (8 * i);
      }
      uint8_t b8[8];
      std::memcpy(b8, &bytes, sizeof(b8));
      vm = _mm256_and_ps(vm, valid8<true>(b8));
    }
    put8<kScale>(o, q, _mm256_maskload_ps(g + t0 + q, in), vm, &acc);
    q += 8;
  }
  if (kScale) {
    int64_t valid = 0, b = 0;
    for (; b + 8 <= q / 8; b += 8) {
      uint64_t word;
      std::memcpy(&word, o.vb + b, sizeof(word));
      valid += __builtin_popcountll(word);
    }
    for (; b < q / 8; ++b) valid += __builtin_popcount(o.vb[b]);
    const int st = abs_sum_finish<kMask>(acc, g, mk, t0, t0 + need, t0 + need, valid, mean_abs, err_index);
    if (st != kOk) return st;
  }
  // Zeros from q (a multiple of 8 past `need`) to `upto`, and the bit bytes some beyond.
  std::memset(o.vb + q / 8, 0, static_cast<size_t>((upto + 7) / 8 + 8 - q / 8));
  for (; q < upto; q += 8) put8<false>(o, q, _mm256_setzero_ps(), _mm256_setzero_ps(), &acc);
  return kOk;
}

PCSD_AVX2_FN inline __m256 to_ps(__m256d lo, __m256d hi) {
  return _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo));
}

// A prefetch hint for the cache line of p; p may lie past the end of its buffer (a prefetch
// never faults; the caller forms it from an index that may run past the last token). Forced
// inline: GCC deems an out-of-line call to it free of effects and drops it.
template <class T>
PCSD_AVX2_INLINE void prefetch(const T* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
}

// The fp64 data sums of the n-token windows of 8 consecutive tokens, lanes 0-3 (a) and 4-7 (b):
// sum x, sum x^2, sum j x, and the decayed sums of the long and the short window.
struct Sums {
  __m256d s1a, s1b, s2a, s2b, sjxa, sjxb, nla, nlb, nsa, nsb;
};

// Direct windowed sums over the offsets j = 0..n-1 (one unaligned load per offset and half).
// kN > 0: the window length is the compile-time constant kN (== K.n), so the loop unrolls
// completely. kNs1: n_min == 1, the short window's sums are not needed.
template <int kN, bool kNs1>
PCSD_AVX2_FN inline Sums direct_sums(const Consts& K, const double* __restrict xd) {
  const int n = kN > 0 ? kN : K.n;
  const __m256d x0a = _mm256_loadu_pd(xd), x0b = _mm256_loadu_pd(xd + 4);
  Sums s{x0a, x0b, _mm256_mul_pd(x0a, x0a), _mm256_mul_pd(x0b, x0b), _mm256_setzero_pd(),
         _mm256_setzero_pd(), x0a, x0b, x0a, x0b};
#pragma GCC unroll 32
  for (int j = 1; j < n; ++j) {
    const __m256d xa = _mm256_loadu_pd(xd + j), xb = _mm256_loadu_pd(xd + j + 4);
    const __m256d jd = ld(K.jd[j]), dec = ld(K.dec[j]);
    s.s1a = _mm256_add_pd(s.s1a, xa);
    s.s1b = _mm256_add_pd(s.s1b, xb);
    s.s2a = _mm256_fmadd_pd(xa, xa, s.s2a);
    s.s2b = _mm256_fmadd_pd(xb, xb, s.s2b);
    s.sjxa = _mm256_fmadd_pd(jd, xa, s.sjxa);
    s.sjxb = _mm256_fmadd_pd(jd, xb, s.sjxb);
    s.nla = _mm256_fmadd_pd(dec, xa, s.nla);
    s.nlb = _mm256_fmadd_pd(dec, xb, s.nlb);
    if (!kNs1) {
      const __m256d dec_s = ld(K.dec_s[j]);
      s.nsa = _mm256_fmadd_pd(dec_s, xa, s.nsa);
      s.nsb = _mm256_fmadd_pd(dec_s, xb, s.nsb);
    }
  }
  return s;
}

// Sums over the 4-token windows of 4 consecutive tokens: an 8-token window is two of them,
// [i, i + 4) and [i + 4, i + 8), so consecutive vectors share half of this work (quad_sums).
struct Quad {
  __m256d q, q2, r, d;  // sum x, sum x^2, sum j x, sum a^j x over j = 0..3
};

PCSD_AVX2_FN inline Quad quad(const Consts& K, const double* __restrict xd) {
  const __m256d x0 = _mm256_loadu_pd(xd), x1 = _mm256_loadu_pd(xd + 1),
                x2 = _mm256_loadu_pd(xd + 2), x3 = _mm256_loadu_pd(xd + 3);
  Quad h;
  h.q = _mm256_add_pd(_mm256_add_pd(x0, x1), _mm256_add_pd(x2, x3));
  h.q2 = _mm256_fmadd_pd(x3, x3,
                         _mm256_fmadd_pd(x2, x2, _mm256_fmadd_pd(x1, x1, _mm256_mul_pd(x0, x0))));
  h.r = _mm256_fmadd_pd(ld(K.jd[3]), x3, _mm256_fmadd_pd(ld(K.jd[2]), x2, x1));
  h.d = _mm256_fmadd_pd(ld(K.dec[3]), x3,
                        _mm256_fmadd_pd(ld(K.dec[2]), x2, _mm256_fmadd_pd(ld(K.dec[1]), x1, x0)));
  return h;
}

// The 8-token window sums of 4 tokens from the quads at their start (lo) and 4 tokens on (hi):
// offsets 4..7 are the hi quad's 0..3, so sum j x gains 4 sum x of hi and its decay a^4.
PCSD_AVX2_FN inline void join(const Consts& K, const Quad& lo, const Quad& hi, __m256d* s1,
                              __m256d* s2, __m256d* sjx, __m256d* nl) {
  *s1 = _mm256_add_pd(lo.q, hi.q);
  *s2 = _mm256_add_pd(lo.q2, hi.q2);
  *sjx = _mm256_fmadd_pd(ld(K.jd[4]), hi.q, _mm256_add_pd(lo.r, hi.r));
  *nl = _mm256_fmadd_pd(ld(K.dec[4]), hi.d, lo.d);
}

// The weight and the statistics of 8 consecutive tokens.
struct Out8 {
  __m256 w, ad, r, slope, eta;
};

// Weights of the 8 tokens whose windows start at scratch offset k (xf, mf point there; s holds
// their data sums). kNs1: n_min == 1, so the short window's decayed mean is the (masked, hence 0
// where invalid) gap at offset 0. kTable: the windows' n + 7 tokens hold at most one hole, and L
// (from Consts::lanes) has the per-lane constants that the mask-only sums would give, so no
// division by them is left; otherwise the mask-only sums are formed here.
// The cancelling differences are formed in fp64 as multiples of the count c, which keeps every
// division in float: c^2 var = c s2 - s1^2, c sxy = c sjx - sj s1, c sxx = c sjj - sj^2 (exact
// small integers in float), so var = (c^2 var) / c^2 and slope = (c sxy) / (c sxx + c eps_slope).
template <int kN, bool kNs1, bool kTable>
PCSD_AVX2_FN inline void window8(const Consts& K, const LaneConsts& L, const Sums& s,
                                 const float* __restrict xf, const float* __restrict mf,
                                 __m256 gamma_over_scale, Out8* o) {
  const int n = kN > 0 ? kN : K.n;
  const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
  __m256 r = zero, slope, dbl, dbs, valid0;
  if (kTable) {  // n >= 2 here, so every window has a valid token
    const __m256d ca = _mm256_load_pd(L.c), cb = _mm256_load_pd(L.c + 4);
    if (K.adaptive) {
      const __m256d va = _mm256_fmsub_pd(s.s2a, ca, _mm256_mul_pd(s.s1a, s.s1a));
      const __m256d vb = _mm256_fmsub_pd(s.s2b, cb, _mm256_mul_pd(s.s1b, s.s1b));
      r = _mm256_fmsub_ps(to_ps(va, vb), _mm256_load_ps(L.var_scale), ld(K.tau_low_inv_tau));
      r = _mm256_min_ps(_mm256_max_ps(r, zero), one);
    }
    const __m256d xya = _mm256_fmsub_pd(s.sjxa, ca, _mm256_mul_pd(_mm256_load_pd(L.sj), s.s1a));
    const __m256d xyb = _mm256_fmsub_pd(s.sjxb, cb, _mm256_mul_pd(_mm256_load_pd(L.sj + 4), s.s1b));
    slope = _mm256_mul_ps(to_ps(xya, xyb), _mm256_load_ps(L.inv_sxxc));
    dbl = _mm256_mul_ps(to_ps(s.nla, s.nlb), _mm256_load_ps(L.inv_den_l));
    dbs = kNs1 ? _mm256_loadu_ps(xf) : _mm256_mul_ps(to_ps(s.nsa, s.nsb), _mm256_load_ps(L.inv_den_s));
    valid0 = _mm256_castsi256_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(L.valid0)));
  } else {
    // mask-only sums: count, sum j, sum j^2, decayed denominators (exact or positive: float)
    const __m256 m0 = _mm256_loadu_ps(mf);
    valid0 = _mm256_cmp_ps(m0, zero, _CMP_GT_OQ);
    __m256 c = m0, sj = zero, sjj = zero, dl = m0, ds = m0;
#pragma GCC unroll 32
    for (int j = 1; j < n; ++j) {
      const __m256 m = _mm256_loadu_ps(mf + j);
      c = _mm256_add_ps(c, m);
      sj = _mm256_fmadd_ps(ld(K.jf[j]), m, sj);
      sjj = _mm256_fmadd_ps(ld(K.jjf[j]), m, sjj);
      dl = _mm256_fmadd_ps(ld(K.dec_f[j]), m, dl);
      if (!kNs1) ds = _mm256_fmadd_ps(ld(K.dec_sf[j]), m, ds);
    }
    const __m256d ca = _mm256_cvtps_pd(_mm256_castps256_ps128(c));
    const __m256d cb = _mm256_cvtps_pd(_mm256_extractf128_ps(c, 1));
    if (K.adaptive) {  // r = clip(var / (tau_high - tau_low) - tau_low / (...)), 0 if c == 0
      const __m256d va = _mm256_fmsub_pd(s.s2a, ca, _mm256_mul_pd(s.s1a, s.s1a));
      const __m256d vb = _mm256_fmsub_pd(s.s2b, cb, _mm256_mul_pd(s.s1b, s.s1b));
      const __m256 var = _mm256_div_ps(to_ps(va, vb), _mm256_mul_ps(c, c));  // NaN if c == 0
      r = _mm256_fmsub_ps(var, ld(K.inv_tau), ld(K.tau_low_inv_tau));
      r = _mm256_and_ps(_mm256_min_ps(_mm256_max_ps(r, zero), one),
                        _mm256_cmp_ps(c, zero, _CMP_GT_OQ));
    }
    const __m256d sja = _mm256_cvtps_pd(_mm256_castps256_ps128(sj));
    const __m256d sjb = _mm256_cvtps_pd(_mm256_extractf128_ps(sj, 1));
    const __m256d xya = _mm256_fmsub_pd(s.sjxa, ca, _mm256_mul_pd(sja, s.s1a));
    const __m256d xyb = _mm256_fmsub_pd(s.sjxb, cb, _mm256_mul_pd(sjb, s.s1b));
    const __m256 sxxc = _mm256_fmsub_ps(sjj, c, _mm256_mul_ps(sj, sj));
    slope = _mm256_div_ps(to_ps(xya, xyb), _mm256_fmadd_ps(ld(K.eps_slope), c, sxxc));
    slope = _mm256_and_ps(slope, _mm256_cmp_ps(c, _mm256_set1_ps(1.5f), _CMP_GT_OQ));
    dbl = _mm256_and_ps(_mm256_div_ps(to_ps(s.nla, s.nlb), dl), _mm256_cmp_ps(dl, zero, _CMP_GT_OQ));
    dbs = kNs1 ? _mm256_loadu_ps(xf)  // masked gaps are 0 in the scratch
               : _mm256_and_ps(_mm256_div_ps(to_ps(s.nsa, s.nsb), ds), _mm256_cmp_ps(ds, zero, _CMP_GT_OQ));
  }
  // (1 - r) dbs + r dbl, in this form: r (dbl - dbs) + dbs loses dbl when |dbs| >> |dbl|
  const __m256 ad = _mm256_fmadd_ps(r, dbl, _mm256_mul_ps(_mm256_sub_ps(one, r), dbs));
  __m256 eta = one;
  if (K.trend) {  // clip(1 - gamma relu(-slope / scale), 0, 1) = max(min(1 + slope gamma / scale, 1), 0)
    eta = _mm256_max_ps(_mm256_min_ps(_mm256_fmadd_ps(slope, gamma_over_scale, one), one), zero);
  }
  const __m256 wv = _mm256_mul_ps(sigmoid_of_neg(_mm256_mul_ps(ld(K.neg_beta), ad)), eta);
  o->w = _mm256_and_ps(wv, valid0);
  o->ad = ad;
  o->r = r;
  o->slope = slope;
  o->eta = eta;
}

// Stores the first `count` (1..8) lanes of the weights (and statistics) of tokens t .. t + 7.
template <bool kStats>
PCSD_AVX2_FN inline void store8(const Out8& o, int64_t t, int64_t count, float* __restrict w,
                                float* __restrict ad, float* __restrict rr, float* __restrict sl,
                                float* __restrict et) {
  if (count == 8) {
    _mm256_storeu_ps(w + t, o.w);
    if (kStats) {
      _mm256_storeu_ps(ad + t, o.ad);
      _mm256_storeu_ps(rr + t, o.r);
      _mm256_storeu_ps(sl + t, o.slope);
      _mm256_storeu_ps(et + t, o.eta);
    }
    return;
  }
  const size_t rem = static_cast<size_t>(count) * sizeof(float);
  alignas(32) float tmp[8];
  _mm256_store_ps(tmp, o.w);
  std::memcpy(w + t, tmp, rem);
  if (kStats) {
    _mm256_store_ps(tmp, o.ad);
    std::memcpy(ad + t, tmp, rem);
    _mm256_store_ps(tmp, o.r);
    std::memcpy(rr + t, tmp, rem);
    _mm256_store_ps(tmp, o.slope);
    std::memcpy(sl + t, tmp, rem);
    _mm256_store_ps(tmp, o.eta);
    std::memcpy(et + t, tmp, rem);
  }
}

// Weights of one chunk of clen tokens (starting at token c0) from the filled scratch.
// The paper's window (n_max = 8, n_min = 1) takes its data sums from quads shared between
// consecutive vectors; every other window sums directly.
template <bool kStats, int kN, bool kNs1>
PCSD_AVX2_INLINE void chunk_weights(const Consts& K, const Scratch& sc, int64_t c0, int64_t clen,
                                    __m256 gamma_over_scale, const float* g, const uint8_t* mk,
                                    float* __restrict w, float* __restrict ad, float* __restrict rr,
                                    float* __restrict sl, float* __restrict et) {
  constexpr bool kQuads = kN == 8 && kNs1;
  const int n = kN > 0 ? kN : K.n;
  const double* xd = sc.x.data();
  Quad h0{};
  if (kQuads) h0 = quad(K, xd);
  for (int64_t k = 0; k < clen; k += 8) {
    // Prefetch the inputs and outputs of the tokens after this chunk (the next segment's,
    // usually) while computing, one line (16 floats) per vector: twice the chunk's length ahead.
    // (Measured: 10-20 % less time when the data comes from memory, as in the benchmark.)
    const int64_t ahead = c0 + clen + 2 * k;
    prefetch(g + ahead);
    if (mk != nullptr) prefetch(mk + ahead);
    prefetch(w + ahead);
    if (kStats) {
      prefetch(ad + ahead);
      prefetch(rr + ahead);
      prefetch(sl + ahead);
      prefetch(et + ahead);
    }
    Sums s;
    if (kQuads) {
      const Quad h1 = quad(K, xd + k + 4), h2 = quad(K, xd + k + 8);
      join(K, h0, h1, &s.s1a, &s.s2a, &s.sjxa, &s.nla);
      join(K, h1, h2, &s.s1b, &s.s2b, &s.sjxb, &s.nlb);
      h0 = h2;
    } else {
      s = direct_sums<kN, kNs1>(K, xd + k);
    }
    Out8 o;
    const uint64_t h = sc.holes(k, n);
    if (h == 0 || (n >= 2 && (h & (h - 1)) == 0)) {  // at most one hole (none with n == 1)
      const LaneConsts& L = K.lanes[__builtin_ctzll(h | uint64_t{1} << (n + 7))];
      window8<kN, kNs1, true>(K, L, s, sc.xf.data() + k, sc.m.data() + k, gamma_over_scale, &o);
    } else {
      window8<kN, kNs1, false>(K, K.lanes[0], s, sc.xf.data() + k, sc.m.data() + k, gamma_over_scale, &o);
    }
    store8<kStats>(o, c0 + k, std::min<int64_t>(8, clen - k), w, ad, rr, sl, et);
  }
}

template <bool kMask, bool kStats, int kN, bool kNs1>
PCSD_AVX2_FN int segment_weights_avx2(const float* __restrict g, const uint8_t* __restrict mk,
                                      int64_t begin, int64_t end, const Consts& K, Scratch& sc,
                                      float* __restrict w, float* __restrict ad,
                                      float* __restrict rr, float* __restrict sl,
                                      float* __restrict et, int64_t* err_index) {
  if (end == begin) return kOk;
  const int n = kN > 0 ? kN : K.n;
  // A segment of one chunk gets its scale from the fill; a longer one needs it before its first
  // chunk, from a pass of its own.
  const bool one_chunk = end - begin <= kChunk;
  double mean_abs = 0.0;
  if (!one_chunk && segment_scale<kMask>(g, mk, begin, end, &mean_abs, err_index) != kOk) {
    return kNonFiniteGap;
  }
  for (int64_t c0 = begin; c0 < end; c0 += kChunk) {
    const int64_t clen = std::min<int64_t>(kChunk, end - c0);
    const int64_t need = std::min<int64_t>(clen + n - 1, end - c0);
    const int64_t upto = ((clen + 7) / 8) * 8 + n;
    const int st = one_chunk ? fill_chunk<kMask, true>(g, mk, c0, need, upto, sc, &mean_abs, err_index)
                             : fill_chunk<kMask, false>(g, mk, c0, need, upto, sc, nullptr, err_index);
    if (st != kOk) return st;
    // gamma / scale, capped: gamma is only asked to be finite, and gamma = 0 must leave eta = 1
    const double gs = std::min(K.gamma / (mean_abs + K.eps_scale),
                               static_cast<double>(std::numeric_limits<float>::max()));
    chunk_weights<kStats, kN, kNs1>(K, sc, c0, clen, _mm256_set1_ps(static_cast<float>(gs)),
                                    g, mk, w, ad, rr, sl, et);
  }
  return kOk;
}

using SegFn = int (*)(const float*, const uint8_t*, int64_t, int64_t, const Consts&, Scratch&,
                      float*, float*, float*, float*, float*, int64_t*);

template <int kN, bool kNs1>
SegFn pick4(bool mask, bool stats) {
  if (mask) {
    return stats ? segment_weights_avx2<true, true, kN, kNs1> : segment_weights_avx2<true, false, kN, kNs1>;
  }
  return stats ? segment_weights_avx2<false, true, kN, kNs1> : segment_weights_avx2<false, false, kN, kNs1>;
}

template <int kN>
SegFn pick3(bool ns1, bool mask, bool stats) {
  return ns1 ? pick4<kN, true>(mask, stats) : pick4<kN, false>(mask, stats);
}

// Exact-length instantiations for the common windows (the paper's n_max = 8, the fixed-n1/-n4
// ablations, 16), a runtime-length loop for the other n_max <= kSimdMaxWindow; n_min == 1 (the
// paper's default) separately, as its short window is the token itself.
SegFn pick(int n, int ns, bool mask, bool stats) {
  const bool ns1 = ns == 1;
  switch (n) {
    case 1: return pick4<1, true>(mask, stats);
    case 4: return pick3<4>(ns1, mask, stats);
    case 8: return pick3<8>(ns1, mask, stats);
    case 16: return pick3<16>(ns1, mask, stats);
    default: return pick3<0>(ns1, mask, stats);
  }
}

PCSD_AVX2_FN void vexp(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp_nonpositive(_mm256_loadu_ps(x + i)));
  if (i < n) {
    alignas(32) float tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(tmp, x + i, static_cast<size_t>(n - i) * sizeof(float));
    _mm256_store_ps(tmp, exp_nonpositive(_mm256_load_ps(tmp)));
    std::memcpy(y + i, tmp, static_cast<size_t>(n - i) * sizeof(float));
  }
}

#undef PCSD_AVX2_FN
#undef PCSD_AVX2_INLINE
}  // namespace simd
#endif  // PCSD_X86

}  // namespace

bool cpu_has_avx2() {
#if PCSD_X86
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return has;
#else
  return false;
#endif
}

bool cpu_simd_applies(const PcsdParams& p) {
  if (p.n_max < 1 || p.n_max > kSimdMaxWindow || p.n_min < 1) return false;
  // The float decay weights alpha^j (j < n_max) must stay comfortably normal.
  return std::pow(p.alpha, static_cast<double>(p.n_max - 1)) >= 1e-30;
}

const char* cpu_kernel_name(const PcsdParams& p, CpuImpl impl) {
  if (impl == kCpuScalar) return "scalar";
  return (cpu_has_avx2() && cpu_simd_applies(p)) ? "avx2" : "scalar";
}

bool cpu_vexp_nonpositive(const float* x, float* y, int64_t n) {
#if PCSD_X86
  if (!cpu_has_avx2()) return false;
  simd::vexp(x, y, n);
  return true;
#else
  (void)x, (void)y, (void)n;
  return false;
#endif
}

int pcsd_weights_cpu(const float* gap, const int64_t* cu, int64_t num_segments, int64_t total,
                     const uint8_t* mask, const PcsdParams& p, float* w, float* adaptive,
                     float* r, float* slope, float* eta, int num_threads, int64_t* err_index,
                     CpuImpl impl) {
  *err_index = -1;
  if (cu[0] != 0) {
    *err_index = 0;
    return kBadCuStart;
  }
  for (int64_t s = 0; s < num_segments; ++s) {
    if (cu[s + 1] < cu[s]) {
      *err_index = s;
      return kCuDecreasing;
    }
  }
  if (cu[num_segments] != total) {
    *err_index = num_segments;
    return kBadCuEnd;
  }
  // Split the segments into contiguous ranges of about equal token counts.
  int threads = num_threads > 0 ? num_threads
                                : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int64_t min_tokens_per_thread = 16384;
  threads = static_cast<int>(std::min<int64_t>(
      threads, std::max<int64_t>(1, std::min<int64_t>(num_segments, total / min_tokens_per_thread))));
  std::vector<int64_t> seg_start(static_cast<size_t>(threads) + 1, num_segments);
  seg_start[0] = 0;
  for (int k = 1; k < threads; ++k) {
    const int64_t target = total * k / threads;
    seg_start[k] = std::upper_bound(cu, cu + num_segments + 1, target) - cu - 1;
    seg_start[k] = std::max(seg_start[k], seg_start[k - 1]);
  }

  // Statistics are all-or-nothing (pcsd/ops/kernels.py passes four buffers or none).
  const bool stats = adaptive != nullptr && r != nullptr && slope != nullptr && eta != nullptr;
  const bool use_simd = std::strcmp(cpu_kernel_name(p, impl), "avx2") == 0;
  std::vector<int> status(static_cast<size_t>(threads), kOk);
  std::vector<int64_t> where(static_cast<size_t>(threads), -1);
  std::function<void(int)> work;
#if PCSD_X86
  simd::Consts consts{};
  simd::SegFn simd_fn = nullptr;
  if (use_simd) {
    consts = simd::make_consts(p);
    simd_fn = simd::pick(consts.n, consts.ns, mask != nullptr, stats);
  }
  if (use_simd) {
    work = [&](int k) {
      simd::Scratch scratch(consts.n);  // once per thread and call
      for (int64_t s = seg_start[k]; s < seg_start[k + 1]; ++s) {
        const int st = simd_fn(gap, mask, cu[s], cu[s + 1], consts, scratch, w, adaptive, r,
                               slope, eta, &where[k]);
        if (st != kOk) {
          status[k] = st;
          return;
        }
      }
    };
  }
#endif
  if (!use_simd) {
    const auto seg_fn = mask != nullptr
                            ? (stats ? segment_weights<true, true> : segment_weights<true, false>)
                            : (stats ? segment_weights<false, true> : segment_weights<false, false>);
    work = [&, seg_fn](int k) {
      for (int64_t s = seg_start[k]; s < seg_start[k + 1]; ++s) {
        const int st = seg_fn(gap, mask, cu[s], cu[s + 1], p, w, adaptive, r, slope, eta, &where[k]);
        if (st != kOk) {
          status[k] = st;
          return;
        }
      }
    };
  }
  if (threads == 1) {
    work(0);
  } else {
    std::vector<std::thread> pool;
    pool.reserve(static_cast<size_t>(threads) - 1);
    for (int k = 1; k < threads; ++k) pool.emplace_back(work, k);
    work(0);
    for (auto& t : pool) t.join();
  }
  for (int k = 0; k < threads; ++k) {
    if (status[k] != kOk) {
      *err_index = where[k];
      return status[k];
    }
  }
  return kOk;
}

}  // namespace pcsd
