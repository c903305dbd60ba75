"""A user's worker on a CUDA host agent, for external_gpu_test.go (GPU only).

Arguments: model, worker socket, library: cupy or torch, and optionally
"slow". The models are worker.py's, computed on the GPU over the slot's
device memory (req.cupy() / req.torch(): no copy), replying with a device
array: affine (float32 rows of 16, y = 2x + 1, computed in place in the
input buffer, then replied from there) and rowsum (int32 rows of 16, one
int32 sum per row, replied from a new array).

slow (torch, affine): before y, queues a long GPU kernel that y waits for
on the stream, and checks that it is still running when req.reply() is
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
        # One kernel that keeps the GPU busy for about half a second
        # (torch.cuda._sleep spins for that many clock cycles), queued
        # before y on the same stream, so y lands only after it: the Python
        # loop of matrix products used before was launched no faster than
        # the GPU ran it on the lent H100, and had finished by reply.
        torch.cuda._sleep(1_000_000_000)
        y = x * 2 + 1
        ev = torch.cuda.Event()
        ev.record()
        if ev.query():
            req.fail("cudaworker: the GPU work had finished before reply: make the sleep longer")
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
