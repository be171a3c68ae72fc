// Runs the real CUDA kernels of csrc/pcsd_cuda.cu on the CPU through the emulation shim
// (tools/cuda_emu/shim) and compares them with the CPU kernel (csrc/pcsd_cpu.cpp). This checks
// the kernels' logic (tiling, halo exchange, segmented scan, segment ends, masks, flags, bounds)
// on a machine without a GPU; fp rounding of the device math library is not emulated, and the
// GPU test proper is tools/cuda_selftest.py. Build and run with tools/cuda_emu/run.sh.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "pcsd_kernels.h"

namespace pcsd {
size_t pcsd_cuda_workspace_bytes(int64_t num_segments, int64_t total);
}

namespace {

struct Batch {
  std::vector<float> gap;
  std::vector<uint8_t> mask;
  std::vector<int64_t> cu;
  std::vector<double> mag;  // per token: max |g| over the valid tokens of its segment
};

Batch make_batch(std::mt19937_64& rng, const std::vector<int64_t>& lengths, double hole_rate,
                 bool garbage) {
  Batch b;
  b.cu.assign(lengths.size() + 1, 0);
  for (size_t s = 0; s < lengths.size(); ++s) b.cu[s + 1] = b.cu[s] + lengths[s];
  const int64_t T = b.cu.back();
  b.gap.assign(static_cast<size_t>(T), 0.0f);
  b.mask.assign(static_cast<size_t>(T), 1);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::normal_distribution<double> nd(0.0, 1.0);
  for (size_t s = 0; s < lengths.size(); ++s) {
    const int64_t a = b.cu[s], n = lengths[s];
    if (n == 0) continue;
    const double mag = std::pow(10.0, -3.0 + 6.0 * u(rng));
    const int kind = static_cast<int>(u(rng) * 4);
    double last = nd(rng) * mag;
    for (int64_t k = 0; k < n; ++k) {
      double x = nd(rng) * mag;
      if (kind == 1) x = mag * (1.0 + 1e-3 * nd(rng));
      if (kind == 2) x = (u(rng) < 0.1) ? (last = nd(rng) * mag) : last;  // constant runs
      if (kind == 3) x = mag * (1.0 - 2.0 * static_cast<double>(k) / static_cast<double>(n) +
                                0.1 * nd(rng));
      b.gap[static_cast<size_t>(a + k)] = static_cast<float>(x);
    }
    const bool all_masked = u(rng) < 0.05;
    for (int64_t k = 0; k < n; ++k) {
      if (all_masked) {
        b.mask[static_cast<size_t>(a + k)] = 0;
      } else if (u(rng) < hole_rate) {
        const int64_t h = 1 + static_cast<int64_t>(u(rng) * 11);
        for (int64_t q = k; q < std::min(n, k + h); ++q) b.mask[static_cast<size_t>(a + q)] = 0;
        k += h;
      }
    }
  }
  if (garbage) {
    const float junk[4] = {NAN, INFINITY, -INFINITY, 1e30f};
    for (int64_t t = 0; t < T; ++t)
      if (b.mask[static_cast<size_t>(t)] == 0) b.gap[static_cast<size_t>(t)] = junk[t % 4];
  } else {
    std::fill(b.mask.begin(), b.mask.end(), 1);
  }
  b.mag.assign(static_cast<size_t>(T), 0.0);
  for (size_t s = 0; s + 1 < b.cu.size(); ++s) {
    double m = 0.0;
    for (int64_t t = b.cu[s]; t < b.cu[s + 1]; ++t)
      if (b.mask[static_cast<size_t>(t)]) m = std::max(m, std::fabs(double(b.gap[size_t(t)])));
    for (int64_t t = b.cu[s]; t < b.cu[s + 1]; ++t) b.mag[static_cast<size_t>(t)] = m;
  }
  return b;
}

struct Out {
  std::vector<float> w, ad, r, sl, et;
};

constexpr float kSentinel = 12345.0f;
constexpr int kGuard = 40;

// Runs the emulated CUDA path with every buffer placed at element `offset` of a larger buffer
// (offset 1 = misaligned, scalar code paths) and checks the guard regions afterwards.
bool run_cuda(const Batch& b, const pcsd::PcsdParams& p, bool use_mask, bool stats, int offset,
              Out& o, std::string& err) {
  const size_t T = b.gap.size();
  std::vector<float> g(T + offset + 8, 0.0f);
  std::vector<uint8_t> m(T + offset + 8, 0);
  std::memcpy(g.data() + offset, b.gap.data(), T * sizeof(float));
  std::memcpy(m.data() + offset, b.mask.data(), T);
  std::vector<float> bufs[5];
  for (auto& v : bufs) v.assign(T + offset + kGuard, kSentinel);
  auto at = [&](std::vector<float>& v) { return v.data() + offset; };
  const int code = pcsd::pcsd_weights_cuda(
      g.data() + offset, b.cu.data(), static_cast<int64_t>(b.cu.size()) - 1,
      static_cast<int64_t>(T), use_mask ? m.data() + offset : nullptr, p, at(bufs[0]),
      stats ? at(bufs[1]) : nullptr, stats ? at(bufs[2]) : nullptr, stats ? at(bufs[3]) : nullptr,
      stats ? at(bufs[4]) : nullptr, nullptr);
  if (code != 0) {
    err = "cuda returned " + std::to_string(code);
    return false;
  }
  const char* names[5] = {"w", "ad", "r", "slope", "eta"};
  for (int k = 0; k < 5; ++k) {
    const bool written = k == 0 || stats;
    for (size_t t = 0; t < bufs[k].size(); ++t) {
      const bool inside = t >= size_t(offset) && t < size_t(offset) + T;
      if ((!inside || !written) && bufs[k][t] != kSentinel) {
        err = std::string(names[k]) + " written outside [0, T) or without a pointer at " +
              std::to_string(int64_t(t) - offset);
        return false;
      }
    }
  }
  auto take = [&](std::vector<float>& v) {
    return std::vector<float>(v.begin() + offset, v.begin() + offset + long(T));
  };
  o.w = take(bufs[0]);
  o.ad = take(bufs[1]);
  o.r = take(bufs[2]);
  o.sl = take(bufs[3]);
  o.et = take(bufs[4]);
  return true;
}

Out run_cpu(const Batch& b, const pcsd::PcsdParams& p, bool use_mask) {
  const size_t T = b.gap.size();
  Out o;
  o.w.assign(T, 0);
  o.ad.assign(T, 0);
  o.r.assign(T, 0);
  o.sl.assign(T, 0);
  o.et.assign(T, 0);
  int64_t where = -1;
  const int st = pcsd::pcsd_weights_cpu(b.gap.data(), b.cu.data(), int64_t(b.cu.size()) - 1,
                                        int64_t(T), use_mask ? b.mask.data() : nullptr, p,
                                        o.w.data(), o.ad.data(), o.r.data(), o.sl.data(),
                                        o.et.data(), 1, &where);
  if (st != 0) std::fprintf(stderr, "CPU status %d at %lld\n", st, (long long)where);
  return o;
}

std::vector<double> seg_scale(const Batch& b, bool use_mask, double eps) {
  std::vector<double> sc(b.gap.size(), 0.0);
  for (size_t s = 0; s + 1 < b.cu.size(); ++s) {
    double sum = 0.0;
    int64_t n = 0;
    for (int64_t t = b.cu[s]; t < b.cu[s + 1]; ++t)
      if (!use_mask || b.mask[size_t(t)]) {
        sum += std::fabs(double(b.gap[size_t(t)]));
        ++n;
      }
    for (int64_t t = b.cu[s]; t < b.cu[s + 1]; ++t)
      sc[size_t(t)] = (n ? sum / double(n) : 0.0) + eps;
  }
  return sc;
}

// Same tolerances as tools/cuda_selftest.py.
int compare(const std::string& label, const Batch& b, const pcsd::PcsdParams& p, bool use_mask,
            const Out& ref, const Out& got) {
  const auto sc = seg_scale(b, use_mask, p.eps_scale);
  int bad = 0;
  double maxdw = 0.0;
  for (size_t t = 0; t < b.gap.size(); ++t) {
    const double M = b.mag[t];
    const double ratio = sc[t] > 0 ? M / sc[t] : 0.0;
    const double tol_ad = 1e-5 * M + 1e-6;
    const double tol_sl = 1e-5 * (M + std::fabs(ref.sl[t])) + 1e-6;
    const double tol_et =
        1e-5 + p.gamma * 1e-5 * (ratio + std::fabs(ref.sl[t]) / std::max(sc[t], 1e-30));
    const double tol_r = 1e-5 + 1e-5 * M * M / (p.tau_high - p.tau_low);
    const double tol_w = 1e-5 * std::fabs(ref.w[t]) + 1e-6 + 0.25 * p.beta_gate * tol_ad + tol_et;
    const double vals[5][3] = {{ref.w[t], got.w[t], tol_w},
                               {ref.ad[t], got.ad[t], tol_ad},
                               {ref.r[t], got.r[t], tol_r},
                               {ref.sl[t], got.sl[t], tol_sl},
                               {ref.et[t], got.et[t], tol_et}};
    const char* names[5] = {"w", "ad", "r", "slope", "eta"};
    maxdw = std::max(maxdw, std::fabs(double(ref.w[t]) - got.w[t]));
    for (int k = 0; k < 5; ++k) {
      const double d = std::fabs(vals[k][0] - vals[k][1]);
      const bool both_nan = std::isnan(vals[k][0]) && std::isnan(vals[k][1]);
      if (!(d <= vals[k][2]) && !both_nan) {
        if (bad < 3)
          std::printf("    %s: %s at t=%zu cuda=%.9g cpu=%.9g tol=%.3g\n", label.c_str(),
                      names[k], t, vals[k][1], vals[k][0], vals[k][2]);
        ++bad;
      }
    }
    if (use_mask && b.mask[t] == 0 && got.w[t] != 0.0f) {
      if (bad < 3) std::printf("    %s: w != 0 at masked t=%zu\n", label.c_str(), t);
      ++bad;
    }
  }
  std::printf("  %-58s T=%7zu max|dw|=%.2e %s\n", label.c_str(), b.gap.size(), maxdw,
              bad ? "FAIL" : "ok");
  return bad ? 1 : 0;
}

pcsd::PcsdParams P(int64_t n_min, int64_t n_max, double alpha = 0.8, bool adaptive = true,
                   bool trend = true) {
  pcsd::PcsdParams p;
  p.n_min = n_min;
  p.n_max = n_max;
  p.alpha = alpha;
  p.adaptive = adaptive;
  p.trend = trend;
  return p;
}

// The kernels' own validation (issue 40): the status and index a checked CUDA call reports equal
// the CPU kernel's for malformed cu_seqlens, non-finite valid gaps, and degenerate shapes; with
// malformed offsets the kernels write nothing (every output keeps its sentinel).
int check_validation(const std::string& label, std::vector<float> gap, std::vector<uint8_t> mask,
                     std::vector<int64_t> cu, int64_t T) {
  const int64_t S = static_cast<int64_t>(cu.size()) - 1;
  gap.resize(static_cast<size_t>(T) + 8, 0.0f);
  mask.resize(static_cast<size_t>(T) + 8, 1);
  std::vector<float> w_cpu(static_cast<size_t>(T) + 8, 0.0f);
  std::vector<float> w(static_cast<size_t>(T) + 8, kSentinel);
  int64_t where_cpu = -1, where = -7;
  int status = -7;
  const auto p = P(1, 8);
  const int st_cpu = pcsd::pcsd_weights_cpu(gap.data(), cu.data(), S, T, mask.data(), p,
                                            w_cpu.data(), nullptr, nullptr, nullptr, nullptr, 1,
                                            &where_cpu);
  const int code = pcsd::pcsd_weights_cuda(gap.data(), cu.data(), S, T, mask.data(), p, w.data(),
                                           nullptr, nullptr, nullptr, nullptr, nullptr, &status,
                                           &where);
  bool ok = code == 0 && status == st_cpu && (status == 0 || where == where_cpu);
  if (ok && status >= 1 && status <= 3) {
    for (float x : w) ok = ok && x == kSentinel;  // malformed offsets: the kernels did not run
  }
  std::printf("  %-58s cpu=(%d, %lld) cuda=(%d, %lld) %s\n", label.c_str(), st_cpu,
              (long long)where_cpu, status, (long long)where, ok ? "ok" : "FAIL");
  return ok ? 0 : 1;
}

int validation_cases(std::mt19937_64& rng, int& cases) {
  int failures = 0;
  const std::vector<int64_t> L = {700, 1, 0, 2500, 3000, 5, 0, 1200};
  std::vector<int64_t> cu = {0};
  for (int64_t x : L) cu.push_back(cu.back() + x);
  const int64_t T = cu.back();
  const Batch b = make_batch(rng, L, 0.1, true);  // NaN/Inf garbage at masked positions only
  auto run = [&](const std::string& label, std::vector<float> g, std::vector<int64_t> c, int64_t t) {
    ++cases;
    failures += check_validation(label, std::move(g), b.mask, std::move(c), t);
  };
  run("valid, garbage under the mask", b.gap, cu, T);
  auto c1 = cu;
  c1[0] = 3;
  run("cu[0] != 0", b.gap, c1, T);
  auto c2 = cu;
  c2[5] = c2[4] - 1;  // decreasing at s = 4 (and the end below it)
  c2[7] = 2;          // and at s = 6
  run("cu decreasing twice: the first is named", b.gap, c2, T);
  auto c3 = cu;
  c3.back() = T - 9;
  run("cu[S] < T", b.gap, c3, T);
  auto c4 = cu;
  c4.back() = T + 4096;  // kernels that ran would read past T
  run("cu[S] > T", b.gap, c4, T);
  auto c5 = cu;
  c5[3] = T + 100000;  // far out of range, then decreasing
  run("cu far past T", b.gap, c5, T);
  std::vector<size_t> valid;
  for (size_t t = 0; t < size_t(T); ++t)
    if (b.mask[t]) valid.push_back(t);
  auto g1 = b.gap;
  g1[valid[valid.size() - 3]] = INFINITY;
  g1[valid[valid.size() / 2]] = NAN;  // the first one (a later tile holds the other)
  run("non-finite valid gaps: the first is named", g1, cu, T);
  auto g2 = g1;
  run("a decrease is named before a non-finite gap", g2, c2, T);
  run("no segments, no tokens", {}, {0}, 0);
  run("no segments, tokens", b.gap, {0}, 5);
  run("no tokens, cu[0] != 0", {}, {2}, 0);
  run("no tokens, empty segments", {}, {0, 0, 0}, 0);
  run("no tokens, a decrease", {}, {0, 1, 0}, 0);
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  std::mt19937_64 rng(20261122);
  std::uniform_int_distribution<int64_t> len600(0, 600);
  struct Named {
    std::string name;
    std::vector<int64_t> lengths;
    double holes;
  };
  std::vector<Named> shapes;
  for (int k = 0; k < (quick ? 1 : 3); ++k) {
    std::vector<int64_t> L(40 + k * 20);
    for (auto& x : L) {
      const double c = std::uniform_real_distribution<double>(0, 1)(rng);
      x = c < 0.1 ? 0 : (c < 0.2 ? 1 : len600(rng));
    }
    shapes.push_back({"random varlen " + std::to_string(k), L, 0.1});
  }
  {
    std::vector<int64_t> L(1500);
    for (auto& x : L) x = std::uniform_int_distribution<int64_t>(0, 3)(rng);
    shapes.push_back({"many tiny segments", L, 0.2});
  }
  shapes.push_back({"long segment over many tiles", {5, 20001, 0, 3, 2100}, 0.02});
  shapes.push_back({"tile-sized segments", {2048, 2048, 2047, 2049, 1, 4095}, 0.05});
  shapes.push_back({"single token", {1}, 0.0});
  shapes.push_back({"all empty but one", {0, 0, 0, 17, 0, 0}, 0.1});
  shapes.push_back({"tail not multiple of 8", {13, 7, 2}, 0.1});

  struct NP {
    std::string name;
    pcsd::PcsdParams p;
  };
  std::vector<NP> params = {
      {"n=1..8", P(1, 8)},
      {"n=1..1", P(1, 1)},
      {"n=3..8 a=1", P(3, 8, 1.0)},
      {"n=8..8 a=0", P(8, 8, 0.0)},
      {"n=2..5", P(2, 5)},
      {"n=2..16", P(2, 16)},
      {"n=4..12", P(4, 12)},
      {"n=4..32", P(4, 32)},
      {"n=1..20", P(1, 20)},
      {"n=8..64 general", P(8, 64)},
      {"n_min>n_max", P(12, 6)},
      {"adaptive off", P(1, 8, 0.8, false, true)},
      {"trend off", P(1, 8, 0.8, true, false)},
      {"both off", P(1, 8, 0.8, false, false)},
      {"both off n=1", P(1, 1, 0.8, false, false)},
  };

  int failures = 0, cases = 0;
  for (const auto& sh : shapes) {
    const bool big = sh.name.rfind("random", 0) == 0;
    for (size_t pi = 0; pi < params.size(); ++pi) {
      if (!big && pi > 2 && pi != 7 && pi != 9) continue;  // fewer params on the special shapes
      for (int use_mask = 1; use_mask >= 0; --use_mask) {
        const Batch b = make_batch(rng, sh.lengths, sh.holes, use_mask != 0);
        const Out ref = run_cpu(b, params[pi].p, use_mask != 0);
        for (int variant = 0; variant < 3; ++variant) {
          // 0: aligned with stats, 1: aligned w only, 2: misaligned with stats
          if (variant == 2 && pi > 0) continue;
          Out got;
          std::string err;
          ++cases;
          const std::string label = sh.name + " | " + params[pi].name +
                                    (use_mask ? " | mask" : " | no mask") +
                                    (variant == 1 ? " | w only" : variant == 2 ? " | unaligned" : "");
          if (!run_cuda(b, params[pi].p, use_mask != 0, variant != 1, variant == 2 ? 1 : 0, got,
                        err)) {
            std::printf("  %s: %s FAIL\n", label.c_str(), err.c_str());
            ++failures;
            continue;
          }
          if (variant == 1) {  // compare w only
            Out r2 = ref;
            r2.ad = got.ad = ref.ad;
            r2.r = got.r = ref.r;
            r2.sl = got.sl = ref.sl;
            r2.et = got.et = ref.et;
            failures += compare(label, b, params[pi].p, use_mask != 0, r2, got);
          } else {
            failures += compare(label, b, params[pi].p, use_mask != 0, ref, got);
          }
        }
      }
    }
  }
  // Empty input.
  {
    Batch e;
    e.cu = {0, 0, 0};
    ++cases;
    Out got;
    std::string err;
    if (!run_cuda(e, P(1, 8), true, true, 0, got, err)) {
      std::printf("  empty: %s FAIL\n", err.c_str());
      ++failures;
    }
  }
  failures += validation_cases(rng, cases);
  std::printf("%d passed, %d failed\n", cases - failures, failures);
  return failures ? 1 : 0;
}
