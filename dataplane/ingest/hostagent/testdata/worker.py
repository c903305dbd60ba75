"""A user's worker for the host agent's tests (external_test.go).

Models: affine (float32 rows of 16, y = 2x + 1, computed in place in the
input's pages to prove they are the DPU-written ones) and rowsum (int32
rows of 16, one int32 sum per row, written straight into the output
buffer). The first input value makes it misbehave: -1 a short output, -2
exit mid-request, -3 hang past the run timeout, -4 fail with a message.
Model late copies its input to its output, and an input starting with "A"
first sleeps 5 s, past the run timeout, then writes its output anyway.
"""
import mmap
import os
import sys
import time

import numpy as np

import lovelock_ingest


def pages_of(a):
    """The object at the end of a's base chain: what its bytes live in."""
    while isinstance(a, np.ndarray):
        a = a.base
    return a.obj if isinstance(a, memoryview) else a


model, sock = sys.argv[1], sys.argv[2]
for req in lovelock_ingest.serve(model, socket=sock):
    if model == "affine":
        x = req.numpy(np.float32, (-1, 16))
        assert isinstance(pages_of(x), mmap.mmap), "the input view is not over the slot's mapping"
        first = float(x[0, 0])
        if first == -1:
            req.reply(x[:-1] * 2 + 1)
            continue
        if first == -2:
            os._exit(3)
        if first == -3:
            time.sleep(60)
        if first == -4:
            req.fail("the model refuses -4")
            continue
        x *= 2  # in place: the host and DPU see these writes in the slot's input buffer
        x += 1
        req.reply(x)
    elif model == "rowsum":
        x = req.numpy(np.int32, (-1, 16))
        out = req.output(np.int32, (x.shape[0],))
        assert isinstance(pages_of(out), mmap.mmap)
        np.sum(x, axis=1, dtype=np.int32, out=out)
        req.reply(out)  # out is the output buffer itself: nothing copied
    elif model == "late":
        mine = req.numpy().copy()
        if mine[0] == ord("A"):
            time.sleep(5)
        req.reply(mine)  # copies into the output buffer, then says done
    else:
        req.reply(req.numpy())
