package xsk

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Socket is one AF_XDP socket bound to an (interface, queue), with an RX
// ring, a TX ring or both, over a UMEM.
//
// The socket belongs to the network namespace of the thread that created
// it. Once bound, the kernel delivers to it only packets that an XDP program
// on that interface redirects, from that queue, to an XSKMAP slot holding
// its FD.
type Socket struct {
	umem     *UMEM
	q        *queueRings
	key      queueKey
	name     string // "eth0 queue 3", for errors
	ownsUMEM bool

	fd         int
	mode       Mode
	zcErr      error
	needWakeup bool
	sg         bool               // bound with XDP_USE_SG
	txFrags    [MaxTXFrags]uint32 // transmitMulti: the UMEM frames of one packet
	maxKicks   int
	idleSpin   time.Duration

	rxMem, txMem []byte
	rx, tx       *ring[Desc]

	rxMu      sync.Mutex // the receive side: rx, fill top-up, scratch
	rxDescs   []Desc
	rxScratch []uint32
	txMu      sync.Mutex // the transmit side: tx, scratch
	txScratch []uint32
	compMu    sync.Mutex // comp scratch (Reclaim runs without txMu)
	comp      []uint32

	life      sync.RWMutex // held shared by every call, exclusively by Close
	closing   atomic.Bool
	closed    bool
	closeOnce sync.Once
	closeErr  error
	wakeMu    sync.Mutex
	efd       int // eventfd that wakes a blocked Poll

	// Pre-wrapped so the packet path reports context without allocating.
	errClosed, errRingFull, errNoFrames, errNoRX, errNoTX error

	rxPackets, txPackets, rxWakeups, txWakeups, polls atomic.Uint64
}

// Stats are a socket's counters: the kernel's (XDP_STATISTICS) and this
// process's.
type Stats struct {
	// RXDropped counts packets the kernel dropped because no fill frame
	// was available or the packet did not fit a frame.
	RXDropped uint64
	// RXInvalidDescs and TXInvalidDescs count descriptors the kernel
	// rejected (this package validates before submitting, so they stay 0).
	RXInvalidDescs uint64
	TXInvalidDescs uint64
	// RXRingFull counts packets dropped because the RX ring was full: the
	// reader is too slow.
	RXRingFull uint64
	// RXFillRingEmpty counts times the kernel found the fill ring empty.
	RXFillRingEmpty uint64
	// TXRingEmpty counts times the kernel found the TX ring empty.
	TXRingEmpty uint64

	// RXPackets counts packets RecvBatch, RecvPackets, TryReceive and
	// Receive took off the RX ring; TXPackets counts packets Transmit and
	// TransmitDescs submitted to the TX ring. A packet counts once however
	// many descriptors it takes on a MultiBuffer socket.
	RXPackets uint64
	TXPackets uint64
	// RXWakeups and TXWakeups count recvfrom(2) and sendto(2) calls made
	// because the kernel asked for a wakeup (or always, without
	// need_wakeup); Polls counts poll(2) calls.
	RXWakeups uint64
	TXWakeups uint64
	Polls     uint64
}

// Open creates a UMEM sized by ucfg and one socket on it bound to (ifindex,
// queue). The UMEM is closed with the socket. Nil configurations take the
// defaults.
func Open(ifindex int, queue uint32, ucfg *UMEMConfig, scfg *SocketConfig) (*Socket, error) {
	u, err := NewUMEM(ucfg)
	if err != nil {
		return nil, err
	}
	s, err := u.NewSocket(ifindex, queue, scfg)
	if err != nil {
		return nil, errors.Join(err, u.Close())
	}
	s.ownsUMEM = true
	return s, nil
}

