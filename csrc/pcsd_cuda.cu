// CUDA kernels for the segmented PCSD token weights. The contract (the exact math) is the header
// comment of pcsd_kernels.h; the reference these kernels must match is pcsd_cpu.cpp.
//
// ------------------------------------------------------------------------------------------------
// Design (four launches on the caller's stream, one small stream-ordered scratch buffer)
// ------------------------------------------------------------------------------------------------
// Tokens are cut into fixed tiles of kTile = 2048 tokens (256 threads x 8 consecutive tokens).
//
// Validation (issue 40): the kernels check their input while they read it, so the caller needs no
// torch-op pass over the data: kernel 0 checks cu_seqlens (cu[0] == 0, non-decreasing, cu[S] == T)
// and kernel 1 the gaps' finiteness at valid positions, into four slots of the scratch buffer
// (first offending index by atomicMin); kernels 1-3 return at once when cu_seqlens is malformed
// (their segment walks assume it is not). A checked call reads the slots back in one transfer.
//
// 0. tile_segments_kernel: tile_seg[b] = segment of the tile's first token (one binary search
//    per tile, all in parallel); tile b's tokens lie in segments [tile_seg[b], tile_seg[b + 1]].
//    Kernels 1 and 3 stage cu_seqlens (and kernel 3 the inverse scales) of that range in shared
//    memory when it has at most kSegCache = 256 segments, so a thread's segment lookup is a short
//    binary search in shared memory instead of a chain of dependent global loads.
// 1. scale_partials_kernel (one block per tile, forward tile order). Each thread loads its 8
//    tokens, walks its runs of equal segment, and the block runs one segmented exclusive scan
//    (cub::BlockScan, operator "reset at a segment start") over the per-thread (sum|g|, count).
//    Every segment that starts and ends inside the tile gets its final scale here
//    (mean |g| over valid tokens + eps_scale). A segment crossing a tile border leaves partials:
//    head[b] = its part inside tile b when it started before tile b, tail[b] = its part inside
//    tile b when it continues past tile b. fp64 sums, int64 counts, fixed reduction order, so the
//    result is deterministic (bitwise identical run to run).
// 2. scale_finalize_kernel (one warp per segment): for a segment spanning tiles b0 < b1,
//    sum = tail[b0] + head[b0+1] + ... + head[b1] (each interior tile is wholly inside the
//    segment, so its head partial is the whole tile). Deterministic warp tree reduction.
// 3. weights_kernel<CAP> (n_max <= 32; CAP = 8, 16 or 32 >= n_max; n_max == 8 has its own exact
//    instantiation without padding) processes the tiles in REVERSE
//    order, so that it first touches the tiles kernel 1 read last and that are still in L2.
//    Each thread owns 8 consecutive tokens; it loads them (2 x float4 + one 8-byte mask load) and
//    gets the (CAP - 1)-token halo from the next lanes with warp shuffles (lanes at the warp end
//    read it from global memory). The window slides over registers; masks live in a 64-bit word
//    of valid bits. Per token, the window's valid bits are (bits >> k) & nmask & endmask, where
//    endmask clears positions at or past the token's segment end (skipped when the thread's whole
//    register window lies inside one segment, the common case). Two cases:
//      * full window (all n_max positions valid and inside the segment; the common case): counts,
//        decay denominators, jbar and sxx are constants precomputed on the host, and only the
//        data-dependent sums remain: 3 FMAs (pass 1) + 4 ops (pass 2) per window position.
//      * partial window (mask holes, segment end): the general masked two-pass formulas of the
//        CPU kernel, with the per-position bit as a 0/1 float.
//    Outputs are written with 2 x float4 streaming stores (__stcs).
//    weights_general_kernel (n_max > 32 or n_max < 1): one thread per token, binary search for the
//    segment, plain loops over global memory exactly like the CPU kernel.
//
// Arithmetic: fp32 accumulation (the CPU kernel uses fp64); centred two-pass variance and centred
// OLS (sum (j - jbar) g) like the CPU kernel, so a large common offset of the gaps does not cancel
// catastrophically; decay powers alpha^j are computed on the host in fp64 exactly like the CPU
// kernel and rounded once; sigmoid evaluates the CPU kernel's two branches through the shared
// e = exp(-|x|) (one exp, one division, no divergence); clip/relu are
// written so that NaN propagates exactly like the CPU kernel's std:: expressions.
//
// ------------------------------------------------------------------------------------------------
// Correctness argument (bounds, races, overflow)
// ------------------------------------------------------------------------------------------------
// * Every token index is int64 (tile start lo = b * kTile with b int64, i0 = lo + 8 * tid).
//   Grid sizes are checked to fit in int on the host. Shifts of 64-bit masks are guarded
//   (rem >= 64 -> all ones), CAP <= 32 keeps the register window (8 + CAP - 1 <= 39) < 64 bits.
// * Reads: every global load is either guarded by p < T (scalar path) or issued only when
//   p + 8 <= T (vector path), so no load touches gap[T..] or mask[T..], even at the array end.
//   Positions past a segment end are loaded (they belong to the next segment or are 0 beyond T)
//   but always have a cleared bit in the window mask (endmask), so they never enter any sum.
//   Masked positions are replaced by 0.0f at load time (select, not multiply), so a NaN/Inf gap
//   at a masked position cannot leak into a sum (0 * NaN would).
// * Segment lookup: seg_search returns the largest s in [l, h] with cu[s] <= i. For i < T = cu[S]
//   searched over [0, S-1] this is the unique non-empty segment containing i (empty segments
//   have cu[s] == cu[s+1] and are skipped because a later s with the same cu[s] is larger).
//   Within tile b the search range is [tile_seg[b], tile_seg[b + 1]] (tile_seg[tiles] = S - 1),
//   which contains seg(i) for every token i of the tile because seg() is non-decreasing; the
//   staged copy holds cu[tile_seg[b] .. tile_seg[b + 1] + 1] (index <= S, in bounds), and every
//   index used by the advance loop is <= seg(last token) + 1 <= tile_seg[b + 1] + 1.
//   Advancing to the next segment uses "while (i >= e) ++s" which skips empty segments and
//   stays <= S - 1 because i < T = cu[S].
// * Warp shuffles and barriers: every thread of the block executes the halo shuffles and the one
//   __syncthreads (no early exit before them; threads past T just carry zeros), the block size
//   is a multiple of 32, so the full shuffle mask is correct. Shared-memory staging is written
//   before that barrier and only read after it.
// * Races: each output element w[i] (and each stat) is written by exactly the one thread that
//   owns token i. scale[s] is written by exactly one thread: kernel 1 when the segment lies in one
//   tile (the thread holding its last token), kernel 2 otherwise (lane 0 of the warp for s).
//   head[b] is written by exactly one thread of block b (the thread holding the last token of
//   the tile's first segment, or thread 255 when that segment covers the whole tile); tail[b]
//   only by the thread holding the tile's last token. Kernels 1 -> 2 -> 3 are ordered by the
//   stream, so no kernel reads what a concurrent kernel writes. Empty segments get the placeholder
//   scale eps_scale from kernel 2 (so no uninitialised scratch is ever read) but no token uses it.
// * Segmented scan: the operator (f1,v1) + (f2,v2) = (f1|f2, f2 ? v2 : v1 + v2) is associative; a
//   thread's flag says "a segment starts at one of my tokens" and its value is the sum of its last
//   run. The exclusive prefix at thread t is therefore the sum of the tokens of seg(i0) from
//   max(segment start, tile start) up to i0 - 1 whenever seg(i0) started before i0 (idle threads
//   past T contribute the identity (0, 0, 0); thread 0's undefined cub result is replaced by it).
// ------------------------------------------------------------------------------------------------
#include <cuda_runtime.h>

