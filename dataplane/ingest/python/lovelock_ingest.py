"""Serve a Lovelock ingest model from your own Python code, without a copy.

The DPU writes each client's input straight into a slot buffer on the GPU
host. This module attaches to the host agent's worker socket, maps those
buffers once, and hands your code each input where it landed:

    import numpy as np, lovelock_ingest
    for req in lovelock_ingest.serve("mymodel", socket="/run/lovelock/ingest-workers.sock"):
        x = req.numpy(np.float32, (-1, 64))   # a view of the bytes the DPU wrote: no copy
        y = my_model(x)                       # your code, unchanged
        req.reply(y)                          # into the slot's output buffer; tells the host agent

Shared-memory devices (the testbed, CI): req.numpy() is an ndarray over the
mmap of the slot's memfd. CUDA devices: req.cupy() / req.torch() are device
arrays over the slot (legacy CUDA IPC handle opened with cupy, then DLPack to
PyTorch); tested on an H100 (hostagent's external_gpu_test.go). The worker
opens CUDA slots when it attaches; import torch before serve() too, if the
model uses it, so that the first request does not wait for that.
Needs numpy; cupy and torch only for CUDA. The protocol is in
dataplane/ingest/hostagent/workers.go; docs/ingest.md tells the rest.
"""
import base64
import json
import mmap
import os
import socket as _socket
import struct

import numpy as np

PROTOCOL = 1
_MAXFDS = 253


def _send(sock, obj):
    body = json.dumps(obj).encode()
    sock.sendall(struct.pack(">I", len(body)) + body)


def _recv(sock):
    """Reads one frame: (dict, [descriptors]). ConnectionError at EOF."""
    flags = getattr(_socket, "MSG_CMSG_CLOEXEC", 0)
    hdr, fds, msg_flags, _ = _socket.recv_fds(sock, 4, _MAXFDS, flags)
    if msg_flags & getattr(_socket, "MSG_CTRUNC", 8):
        raise ConnectionError("lovelock_ingest: descriptors cut off (too many slot buffers)")
    body = b""
    try:
        while len(hdr) < 4 or len(body) < struct.unpack(">I", hdr[:4])[0]:
            chunk = sock.recv(4 - len(hdr) if len(hdr) < 4 else struct.unpack(">I", hdr)[0] - len(body))
            if not chunk:
                raise ConnectionError("lovelock_ingest: the host agent closed the worker socket (it stopped, restarted, "
                                      "or disconnected this worker after a run timeout): start the worker again")
            if len(hdr) < 4:
                hdr += chunk
            else:
                body += chunk
        return json.loads(body), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