// NewSocket creates an AF_XDP socket on u and binds it to (ifindex, queue).
//
// The first socket of a UMEM registers it with the kernel and binds with
// cfg.Mode (ModeAuto tries zero-copy, then copy). Later sockets bind with
// XDP_SHARED_UMEM and inherit the first one's mode and need_wakeup setting:
// on the same (interface, queue) they share its fill and completion rings;
// on another queue or interface they get a fill and completion ring pair of
// their own, which the kernel supports since Linux 5.10.
func (u *UMEM) NewSocket(ifindex int, queue uint32, cfg *SocketConfig) (*Socket, error) {
	name := fmt.Sprintf("%s queue %d", ifaceName(ifindex), queue)
	c, err := cfg.normalise()
	if err != nil {
		return nil, fmt.Errorf("xsk %s: %w", name, err)
	}
	if c.FillFrames > u.cfg.FillSize {
		return nil, fmt.Errorf("xsk %s: %d fill frames do not fit a fill ring of %d", name, c.FillFrames, u.cfg.FillSize)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return nil, fmt.Errorf("xsk %s: umem: %w", name, ErrClosed)
	}
	s, err := u.open(queueKey{ifindex, queue}, name, c)
	if err != nil {
		return nil, fmt.Errorf("xsk %s: %w", name, err)
	}
	return s, nil
}

// open does NewSocket's work with u.mu held.
func (u *UMEM) open(key queueKey, name string, c SocketConfig) (_ *Socket, err error) {
	s := &Socket{
		umem: u, key: key, name: name, fd: -1, efd: -1,
		needWakeup: !u.cfg.NoNeedWakeup,
		// Copy-mode sendto transmits at most 32 frames (the kernel's
		// TX_BATCH_SIZE) per call; enough calls to empty the ring.
		maxKicks: c.TXSize/32 + 2,
		idleSpin: c.IdleSpin,
	}
	var newQ *queueRings
	defer func() {
		if err == nil {
			return
		}
		_ = munmap(&s.rxMem)
		_ = munmap(&s.txMem)
		if newQ != nil {
			_ = newQ.unmap()
		}
		if s.efd >= 0 {
			_ = unix.Close(s.efd)
		}
		if s.fd >= 0 {
			_ = unix.Close(s.fd)
		}
	}()

	s.fd, err = unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		s.fd = -1
		return nil, fmt.Errorf("create AF_XDP socket: %w", err)
	}
	off, err := mmapOffsets(s.fd)
	if err != nil {
		return nil, err
	}
	first := len(u.sockets) == 0
	if first {
		if err := registerUMEM(s.fd, u.area, u.cfg); err != nil {
			return nil, err
		}
	}
	q, share := u.queues[key]
	if !share {
		if newQ, err = u.newQueue(key, s.fd, off); err != nil {
			return nil, err
		}
		q = newQ
	}
	if !c.NoRX {
		if s.rxMem, s.rx, err = mapRing[Desc](s.fd, unix.XDP_RX_RING, unix.XDP_PGOFF_RX_RING, off.Rx, c.RXSize, false); err != nil {
			return nil, err
		}
	}
	if !c.NoTX {
		if s.txMem, s.tx, err = mapRing[Desc](s.fd, unix.XDP_TX_RING, unix.XDP_PGOFF_TX_RING, off.Tx, c.TXSize, true); err != nil {
			return nil, err
		}
	}
	s.sg = c.MultiBuffer
	if err := s.bind(c.Mode, u.peer(key, first, share), c.BusyTimeout); err != nil {
		return nil, err
	}
	if s.efd, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		s.efd = -1
		return nil, fmt.Errorf("eventfd: %w", err)
	}

	s.q = q
	q.refs++
	u.queues[key] = q
	u.sockets[s] = struct{}{}
	s.rxDescs = make([]Desc, c.BatchSize)
	s.rxScratch = make([]uint32, 0, max(c.BatchSize, 256))
	s.txScratch = make([]uint32, 0, c.BatchSize)
	s.comp = make([]uint32, 0, max(c.BatchSize, 256))
	s.errClosed = fmt.Errorf("xsk %s: %w", name, ErrClosed)
	s.errRingFull = fmt.Errorf("xsk %s: TX: %w", name, ErrRingFull)
	s.errNoFrames = fmt.Errorf("xsk %s: TX: %w", name, ErrNoFrames)
	s.errNoRX = fmt.Errorf("xsk %s: RX: %w", name, ErrNoRing)
	s.errNoTX = fmt.Errorf("xsk %s: TX: %w", name, ErrNoRing)

	if !c.NoRX && q.target.Load() == 0 {
		target := c.FillFrames
		if target == 0 {
			free := u.freeCount()
			target = min(u.cfg.FillSize, max(free/2, min(free, 1)))
		}
		q.target.Store(int64(target))
		u.fillUp(q, s.rxScratch)
	}
	return s, nil
}