#include <cub/block/block_scan.cuh>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "pcsd_kernels.h"

namespace pcsd {

// Extra entry points (not yet declared in pcsd_kernels.h): the workspace the CUDA path needs, and
// a variant that uses caller-provided workspace (e.g. from torch's caching allocator) instead of
// cudaMallocAsync. Declared here so that -Wmissing-declarations stays quiet.
size_t pcsd_cuda_workspace_bytes(int64_t num_segments, int64_t total);
int pcsd_weights_cuda_ws(const float* gap, const int64_t* cu_seqlens, int64_t num_segments,
                         int64_t total, const uint8_t* mask, const PcsdParams& p, float* w,
                         float* adaptive, float* r, float* slope, float* eta, void* workspace,
                         size_t workspace_bytes, void* stream, int* status = nullptr,
                         int64_t* err_index = nullptr);

namespace {

constexpr int kThreads = 256;               // threads per block (multiple of 32)
constexpr int kTok = 8;                     // consecutive tokens per thread
constexpr int kTile = kThreads * kTok;      // tokens per block tile
constexpr int kMaxCap = 32;                 // largest n_max served by the register kernel
constexpr int kSegCache = 256;              // segments per tile staged in shared memory
constexpr unsigned kFull = 0xffffffffu;
// Validation slots in the workspace (set to kNone before kernel 0): [0] = 0 when cu[0] != 0,
// [1] = the first s with cu[s + 1] < cu[s], [2] = S when cu[S] != T (kernel 0), [3] = the first
// valid position with a non-finite gap (kernel 1). Kernels 1-3 do nothing when [0..2] name a fault:
// with malformed cu_seqlens their segment walks could leave the arrays.
constexpr int kStatusSlots = 4;
constexpr unsigned long long kNone = ~0ull;

struct Bufs {
  const float* gap;
  const int64_t* cu;
  const uint8_t* mask;  // nullptr: all valid
  int64_t S;
  int64_t T;
  float* w;
  float* ad;
  float* rr;
  float* sl;
  float* et;
  const float* scale;  // per-segment scale (kernel 3); written by kernels 1-2
  const int64_t* tile_seg;  // [tiles + 1]: seg(tile start), last entry S - 1 (kernel 0)
  unsigned long long* status;  // [kStatusSlots] validation slots (see kNone)
  bool vec_in;         // gap 16-byte and mask 8-byte aligned: vector loads allowed
  bool vec_w, vec_ad, vec_rr, vec_sl, vec_et;  // 16-byte aligned outputs
};

// Host-precomputed constants. Arrays are indexed with compile-time indices after unrolling, so
// they stay in the kernel-parameter constant bank and are used as direct FMA operands.
struct DevParams {
  float A[kMaxCap];   // alpha^j for j < n_max, 0 beyond
  float Sw[kMaxCap];  // alpha^j for j < min(n_min, n_max), 0 beyond
  float U[kMaxCap];   // 1 for j < n_max, 0 beyond
  float JC[kMaxCap];  // j - (n_max - 1) / 2 for j < n_max, 0 beyond (centred offsets, full window)
  float inv_den_l;    // 1 / sum_{j<n_max} alpha^j (0 if that sum <= 0)
  float inv_den_s;    // 1 / sum_{j<min(n_min,n_max)} alpha^j (0 if <= 0)
  float inv_n;        // 1 / n_max
  float inv_sxx_eps;  // 1 / (sum_j JC_j^2 + eps_slope)
  float tau_low;
  float inv_tau;      // 1 / (tau_high - tau_low), rounded from fp64
  float gamma;
  float beta;
  float eps_slope;
  int64_t n_min;
  int64_t n_max;
  double alpha;
  uint64_t nmask;     // (1 << n_max) - 1 for the register kernel
  bool adaptive;
  bool trend;
};

struct Part {
  double sum;
  long long cnt;
  int flag;
};

struct SegSumOp {
  __device__ __forceinline__ Part operator()(const Part& x, const Part& y) const {
    Part o;
    o.flag = x.flag | y.flag;
    o.sum = y.flag ? y.sum : x.sum + y.sum;
    o.cnt = y.flag ? y.cnt : x.cnt + y.cnt;
    return o;
  }
};

__device__ __forceinline__ float clip01f(float x) {
  // Same NaN behaviour as the CPU's x < 0 ? 0 : (x > 1 ? 1 : x).
  return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x);
}

__device__ __forceinline__ float sigmoidf_(float x) {
  // The CPU's two branches (x >= 0: 1 / (1 + exp(-x)), else exp(x) / (1 + exp(x))) share
  // e = exp(-|x|), so one exp and one division serve both without divergence; NaN stays NaN.
  const float e = expf(-fabsf(x));
  return (x >= 0.0f ? 1.0f : e) / (1.0f + e);
}

// Largest s in [l, h] with cu[s] <= i (see the correctness notes above).
__device__ __forceinline__ int64_t seg_search(const int64_t* __restrict__ cu, int64_t l, int64_t h,
                                              int64_t i) {
  while (l < h) {
    const int64_t mid = l + (h - l + 1) / 2;
    if (__ldg(cu + mid) <= i) {
      l = mid;
    } else {
      h = mid - 1;
    }
  }
  return l;
}

// cu_seqlens entries [lo, hi + 1] of one tile's segment range [lo, hi], read from shared memory
// when the range was staged there (at most kSegCache segments) and from global memory otherwise.
struct SegView {
  const int64_t* g;   // global cu_seqlens
  const int64_t* sh;  // shared copy of cu[lo .. hi + 1] or nullptr
  int64_t lo, hi;
  __device__ __forceinline__ int64_t cu(int64_t s) const { return sh ? sh[s - lo] : __ldg(g + s); }
  // Largest s in [lo, hi] with cu(s) <= i (seg_search over the view).
  __device__ __forceinline__ int64_t find(int64_t i) const {
    int64_t l = lo, h = hi;
    while (l < h) {
      const int64_t mid = l + (h - l + 1) / 2;
      if (cu(mid) <= i) {
        l = mid;
      } else {
        h = mid - 1;
      }
    }
    return l;
  }
};

// Stages cu[lo .. hi + 1] of this block's tile into shared memory when it fits. Block-uniform
// result; the caller must __syncthreads() before using the view.
__device__ __forceinline__ SegView stage_segments(const Bufs& a, int64_t b, int64_t* sh_cu) {
  SegView v;
  v.g = a.cu;
  v.lo = __ldg(a.tile_seg + b);
  v.hi = __ldg(a.tile_seg + b + 1);
  const int64_t n = v.hi - v.lo + 1;
  v.sh = nullptr;
  if (n <= kSegCache) {
    for (int64_t t = threadIdx.x; t <= n; t += kThreads) sh_cu[t] = __ldg(a.cu + v.lo + t);
    v.sh = sh_cu;
  }
  return v;
}

// One bit per byte: bit k set when byte k of x is nonzero.
__device__ __forceinline__ uint32_t nz_bits4(uint32_t x) {
  return ((__vcmpne4(x, 0u) & 0x08040201u) * 0x01010101u) >> 24;
}

// True when kernel 0 found cu_seqlens malformed (block-uniform: the slots do not change while
// kernels 1-3 run, so an early return before a barrier or shuffle is taken by the whole block).
__device__ __forceinline__ bool cu_invalid(const unsigned long long* st) {
  return st[0] != kNone || st[1] != kNone || st[2] != kNone;
}

// Loads tokens p .. p+7 (p a multiple of 8). Positions >= T or masked get v = 0 and a cleared bit.
__device__ __forceinline__ void load8(const Bufs& a, int64_t p, float (&v)[kTok], uint32_t& bits) {
  if (a.vec_in && p + kTok <= a.T) {
    const float4 x0 = __ldg(reinterpret_cast<const float4*>(a.gap + p));
    const float4 x1 = __ldg(reinterpret_cast<const float4*>(a.gap + p + 4));
    v[0] = x0.x; v[1] = x0.y; v[2] = x0.z; v[3] = x0.w;
    v[4] = x1.x; v[5] = x1.y; v[6] = x1.z; v[7] = x1.w;
    bits = 0xffu;
    if (a.mask != nullptr) {
      const uint2 m = __ldg(reinterpret_cast<const uint2*>(a.mask + p));
      bits = nz_bits4(m.x) | (nz_bits4(m.y) << 4);
    }
  } else {
    bits = 0u;
#pragma unroll
    for (int c = 0; c < kTok; ++c) {
      const int64_t t = p + c;
      v[c] = 0.0f;
      if (t < a.T) {
        v[c] = __ldg(a.gap + t);
        const bool ok = a.mask == nullptr || __ldg(a.mask + t) != 0;
        bits |= (ok ? 1u : 0u) << c;
      }
    }
  }
#pragma unroll
  for (int c = 0; c < kTok; ++c) {
    v[c] = ((bits >> c) & 1u) ? v[c] : 0.0f;  // select, so NaN at masked positions is dropped
  }
}

__device__ __forceinline__ void store8(float* out, bool vec, int64_t p, int64_t T,
                                       const float (&x)[kTok]) {
  if (vec && p + kTok <= T) {
    __stcs(reinterpret_cast<float4*>(out + p), make_float4(x[0], x[1], x[2], x[3]));
    __stcs(reinterpret_cast<float4*>(out + p + 4), make_float4(x[4], x[5], x[6], x[7]));
  } else {
#pragma unroll
    for (int c = 0; c < kTok; ++c) {
      if (p + c < T) out[p + c] = x[c];
    }
  }
}

// ---------------------------------------------------------------------------------- kernel 0
// tile_seg[b] = segment of token b * kTile for b < tiles, tile_seg[tiles] = S - 1. Tile b's
// tokens all lie in segments [tile_seg[b], tile_seg[b + 1]]. One binary search per tile here
// spares every block of kernels 1 and 3 a serial chain of dependent loads at its start.
__global__ void __launch_bounds__(kThreads)
    tile_segments_kernel(const int64_t* __restrict__ cu, int64_t S, int64_t T, int64_t nt,
                         int64_t* __restrict__ tile_seg, unsigned long long* __restrict__ status) {
  // Also validates cu_seqlens (the slots of kStatusSlots): a binary search over malformed offsets
  // still returns an index in [0, S - 1], and kernels 1-3 skip their work when a slot is set.
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t n = nt + 1 > S ? nt + 1 : S;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; j < n; j += stride) {
    if (j <= nt) tile_seg[j] = j < nt ? seg_search(cu, 0, S - 1, j * kTile) : S - 1;
    if (j < S && __ldg(cu + j + 1) < __ldg(cu + j)) {
      atomicMin(status + 1, static_cast<unsigned long long>(j));
    }
    if (j == 0) {
      if (__ldg(cu) != 0) status[0] = 0ull;
      if (__ldg(cu + S) != T) status[2] = static_cast<unsigned long long>(S);
    }
  }
}

