package xsk

import (
	"errors"
	"fmt"
	"net"
	"unsafe"

	"golang.org/x/sys/unix"
)

// x/sys/unix has no typed helpers for the struct-valued SOL_XDP options.

func setsockopt(fd, level, opt int, p unsafe.Pointer, size uintptr) error {
	_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(p), size, 0)
	if e != 0 {
		return e
	}
	return nil
}

func getsockopt(fd, level, opt int, p unsafe.Pointer, size uintptr) error {
	l := uint32(size)
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(p), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return e
	}
	if uintptr(l) != size {
		return fmt.Errorf("getsockopt %d returned %d bytes, want %d", opt, l, size)
	}
	return nil
}

func registerUMEM(fd int, area []byte, cfg UMEMConfig) error {
	reg := unix.XDPUmemReg{
		Addr:     uint64(uintptr(unsafe.Pointer(&area[0]))),
		Len:      uint64(len(area)),
		Size:     uint32(cfg.FrameSize),
		Headroom: uint32(cfg.Headroom),
	}
	if err := setsockopt(fd, unix.SOL_XDP, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Sizeof(reg)); err != nil {
		return fmt.Errorf("register UMEM (%d frames of %d bytes): %w", cfg.FrameCount, cfg.FrameSize, err)
	}
	return nil
}

func mmapOffsets(fd int) (unix.XDPMmapOffsets, error) {
	var off unix.XDPMmapOffsets
	if err := getsockopt(fd, unix.SOL_XDP, unix.XDP_MMAP_OFFSETS, unsafe.Pointer(&off), unsafe.Sizeof(off)); err != nil {
		return off, fmt.Errorf("read ring offsets: %w", err)
	}
	return off, nil
}

// mapRing sizes ring opt on fd to n entries and maps it.
func mapRing[T entry](fd, opt int, pgoff int64, off unix.XDPRingOffset, n int, producer bool) ([]byte, *ring[T], error) {
	if err := unix.SetsockoptInt(fd, unix.SOL_XDP, opt, n); err != nil {
		return nil, nil, fmt.Errorf("size %s ring to %d: %w", ringName(opt), n, err)
	}
	var zero T
	length := int(off.Desc) + n*int(unsafe.Sizeof(zero))
	mem, err := unix.Mmap(fd, pgoff, length, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, nil, fmt.Errorf("mmap %s ring: %w", ringName(opt), err)
	}
	r, err := newRing[T](mem, off, uint32(n), producer)
	if err != nil {
		_ = unix.Munmap(mem)
		return nil, nil, fmt.Errorf("%s ring: %w", ringName(opt), err)
	}
	return mem, r, nil
}

func ringName(opt int) string {
	switch opt {
	case unix.XDP_RX_RING:
		return "RX"
	case unix.XDP_TX_RING:
		return "TX"
	case unix.XDP_UMEM_FILL_RING:
		return "fill"
	case unix.XDP_UMEM_COMPLETION_RING:
		return "completion"
	}
	return fmt.Sprintf("ring %d", opt)
}

// munmap unmaps *mem once and forgets it.
func munmap(mem *[]byte) error {
	if *mem == nil {
		return nil
	}
	err := unix.Munmap(*mem)
	*mem = nil
	return err
}

// ifaceName names ifindex for messages; it never fails.
func ifaceName(ifindex int) string {
	if ifi, err := net.InterfaceByIndex(ifindex); err == nil {
		return ifi.Name
	}
	return fmt.Sprintf("if%d", ifindex)
}

// transient reports errors of sendto/recvfrom wakeups that mean "try again
// later" rather than "the socket is broken": EAGAIN (batch limit, socket
// buffer or completion ring full), EBUSY (the driver dropped one frame; it
// still completes), ENOBUFS (skb allocation failed), EINTR.
func transient(err error) bool {
	return errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EBUSY) ||
		errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.EINTR)
}