// peer returns the fd to share the UMEM through, or -1 for the first
// socket. Sharing a queue's rings needs a socket bound to that queue.
func (u *UMEM) peer(key queueKey, first, share bool) int {
	if first {
		return -1
	}
	for o := range u.sockets {
		if !share || o.key == key {
			return o.fd
		}
	}
	return -1 // unreachable: not first means a socket exists
}

func (s *Socket) bind(want Mode, peer int, busy time.Duration) error {
	sa := &unix.SockaddrXDP{Ifindex: uint32(s.key.ifindex), QueueID: s.key.queue}
	if peer >= 0 {
		// The kernel refuses mode and wakeup flags on a shared bind; the
		// socket inherits them from the pool it joins.
		sa.Flags = unix.XDP_SHARED_UMEM
		sa.SharedUmemFD = uint32(peer)
		s.sg = false
		if err := bindRetry(s.fd, sa, busy); err != nil {
			return fmt.Errorf("bind sharing a UMEM: %w", err)
		}
	} else {
		var base uint16
		if s.needWakeup {
			base = unix.XDP_USE_NEED_WAKEUP
		}
		if s.sg {
			base |= unix.XDP_USE_SG
		}
		switch want {
		case ModeCopy:
			sa.Flags = base | unix.XDP_COPY
		default:
			sa.Flags = base | unix.XDP_ZEROCOPY
		}
		err := bindRetry(s.fd, sa, busy)
		if err != nil && want == ModeAuto && !errors.Is(err, unix.EBUSY) {
			// A failed bind leaves the socket unbound with its rings
			// intact, so copy mode can be tried on the same socket.
			s.zcErr = err
			sa.Flags = base | unix.XDP_COPY
			err = bindRetry(s.fd, sa, busy)
		}
		if err != nil {
			if s.sg && (errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP)) {
				err = fmt.Errorf("%w: %w", ErrMultiBuffer, err)
			}
			if s.zcErr != nil {
				return fmt.Errorf("bind: zero-copy: %v; copy: %w", s.zcErr, err)
			}
			return fmt.Errorf("bind in %s mode: %w", want, err)
		}
	}
	opts, err := unix.GetsockoptInt(s.fd, unix.SOL_XDP, unix.XDP_OPTIONS)
	if err != nil {
		return fmt.Errorf("read bind options: %w", err)
	}
	s.mode = ModeCopy
	if opts&unix.XDP_OPTIONS_ZEROCOPY != 0 {
		s.mode = ModeZeroCopy
	}
	if want != ModeAuto && s.mode != want {
		return fmt.Errorf("bound in %s mode, not %s: a socket sharing a UMEM inherits the mode of the first", s.mode, want)
	}
	return nil
}

// bindRetry binds, retrying for up to wait while the queue is busy.
func bindRetry(fd int, sa *unix.SockaddrXDP, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	pause := time.Millisecond
	for {
		err := unix.Bind(fd, sa)
		if !errors.Is(err, unix.EBUSY) || wait < 0 || time.Now().After(deadline) {
			return err
		}
		time.Sleep(pause)
		pause = min(2*pause, 20*time.Millisecond)
	}
}

// FD returns the socket's file descriptor, for an XSKMAP update, or -1
// once the socket is closed.
func (s *Socket) FD() int {
	if s.enter() != nil {
		return -1
	}
	defer s.exit()
	return s.fd
}

// Ifindex returns the interface the socket is bound to.
func (s *Socket) Ifindex() int { return s.key.ifindex }

// Queue returns the queue the socket is bound to: the XSKMAP slot it
// belongs in.
func (s *Socket) Queue() uint32 { return s.key.queue }

// MultiBuffer reports whether the socket was bound with XDP_USE_SG
// (SocketConfig.MultiBuffer; never on a socket that shares its UMEM).
func (s *Socket) MultiBuffer() bool { return s.sg }

// Mode returns ModeCopy or ModeZeroCopy, as the kernel reported after the
// bind (XDP_OPTIONS).
func (s *Socket) Mode() Mode { return s.mode }