// ---------------------------------------------------------------------------------- kernel 1
__global__ void __launch_bounds__(kThreads)
    scale_partials_kernel(Bufs a, double eps_scale, float* __restrict__ scale,
                          Part* __restrict__ head, Part* __restrict__ tail) {
  using Scan = cub::BlockScan<Part, kThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int64_t sh_cu[kSegCache + 1];

  const int64_t b = blockIdx.x;
  const int64_t lo = b * kTile;
  const int64_t hi = min(lo + static_cast<int64_t>(kTile), a.T);
  const int64_t i0 = lo + static_cast<int64_t>(kTok) * threadIdx.x;
  const int64_t i1 = min(i0 + kTok, hi);  // this thread's tokens are [i0, i1); may be empty
  if (cu_invalid(a.status)) return;  // block-uniform, before any barrier
  float v[kTok];
  uint32_t bits;
  load8(a, i0, v, bits);  // issued first: its latency overlaps the staging below
  {  // the first valid non-finite gap (positions >= T and masked ones have a cleared bit)
    unsigned long long bad = kNone;
#pragma unroll
    for (int c = kTok - 1; c >= 0; --c) {
      if (((bits >> c) & 1u) && !isfinite(v[c])) bad = static_cast<unsigned long long>(i0 + c);
    }
    if (bad != kNone) atomicMin(a.status + 3, bad);
  }
  const SegView sv = stage_segments(a, b, sh_cu);
  __syncthreads();

  // Phase A: the scan input (flag = a segment starts at one of my tokens, value = my last run).
  int64_t s0 = 0, start0 = 0;
  Part in{0.0, 0, 0};
  if (i0 < i1) {
    s0 = sv.find(i0);
    start0 = sv.cu(s0);
    int64_t s = s0;
    int64_t e = sv.cu(s + 1);
    in.flag = start0 == i0 ? 1 : 0;
#pragma unroll
    for (int c = 0; c < kTok; ++c) {
      const int64_t i = i0 + c;
      if (i < i1) {
        if (i >= e) {
          while (i >= e) e = sv.cu((++s) + 1);
          in.flag = 1;
          in.sum = 0.0;
          in.cnt = 0;
        }
        if ((bits >> c) & 1u) {
          in.sum += fabs(static_cast<double>(v[c]));
          in.cnt += 1;
        }
      }
    }
  }
  Part excl{0.0, 0, 0};
  Scan(scan_tmp).ExclusiveScan(in, excl, SegSumOp());
  if (threadIdx.x == 0) excl = Part{0.0, 0, 0};  // cub leaves thread 0's result undefined

  // Phase B: close every segment whose last token is mine.
  if (i0 < i1) {
    int64_t s = s0;
    int64_t st = start0;
    int64_t e = sv.cu(s + 1);
    double acc = st < i0 ? excl.sum : 0.0;
    long long n = st < i0 ? excl.cnt : 0;
    auto close = [&](int64_t seg, int64_t seg_start, double sum, long long cnt) {
      if (seg_start >= lo) {  // whole segment inside this tile: final scale now
        scale[seg] = static_cast<float>((cnt > 0 ? sum / static_cast<double>(cnt) : 0.0) + eps_scale);
      } else {                // the tile's first segment, started in an earlier tile
        head[b] = Part{sum, cnt, 0};
      }
    };
#pragma unroll
    for (int c = 0; c < kTok; ++c) {
      const int64_t i = i0 + c;
      if (i < i1) {
        if (i >= e) {
          close(s, st, acc, n);
          while (i >= e) e = sv.cu((++s) + 1);
          st = i;  // the new segment starts exactly here (segments tile [0, T))
          acc = 0.0;
          n = 0;
        }
        if ((bits >> c) & 1u) {
          acc += fabs(static_cast<double>(v[c]));
          n += 1;
        }
      }
    }
    if (e <= i1) {
      close(s, st, acc, n);
    } else if (i1 == hi) {  // segment continues past the tile end (only when hi < T)
      tail[b] = Part{acc, n, 0};
      if (st < lo) head[b] = Part{acc, n, 0};  // it also covers the whole tile
    }
  }
}

