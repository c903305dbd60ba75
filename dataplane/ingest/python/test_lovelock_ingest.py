"""Tests of lovelock_ingest against a stand-in host agent written here.

The Go test dataplane/ingest/hostagent (TestPythonUnittest) runs this file,
so CI does; the real agent is exercised by the other tests there. Run by
hand: cd dataplane/ingest/python && python3 -m unittest -v
"""
import base64
import json
import mmap
import os
import socket
import struct
import tempfile
import threading
import unittest

import numpy as np

import lovelock_ingest

SLOT = 4096


def send(conn, obj, fds=()):
    body = json.dumps(obj).encode()
    msg = struct.pack(">I", len(body)) + body
    if fds:
        socket.send_fds(conn, [msg], list(fds))
    else:
        conn.sendall(msg)


def recv(conn):
    hdr = conn.recv(4, socket.MSG_WAITALL)
    if len(hdr) < 4:
        return None
    return json.loads(conn.recv(struct.unpack(">I", hdr)[0], socket.MSG_WAITALL))


class FakeAgent:
    """One GPU, one slot, like hostagent's sendAttached; kind memfd or cuda-ipc."""

    def __init__(self, kind="memfd"):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "workers.sock")
        self.ln = socket.socket(socket.AF_UNIX)
        self.ln.bind(self.path)
        self.ln.listen()
        self.kind, self.conn = kind, None
        self.fds = [os.memfd_create("in"), os.memfd_create("out")]
        for fd in self.fds:
            os.ftruncate(fd, SLOT)
        self.inp, self.out = (mmap.mmap(fd, SLOT) for fd in self.fds)  # the agent's (or DPU's) own mappings
        self.thread = threading.Thread(target=self._attach)
        self.thread.start()

    def _attach(self):
        self.conn, _ = self.ln.accept()
        self.attach = recv(self.conn)
        slot = {"slot": 0, "in_bytes": SLOT, "out_bytes": SLOT}
        if self.kind == "cuda-ipc":
            slot.update(in_ipc=base64.b64encode(bytes(64)).decode(), out_ipc=base64.b64encode(bytes(range(64))).decode())
        send(self.conn, {"op": "attached", "version": 1, "model": "m", "row_bytes": 4, "epoch": 7,
                         "gpus": [{"index": 0, "kind": "shm", "handle_kind": self.kind, "slots": [slot]}]},
             self.fds if self.kind == "memfd" else ())

    def run(self, request, data, out_len):
        self.thread.join()
        self.inp[: len(data)] = data
        send(self.conn, {"op": "run", "request": request, "gpu": 0, "slot": 0, "len": len(data), "out_len": out_len})

    def close(self):
        self.thread.join()
        if self.conn:
            self.conn.close()
        self.ln.close()
        self.inp.close()
        self.out.close()
        for fd in self.fds:
            os.close(fd)
        self.dir.cleanup()