// ZeroCopyErr returns why the kernel refused zero-copy when a ModeAuto
// bind fell back to copy mode, and nil otherwise.
func (s *Socket) ZeroCopyErr() error { return s.zcErr }

// UMEM returns the UMEM the socket uses.
func (s *Socket) UMEM() *UMEM { return s.umem }

// Frame returns the bytes a received descriptor points at; see UMEM.Frame.
func (s *Socket) Frame(d Desc) []byte { return s.umem.Frame(d) }

func (s *Socket) enter() error {
	s.life.RLock()
	if s.closed || s.closing.Load() {
		s.life.RUnlock()
		return s.errClosedOr()
	}
	return nil
}

func (s *Socket) exit() { s.life.RUnlock() }

func (s *Socket) errClosedOr() error {
	if s.errClosed != nil {
		return s.errClosed
	}
	return ErrClosed
}

// healthInterval is how often an idle Receive looks for a socket error.
// When its interface goes away the kernel unbinds the socket and sets
// ENETDOWN, but poll(2) on it never wakes again.
const healthInterval = 500 * time.Millisecond

// sockErr returns the socket's pending error (SO_ERROR), if any.
func (s *Socket) sockErr() error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.exit()
	v, err := unix.GetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil {
		return fmt.Errorf("xsk %s: read socket error: %w", s.name, err)
	}
	if v != 0 {
		return fmt.Errorf("xsk %s: %w", s.name, unix.Errno(v))
	}
	return nil
}

// spin waits up to idleSpin for the RX ring to fill and reports whether it
// did.
func (s *Socket) spin() bool {
	if s.idleSpin <= 0 || s.enter() != nil {
		return false
	}
	defer s.exit()
	deadline := time.Now().Add(s.idleSpin)
	for !s.rx.present() {
		if s.closing.Load() || time.Now().After(deadline) {
			return false
		}
		runtime.Gosched()
	}
	return true
}

// Poll waits until the RX ring has packets (for a socket without RX ring:
// until the TX ring has room), the timeout passes (false, nil), ctx ends
// (ctx.Err()) or the socket is closed (ErrClosed). A negative timeout waits
// without limit; zero only checks. In copy mode poll(2) also drives pending
// transmissions.
func (s *Socket) Poll(ctx context.Context, timeout time.Duration) (bool, error) {
	if err := s.enter(); err != nil {
		return false, err
	}
	defer s.exit()
	if s.rx != nil && s.rx.present() {
		return true, nil
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, s.wake)
		defer stop()
	}
	events := int16(unix.POLLIN)
	if s.rx == nil {
		events = unix.POLLOUT
	}
	fds := []unix.PollFd{{Fd: int32(s.fd), Events: events}, {Fd: int32(s.efd), Events: unix.POLLIN}}
	for {
		if s.closing.Load() {
			return false, s.errClosed
		}
		if err := ctx.Err(); err != nil {
			return false, err
		}
		ms := -1
		if timeout == 0 {
			ms = 0
		} else if timeout > 0 {
			left := time.Until(deadline)
			if left <= 0 {
				return false, nil
			}
			ms = int((left + time.Millisecond - 1) / time.Millisecond)
		}
		fds[0].Revents, fds[1].Revents = 0, 0
		s.polls.Add(1)
		n, err := unix.Poll(fds, ms)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("xsk %s: poll: %w", s.name, err)
		}
		if fds[1].Revents != 0 {
			var buf [8]byte
			_, _ = unix.Read(s.efd, buf[:])
			continue // look at closing and ctx again
		}
		if fds[0].Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0 {
			return false, fmt.Errorf("xsk %s: poll: revents %#x", s.name, fds[0].Revents)
		}
		if fds[0].Revents&events != 0 {
			return true, nil
		}
		if n == 0 && timeout == 0 {
			return false, nil
		}
	}
}

// wake interrupts a blocked Poll. It may run after Poll returned (from a
// context.AfterFunc), hence the lock around the eventfd's lifetime.
func (s *Socket) wake() {
	s.wakeMu.Lock()
	defer s.wakeMu.Unlock()
	if s.efd < 0 {
		return
	}
	var buf [8]byte
	binary.NativeEndian.PutUint64(buf[:], 1)
	_, _ = unix.Write(s.efd, buf[:])
}