// ---------------------------------------------------------------------------------- kernel 2
__global__ void __launch_bounds__(kThreads)
    scale_finalize_kernel(const int64_t* __restrict__ cu, int64_t S, double eps_scale,
                          float* __restrict__ scale, const Part* __restrict__ head,
                          const Part* __restrict__ tail, const unsigned long long* status) {
  if (cu_invalid(status)) return;
  const int lane = threadIdx.x & 31;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) >> 5;
  const int64_t nwarps = (static_cast<int64_t>(gridDim.x) * kThreads) >> 5;
  for (int64_t s = warp; s < S; s += nwarps) {
    const int64_t a0 = __ldg(cu + s);
    const int64_t z = __ldg(cu + s + 1);
    if (a0 >= z) {  // empty segment: no token reads its scale; defined value for initcheck
      if (lane == 0) scale[s] = static_cast<float>(eps_scale);
      continue;
    }
    const int64_t b0 = a0 / kTile;
    const int64_t b1 = (z - 1) / kTile;
    if (b0 == b1) continue;  // done by kernel 1
    double sum = 0.0;
    long long n = 0;
    for (int64_t t = b0 + 1 + lane; t <= b1; t += 32) {
      sum += head[t].sum;
      n += head[t].cnt;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      sum += __shfl_xor_sync(kFull, sum, o);
      n += __shfl_xor_sync(kFull, n, o);
    }
    if (lane == 0) {
      sum += tail[b0].sum;
      n += tail[b0].cnt;
      scale[s] = static_cast<float>((n > 0 ? sum / static_cast<double>(n) : 0.0) + eps_scale);
    }
  }
}

// ---------------------------------------------------------------------------------- kernel 3
struct TokOut {
  float w, ad, r, slope, eta;
};

