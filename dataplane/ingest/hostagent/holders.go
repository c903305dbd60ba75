package hostagent

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// A worker killed for overrunning its run may leave processes behind that
// still hold the slot buffers: a child it forked keeps its mappings, a
// daemon it double-forked (reparented to init, outside its process tree)
// too, a subprocess it gave a descriptor can map it later. Any of them can
// write its late output into a slot after the slot has gone to the next
// request. procScanner finds them: every process that maps one of the
// agent's memfd buffers or holds a descriptor of one, the buffer known by
// device and inode (fstat of the agent's own descriptor), looked up in
// /proc/PID/maps and, through readlink and stat, /proc/PID/fd.
//
// What a scan costs: for every process, one read of /proc/PID/maps (the
// kernel writes a line per mapping under the process's mmap lock, read
// side), a stat of /proc/PID/task (its link count is the number of
// threads), then, unless it is a kernel thread or a zombie, one listing of
// /proc/PID/fd and a readlink per descriptor (a stat only for a memfd's);
// and for a process of several threads a listing of its threads and a
// kcmp or two per thread (a thread with a descriptor table of its own is
// listed too, and when the process's first thread has exited, a thread's
// mappings are read). BenchmarkScan measures it.

// fileID is a file by device and inode, as fstat gives them and
// /proc/PID/maps shows them.
type fileID struct{ dev, ino uint64 }

func fileIDOf(fd int) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fileID{}, err
	}
	return fileID{dev: st.Dev, ino: st.Ino}, nil
}

// holder is a process that maps one of the scanned files or holds a
// descriptor of one.
type holder struct {
	pid int
	// how says how, for a log: "maps GPU 0 slot 1 output", "holds
	// descriptor 7 of GPU 0 slot 1 output".
	how string
}

// memfdLink is how readlink of /proc/PID/fd/N begins for a memfd: only
// such descriptors are looked at further (a stat of another file could
// wait on a network file system).
const memfdLink = "/memfd:"

// kcmp types (linux/kcmp.h).
const (
	kcmpFile  = 0
	kcmpVM    = 1
	kcmpFiles = 2
)

// procScanner finds the processes that hold files, in a /proc. It is not
// safe for concurrent use.
type procScanner struct {
	proc  string
	files map[fileID]string
	// self is left out: the agent's own process maps every buffer.
	self int

	buf    []byte
	dirent []byte
	link   []byte
	names  []string

	// What the last scan looked at: processes, threads listed beyond the
	// first, descriptors, lines of maps; and the processes or threads it
	// could not look into (another user's, for an agent that is not
	// root).
	procs, threads, descriptors, mapLines, unreadable int
	took                                              time.Duration
}

func newProcScanner(files map[fileID]string) *procScanner {
	return &procScanner{proc: "/proc", files: files, self: os.Getpid(), buf: make([]byte, 64<<10), dirent: make([]byte, 8<<10), link: make([]byte, 512)}
}

// scan returns the holders, one entry per process (its first hold found).
func (s *procScanner) scan() ([]holder, error) {
	start := time.Now()
	s.procs, s.threads, s.descriptors, s.mapLines, s.unreadable = 0, 0, 0, 0, 0
	d, err := os.Open(s.proc)
	if err != nil {
		return nil, err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return nil, err
	}
	var hs []holder
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil || pid <= 0 || pid == s.self {
			continue
		}
		s.procs++
		if how, ok := s.process(pid); ok {
			hs = append(hs, holder{pid: pid, how: how})
		}
	}
	s.took = time.Since(start)
	return hs, nil
}

// holds looks at one process again.
func (s *procScanner) holds(pid int) (string, bool) {
	if pid == s.self {
		return "", false
	}
	return s.process(pid)
}