// Stats reads the kernel's counters and this process's.
func (s *Socket) Stats() (Stats, error) {
	if err := s.enter(); err != nil {
		return Stats{}, err
	}
	defer s.exit()
	var k unix.XDPStatistics
	if err := getsockopt(s.fd, unix.SOL_XDP, unix.XDP_STATISTICS, unsafe.Pointer(&k), unsafe.Sizeof(k)); err != nil {
		return Stats{}, fmt.Errorf("xsk %s: statistics: %w", s.name, err)
	}
	return Stats{
		RXDropped:       k.Rx_dropped,
		RXInvalidDescs:  k.Rx_invalid_descs,
		TXInvalidDescs:  k.Tx_invalid_descs,
		RXRingFull:      k.Rx_ring_full,
		RXFillRingEmpty: k.Rx_fill_ring_empty_descs,
		TXRingEmpty:     k.Tx_ring_empty_descs,
		RXPackets:       s.rxPackets.Load(),
		TXPackets:       s.txPackets.Load(),
		RXWakeups:       s.rxWakeups.Load(),
		TXWakeups:       s.txWakeups.Load(),
		Polls:           s.polls.Load(),
	}, nil
}

// Close wakes a blocked Poll or Receive, waits for calls in progress,
// unmaps the RX and TX rings, closes the socket (the kernel removes it from
// every XSKMAP, so its slot falls back to XDP_PASS) and, with the last
// socket on its queue, unmaps the fill and completion rings and takes back
// the frames the kernel held. Frames the caller still holds stay with the
// UMEM as User frames. Closing twice is safe; afterwards every method
// returns an error wrapping ErrClosed. Close must not be called from a
// TryReceive or Receive callback of the same socket.
func (s *Socket) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.close() })
	return s.closeErr
}

func (s *Socket) close() error {
	s.closing.Store(true)
	s.wake()
	s.life.Lock()
	// detach reads the TX ring after closing the fd, so it goes first.
	errs := []error{s.umem.detach(s), munmap(&s.rxMem), munmap(&s.txMem)}
	s.closed = true
	s.wakeMu.Lock()
	if s.efd >= 0 {
		errs = append(errs, unix.Close(s.efd))
		s.efd = -1
	}
	s.wakeMu.Unlock()
	s.life.Unlock()
	if s.ownsUMEM {
		errs = append(errs, s.umem.Close())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("xsk %s: close: %w", s.name, err)
	}
	return nil
}

// detach closes s's fd and, with the last socket of its queue, the queue's
// rings. It holds u.mu so that NewSocket never shares through a closing fd.
func (u *UMEM) detach(s *Socket) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.sockets, s)
	var errs []error
	if err := unix.Close(s.fd); err != nil {
		errs = append(errs, err)
	}
	s.fd = -1
	q := s.q
	if q.refs--; q.refs == 0 {
		delete(u.queues, q.key)
		errs = append(errs, q.unmap())
		u.reclaimQueue(q.id)
	} else if s.tx != nil {
		// The queue lives on, so reclaimQueue will not run, but with the
		// fd closed nothing consumes this socket's TX ring any more: the
		// frames still on it (submitted while the interface was down, for
		// example) would stay in TX state until the queue's last socket
		// closed.
		u.reclaimTX(s.tx, q.id)
	}
	return errors.Join(errs...)
}

// reclaimTX returns to the free list the frames of the TX ring's entries
// the kernel has not consumed. Called once the ring's socket is closed, so
// that the kernel's consumer index no longer moves.
func (u *UMEM) reclaimTX(tx *ring[Desc], id uint32) {
	var back []uint32
	st := kernelState(frameTX, id)
	for i, end := atomic.LoadUint32(tx.consumer), atomic.LoadUint32(tx.producer); i != end; i++ {
		fi := tx.at(i).Addr >> u.shift
		if fi < uint64(len(u.state)) && u.state[fi].CompareAndSwap(st, frameFree) {
			back = append(back, uint32(fi))
		}
	}
	u.release(back)
}