__device__ __forceinline__ TokOut epilogue(const DevParams& p, float dbar_s, float dbar_l, float r,
                                           float slope, float inv_scale, bool valid) {
  TokOut o;
  o.ad = (1.0f - r) * dbar_s + r * dbar_l;
  o.eta = 1.0f;
  if (p.trend) {
    const float q = -slope * inv_scale;
    const float relu = 0.0f < q ? q : 0.0f;  // std::max(0.0, q): NaN -> 0
    o.eta = clip01f(1.0f - p.gamma * relu);
  }
  o.w = valid ? sigmoidf_(p.beta * o.ad) * o.eta : 0.0f;
  o.r = r;
  o.slope = slope;
  return o;
}

// Full window: all n_max positions valid and inside the segment. EXACT: n_max == CAP, so the
// padding factors U_j are all 1 and drop out.
template <int CAP, bool EXACT>
__device__ __forceinline__ void window_full(const float* vk, const DevParams& p, float& dbar_s,
                                            float& dbar_l, float& r, float& slope) {
  float num_l = 0.0f, num_s = 0.0f, sum = 0.0f;
#pragma unroll
  for (int j = 0; j < CAP; ++j) {
    num_l = fmaf(p.A[j], vk[j], num_l);
    num_s = fmaf(p.Sw[j], vk[j], num_s);
    sum = EXACT ? sum + vk[j] : fmaf(p.U[j], vk[j], sum);
  }
  dbar_l = num_l * p.inv_den_l;
  dbar_s = num_s * p.inv_den_s;
  const float mean = sum * p.inv_n;
  float var = 0.0f, sxy = 0.0f;
#pragma unroll
  for (int j = 0; j < CAP; ++j) {
    const float d = vk[j] - mean;
    var = fmaf(EXACT ? d : p.U[j] * d, d, var);
    sxy = fmaf(p.JC[j], vk[j], sxy);
  }
  var *= p.inv_n;
  r = p.adaptive ? clip01f((var - p.tau_low) * p.inv_tau) : 0.0f;
  // JC == 0 when n_max == 1, so slope is 0 there, as in the CPU kernel (cnt < 2).
  slope = sxy * p.inv_sxx_eps;  // reported even when the trend factor is off
}

// Partial window: valid bits wm (bit j = position i + j counts).
template <int CAP>
__device__ __forceinline__ void window_partial(const float* vk, uint64_t wm, const DevParams& p,
                                               float& dbar_s, float& dbar_l, float& r,
                                               float& slope) {
  float num_l = 0.0f, den_l = 0.0f, num_s = 0.0f, den_s = 0.0f;
  float cnt = 0.0f, sum = 0.0f, sum_j = 0.0f;
#pragma unroll
  for (int j = 0; j < CAP; ++j) {
    const float mf = ((wm >> j) & 1ull) ? 1.0f : 0.0f;
    const float x = mf * vk[j];
    num_l = fmaf(p.A[j], x, num_l);
    den_l = fmaf(p.A[j], mf, den_l);
    num_s = fmaf(p.Sw[j], x, num_s);
    den_s = fmaf(p.Sw[j], mf, den_s);
    cnt += mf;
    sum += x;
    sum_j = fmaf(static_cast<float>(j), mf, sum_j);
  }
  dbar_s = den_s > 0.0f ? num_s / den_s : 0.0f;
  dbar_l = den_l > 0.0f ? num_l / den_l : 0.0f;
  r = 0.0f;
  slope = 0.0f;
  if (cnt > 0.0f) {  // statistics are reported whatever the flags
    const float mean = sum / cnt;
    const float jbar = sum_j / cnt;
    float var = 0.0f, sxy = 0.0f, sxx = 0.0f;
#pragma unroll
    for (int j = 0; j < CAP; ++j) {
      const float mf = ((wm >> j) & 1ull) ? 1.0f : 0.0f;
      const float d = vk[j] - mean;
      var = fmaf(mf * d, d, var);
      const float dj = static_cast<float>(j) - jbar;
      const float t = mf * dj;
      sxy = fmaf(t, vk[j], sxy);
      sxx = fmaf(t, dj, sxx);
    }
    var /= cnt;
    if (p.adaptive) r = clip01f((var - p.tau_low) * p.inv_tau);
    if (cnt >= 2.0f) slope = sxy / (sxx + p.eps_slope);
  }
}

