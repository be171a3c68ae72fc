// pybind11 edge of pcsd._C. Takes raw addresses (ints) and sizes: no torch headers, so the module
// survives torch upgrades. pcsd/ops/kernels.py owns allocation, dtype/device checks and error messages.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "pcsd_kernels.h"

namespace py = pybind11;

namespace {

template <typename T>
T* as_ptr(std::uintptr_t addr) {
  return reinterpret_cast<T*>(addr);
}

pcsd::PcsdParams make_params(int64_t n_min, int64_t n_max, double alpha, double tau_low,
                             double tau_high, double gamma, double beta_gate, double eps_slope,
                             double eps_scale, bool adaptive, bool trend) {
  pcsd::PcsdParams p;
  p.n_min = n_min;
  p.n_max = n_max;
  p.alpha = alpha;
  p.tau_low = tau_low;
  p.tau_high = tau_high;
  p.gamma = gamma;
  p.beta_gate = beta_gate;
  p.eps_slope = eps_slope;
  p.eps_scale = eps_scale;
  p.adaptive = adaptive;
  p.trend = trend;
  return p;
}

// The CPU implementation to run: the `impl` argument, else the PCSD_CPU_KERNEL environment
// variable (read on every call), else "auto". Values: auto | scalar | avx2.
pcsd::CpuImpl parse_impl(const std::string& arg) {
  std::string v = arg;
  const char* from = "impl";
  if (v.empty()) {
    const char* env = std::getenv("PCSD_CPU_KERNEL");
    v = env != nullptr ? env : "";
    from = "PCSD_CPU_KERNEL";
  }
  if (v.empty() || v == "auto") return pcsd::kCpuAuto;
  if (v == "scalar") return pcsd::kCpuScalar;
  if (v == "avx2") {
    if (!pcsd::cpu_has_avx2()) {
      throw py::value_error(std::string(from) + "=avx2 but this CPU lacks AVX2/FMA; use auto or scalar");
    }
    return pcsd::kCpuAvx2;
  }
  throw py::value_error(std::string(from) + " must be one of auto, scalar, avx2, got '" + v + "'");
}

py::tuple weights_cpu(std::uintptr_t gap, std::uintptr_t cu, int64_t num_segments, int64_t total,
                      std::uintptr_t mask, int64_t n_min, int64_t n_max, double alpha,
                      double tau_low, double tau_high, double gamma, double beta_gate,
                      double eps_slope, double eps_scale, bool adaptive, bool trend,
                      std::uintptr_t w, std::uintptr_t ad, std::uintptr_t r, std::uintptr_t slope,
                      std::uintptr_t eta, int num_threads, const std::string& impl) {
  const auto p = make_params(n_min, n_max, alpha, tau_low, tau_high, gamma, beta_gate, eps_slope,
                             eps_scale, adaptive, trend);
  const pcsd::CpuImpl which = parse_impl(impl);
  int64_t err_index = -1;
  int status;
  {
    py::gil_scoped_release release;
    status = pcsd::pcsd_weights_cpu(as_ptr<const float>(gap), as_ptr<const int64_t>(cu),
                                    num_segments, total, as_ptr<const uint8_t>(mask), p,
                                    as_ptr<float>(w), as_ptr<float>(ad), as_ptr<float>(r),
                                    as_ptr<float>(slope), as_ptr<float>(eta), num_threads,
                                    &err_index, which);
  }
  return py::make_tuple(status, err_index);
}

#ifdef PCSD_WITH_CUDA
// check: read the kernels' validation back (one 32-byte transfer, one stream synchronisation)
// and return (status, err_index) as pcsd_weights_cpu does; without it (0, -1) and no host sync.
py::tuple weights_cuda(std::uintptr_t gap, std::uintptr_t cu, int64_t num_segments, int64_t total,
                       std::uintptr_t mask, int64_t n_min, int64_t n_max, double alpha,
                       double tau_low, double tau_high, double gamma, double beta_gate,
                       double eps_slope, double eps_scale, bool adaptive, bool trend,
                       std::uintptr_t w, std::uintptr_t ad, std::uintptr_t r, std::uintptr_t slope,
                       std::uintptr_t eta, std::uintptr_t stream, bool check) {
  const auto p = make_params(n_min, n_max, alpha, tau_low, tau_high, gamma, beta_gate, eps_slope,
                             eps_scale, adaptive, trend);
  int code;
  int status = 0;
  int64_t err_index = -1;
  {
    py::gil_scoped_release release;
    code = pcsd::pcsd_weights_cuda(as_ptr<const float>(gap), as_ptr<const int64_t>(cu),
                                   num_segments, total, as_ptr<const uint8_t>(mask), p,
                                   as_ptr<float>(w), as_ptr<float>(ad), as_ptr<float>(r),
                                   as_ptr<float>(slope), as_ptr<float>(eta),
                                   reinterpret_cast<void*>(stream), check ? &status : nullptr,
                                   check ? &err_index : nullptr);
  }
  if (code != 0) {
    throw std::runtime_error(std::string("pcsd CUDA kernel failed: ") +
                             pcsd::pcsd_cuda_error_string(code));
  }
  return py::make_tuple(status, err_index);
}
#endif

// Which CPU implementation pcsd_weights_cpu runs for these window parameters ("avx2"/"scalar").
std::string cpu_kernel(int64_t n_min, int64_t n_max, double alpha, const std::string& impl) {
  pcsd::PcsdParams p;
  p.n_min = n_min;
  p.n_max = n_max;
  p.alpha = alpha;
  return pcsd::cpu_kernel_name(p, parse_impl(impl));
}

bool vexp_nonpositive(std::uintptr_t x, std::uintptr_t y, int64_t n) {
  return pcsd::cpu_vexp_nonpositive(as_ptr<const float>(x), as_ptr<float>(y), n);
}

py::dict build_info() {
  py::dict d;
  d["version"] = PCSD_VERSION;
  d["cpu_kernels"] = true;
  d["cpu_avx2"] = pcsd::cpu_has_avx2();
#ifdef PCSD_WITH_CUDA
  d["cuda_kernels"] = true;
  d["cuda_archs"] = PCSD_CUDA_ARCHS;
#else
  d["cuda_kernels"] = false;
  d["cuda_archs"] = "";
#endif
  d["compiler"] = PCSD_COMPILER;
  d["build_type"] = PCSD_BUILD_TYPE;
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "pcsd native kernels (private; use pcsd.ops)";
  m.attr("__version__") = PCSD_VERSION;
  m.def("build_info", &build_info, "What this module was compiled with.");
  m.def("echo", [](int64_t x) { return x; }, "Round-trips an integer (smoke test).");
  m.def("pcsd_weights_cpu", &weights_cpu,
        "Segmented PCSD weights on CPU buffers (raw addresses). impl: auto | scalar | avx2; empty "
        "reads the PCSD_CPU_KERNEL environment variable (default auto).",
        py::arg("gap"), py::arg("cu"), py::arg("num_segments"), py::arg("total"), py::arg("mask"),
        py::arg("n_min"), py::arg("n_max"), py::arg("alpha"), py::arg("tau_low"),
        py::arg("tau_high"), py::arg("gamma"), py::arg("beta_gate"), py::arg("eps_slope"),
        py::arg("eps_scale"), py::arg("adaptive"), py::arg("trend"), py::arg("w"), py::arg("ad"),
        py::arg("r"), py::arg("slope"), py::arg("eta"), py::arg("num_threads"),
        py::arg("impl") = "");
  m.def("cpu_kernel", &cpu_kernel,
        "The CPU implementation ('avx2' or 'scalar') that pcsd_weights_cpu runs for these window "
        "parameters and impl (empty: PCSD_CPU_KERNEL, default auto).",
        py::arg("n_min"), py::arg("n_max"), py::arg("alpha"), py::arg("impl") = "");
  m.def("vexp_nonpositive", &vexp_nonpositive,
        "exp(x) for x <= 0 with the AVX2 kernel's polynomial, float32 buffers (raw addresses); "
        "False without AVX2. For the accuracy test.",
        py::arg("x"), py::arg("y"), py::arg("n"));
#ifdef PCSD_WITH_CUDA
  m.def("pcsd_weights_cuda", &weights_cuda,
        "Segmented PCSD weights on CUDA buffers (raw device addresses, stream). check: return the "
        "kernels' validation (status, err_index) as pcsd_weights_cpu does (one host sync); "
        "without it (0, -1), asynchronous.",
        py::arg("gap"), py::arg("cu"), py::arg("num_segments"), py::arg("total"), py::arg("mask"),
        py::arg("n_min"), py::arg("n_max"), py::arg("alpha"), py::arg("tau_low"),
        py::arg("tau_high"), py::arg("gamma"), py::arg("beta_gate"), py::arg("eps_slope"),
        py::arg("eps_scale"), py::arg("adaptive"), py::arg("trend"), py::arg("w"), py::arg("ad"),
        py::arg("r"), py::arg("slope"), py::arg("eta"), py::arg("stream"),
        py::arg("check") = false);
#endif
}