// process reports how pid holds one of the files, if it does.
func (s *procScanner) process(pid int) (string, bool) {
	dir := s.proc + "/" + strconv.Itoa(pid)
	how, lines := s.mapsOf(dir)
	if how != "" {
		return how, true
	}
	// Every thread of a process shares its mappings, but a thread may
	// have a descriptor table of its own (unshare(CLONE_FILES)), and once
	// the first thread has exited /proc/PID/maps and /proc/PID/fd are
	// empty while the others still hold what they held.
	threads := s.threadCount(dir)
	if lines == 0 && threads == 1 {
		// No memory and one thread: a kernel thread, or a zombie.
		return "", false
	}
	if how, ok := s.fdsOf(dir); ok {
		return how, true
	}
	if threads == 1 {
		return "", false
	}
	tids := s.tasks(dir)
	tables := []int{pid}
	mapsRead := false
	for _, tid := range tids {
		if tid == pid {
			continue
		}
		s.threads++
		tdir := dir + "/task/" + strconv.Itoa(tid)
		if !mapsRead && kcmp(pid, tid, kcmpVM) != 0 {
			mapsRead = true
			if how, _ := s.mapsOf(tdir); how != "" {
				return how, true
			}
		}
		seen := false
		for _, t := range tables {
			if kcmp(t, tid, kcmpFiles) == 0 {
				seen = true
				break
			}
		}
		if seen {
			continue
		}
		if len(tables) < 64 {
			tables = append(tables, tid)
		}
		if how, ok := s.fdsOf(tdir); ok {
			return how, true
		}
	}
	return "", false
}

// kcmp compares a resource of two tasks (for kcmpFile, descriptor idx[0]
// of pid1 and idx[1] of pid2): 0 when they share it; anything else (an
// error too) says they may not.
func kcmp(pid1, pid2, typ int, idx ...int) int {
	var i1, i2 uintptr
	if len(idx) == 2 {
		i1, i2 = uintptr(idx[0]), uintptr(idx[1])
	}
	r, _, errno := unix.Syscall6(unix.SYS_KCMP, uintptr(pid1), uintptr(pid2), uintptr(typ), i1, i2, 0)
	if errno != 0 {
		return -1
	}
	return int(r)
}

func (s *procScanner) failed(err error) {
	if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
		s.unreadable++
	}
	// ENOENT, ESRCH: the process or thread is gone.
}

// mapsOf looks for a mapping of one of the files in dir/maps: how it
// holds it, or "" and the number of mappings (-1: unreadable).
func (s *procScanner) mapsOf(dir string) (string, int) {
	fd, err := unix.Open(dir+"/maps", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		s.failed(err)
		return "", -1
	}
	defer unix.Close(fd)
	have, lines := 0, 0
	for {
		n, err := unix.Read(fd, s.buf[have:])
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			s.failed(err)
			return "", -1
		}
		if n == 0 {
			return "", lines
		}
		have += n
		b := s.buf[:have]
		for {
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				break
			}
			lines++
			s.mapLines++
			if id, ok := parseMapsLine(b[:i]); ok {
				if name, ok := s.files[id]; ok {
					return "maps " + name, lines
				}
			}
			b = b[i+1:]
		}
		if len(b) == len(s.buf) {
			// A line longer than the buffer (a path of 64 KiB): skip it.
			b = b[:0]
		}
		have = copy(s.buf, b)
	}
}

// parseMapsLine returns the device and inode of a line of /proc/PID/maps,
// "start-end perms offset major:minor inode  path", and false for an
// anonymous mapping (inode 0) or a malformed line.
func parseMapsLine(l []byte) (fileID, bool) {
	for range 3 {
		i := bytes.IndexByte(l, ' ')
		if i < 0 {
			return fileID{}, false
		}
		l = l[i+1:]
	}
	i := bytes.IndexByte(l, ' ')
	if i < 0 {
		return fileID{}, false
	}
	dev := l[:i]
	l = l[i+1:]
	var ino uint64
	n := 0
	for n < len(l) && l[n] >= '0' && l[n] <= '9' {
		ino = ino*10 + uint64(l[n]-'0')
		n++
	}
	if n == 0 || ino == 0 {
		return fileID{}, false
	}
	c := bytes.IndexByte(dev, ':')
	if c < 0 {
		return fileID{}, false
	}
	major, err1 := strconv.ParseUint(string(dev[:c]), 16, 32)
	minor, err2 := strconv.ParseUint(string(dev[c+1:]), 16, 32)
	if err1 != nil || err2 != nil {
		return fileID{}, false
	}
	return fileID{dev: unix.Mkdev(uint32(major), uint32(minor)), ino: ino}, true
}