template <int CAP, bool STATS, bool EXACT>
__global__ void __launch_bounds__(kThreads, 2) weights_kernel(Bufs a, DevParams p) {
  constexpr int R = kTok + CAP - 1;                  // register window per thread
  constexpr int H = (CAP - 1 + kTok - 1) / kTok;     // neighbour lanes that supply the halo
  static_assert(R <= 64, "window bits must fit in 64 bits");
  __shared__ int64_t sh_cu[kSegCache + 1];
  __shared__ float sh_inv_scale[kSegCache];

  if (cu_invalid(a.status)) return;  // block-uniform, before the shuffles and the barrier
  const int64_t nt = (a.T + kTile - 1) / kTile;
  const int64_t b = nt - 1 - static_cast<int64_t>(blockIdx.x);  // reverse order: L2 reuse
  const int64_t lo = b * kTile;

  const int64_t i0 = lo + static_cast<int64_t>(kTok) * threadIdx.x;
  const int lane = threadIdx.x & 31;
  float v[R];
  uint64_t bits;
  {
    float own[kTok];
    uint32_t ob;
    load8(a, i0, own, ob);
#pragma unroll
    for (int c = 0; c < kTok; ++c) v[c] = own[c];
    bits = ob;
#pragma unroll
    for (int q = 1; q <= H; ++q) {
      float nv[kTok];
      uint32_t nb = __shfl_down_sync(kFull, ob, q);
#pragma unroll
      for (int c = 0; c < kTok; ++c) {
        if (q * kTok + c < R) nv[c] = __shfl_down_sync(kFull, own[c], q);
      }
      if (lane + q >= 32) load8(a, i0 + static_cast<int64_t>(q) * kTok, nv, nb);
#pragma unroll
      for (int c = 0; c < kTok; ++c) {
        if (q * kTok + c < R) v[q * kTok + c] = nv[c];
      }
      bits |= static_cast<uint64_t>(nb & 0xffu) << (q * kTok);
    }
  }
  const SegView sv = stage_segments(a, b, sh_cu);
  if (sv.sh != nullptr) {
    for (int64_t t = threadIdx.x; t <= sv.hi - sv.lo; t += kThreads) {
      sh_inv_scale[t] = 1.0f / a.scale[sv.lo + t];  // garbage for empty segments: never used
    }
  }
  __syncthreads();  // staged segments visible; every thread reaches this (after the shuffles)
  if (i0 >= a.T) return;
  auto inv_scale_of = [&](int64_t seg) {
    return sv.sh != nullptr ? sh_inv_scale[seg - sv.lo] : 1.0f / a.scale[seg];
  };

  int64_t s = sv.find(i0);
  int64_t e = sv.cu(s + 1);
  float inv_scale = inv_scale_of(s);
  // Common case: the whole register window lies in one segment, so no window is cut by its end.
  const bool one_seg = e - i0 >= R;
  float wo[kTok], ado[kTok], ro[kTok], slo[kTok], eto[kTok];
#pragma unroll
  for (int k = 0; k < kTok; ++k) {
    const int64_t i = i0 + k;
    wo[k] = 0.0f;
    ado[k] = ro[k] = slo[k] = eto[k] = 0.0f;
    if (i < a.T) {
      if (i >= e) {
        while (i >= e) e = sv.cu((++s) + 1);
        inv_scale = inv_scale_of(s);
      }
      uint64_t wm = (bits >> k) & p.nmask;
      if (!one_seg) {
        const int64_t rem = e - i;  // >= 1
        wm &= rem >= 64 ? ~0ull : ((1ull << rem) - 1ull);
      }
      float dbar_s, dbar_l, r, slope;
      if (wm == p.nmask) {
        window_full<CAP, EXACT>(v + k, p, dbar_s, dbar_l, r, slope);
      } else {
        window_partial<CAP>(v + k, wm, p, dbar_s, dbar_l, r, slope);
      }
      const TokOut o = epilogue(p, dbar_s, dbar_l, r, slope, inv_scale, (bits >> k) & 1ull);
      wo[k] = o.w;
      if (STATS) {
        ado[k] = o.ad;
        ro[k] = o.r;
        slo[k] = o.slope;
        eto[k] = o.eta;
      }
    }
  }
  store8(a.w, a.vec_w, i0, a.T, wo);
  if (STATS) {
    if (a.ad != nullptr) store8(a.ad, a.vec_ad, i0, a.T, ado);
    if (a.rr != nullptr) store8(a.rr, a.vec_rr, i0, a.T, ro);
    if (a.sl != nullptr) store8(a.sl, a.vec_sl, i0, a.T, slo);
    if (a.et != nullptr) store8(a.et, a.vec_et, i0, a.T, eto);
  }
}

// General fallback (n_max > 32 or n_max < 1): one thread per token, loops like the CPU kernel.
__global__ void __launch_bounds__(kThreads)
    weights_general_kernel(Bufs a, DevParams p) {
  if (cu_invalid(a.status)) return;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < a.T;
       i += stride) {
    const int64_t s = seg_search(a.cu, 0, a.S - 1, i);
    const int64_t end = __ldg(a.cu + s + 1);
    const int64_t wlen = min(p.n_max, end - i);
    const int64_t slen = min(p.n_min, end - i);
    const uint8_t* m = a.mask;
    float num_s = 0.0f, den_s = 0.0f, num_l = 0.0f, den_l = 0.0f;
    float cnt = 0.0f, sum = 0.0f, sum_j = 0.0f;
    double dec = 1.0;  // alpha^j, fp64 products like the CPU's decay table
    for (int64_t j = 0; j < wlen; ++j, dec *= p.alpha) {
      const int64_t t = i + j;
      if (m != nullptr && __ldg(m + t) == 0) continue;
      const float x = __ldg(a.gap + t);
      const float dj = static_cast<float>(dec);
      num_l = fmaf(dj, x, num_l);
      den_l += dj;
      if (j < slen) {
        num_s = fmaf(dj, x, num_s);
        den_s += dj;
      }
      cnt += 1.0f;
      sum += x;
      sum_j += static_cast<float>(j);
    }
    const float dbar_s = den_s > 0.0f ? num_s / den_s : 0.0f;
    const float dbar_l = den_l > 0.0f ? num_l / den_l : 0.0f;
    float r = 0.0f, slope = 0.0f;
    if (cnt > 0.0f) {  // statistics are reported whatever the flags
      const float mean = sum / cnt;
      const float jbar = sum_j / cnt;
      float var = 0.0f, sxy = 0.0f, sxx = 0.0f;
      for (int64_t j = 0; j < wlen; ++j) {
        const int64_t t = i + j;
        if (m != nullptr && __ldg(m + t) == 0) continue;
        const float x = __ldg(a.gap + t);
        const float d = x - mean;
        const float dj = static_cast<float>(j) - jbar;
        var = fmaf(d, d, var);
        sxy = fmaf(dj, x, sxy);
        sxx = fmaf(dj, dj, sxx);
      }
      var /= cnt;
      if (p.adaptive) r = clip01f((var - p.tau_low) * p.inv_tau);
      if (cnt >= 2.0f) slope = sxy / (sxx + p.eps_slope);
    }
    const bool valid = m == nullptr || __ldg(m + i) != 0;
    const TokOut o = epilogue(p, dbar_s, dbar_l, r, slope, 1.0f / a.scale[s], valid);
    a.w[i] = o.w;
    if (a.ad != nullptr) a.ad[i] = o.ad;
    if (a.rr != nullptr) a.rr[i] = o.r;
    if (a.sl != nullptr) a.sl[i] = o.slope;
    if (a.et != nullptr) a.et[i] = o.eta;
  }
}

// ---------------------------------------------------------------------------------- host side
bool aligned(const void* ptr, uintptr_t n) { return (reinterpret_cast<uintptr_t>(ptr) % n) == 0; }

size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

