"""Run by tests/twin/test_graphs.py under torchrun on the twin (2 ranks, NCCL): real ``torch.cuda.graph`` capture
and replay, with an all_reduce captured through ProcessGroupNCCL (otel_ebpf/twin/cudart_capture.c,
cudart_graphs.c, nccl_group.c).

One eager all_reduce first, so the communicator exists before the capture. Then ``buf`` and ``buf2`` (ones, put
on the device by a copy: kernels do nothing on the twin) are all-reduced inside a captured graph, with elementwise
kernels on the capturing stream and on a side stream that joins the capture and is joined back
(``wait_stream``). ``buf`` goes the synchronous way (torch 2.11 runs it on the current stream), ``buf2`` with
``async_op=True`` and ``work.wait()`` (on ProcessGroupNCCL's own stream, which joins the capture through an event,
and is joined back the same way). Capturing must not run the all_reduces (both stay 1); each replay must (an
in-place sum over 2 ranks doubles them: 2 after one replay, 8 after three). Each rank writes
``<out>/rank<N>.json`` with those values, its pid (the twin's stats file is per pid) and what torch said while
capturing.

Then captures that must fail, run after the results above are written: a host synchronisation of the capturing
stream through torch (``torch.cuda.current_stream().synchronize()``); a side stream that joins the capture and is
not joined back (its copy is left out of the graph: cudaErrorStreamCaptureUnjoined); and, through the runtime's own
API from ctypes, a copy to pageable host memory on a capturing stream, which is host-synchronous. They launch no
kernel. Their outcome goes to ``<out>/rank<N>.refused.json``.
"""
import ctypes
import json
import os
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

out = Path(sys.argv[1])
device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=device)
rank = dist.get_rank()
found: dict[str, object] = {"rank": rank, "pid": os.getpid()}

warm = torch.full((4,), rank + 1.0).to(device)
dist.all_reduce(warm)  # the communicator exists before the capture
found["warm"] = warm.cpu().tolist()

x = torch.arange(8, dtype=torch.float32).to(device)
buf = torch.ones(16).to(device)
buf2 = torch.ones(4).to(device)
side = torch.cuda.Stream()
torch.cuda.synchronize()

g = torch.cuda.CUDAGraph()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with torch.cuda.graph(g):
        found["capturing_inside"] = torch.cuda.is_current_stream_capturing()
        y = x * 2 + 1
        side.wait_stream(torch.cuda.current_stream())  # the side stream joins the capture
        with torch.cuda.stream(side):
            found["side_capturing"] = torch.cuda.is_current_stream_capturing()
            z = x + 1
        torch.cuda.current_stream().wait_stream(side)  # and is joined back
        dist.all_reduce(buf)
        dist.all_reduce(buf2, async_op=True).wait()
found["warnings"] = [str(w.message) for w in caught]
found["capturing_after"] = torch.cuda.is_current_stream_capturing()
torch.cuda.synchronize()
found["after_capture"] = buf.cpu().tolist() + buf2.cpu().tolist()  # the capture ran nothing

g.replay()
torch.cuda.synchronize()
found["after_one_replay"] = buf.cpu().tolist() + buf2.cpu().tolist()
g.replay()
g.replay()
torch.cuda.synchronize()
found["after_three_replays"] = buf.cpu().tolist() + buf2.cpu().tolist()
(out / f"rank{rank}.json").write_text(json.dumps(found))


def chain(exc: BaseException | None) -> list[str]:
    """The messages of an exception and those it was raised during (capture_end raises in __exit__)."""
    seen: list[str] = []
    while exc is not None and len(seen) < 4:
        seen.append(str(exc))
        exc = exc.__context__
    return seen


refused: dict[str, object] = {}
g2 = torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(g2):
        torch.cuda.current_stream().synchronize()
    refused["sync_raised"] = []
except RuntimeError as exc:
    refused["sync_raised"] = chain(exc)
refused["capturing_after_sync"] = torch.cuda.is_current_stream_capturing()

g3 = torch.cuda.CUDAGraph()
copy = torch.empty_like(x)
try:
    with torch.cuda.graph(g3):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            copy.copy_(x)  # a device-to-device copy: a node, no kernel
    refused["unjoined_raised"] = []
except RuntimeError as exc:
    refused["unjoined_raised"] = chain(exc)
with torch.cuda.stream(side):
    refused["side_capturing_after"] = torch.cuda.is_current_stream_capturing()

# The runtime's API as a C extension calls it, on a stream of torch's: BeginCapture, a pageable copy (refused),
# the capture's status (invalidated), EndCapture (the capture is gone, no graph), then the stream works again.
cudart = ctypes.CDLL("libcudart.so.13")
handle = ctypes.c_void_p(torch.cuda.Stream().cuda_stream)
host = ctypes.create_string_buffer(64)
status = ctypes.c_int(-1)
graph = ctypes.c_void_p(1)
codes = {"begin_legacy": cudart.cudaStreamBeginCapture(ctypes.c_void_p(0), 0)}
codes["begin"] = cudart.cudaStreamBeginCapture(handle, 0)
codes["begin_again"] = cudart.cudaStreamBeginCapture(handle, 0)
codes["pageable_copy"] = cudart.cudaMemcpyAsync(host, ctypes.c_void_p(x.data_ptr()), ctypes.c_size_t(32), 2, handle)
codes["is_capturing"] = cudart.cudaStreamIsCapturing(handle, ctypes.byref(status))
refused["status_after_copy"] = status.value
codes["end"] = cudart.cudaStreamEndCapture(handle, ctypes.byref(graph))
refused["graph_after_end"] = graph.value
codes["end_again"] = cudart.cudaStreamEndCapture(handle, ctypes.byref(graph))
codes["copy_after_end"] = cudart.cudaMemcpyAsync(host, ctypes.c_void_p(x.data_ptr()), ctypes.c_size_t(32), 2, handle)
refused["copied"] = list(ctypes.cast(host, ctypes.POINTER(ctypes.c_float))[:8])
cudart.cudaGetLastError()
refused["codes"] = codes
(out / f"rank{rank}.refused.json").write_text(json.dumps(refused))
dist.destroy_process_group()
