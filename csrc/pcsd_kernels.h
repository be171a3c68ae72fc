// Segmented PCSD token weights: the contract shared by the CPU and CUDA kernels.
//
// Inputs are raw pointers so that the compiled module needs no torch headers and keeps working
// across torch upgrades; pcsd/ops/kernels.py allocates every buffer with torch and passes data_ptr().
//
//   gap        float32 [T]      teacher - student sampled log-prob gaps, packed back to back
//   cu_seqlens int64   [S + 1]  cu[0] == 0, non-decreasing, cu[S] == T; segment s = [cu[s], cu[s+1])
//   mask       uint8   [T]      1 = valid token; nullptr = all valid
//   w          float32 [T]      output weights (0 at masked positions)
//   adaptive, r, slope, eta     float32 [T] optional per-token statistics (nullptr = not wanted)
//
// Per segment, windows truncated at the segment end (never crossing it), offsets j = 0..N-1:
//   dbar_N[i] = sum_j a^j m[i+j] g[i+j] / sum_j a^j m[i+j]            (0 when no valid token)
//   mean/var  = masked mean and population variance over the n_max window
//   r         = clip((var - tau_low) / (tau_high - tau_low), 0, 1)     (0 when !adaptive)
//   adaptive  = (1 - r) dbar_{n_min} + r dbar_{n_max}
//   slope     = sum m (j - jbar) g / (sum m (j - jbar)^2 + eps_slope)  (0 with < 2 valid tokens)
//   scale     = mean |g| over the segment's valid tokens + eps_scale
//   eta       = clip(1 - gamma relu(-slope / scale), 0, 1)             (1 when !trend)
//   w         = sigmoid(beta_gate adaptive) eta, and 0 at masked positions
#pragma once
#include <cstdint>

namespace pcsd {

struct PcsdParams {
  int64_t n_min = 1;
  int64_t n_max = 8;
  double alpha = 0.8;
  double tau_low = 0.05;
  double tau_high = 0.5;
  double gamma = 0.3;
  double beta_gate = 5.0;
  double eps_slope = 1e-6;
  double eps_scale = 1e-6;
  bool adaptive = true;  // false: r = 0, the decayed mean over the n_min window alone
  bool trend = true;     // false: eta = 1
};

// Status codes returned by the kernels; *err_index names the offending position.
enum Status : int {
  kOk = 0,
  kBadCuStart = 1,     // cu[0] != 0
  kCuDecreasing = 2,   // cu[s+1] < cu[s] at s = *err_index
  kBadCuEnd = 3,       // cu[S] != T
  kNonFiniteGap = 4,   // gap not finite at valid position *err_index
};

// Which CPU implementation runs (see pcsd_cpu.cpp):
//   kCpuAuto   the AVX2+FMA kernel when the CPU has AVX2 and FMA and the parameters suit it
//              (cpu_simd_applies), else the portable scalar kernel;
//   kCpuScalar the portable scalar kernel (fp64 sliding sums; also the second reference);
//   kCpuAvx2   the AVX2+FMA kernel; falls back to the scalar kernel where it does not apply.
enum CpuImpl : int { kCpuAuto = 0, kCpuScalar = 1, kCpuAvx2 = 2 };

// CPU kernel: parallel over contiguous ranges of segments, no allocation per token.
// num_threads <= 0 means one thread per hardware thread.
int pcsd_weights_cpu(const float* gap, const int64_t* cu_seqlens, int64_t num_segments,
                     int64_t total, const uint8_t* mask, const PcsdParams& p, float* w,
                     float* adaptive, float* r, float* slope, float* eta, int num_threads,
                     int64_t* err_index, CpuImpl impl = kCpuAuto);

// True when this CPU can run the AVX2+FMA kernel (checked at run time; the module is built
// without -march flags so that it stays portable).
bool cpu_has_avx2();
// True when the AVX2 kernel handles these parameters (n_max <= kSimdMaxWindow, and the decay
// weights alpha^j stay normal floats); the scalar kernel handles everything else.
bool cpu_simd_applies(const PcsdParams& p);
// The implementation that `impl` resolves to for `p` on this CPU: "avx2" or "scalar".
const char* cpu_kernel_name(const PcsdParams& p, CpuImpl impl);
// exp(x) for x <= 0 on 8 lanes at a time with the AVX2 kernel's polynomial (exposed so that the
// tests measure its error). Returns false (and writes nothing) without AVX2.
bool cpu_vexp_nonpositive(const float* x, float* y, int64_t n);

#ifdef PCSD_WITH_CUDA
// CUDA kernel: all pointers are device pointers; stream is a cudaStream_t. The kernels validate
// their input as they read it (cu_seqlens in the first launch, which stops the others when it is
// malformed; the gaps' finiteness at valid positions in the second). With status and err_index
// given, the call reads that verdict back (one 32-byte transfer and a stream synchronisation) as
// the CPU kernel's Status and index; without them it never synchronises with the host.
// Returns 0 or a cudaError_t value.
int pcsd_weights_cuda(const float* gap, const int64_t* cu_seqlens, int64_t num_segments,
                      int64_t total, const uint8_t* mask, const PcsdParams& p, float* w,
                      float* adaptive, float* r, float* slope, float* eta, void* stream,
                      int* status = nullptr, int64_t* err_index = nullptr);
const char* pcsd_cuda_error_string(int code);
#endif

}  // namespace pcsd