struct Layout {
  size_t scale_off, head_off, tail_off, tile_off, status_off, bytes;
};

Layout workspace_layout(int64_t S, int64_t T) {
  const int64_t nt = T > 0 ? (T + kTile - 1) / kTile : 0;
  Layout l;
  l.scale_off = 0;
  l.head_off = align_up(static_cast<size_t>(S) * sizeof(float), 256);
  l.tail_off = l.head_off + align_up(static_cast<size_t>(nt) * sizeof(Part), 256);
  l.tile_off = l.tail_off + align_up(static_cast<size_t>(nt) * sizeof(Part), 256);
  l.status_off = l.tile_off + align_up(static_cast<size_t>(nt + 1) * sizeof(int64_t), 256);
  l.bytes = l.status_off + align_up(kStatusSlots * sizeof(unsigned long long), 256);
  return l;
}

DevParams make_dev_params(const PcsdParams& p) {
  DevParams d{};
  d.n_min = p.n_min;
  d.n_max = p.n_max;
  d.alpha = p.alpha;
  d.adaptive = p.adaptive;
  d.trend = p.trend;
  d.tau_low = static_cast<float>(p.tau_low);
  d.inv_tau = static_cast<float>(1.0 / (p.tau_high - p.tau_low));
  d.gamma = static_cast<float>(p.gamma);
  d.beta = static_cast<float>(p.beta_gate);
  d.eps_slope = static_cast<float>(p.eps_slope);
  const int64_t nmax = p.n_max;
  const int64_t nshort = p.n_min < p.n_max ? p.n_min : p.n_max;
  double den_l = 0.0, den_s = 0.0, sxx = 0.0;
  double a = 1.0;  // same fp64 products as the CPU kernel's decay table
  const double jbar = 0.5 * static_cast<double>(nmax - 1);
  for (int j = 0; j < kMaxCap; ++j) {
    const bool in_l = j < nmax;
    const bool in_s = j < nshort;
    d.A[j] = in_l ? static_cast<float>(a) : 0.0f;
    d.Sw[j] = in_s ? static_cast<float>(a) : 0.0f;
    d.U[j] = in_l ? 1.0f : 0.0f;
    d.JC[j] = in_l ? static_cast<float>(j - jbar) : 0.0f;
    if (in_l) {
      den_l += a;
      sxx += (j - jbar) * (j - jbar);
    }
    if (in_s) den_s += a;
    a *= p.alpha;
  }
  d.inv_den_l = den_l > 0.0 ? static_cast<float>(1.0 / den_l) : 0.0f;
  d.inv_den_s = den_s > 0.0 ? static_cast<float>(1.0 / den_s) : 0.0f;
  d.inv_n = nmax > 0 ? static_cast<float>(1.0 / static_cast<double>(nmax)) : 0.0f;
  d.inv_sxx_eps = static_cast<float>(1.0 / (sxx + static_cast<double>(d.eps_slope)));
  d.nmask = (nmax >= 1 && nmax <= kMaxCap) ? ((1ull << nmax) - 1ull) : 0ull;
  return d;
}

template <int CAP, bool EXACT = false>
void launch_weights(const Bufs& a, const DevParams& d, unsigned grid, cudaStream_t st,
                    bool stats) {
  if (stats) {
    weights_kernel<CAP, true, EXACT><<<grid, kThreads, 0, st>>>(a, d);
  } else {
    weights_kernel<CAP, false, EXACT><<<grid, kThreads, 0, st>>>(a, d);
  }
}

// The host's view of a call's validation: cu_seqlens copied to the host and checked in the CPU
// kernel's order (the kernels do not run when there are no tokens or no segments).
int check_cu_on_host(const int64_t* cu_dev, int64_t S, int64_t T, cudaStream_t st, int* status,
                     int64_t* err_index) {
  *status = kOk;
  *err_index = -1;
  if (S < 0) return cudaErrorInvalidValue;
  int64_t* h = static_cast<int64_t*>(std::malloc(static_cast<size_t>(S + 1) * sizeof(int64_t)));
  if (h == nullptr) return cudaErrorMemoryAllocation;
  cudaError_t err = cudaMemcpyAsync(h, cu_dev, static_cast<size_t>(S + 1) * sizeof(int64_t),
                                    cudaMemcpyDeviceToHost, st);
  if (err == cudaSuccess) err = cudaStreamSynchronize(st);
  if (err == cudaSuccess) {
    if (h[0] != 0) {
      *status = kBadCuStart;
      *err_index = 0;
    } else {
      for (int64_t s = 0; s < S && *status == kOk; ++s) {
        if (h[s + 1] < h[s]) {
          *status = kCuDecreasing;
          *err_index = s;
        }
      }
      if (*status == kOk && h[S] != T) {
        *status = kBadCuEnd;
        *err_index = S;
      }
    }
  }
  std::free(h);
  return err;
}

// Reads the validation slots (one 32-byte transfer, one stream synchronisation) and turns them
// into the CPU kernel's status and index: the first fault in the order cu[0], a decrease, cu[S],
// a non-finite gap.
int read_status(const unsigned long long* slots_dev, cudaStream_t st, int* status,
                int64_t* err_index) {
  unsigned long long h[kStatusSlots];
  cudaError_t err = cudaMemcpyAsync(h, slots_dev, sizeof(h), cudaMemcpyDeviceToHost, st);
  if (err == cudaSuccess) err = cudaStreamSynchronize(st);
  if (err != cudaSuccess) return err;
  static const int codes[kStatusSlots] = {kBadCuStart, kCuDecreasing, kBadCuEnd, kNonFiniteGap};
  *status = kOk;
  *err_index = -1;
  for (int k = 0; k < kStatusSlots; ++k) {
    if (h[k] != kNone) {
      *status = codes[k];
      *err_index = static_cast<int64_t>(h[k]);
      break;
    }
  }
  return cudaSuccess;
}

}  // namespace

size_t pcsd_cuda_workspace_bytes(int64_t num_segments, int64_t total) {
  return workspace_layout(num_segments, total).bytes;
}

