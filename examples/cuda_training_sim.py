"""A small stand-in for a training loop's host side, driving the REAL CUDA runtime.

It loads libcudart.so.12 from the nvidia-cuda-runtime-cu12 wheel (or $CUDART) with ctypes and
makes the calls a data-parallel training step makes: set the device, allocate weights,
copy a batch in, launch kernels, wait for the stream, copy the loss out, free. On a machine
without a GPU every call returns cudaErrorInsufficientDriver (35), which is what otel-ebpf
then reports: the calls, their sizes and their errors are real either way.

    python examples/cuda_training_sim.py --steps 20 --kernels-per-step 50
"""
from __future__ import annotations

import argparse
import ctypes as ct
import glob
import os
import site
import sys
import time


class Dim3(ct.Structure):
    _fields_ = [("x", ct.c_uint), ("y", ct.c_uint), ("z", ct.c_uint)]


def find_cudart() -> str:
    if os.environ.get("CUDART"):
        return os.environ["CUDART"]
    for d in site.getsitepackages() + sys.path:
        hits = glob.glob(os.path.join(d, "nvidia", "cuda_runtime", "lib", "libcudart.so.1*"))
        if hits:
            return hits[0]
    return "libcudart.so.12"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--kernels-per-step", type=int, default=50)
    ap.add_argument("--batch-bytes", type=int, default=4 << 20)
    ap.add_argument("--step-sleep-ms", type=float, default=5.0, help="host-side work per step")
    a = ap.parse_args()
    rt = ct.CDLL(find_cudart())
    rt.cudaLaunchKernel.argtypes = [ct.c_void_p, Dim3, Dim3, ct.c_void_p, ct.c_size_t, ct.c_void_p]
    rt.cudaMemcpy.argtypes = [ct.c_void_p, ct.c_void_p, ct.c_size_t, ct.c_int]
    rt.cudaMemcpyAsync.argtypes = [ct.c_void_p, ct.c_void_p, ct.c_size_t, ct.c_int, ct.c_void_p]
    rt.cudaMalloc.argtypes = [ct.POINTER(ct.c_void_p), ct.c_size_t]
    rt.cudaFree.argtypes = [ct.c_void_p]
    rt.cudaStreamSynchronize.argtypes = [ct.c_void_p]
    host = ct.create_string_buffer(a.batch_bytes)
    weights, grads = ct.c_void_p(), ct.c_void_p()
    rcs = {"cudaSetDevice": rt.cudaSetDevice(0),
           "cudaMalloc": rt.cudaMalloc(ct.byref(weights), 64 << 20)}
    rt.cudaMalloc(ct.byref(grads), 64 << 20)
    fake_kernel = ct.cast(rt.cudaLaunchKernel, ct.c_void_p)  # any host address stands for a kernel stub
    for _step in range(a.steps):
        rt.cudaMemcpyAsync(weights, host, a.batch_bytes, 1, None)  # HostToDevice
        for k in range(a.kernels_per_step):
            rt.cudaLaunchKernel(fake_kernel, Dim3(256 + k % 4, 1, 1), Dim3(128, 1, 1), None, 0, None)
        rt.cudaStreamSynchronize(None)
        rt.cudaMemcpy(host, grads, 4096, 2)  # DeviceToHost: the loss and metrics
        time.sleep(a.step_sleep_ms / 1000)
    rt.cudaFree(weights)  # grads is left allocated on purpose: otel-ebpf reports it as leaked
    rt.cudaDeviceSynchronize()
    print(f"cuda_training_sim: {a.steps} steps x {a.kernels_per_step} kernels; "
          f"first return codes {rcs} (35 = no GPU driver)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
