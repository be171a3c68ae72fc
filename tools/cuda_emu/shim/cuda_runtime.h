// CPU emulation of the small part of the CUDA runtime and device API that csrc/pcsd_cuda.cu
// uses, so that its kernels can be executed (slowly) on a machine without a GPU. Each launch runs
// its blocks one after another; the threads of a block are real std::threads (a reused pool), __syncthreads is a
// block-wide std::barrier and warp shuffles go through a per-warp slot array between two warp
// barriers. A thread that returns from the kernel drops out of both barriers, like an exited CUDA
// thread. Used only by tools/cuda_emu/run.sh; never part of the real build.
#pragma once
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

struct uint3 { unsigned x, y, z; };
struct float4 { float x, y, z, w; } __attribute__((aligned(16)));
struct uint2 { unsigned x, y; } __attribute__((aligned(8)));
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

namespace emu {
struct Block {
  explicit Block(unsigned n) : bar(n) {
    for (unsigned w = 0; w < (n + 31) / 32; ++w) {
      unsigned lanes = n - 32 * w < 32 ? n - 32 * w : 32;
      warps.emplace_back(std::make_unique<std::barrier<>>(lanes));
    }
    slots.resize(n);
  }
  std::barrier<> bar;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<uint64_t> slots;
};
inline thread_local Block* cur = nullptr;
}  // namespace emu

inline thread_local uint3 threadIdx, blockIdx, blockDim, gridDim;

inline void __syncthreads() { emu::cur->bar.arrive_and_wait(); }

template <class T>
T emu_shfl(T v, int src_lane_or_neg) {
  static_assert(sizeof(T) <= 8, "shuffle of a type larger than 8 bytes");
  auto* b = emu::cur;
  const unsigned t = threadIdx.x;
  auto& wb = *b->warps[t / 32];
  uint64_t raw = 0;
  std::memcpy(&raw, &v, sizeof(T));
  b->slots[t] = raw;
  wb.arrive_and_wait();
  T out = v;
  if (src_lane_or_neg >= 0) {
    uint64_t r = b->slots[(t / 32) * 32 + static_cast<unsigned>(src_lane_or_neg)];
    std::memcpy(&out, &r, sizeof(T));
  }
  wb.arrive_and_wait();
  return out;
}
template <class T>
T __shfl_down_sync(unsigned, T v, unsigned d) {
  const unsigned lane = threadIdx.x % 32;
  return emu_shfl(v, lane + d < 32 ? static_cast<int>(lane + d) : -1);
}
template <class T>
T __shfl_xor_sync(unsigned, T v, int m) {
  const unsigned lane = threadIdx.x % 32;
  return emu_shfl(v, static_cast<int>(lane ^ static_cast<unsigned>(m)));
}

// Vector accesses must be naturally aligned on a GPU (else "misaligned address"): check it.
inline void emu_check_aligned(const void* p, size_t n) {
  if (reinterpret_cast<uintptr_t>(p) % n != 0) {
    std::fprintf(stderr, "emulated CUDA: misaligned %zu-byte vector access at %p\n", n, p);
    std::abort();
  }
}
template <class T> inline T __ldg(const T* p) {
  if constexpr (sizeof(T) > 4) emu_check_aligned(p, sizeof(T));
  return *p;
}
inline void __stcs(float4* p, float4 v) { emu_check_aligned(p, sizeof(float4)); *p = v; }
inline unsigned __vcmpne4(unsigned a, unsigned b) {
  unsigned r = 0;
  for (int k = 0; k < 4; ++k)
    if (((a >> (8 * k)) & 0xffu) != ((b >> (8 * k)) & 0xffu)) r |= 0xffu << (8 * k);
  return r;
}
template <class T> inline T min(T a, T b) { return b < a ? b : a; }
template <class T> inline T max(T a, T b) { return a < b ? b : a; }

// ---- runtime API
using cudaStream_t = void*;
enum cudaError_t : int {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorNotSupported = 801,
};
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline const char* cudaGetErrorString(cudaError_t) { return "emulated CUDA error"; }
inline cudaError_t cudaMallocAsync(void** p, size_t n, cudaStream_t) {
  *p = std::malloc(n ? n : 1);
  if (*p) std::memset(*p, 0xA5, n);  // poison: reading unwritten scratch gives garbage
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t) { std::free(p); return cudaSuccess; }
inline cudaError_t cudaMalloc(void** p, size_t n) { return cudaMallocAsync(p, n, nullptr); }
inline cudaError_t cudaFree(void* p) { std::free(p); return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
enum cudaMemcpyKind : int { cudaMemcpyDeviceToHost = 2 };
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t) {
  std::memset(p, v, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind,
                                   cudaStream_t) {
  std::memcpy(dst, src, n);
  return cudaSuccess;
}
// The block's threads run concurrently: device atomics are real atomics here.
inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) {
  std::atomic_ref<unsigned long long> a(*p);
  unsigned long long old = a.load();
  while (v < old && !a.compare_exchange_weak(old, v)) {
  }
  return old;
}
using std::isfinite;

namespace emu {
struct Cfg { unsigned grid, block; };
inline Cfg cfg(unsigned grid, unsigned block, size_t = 0, cudaStream_t = nullptr) {
  return Cfg{grid, block};
}

// A pool of persistent worker threads, one per CUDA thread of a block, reused for every block of
// every launch (creating 256 threads per block dominated the run time).
class Pool {
 public:
  explicit Pool(unsigned n) : n_(n), start_(n + 1), done_(n + 1) {
    for (unsigned t = 0; t < n; ++t) workers_.emplace_back([this, t] { loop(t); });
  }
  ~Pool() {
    stop_ = true;
    start_.arrive_and_wait();
    for (auto& w : workers_) w.join();
  }
  unsigned size() const { return n_; }
  // Runs body(t) on every worker t for one block and waits for all of them.
  template <class F>
  void run_block(F& body) {
    body_ = [&body](unsigned t) { body(t); };
    start_.arrive_and_wait();
    done_.arrive_and_wait();
  }

 private:
  void loop(unsigned t) {
    for (;;) {
      start_.arrive_and_wait();
      if (stop_) return;
      body_(t);
      done_.arrive_and_wait();
    }
  }
  unsigned n_;
  std::barrier<> start_, done_;
  std::function<void(unsigned)> body_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

inline Pool& pool_for(unsigned n) {
  static std::unique_ptr<Pool> p;
  if (!p || p->size() != n) {
    p.reset();
    p = std::make_unique<Pool>(n);
  }
  return *p;
}

template <class... P, class... A>
void launch(Cfg c, void (*k)(P...), A&&... args) {
  Pool& pool = pool_for(c.block);
  for (unsigned b = 0; b < c.grid; ++b) {
    Block blk(c.block);
    auto body = [&](unsigned t) {
      cur = &blk;
      threadIdx = uint3{t, 0, 0};
      blockIdx = uint3{b, 0, 0};
      blockDim = uint3{c.block, 1, 1};
      gridDim = uint3{c.grid, 1, 1};
      k(args...);
      blk.bar.arrive_and_drop();
      blk.warps[t / 32]->arrive_and_drop();
    };
    pool.run_block(body);
  }
}
}  // namespace emu