int pcsd_weights_cuda_ws(const float* gap, const int64_t* cu_seqlens, int64_t num_segments,
                         int64_t total, const uint8_t* mask, const PcsdParams& p, float* w,
                         float* adaptive, float* r, float* slope, float* eta, void* workspace,
                         size_t workspace_bytes, void* stream, int* status, int64_t* err_index) {
  const bool check = status != nullptr && err_index != nullptr;
  if (total <= 0 || num_segments <= 0) {  // nothing to write; the offsets are checked on the host
    return check ? check_cu_on_host(cu_seqlens, num_segments, total,
                                    static_cast<cudaStream_t>(stream), status, err_index)
                 : cudaSuccess;
  }
  const Layout lay = workspace_layout(num_segments, total);
  if (workspace == nullptr || workspace_bytes < lay.bytes) return cudaErrorInvalidValue;
  const int64_t nt = (total + kTile - 1) / kTile;
  if (nt > INT_MAX) return cudaErrorInvalidValue;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  char* ws = static_cast<char*>(workspace);
  float* scale = reinterpret_cast<float*>(ws + lay.scale_off);
  Part* head = reinterpret_cast<Part*>(ws + lay.head_off);
  Part* tail = reinterpret_cast<Part*>(ws + lay.tail_off);
  int64_t* tile_seg = reinterpret_cast<int64_t*>(ws + lay.tile_off);
  unsigned long long* slots = reinterpret_cast<unsigned long long*>(ws + lay.status_off);

  Bufs a{};
  a.gap = gap;
  a.cu = cu_seqlens;
  a.mask = mask;
  a.S = num_segments;
  a.T = total;
  a.w = w;
  a.ad = adaptive;
  a.rr = r;
  a.sl = slope;
  a.et = eta;
  a.scale = scale;
  a.tile_seg = tile_seg;
  a.status = slots;
  a.vec_in = aligned(gap, 16) && (mask == nullptr || aligned(mask, 8));
  a.vec_w = aligned(w, 16);
  a.vec_ad = aligned(adaptive, 16);
  a.vec_rr = aligned(r, 16);
  a.vec_sl = aligned(slope, 16);
  a.vec_et = aligned(eta, 16);

  cudaGetLastError();  // clear a stale error so that the codes below are ours
  cudaError_t err = cudaMemsetAsync(slots, 0xff, kStatusSlots * sizeof(unsigned long long), st);
  if (err != cudaSuccess) return err;
  const int64_t k0_items = nt + 1 > num_segments ? nt + 1 : num_segments;
  const int64_t k0_blocks = (k0_items + kThreads - 1) / kThreads;
  tile_segments_kernel<<<static_cast<unsigned>(k0_blocks < 4096 ? k0_blocks : 4096), kThreads, 0,
                         st>>>(cu_seqlens, num_segments, total, nt, tile_seg, slots);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  scale_partials_kernel<<<static_cast<unsigned>(nt), kThreads, 0, st>>>(a, p.eps_scale, scale,
                                                                         head, tail);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int64_t fin_blocks = (num_segments + (kThreads / 32) - 1) / (kThreads / 32);
  scale_finalize_kernel<<<static_cast<unsigned>(fin_blocks < 4096 ? fin_blocks : 4096), kThreads,
                          0, st>>>(cu_seqlens, num_segments, p.eps_scale, scale, head, tail,
                                   slots);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;

  const DevParams d = make_dev_params(p);
  const bool stats = adaptive != nullptr || r != nullptr || slope != nullptr || eta != nullptr;
  const unsigned grid = static_cast<unsigned>(nt);
  if (p.n_max == 8) {  // the default window: exact-size instantiation
    launch_weights<8, true>(a, d, grid, st, stats);
  } else if (p.n_max >= 1 && p.n_max <= 8) {
    launch_weights<8>(a, d, grid, st, stats);
  } else if (p.n_max >= 9 && p.n_max <= 16) {
    launch_weights<16>(a, d, grid, st, stats);
  } else if (p.n_max >= 17 && p.n_max <= kMaxCap) {
    launch_weights<32>(a, d, grid, st, stats);
  } else {
    const int64_t blocks = (total + kThreads - 1) / kThreads;
    weights_general_kernel<<<static_cast<unsigned>(blocks < (1 << 20) ? blocks : (1 << 20)),
                             kThreads, 0, st>>>(a, d);
  }
  err = cudaGetLastError();
  if (err != cudaSuccess || !check) return err;
  return read_status(slots, st, status, err_index);
}

int pcsd_weights_cuda(const float* gap, const int64_t* cu_seqlens, int64_t num_segments,
                      int64_t total, const uint8_t* mask, const PcsdParams& p, float* w,
                      float* adaptive, float* r, float* slope, float* eta, void* stream,
                      int* status, int64_t* err_index) {
  if (total <= 0 || num_segments <= 0) {
    return pcsd_weights_cuda_ws(gap, cu_seqlens, num_segments, total, mask, p, w, adaptive, r,
                                slope, eta, nullptr, 0, stream, status, err_index);
  }
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const size_t bytes = pcsd_cuda_workspace_bytes(num_segments, total);
  // Stream-ordered scratch from the device's default memory pool: no device synchronisation,
  // and the pool reuses the block on the next call. Devices without memory pools fall back to
  // cudaMalloc and a stream synchronisation before cudaFree.
  void* ws = nullptr;
  bool pooled = true;
  cudaError_t err = cudaMallocAsync(&ws, bytes, st);
  if (err == cudaErrorNotSupported) {
    cudaGetLastError();
    pooled = false;
    err = cudaMalloc(&ws, bytes);
  }
  if (err != cudaSuccess) return err;
  const int code = pcsd_weights_cuda_ws(gap, cu_seqlens, num_segments, total, mask, p, w, adaptive,
                                        r, slope, eta, ws, bytes, stream, status, err_index);
  cudaError_t ferr;
  if (pooled) {
    ferr = cudaFreeAsync(ws, st);
  } else {
    ferr = cudaStreamSynchronize(st);
    const cudaError_t e2 = cudaFree(ws);
    if (ferr == cudaSuccess) ferr = e2;
  }
  if (code != cudaSuccess) return code;
  return ferr;
}

const char* pcsd_cuda_error_string(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

}  // namespace pcsd
