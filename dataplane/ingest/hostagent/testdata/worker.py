"""A user's worker for the host agent's tests (external_test.go).

Models: affine (float32 rows of 16, y = 2x + 1, computed in place in the
input's pages to prove they are the DPU-written ones) and rowsum (int32
rows of 16, one int32 sum per row, written straight into the output
buffer). The first input value makes it misbehave: -1 a short output, -2
exit mid-request, -3 hang past the run timeout, -4 fail with a message.
Model late copies its input to its output, and an input starting with "A"
first sleeps 5 s, past the run timeout, then writes its output anyway.

Model leak copies its input to its output too, but an input starting with
f, d, x or u leaves a process behind that keeps the slot's output buffer,
then hangs past the run timeout; once the next request's output (starting
BBBBBBBB) is in the buffer, that process writes this input over it: f a
forked child, d a double-forked daemon (setsid, reparented away from the
worker), x a subprocess (exec) given only the buffer's descriptor, which it
maps to write, u a forked child that becomes user nobody (65534), which a
host agent without CAP_KILL may not kill. U: the worker itself becomes
nobody and hangs. Each such process writes its pid to DIR/holder, DIR the
third argument.

Modes where the worker goes away mid-run, long before the run timeout: e
and c leave a forked child as f does (which closes its copy of the worker
socket, as a daemon closes its descriptors), then the worker exits (e) or
closes its socket and sleeps (c); w: the worker closes its socket and
writes late itself; p: the worker answers done for another request, then
writes late itself.

A fourth argument "keep-child": once attached, the worker forks a child
that keeps every slot buffer mapped and sleeps (a pool process of a worker
that is fine), its pid in DIR/bystander. "keep-daemon": a double-forked
daemon (setsid, reparented away from the worker) does the same, with the
mappings' descriptors (Python's mmap keeps one each), its pid in
DIR/daemon.
"""
import mmap
import os
import subprocess
import sys
import time

if len(sys.argv) > 1 and sys.argv[1] == "--late":
    # The subprocess of mode x: descriptor, pid file, late bytes in hex.
    fd, pidfile, late = int(sys.argv[2]), sys.argv[3], bytes.fromhex(sys.argv[4])
    with open(pidfile + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(pidfile + ".tmp", pidfile)
    for _ in range(30000):
        if os.pread(fd, 8, 0) == b"B" * 8:
            m = mmap.mmap(fd, len(late))  # mapped only now
            m[:] = late
            os._exit(0)
        time.sleep(0.001)
    os._exit(1)

import numpy as np

import lovelock_ingest

NOBODY = 65534


def write_pid(path):
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(path + ".tmp", path)


def detach():
    """Lets go of the worker's stdout and stderr: the test reads them until every holder closes them."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)


def become_nobody():
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)


def late_write(out, late):
    """Keeps out, the slot's output buffer; once the next request's output is there, writes late over it."""
    for _ in range(30000):
        if bytes(out[:8]) == b"B" * 8:
            out[:len(late)] = np.frombuffer(late, dtype=np.uint8)
            os._exit(0)
        time.sleep(0.001)
    os._exit(1)


def fd_of(a):
    """This process's descriptor of the file a (an ndarray over an mmap) lies in."""
    addr = a.ctypes.data
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                ino = int(line.split()[4])
                break
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.stat(f"/proc/self/fd/{name}").st_ino == ino:
                return int(name)
        except OSError:
            pass
    raise RuntimeError("no descriptor of the output buffer")


def leave(req, late, mode, close_socket=False):
    """Leaves a process behind that writes late into req's output buffer."""
    out = req.output()
    pidfile = os.path.join(piddir, "holder")
    if mode in "fu":
        if os.fork() == 0:
            detach()
            if close_socket:
                req._w.sock.close()
            write_pid(pidfile)
            if mode == "u":
                become_nobody()
            late_write(out, late)
    elif mode == "d":
        if os.fork() == 0:
            detach()
            os.setsid()
            if os.fork() == 0:
                write_pid(pidfile)
                late_write(out, late)
            os._exit(0)
        os.wait()
    elif mode == "x":
        fd = fd_of(out)
        subprocess.Popen([sys.executable, __file__, "--late", str(fd), pidfile, late.hex()], pass_fds=[fd],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def pages_of(a):
    """The object at the end of a's base chain: what its bytes live in."""
    while isinstance(a, np.ndarray):
        a = a.base
    return a.obj if isinstance(a, memoryview) else a


model, sock = sys.argv[1], sys.argv[2]
piddir = sys.argv[3] if len(sys.argv) > 3 else None
requests = lovelock_ingest.serve(model, socket=sock)
if len(sys.argv) > 4 and sys.argv[4] == "keep-child" and os.fork() == 0:
    detach()
    write_pid(os.path.join(piddir, "bystander"))
    time.sleep(60)
    os._exit(0)
if len(sys.argv) > 4 and sys.argv[4] == "keep-daemon":
    if os.fork() == 0:
        detach()
        os.setsid()
        middle = os.getpid()
        if os.fork() == 0:
            # The pid file says the daemon is reparented: only once the
            # middle process has exited is it out of the worker's tree.
            while os.getppid() == middle:
                time.sleep(0.001)
            write_pid(os.path.join(piddir, "daemon"))
            time.sleep(60)
        os._exit(0)
    os.wait()
for req in requests:
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
    elif model == "leak":
        mine = bytes(req.numpy())
        mode = chr(mine[0])
        if mode in "fdxu":
            leave(req, mine, mode)
            time.sleep(60)
        elif mode == "U":
            become_nobody()
            time.sleep(60)
        elif mode in "ec":
            leave(req, mine, "f", close_socket=True)
            if mode == "e":
                os._exit(0)
            req._w.sock.close()
            time.sleep(60)
        elif mode == "w":
            req._w.sock.close()
            late_write(req.output(), mine)
        elif mode == "p":
            lovelock_ingest._send(req._w.sock, {"op": "done", "request": req.id + 1000, "len": len(mine)})
            late_write(req.output(), mine)
        req.reply(mine)
    else:
        req.reply(req.numpy())
