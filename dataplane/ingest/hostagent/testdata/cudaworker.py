"""A user's worker on a CUDA host agent, for external_gpu_test.go (GPU only).

Arguments: model, worker socket, library: cupy or torch, and optionally
"slow". The models are worker.py's, computed on the GPU over the slot's
device memory (req.cupy() / req.torch(): no copy), replying with a device
array: affine (float32 rows of 16, y = 2x + 1, computed in place in the
input buffer, then replied from there) and rowsum (int32 rows of 16, one
int32 sum per row, replied from a new array).

slow (torch, affine): before y, queues long GPU work (matrix products) that
y depends on, and checks that it is still running when req.reply() is
called; if it is not, the request fails saying so, as the test would then
not show that reply waits for the GPU before it tells the host agent done.
"""
import sys

import cupy as cp

import lovelock_ingest

model, sock, lib = sys.argv[1], sys.argv[2], sys.argv[3]
slow = len(sys.argv) > 4 and sys.argv[4] == "slow"
# One-time set-up (the CUDA context, cupy's kernels compiled by NVRTC) before
# attaching, so that the test's first request does not wait for it.
w = cp.arange(32, dtype=cp.float32).reshape(-1, 16)
w *= 2
w += 1
cp.empty(128, cp.uint8)[:] = w.view(cp.uint8).reshape(-1)
cp.sum(w.view(cp.int32), axis=1, dtype=cp.int32)
if lib == "torch":
    import torch
    torch.ones(16, device="cuda").mul_(2).add_(1)
cp.cuda.runtime.deviceSynchronize()

requests = lovelock_ingest.serve(model, socket=sock)
busy = None
for req in requests:
    if lib == "cupy":
        if model == "affine":
            x = req.cupy("float32", (-1, 16))
            assert isinstance(x, cp.ndarray) and x.data.ptr == req._s["in_ptr"], "not a view of the input buffer"
            x *= 2  # in place: the DPU side reads these writes in the slot's input buffer
            x += 1
            req.reply(x)
        elif model == "rowsum":
            x = req.cupy("int32", (-1, 16))
            req.reply(cp.sum(x, axis=1, dtype=cp.int32))  # wraps, as numpy's and Go's int32 sums do
        else:
            req.fail(f"cudaworker: no model {model}")
        continue
    if model == "affine" and slow:
        x = req.torch("float32", (-1, 16))
        if busy is None:
            g = torch.Generator(device="cuda").manual_seed(1)
            busy = torch.randn(2048, 2048, device="cuda", generator=g) / 64
            torch.cuda.synchronize()  # the first products' set-up (cuBLAS) stays out of the timing below
        acc = busy
        for _ in range(600):  # 10 TFLOP: about 150 ms on an H100 in FP32, queued in about 10 ms
            acc = torch.tanh(acc @ busy)
        # 0 * a finite sum is ±0, and 2x + 1 ± 0 is 2x + 1 to the bit: y waits for acc without changing.
        y = x * 2 + 1 + acc.sum() * 0
        ev = torch.cuda.Event()
        ev.record()
        if ev.query():
            req.fail("cudaworker: the GPU work had finished before reply: make the busy loop longer")
            continue
        req.reply(y)
    elif model == "affine":
        x = req.torch("float32", (-1, 16))
        assert isinstance(x, torch.Tensor) and x.is_cuda and x.data_ptr() == req._s["in_ptr"], "not a view of the input buffer"
        x.mul_(2).add_(1)
        req.reply(x)
    elif model == "rowsum":
        x = req.torch("int32", (-1, 16))
        req.reply(x.sum(dim=1, dtype=torch.int32))
    else:
        req.fail(f"cudaworker: no model {model}")
