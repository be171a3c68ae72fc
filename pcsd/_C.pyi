"""Stubs for the private compiled module pcsd._C (csrc/bindings.cpp). Use pcsd.ops.kernels instead."""

__version__: str

def build_info() -> dict[str, object]: ...
def echo(x: int) -> int: ...
def pcsd_weights_cpu(
    gap: int,
    cu: int,
    num_segments: int,
    total: int,
    mask: int,
    n_min: int,
    n_max: int,
    alpha: float,
    tau_low: float,
    tau_high: float,
    gamma: float,
    beta_gate: float,
    eps_slope: float,
    eps_scale: float,
    adaptive: bool,
    trend: bool,
    w: int,
    ad: int,
    r: int,
    slope: int,
    eta: int,
    num_threads: int,
    impl: str = "",
) -> tuple[int, int]:
    """impl: "auto" | "scalar" | "avx2"; "" reads PCSD_CPU_KERNEL (default auto)."""

def cpu_kernel(n_min: int, n_max: int, alpha: float, impl: str = "") -> str:
    """The CPU implementation ("avx2" or "scalar") pcsd_weights_cpu runs for these parameters."""

def vexp_nonpositive(x: int, y: int, n: int) -> bool: ...
def pcsd_weights_cuda(
    gap: int,
    cu: int,
    num_segments: int,
    total: int,
    mask: int,
    n_min: int,
    n_max: int,
    alpha: float,
    tau_low: float,
    tau_high: float,
    gamma: float,
    beta_gate: float,
    eps_slope: float,
    eps_scale: float,
    adaptive: bool,
    trend: bool,
    w: int,
    ad: int,
    r: int,
    slope: int,
    eta: int,
    stream: int,
) -> None: ...