// fdsOf looks for a descriptor of one of the files in dir/fd.
func (s *procScanner) fdsOf(dir string) (string, bool) {
	how := ""
	s.eachFD(dir, func(fd int, _ fileID, what string) bool {
		how = "holds descriptor " + strconv.Itoa(fd) + " of " + what
		return false
	})
	return how, how != ""
}

// heldFD is a process's descriptor of one of the files.
type heldFD struct {
	fd int
	id fileID
}

// fdsHeld returns pid's descriptors of the files, in its first thread's
// table.
func (s *procScanner) fdsHeld(pid int) []heldFD {
	var out []heldFD
	s.eachFD(s.proc+"/"+strconv.Itoa(pid), func(fd int, id fileID, _ string) bool {
		out = append(out, heldFD{fd: fd, id: id})
		return true
	})
	return out
}

// eachFD calls f for each descriptor of one of the files in dir/fd, while
// f returns true.
func (s *procScanner) eachFD(dir string, f func(fd int, id fileID, what string) bool) {
	dfd, err := unix.Open(dir+"/fd", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		s.failed(err)
		return
	}
	defer unix.Close(dfd)
	for {
		n, err := unix.ReadDirent(dfd, s.dirent)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			s.failed(err)
			return
		}
		if n <= 0 {
			return
		}
		var names []string
		_, _, names = unix.ParseDirent(s.dirent[:n], -1, s.names[:0])
		s.names = names[:0]
		for _, name := range names {
			s.descriptors++
			k, err := unix.Readlinkat(dfd, name, s.link)
			if err != nil || !bytes.HasPrefix(s.link[:k], []byte(memfdLink)) {
				continue
			}
			var st unix.Stat_t
			if unix.Fstatat(dfd, name, &st, 0) != nil {
				continue
			}
			fd, err := strconv.Atoi(name)
			if err != nil {
				continue
			}
			id := fileID{dev: st.Dev, ino: st.Ino}
			if what, ok := s.files[id]; ok && !f(fd, id, what) {
				return
			}
		}
	}
}

// threadCount returns how many threads a process has, from the link count
// of its task directory (2 and one per thread); 2 when it cannot tell, so
// that its threads are listed.
func (s *procScanner) threadCount(dir string) int {
	var st unix.Stat_t
	if err := unix.Stat(dir+"/task", &st); err != nil || st.Nlink < 3 {
		return 2
	}
	return int(st.Nlink) - 2
}

// tasks lists dir/task: the process's threads.
func (s *procScanner) tasks(dir string) []int {
	d, err := os.Open(dir + "/task")
	if err != nil {
		s.failed(err)
		return nil
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return nil
	}
	tids := make([]int, 0, len(names))
	for _, n := range names {
		if tid, err := strconv.Atoi(n); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids
}

// procStat returns a process's command name and parent from
// /proc/PID/stat.
func procStat(proc string, pid int) (comm string, ppid int, err error) {
	b, err := os.ReadFile(proc + "/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0, err
	}
	// "pid (comm) state ppid ...": comm may hold spaces and parentheses.
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return "", 0, errors.New("malformed stat")
	}
	f := bytes.Fields(b[end+1:])
	if len(f) < 2 {
		return "", 0, errors.New("malformed stat")
	}
	ppid, err = strconv.Atoi(string(f[1]))
	return string(b[open+1 : end]), ppid, err
}