class Request:
    """One input in one slot. Reply exactly once: reply() or fail()."""

    def __init__(self, worker, msg):
        self.id, self.gpu, self.slot = msg["request"], msg["gpu"], msg["slot"]
        self.nbytes, self.out_nbytes = msg["len"], msg["out_len"]  # input size; output size the host expects
        self._w, self._s = worker, worker._slots[(self.gpu, self.slot)]
        self.replied = False

    def numpy(self, dtype=np.uint8, shape=None):
        """The input as an ndarray over the slot's pages (shared memory only): no copy, writable."""
        return self._view(self._s["in"], self.nbytes, dtype, shape)

    def output(self, dtype=np.uint8, shape=None):
        """The output buffer's first out_nbytes as an ndarray: write into it, then reply(it) copies nothing."""
        return self._view(self._s["out"], self.out_nbytes, dtype, shape)

    def _view(self, mm, n, dtype, shape):
        if mm is None:
            raise TypeError("lovelock_ingest: this slot is CUDA memory: use req.cupy() or req.torch()")
        dt = np.dtype(dtype)
        if n % dt.itemsize:
            raise ValueError(f"lovelock_ingest: {n} bytes is not a whole number of {dt} items")
        a = np.frombuffer(mm, dtype=dt, count=n // dt.itemsize)
        return a if shape is None else a.reshape(shape)

    def cupy(self, dtype="uint8", shape=None, output=False):
        """The input (or the output buffer) as a cupy array on the GPU: no copy."""
        cp = self._w._cuda()
        ptr = self._s["out_ptr" if output else "in_ptr"]
        n = self.out_nbytes if output else self.nbytes
        mem = cp.cuda.UnownedMemory(ptr, n, self._w, device_id=self._s["gpu"])
        a = cp.ndarray((n,), dtype=cp.uint8, memptr=cp.cuda.MemoryPointer(mem, 0)).view(dtype)
        return a if shape is None else a.reshape(shape)

    def torch(self, dtype="uint8", shape=None, output=False):
        """The input (or output buffer) as a torch CUDA tensor through DLPack: no copy. dtype is numpy's."""
        try:
            import torch
        except ImportError as e:
            raise ImportError("lovelock_ingest: req.torch() needs PyTorch (pip install torch)") from e
        return torch.from_dlpack(self.cupy(dtype, shape, output))

    def reply(self, y=None):
        """Writes y (array-like, bytes, or None if already written through output()) and tells the host."""
        if self.replied:
            raise RuntimeError(f"lovelock_ingest: request {self.id} answered twice")
        if self._s["out"] is None:
            n = self._reply_cuda(y)
        elif y is None:
            n = self.out_nbytes
        else:
            src = np.ascontiguousarray(y).reshape(-1).view(np.uint8)
            n = src.nbytes
            if n > len(self._s["out"]):
                self.fail(f"output of {n} bytes does not fit the {len(self._s['out'])}-byte output buffer")
                raise ValueError(f"lovelock_ingest: output of {n} bytes, the slot holds {len(self._s['out'])}")
            dst = np.frombuffer(self._s["out"], dtype=np.uint8, count=n)
            if not np.shares_memory(dst, src):  # written in place through output(): nothing to copy
                dst[:] = src
        self._done({"len": int(n)})

    def _reply_cuda(self, y):
        if y is None:
            return self.out_nbytes
        cp = self._w._cuda()
        src = cp.ascontiguousarray(cp.from_dlpack(y) if hasattr(y, "__dlpack__") else cp.asarray(y)).reshape(-1).view(cp.uint8)
        dst = self.cupy(output=True) if src.nbytes <= self.out_nbytes else None
        if dst is None:
            self.fail(f"output of {src.nbytes} bytes, the host expects {self.out_nbytes}")
            raise ValueError(f"lovelock_ingest: output of {src.nbytes} bytes, the host expects {self.out_nbytes}")
        dst[: src.nbytes] = src
        cp.cuda.runtime.deviceSynchronize()  # the DPU reads the output as soon as the host agent hears done
        return src.nbytes

    def fail(self, message):
        """Fails the request: the client gets model-failed with message."""
        self._done({"err": str(message) or "failed"})

    def _done(self, fields):
        if self.replied:
            return
        self.replied = True
        try:
            _send(self._w.sock, dict(op="done", request=self.id, **fields))
        except OSError as e:
            raise ConnectionError(f"lovelock_ingest: the host agent is gone ({e}): start the worker again") from e


def _importable(name):
    """Whether module name can be imported, without importing it."""
    import importlib.util
    return importlib.util.find_spec(name) is not None


class Worker:
    """A connection to the host agent serving one model; iterate it for Requests."""

    def __init__(self, model, socket="/run/lovelock/ingest-workers.sock"):
        self.model, self.sock, self._slots, self._cp = model, _socket.socket(_socket.AF_UNIX), {}, None
        self._req = None  # the request in hand
        try:
            self.sock.connect(socket)
            _send(self.sock, {"op": "attach", "version": PROTOCOL, "model": model})
            msg, fds = _recv(self.sock)
        except BaseException:
            self.sock.close()
            raise
        kept = set()
        try:
            if msg.get("err"):
                self.sock.close()
                raise ConnectionRefusedError(f"lovelock_ingest: the host agent refused model {model!r}: {msg['err']}")
            self.row_bytes, self.epoch = msg["row_bytes"], msg["epoch"]
            it = iter(fds)
            for g in msg["gpus"]:
                for s in g["slots"]:
                    slot = self._slots[(g["index"], s["slot"])] = {"kind": g["handle_kind"], "gpu": g["index"]}
                    for k in ("in", "out"):
                        slot[k] = None
                        if g["handle_kind"] == "memfd":  # map once; the views of every request share it
                            slot[k] = mmap.mmap(next(it), s[k + "_bytes"], mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                        elif g["handle_kind"] == "cuda-ipc":
                            slot[k + "_ipc"] = base64.b64decode(s[k + "_ipc"])
                        else:  # cuda-fd: a POSIX descriptor of a cuMemCreate allocation, which cupy cannot map
                            slot[k + "_fd"] = next(it)
                            kept.add(slot[k + "_fd"])
        finally:
            for fd in set(fds) - kept:  # an mmap keeps its pages without the descriptor
                os.close(fd)
        # CUDA slots are opened now, while no request waits, not in the first
        # one: importing cupy and opening the handles takes seconds, which a
        # client's retransmissions may not outlast. Without cupy, the first
        # req.cupy() or req.torch() says what to install.
        if any(s["kind"] != "memfd" for s in self._slots.values()) and _importable("cupy"):
            try:
                self._cuda()
            except BaseException:
                self.sock.close()
                raise

    def _cuda(self):
        """Imports cupy and opens every slot's IPC handle, once: at attach where cupy is installed."""
        if self._cp is None:
            try:
                import cupy as cp
            except ImportError as e:
                raise ImportError("lovelock_ingest: CUDA slots need cupy (pip install cupy-cuda12x) and, for req.torch(), torch") from e
            for s in self._slots.values():
                if s["kind"] != "cuda-ipc":
                    raise NotImplementedError(f"lovelock_ingest: the host agent exports {s['kind']} handles; this module "
                                              "maps legacy CUDA IPC handles only: run the host agent's CUDA device with LegacyIPC")
                # s["gpu"] is the host agent's CUDA ordinal: give the worker the agent's CUDA_VISIBLE_DEVICES.
                with cp.cuda.Device(s["gpu"]):
                    for k in ("in", "out"):  # flags default to cudaIpcMemLazyEnablePeerAccess
                        s[k + "_ptr"] = cp.cuda.runtime.ipcOpenMemHandle(s[k + "_ipc"])
            self._cp = cp
        return self._cp

    def __iter__(self):
        while True:
            msg, fds = _recv(self.sock)
            for fd in fds:
                os.close(fd)
            if msg.get("op") != "run":
                raise ConnectionError(f"lovelock_ingest: unexpected frame {msg!r} from the host agent")
            req = self._req = Request(self, msg)
            yield req
            if not req.replied:
                req.fail("the worker's loop went on without req.reply()")

    def close(self):
        """Detaches. A request in hand still unanswered is failed first: the host agent takes a worker that
        closes its connection mid-run for one that may still write into the slot, and kills it."""
        req, self._req = self._req, None
        if req is not None and not req.replied:
            try:
                req.fail("the worker detached before req.reply()")
            except ConnectionError:
                pass
        self.sock.close()


def serve(model, socket="/run/lovelock/ingest-workers.sock"):
    """Attaches to the host agent at socket as model's worker (now: a refusal raises here) and
    returns an iterator of Requests."""
    w = Worker(model, socket)

    def requests():
        try:
            yield from w
        finally:
            w.close()
    return requests()