class ServeTest(unittest.TestCase):
    def setUp(self):
        self.agent = FakeAgent()
        self.addCleanup(self.agent.close)

    def test_zero_copy_numpy_view(self):
        w = lovelock_ingest.Worker("m", self.agent.path)
        self.addCleanup(w.close)
        self.assertEqual(self.agent.attach, {"op": "attach", "version": 1, "model": "m"})
        x0 = np.arange(8, dtype=np.float32)
        self.agent.run(1, x0.tobytes(), 32)
        req = next(iter(w))
        x = req.numpy(np.float32, (-1, 4))
        np.testing.assert_array_equal(x.reshape(-1), x0)
        self.assertTrue(np.shares_memory(x, req.numpy()))
        base = x
        while isinstance(base, np.ndarray):
            base = base.base
        self.assertIs(base.obj, w._slots[(0, 0)]["in"])  # the array's bytes are the mmap of the slot's memfd
        self.agent.inp[0:4] = struct.pack("<f", 42.0)  # the DPU writes again: the view sees it, no copy was made
        self.assertEqual(x[0, 0], 42.0)
        x[1, 1] = -3.5  # and the worker's writes land in the shared pages
        self.assertEqual(struct.unpack("<f", self.agent.inp[20:24])[0], -3.5)
        req.reply(x * 2)
        self.assertEqual(recv(self.agent.conn), {"op": "done", "request": 1, "len": 32})
        np.testing.assert_array_equal(np.frombuffer(self.agent.out, np.float32, 8), (x * 2).reshape(-1))

    def test_output_view_and_fail(self):
        gen = lovelock_ingest.serve("m", socket=self.agent.path)
        self.agent.run(5, np.ones(4, np.int32).tobytes(), 4)
        req = next(gen)
        out = req.output(np.int32)
        self.assertTrue(np.shares_memory(out, np.frombuffer(req._s["out"], np.uint8)))
        out[0] = 99
        req.reply(out)  # written in place: reply copies nothing
        self.assertEqual(recv(self.agent.conn)["len"], 4)
        self.assertEqual(struct.unpack("<i", self.agent.out[:4])[0], 99)
        self.agent.run(6, b"\0" * 8, 4)
        next(gen)  # the loop forgets to reply: the next iteration fails it
        self.agent.run(7, b"\0" * 8, 4)
        req = next(gen)
        self.assertEqual(recv(self.agent.conn), {"op": "done", "request": 6, "err": "the worker's loop went on without req.reply()"})
        with self.assertRaises(ValueError):  # too large for the output buffer: fails the request, and raises
            req.reply(np.zeros(SLOT + 1, np.uint8))
        self.assertIn("does not fit", recv(self.agent.conn)["err"])
        gen.close()

    def ring_once_attached(self, request):
        """Sends a run once a worker has attached (FakeAgent.run waits for it)."""
        t = threading.Thread(target=self.agent.run, args=(request, b"\0" * 8, 4))
        t.start()
        self.addCleanup(t.join)

    def test_loop_left_without_reply(self):
        self.ring_once_attached(8)
        for req in lovelock_ingest.serve("m", socket=self.agent.path):
            break  # serve() closes the socket, failing the request first: the run ends, the worker only detaches
        self.assertEqual(recv(self.agent.conn), {"op": "done", "request": 8, "err": "the worker detached before req.reply()"})
        self.assertIsNone(recv(self.agent.conn))

    def test_loop_raises_without_reply(self):
        self.ring_once_attached(9)

        def worker():
            for req in lovelock_ingest.serve("m", socket=self.agent.path):
                raise KeyError("the model broke")

        with self.assertRaises(KeyError):
            worker()
        self.assertEqual(recv(self.agent.conn), {"op": "done", "request": 9, "err": "the worker detached before req.reply()"})
        self.assertIsNone(recv(self.agent.conn))

    def test_agent_gone(self):
        w = lovelock_ingest.Worker("m", self.agent.path)
        self.addCleanup(w.close)
        self.agent.thread.join()
        self.agent.conn.close()
        with self.assertRaisesRegex(ConnectionError, "closed the worker socket"):
            next(iter(w))


class RefusedTest(unittest.TestCase):
    def test_refused(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "w.sock")
            ln = socket.socket(socket.AF_UNIX)
            ln.bind(path)
            ln.listen()

            def refuse():
                c, _ = ln.accept()
                recv(c)
                send(c, {"op": "attached", "version": 1, "err": "no external model \"m\""})
                c.close()

            t = threading.Thread(target=refuse)
            t.start()
            with self.assertRaisesRegex(ConnectionRefusedError, "refused model 'm': no external model"):
                lovelock_ingest.Worker("m", path)
            t.join()
            ln.close()


class CudaTest(unittest.TestCase):
    """Without a GPU: the CUDA path's errors when cupy or torch is missing."""

    def test_cuda_slots_need_cupy(self):
        agent = FakeAgent("cuda-ipc")
        self.addCleanup(agent.close)
        w = lovelock_ingest.Worker("m", agent.path)
        self.addCleanup(w.close)
        self.assertEqual(len(w._slots[(0, 0)]["in_ipc"]), 64)
        agent.run(1, b"\0" * 8, 8)
        req = next(iter(w))
        with self.assertRaisesRegex(TypeError, "CUDA memory"):
            req.numpy()
        try:
            import cupy  # noqa: F401
        except ImportError:
            with self.assertRaisesRegex(ImportError, "needs PyTorch|need cupy"):
                req.torch()
            with self.assertRaisesRegex(ImportError, "need cupy"):
                req.cupy()
        req.fail("no GPU here")
        self.assertEqual(recv(agent.conn)["err"], "no GPU here")


if __name__ == "__main__":
    unittest.main()
