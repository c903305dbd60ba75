"""A process that keeps a memfd the way a worker's leftovers may, for
holders_test.go: python3 holder.py MODE PIDFILE, with the memfd as
descriptor 3.

  map          maps it and closes the descriptor: a mapping, no descriptor
  fd           keeps the descriptor only
  thread-fd    a thread takes a descriptor table of its own
               (unshare(CLONE_FILES)) and the main thread closes its copy:
               only the thread's table has it
  leader-exit  maps it, closes the descriptor, and the main thread exits
               (pthread_exit) while another thread lives on: the process's
               first thread is a zombie, its /proc/PID/maps empty

It writes its pid to PIDFILE once it holds the memfd, then sleeps until
killed (60 s at most).
"""
import ctypes
import os
import sys
import threading
import time

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
PROT_RW, MAP_SHARED, CLONE_FILES = 3, 1, 0x400


def write_pid(path):
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(path + ".tmp", path)


def map_fd(fd):
    """Maps fd without Python's mmap, which would keep a copy of the descriptor."""
    p = libc.mmap(None, os.fstat(fd).st_size, PROT_RW, MAP_SHARED, fd, 0)
    if p in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap")
    return p


mode, pidfile = sys.argv[1], sys.argv[2]
if mode == "map":
    map_fd(3)
    os.close(3)
elif mode == "fd":
    pass
elif mode == "thread-fd":
    ready = threading.Event()

    def own_table():
        if libc.unshare(CLONE_FILES) != 0:
            raise OSError(ctypes.get_errno(), "unshare")
        ready.set()
        time.sleep(60)
    threading.Thread(target=own_table, daemon=True).start()
    ready.wait()
    os.close(3)
elif mode == "leader-exit":
    map_fd(3)
    os.close(3)
    threading.Thread(target=time.sleep, args=(60,)).start()
    write_pid(pidfile)
    libc.pthread_exit(None)  # ctypes lets go of the GIL: the other thread runs on
else:
    sys.exit("unknown mode " + mode)
write_pid(pidfile)
time.sleep(60)
