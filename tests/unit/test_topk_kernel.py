"""The top-k kernel of the GPU path (engines.topk.topk_kernel_source), its CUDA source compiled here by g++ with a few
macros standing in for CUDA's (a POSIX thread per GPU thread; warp shuffles through a shared array between barriers)
and run over its whole grid on the CPU, against the numpy rule (engines.topk.topk_host: float64 softmax, a stable
argsort), which shares no code with it. Checks the indices (ties: the lower class first; NaN ranks last), the scores
(float32 against float64, rtol 1e-5) and the packing of both into one int32 row. The float16 variant and the launch
through CuPy run in tests/gpu/test_topk_gpu.py."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from engines.topk import TOPK_MAX, TOPK_ROWS_PER_BLOCK, topk_host, topk_kernel_source, unpack

# CUDA's names for g++: every thread of the grid is a POSIX thread, a warp's 32 of them at a time, and a warp
# shuffle is an exchange through a shared array between two barriers of those 32
_PRELUDE = r"""
#include <math.h>
#include <pthread.h>
#include <string.h>
#undef INFINITY
struct uint3_ { unsigned x, y, z; };
static thread_local uint3_ blockIdx, threadIdx;
static uint3_ blockDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, sizeof i); return i; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, sizeof f); return f; }
static pthread_barrier_t warp_barrier;
static float warp_f[32];
static int warp_i[32];
static float __shfl_xor_sync(unsigned, float v, int lanes) {
    unsigned l = threadIdx.x & 31;
    warp_f[l] = v; pthread_barrier_wait(&warp_barrier);
    float got = warp_f[l ^ lanes]; pthread_barrier_wait(&warp_barrier);
    return got;
}
static int __shfl_xor_sync(unsigned, int v, int lanes) {
    unsigned l = threadIdx.x & 31;
    warp_i[l] = v; pthread_barrier_wait(&warp_barrier);
    int got = warp_i[l ^ lanes]; pthread_barrier_wait(&warp_barrier);
    return got;
}
"""

_DRIVER = r"""
struct Args { const float* x; int rows, cols, k, softmax; int* out; unsigned block, thread; };
static void* lane(void* p) {
    Args* a = (Args*)p;
    blockIdx.x = a->block; threadIdx.x = a->thread;
    trtc_topk_f32(a->x, a->rows, a->cols, a->k, a->softmax, a->out);
    return 0;
}
extern "C" int run_grid(const float* x, int rows, int cols, int k, int softmax, int* out, int per_block) {
    blockDim.x = 32 * per_block;
    pthread_barrier_init(&warp_barrier, 0, 32);
    for (unsigned b = 0; b < (unsigned)(rows + per_block - 1) / per_block; b++)
        for (unsigned w = 0; w < (unsigned)per_block; w++) {
            pthread_t t[32];
            Args a[32];
            for (unsigned l = 0; l < 32; l++) {
                a[l] = Args{x, rows, cols, k, softmax, out, b, 32 * w + l};
                if (pthread_create(&t[l], 0, lane, &a[l])) return -1;
            }
            for (unsigned l = 0; l < 32; l++) pthread_join(t[l], 0);
        }
    pthread_barrier_destroy(&warp_barrier);
    return 0;
}
"""


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    if not shutil.which("g++"):
        pytest.skip("needs g++ to run the kernel's source on the CPU")
    folder = tmp_path_factory.mktemp("topk")
    (folder / "k.cpp").write_text(_PRELUDE + topk_kernel_source(half=False) + _DRIVER)
    subprocess.run(["g++", "-O1", "-shared", "-fPIC", "-pthread", "-o", str(folder / "k.so"), str(folder / "k.cpp")],
                   check=True)
    return ctypes.CDLL(str(folder / "k.so")).run_grid


def _run(kernel, x: np.ndarray, k: int, softmax: bool) -> tuple[np.ndarray, np.ndarray]:
    x = np.ascontiguousarray(x, np.float32)
    out = np.full((x.shape[0], 2 * k), -7, np.int32)  # rows past the grid's would keep -7
    p = ctypes.c_void_p
    assert kernel(p(x.ctypes.data), ctypes.c_int(x.shape[0]), ctypes.c_int(x.shape[1]), ctypes.c_int(k),
                  ctypes.c_int(int(softmax)), p(out.ctypes.data), ctypes.c_int(TOPK_ROWS_PER_BLOCK)) == 0
    return unpack(out)


def _logits(rows: int, cols: int, seed: int) -> np.ndarray:
    """Logits on a 1/64 grid, so rows hold exact ties (and distinct values differ enough that float32 and
    float64 softmax order them alike)."""
    rng = np.random.default_rng(seed)
    return np.round(rng.normal(0, 3, (rows, cols)) * 64) / 64


@pytest.mark.parametrize("softmax", [True, False])
@pytest.mark.parametrize("k", [1, 5, TOPK_MAX])
def test_the_kernel_gives_the_numpy_rule(kernel, softmax, k):
    # 70 rows: 18 blocks of 4 warps, the last with two idle warps; for k = 32 (each warp shuffle is two barriers of
    # 32 POSIX threads here) 10 rows: 3 blocks, the last alike
    x = _logits(70 if k < TOPK_MAX else 10, 1000, seed=k)
    x[3, [10, 20, 30]] = x[3].max() + 1  # a three-way tie for first place
    idx, scores = _run(kernel, x, k, softmax)
    ref_idx, ref_scores = topk_host(x.astype(np.float32), k, softmax)
    assert (idx == ref_idx).all(), np.argwhere(idx != ref_idx)[:5]
    assert list(idx[3, :min(k, 3)]) == [10, 20, 30][:k]  # ties: the lower class first
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-7)


def test_a_row_with_nan_ranks_it_last_and_short_rows(kernel):
    x = _logits(3, 10, seed=1).astype(np.float32)
    x[1, 2] = np.nan
    idx, scores = _run(kernel, x, 10, softmax=False)
    ref_idx, ref_scores = topk_host(x, 10, False)
    assert (idx == ref_idx).all() and idx[1, -1] == 2 and np.isnan(scores[1, -1])
    np.testing.assert_array_equal(scores[[0, 2]], ref_scores[[0, 2]])
    idx, _ = _run(kernel, x[:, :3], 3, softmax=True)  # k equal to the number of classes
    assert (idx == topk_host(x[:, :3], 3, True)[0]).all()


def _nvrtc():
    """libnvrtc and the CUDA headers from the nvidia wheels torch's CUDA build brings (no GPU needed to compile),
    or None."""
    import glob
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations if spec else []):
        for lib in sorted(glob.glob(f"{root}/*/lib/libnvrtc.so.*")) + sorted(glob.glob(f"{root}/cuda_nvrtc/lib/"
                                                                                       "libnvrtc.so.*")):
            include = [d for d in glob.glob(f"{root}/*/include") if glob.glob(f"{d}/cuda_fp16.h")]
            if include and "builtins" not in lib and ".alt." not in lib:
                # NVRTC opens its builtins library by name at compile time: load it first (outside the loader's
                # path it is not found otherwise)
                for builtins in glob.glob(lib.replace("libnvrtc.so", "libnvrtc-builtins.so") + "*"):
                    ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
                return ctypes.CDLL(lib), include[0]
    return None


@pytest.mark.parametrize("half", [False, True])
def test_the_kernel_compiles_under_nvrtc(half):
    """What CuPy's RawKernel does on the GPU machine, without a GPU: NVRTC compiles the source for an H100
    (compute_90), with only the CUDA headers on the include path; the PTX holds the kernel's entry point."""
    found = _nvrtc()
    if found is None:
        pytest.skip("needs libnvrtc and the CUDA headers (the nvidia wheels of torch's CUDA build)")
    lib, include = found
    name = "trtc_topk_f16" if half else "trtc_topk_f32"
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), topk_kernel_source(half).encode(), b"topk.cu", 0, None,
                                  None) == 0
    opts = [b"--gpu-architecture=compute_90", f"-I{include}".encode()]
    status = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    assert status == 0, log.value.decode(errors="replace")
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, ptx)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    assert f".entry {name}".encode() in ptx.value
