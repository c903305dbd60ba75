package fmap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The userfaultfd ABI. golang.org/x/sys/unix (v0.49) has SYS_USERFAULTFD but
// none of the constants or structs below; they are transcribed from
// include/uapi/linux/userfaultfd.h (Linux 6.18). The ioctl numbers are
// computed from the struct sizes the way the header's _IOWR/_IOR macros do,
// so a layout mistake changes the number and the kernel rejects it (ENOTTY)
// instead of reading garbage.
const (
	uffdAPI          = 0xAA // UFFD_API
	uffdUserModeOnly = 1    // UFFD_USER_MODE_ONLY (flag of userfaultfd(2))

	// ioctl command numbers (_UFFDIO_*), also the bit positions in the
	// ioctls mask that UFFDIO_REGISTER returns.
	nrRegister     = 0x00
	nrWake         = 0x02
	nrCopy         = 0x03
	nrWriteProtect = 0x06
	nrPoison       = 0x08
	nrAPI          = 0x3F

	featureMissingShmem     = 1 << 5  // UFFD_FEATURE_MISSING_SHMEM
	featureWPHugetlbfsShmem = 1 << 12 // UFFD_FEATURE_WP_HUGETLBFS_SHMEM (5.19+)
	featureWPUnpopulated    = 1 << 13 // UFFD_FEATURE_WP_UNPOPULATED (6.4+)
	featurePoison           = 1 << 14 // UFFD_FEATURE_POISON (6.6+)
	featureWPAsync          = 1 << 15 // UFFD_FEATURE_WP_ASYNC (6.7+)

	registerModeMissing = 1 << 0 // UFFDIO_REGISTER_MODE_MISSING
	registerModeWP      = 1 << 1 // UFFDIO_REGISTER_MODE_WP

	copyModeDontWake = 1 << 0 // UFFDIO_COPY_MODE_DONTWAKE
	copyModeWP       = 1 << 1 // UFFDIO_COPY_MODE_WP

	writeProtectModeWP = 1 << 0 // UFFDIO_WRITEPROTECT_MODE_WP

	eventPagefault = 0x12 // UFFD_EVENT_PAGEFAULT

	pagefaultFlagWrite = 1 << 0 // UFFD_PAGEFAULT_FLAG_WRITE
	pagefaultFlagWP    = 1 << 1 // UFFD_PAGEFAULT_FLAG_WP

	uffdMsgSize = 32 // sizeof(struct uffd_msg)
)

type uffdioAPI struct{ API, Features, Ioctls uint64 }

type uffdioRange struct{ Start, Len uint64 }

type uffdioRegister struct {
	Range        uffdioRange
	Mode, Ioctls uint64
}

type uffdioCopy struct {
	Dst, Src, Len, Mode uint64
	Copy                int64
}

type uffdioWriteProtect struct {
	Range uffdioRange
	Mode  uint64
}

type uffdioPoison struct {
	Range   uffdioRange
	Mode    uint64
	Updated int64
}

const (
	iocWrite = 1
	iocRead  = 2

	ioctlAPI          = (iocRead|iocWrite)<<30 | uint(unsafe.Sizeof(uffdioAPI{}))<<16 | uffdAPI<<8 | nrAPI
	ioctlRegister     = (iocRead|iocWrite)<<30 | uint(unsafe.Sizeof(uffdioRegister{}))<<16 | uffdAPI<<8 | nrRegister
	ioctlWake         = iocRead<<30 | uint(unsafe.Sizeof(uffdioRange{}))<<16 | uffdAPI<<8 | nrWake
	ioctlCopy         = (iocRead|iocWrite)<<30 | uint(unsafe.Sizeof(uffdioCopy{}))<<16 | uffdAPI<<8 | nrCopy
	ioctlWriteProtect = (iocRead|iocWrite)<<30 | uint(unsafe.Sizeof(uffdioWriteProtect{}))<<16 | uffdAPI<<8 | nrWriteProtect
	ioctlPoison       = (iocRead|iocWrite)<<30 | uint(unsafe.Sizeof(uffdioPoison{}))<<16 | uffdAPI<<8 | nrPoison

	// USERFAULTFD_IOC_NEW, _IO(0xAA, 0x00) on /dev/userfaultfd (6.1+).
	ioctlDevNew = uffdAPI << 8 // nr 0x00
)

// uffdMsg is the part of struct uffd_msg a page-fault event uses.
type uffdMsg struct {
	Event   uint8
	Flags   uint64
	Address uint64
}

func parseMsg(b []byte) uffdMsg {
	// struct uffd_msg: __u8 event; __u8 reserved1; __u16 reserved2;
	// __u32 reserved3; union { struct { __u64 flags; __u64 address; ... } pagefault; ... }
	return uffdMsg{
		Event:   b[0],
		Flags:   binary.NativeEndian.Uint64(b[8:]),
		Address: binary.NativeEndian.Uint64(b[16:]),
	}
}

func ioctl(fd int, req uint, arg unsafe.Pointer) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg))
	switch e {
	case 0:
		return nil
	case unix.ESRCH:
		return errGone
	}
	return e
}

// errGone is a userfaultfd ioctl's ESRCH: the mm that created the
// userfaultfd is gone (the program exited, or exec'd), so no fault is
// left to serve and nothing can write its memory any more.
var errGone = fmt.Errorf("the program's memory is gone (it exited): %w", unix.ESRCH)

// errUffdPerm is what openUffd reports when neither way of creating a
// userfaultfd is allowed.
var errUffdPerm = errors.New("userfaultfd: permission denied: run as root, grant CAP_SYS_PTRACE, " +
	"set vm.unprivileged_userfaultfd=1, or give the user read-write access to /dev/userfaultfd")

// openUffd creates a non-blocking, close-on-exec userfaultfd. It tries the
// syscall, then /dev/userfaultfd (whose file mode is the access control since
// 6.1), then the syscall with UFFD_USER_MODE_ONLY, which unprivileged users
// get where vm.unprivileged_userfaultfd=0; with it a fault taken inside a
// system call (read(2) into the mapping) fails with EFAULT instead of being
// served, which the caller must accept. userModeOnly says which one it got.
func openUffd() (fd int, userModeOnly bool, err error) {
	const flags = unix.O_CLOEXEC | unix.O_NONBLOCK
	r, _, e := unix.Syscall(unix.SYS_USERFAULTFD, flags, 0, 0)
	if e == 0 {
		return int(r), false, nil
	}
	if e != unix.EPERM {
		return -1, false, fmt.Errorf("userfaultfd: %w (the kernel needs CONFIG_USERFAULTFD)", e)
	}
	if dev, err := os.OpenFile("/dev/userfaultfd", os.O_RDWR|unix.O_CLOEXEC, 0); err == nil {
		r, _, e := unix.Syscall(unix.SYS_IOCTL, dev.Fd(), ioctlDevNew, flags)
		dev.Close()
		if e == 0 {
			return int(r), false, nil
		}
	}
	r, _, e = unix.Syscall(unix.SYS_USERFAULTFD, flags|uffdUserModeOnly, 0, 0)
	if e == 0 {
		return int(r), true, nil
	}
	return -1, false, errUffdPerm
}

// uffdFeatures reports the features this kernel's userfaultfd offers. Since
// a userfaultfd accepts UFFDIO_API once, it asks on a throwaway descriptor.
func uffdFeatures() (uint64, error) {
	fd, _, err := openUffd()
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	api := uffdioAPI{API: uffdAPI}
	if err := ioctl(fd, ioctlAPI, unsafe.Pointer(&api)); err != nil {
		return 0, fmt.Errorf("userfaultfd: UFFDIO_API: %w", err)
	}
	return api.Features, nil
}

// uffdEnable does the UFFDIO_API handshake on fd, asking for features.
func uffdEnable(fd int, features uint64) error {
	api := uffdioAPI{API: uffdAPI, Features: features}
	if err := ioctl(fd, ioctlAPI, unsafe.Pointer(&api)); err != nil {
		return fmt.Errorf("userfaultfd: UFFDIO_API with features %#x: %w", features, err)
	}
	return nil
}

// uffdRegister registers [addr, addr+n) with mode and returns the ioctls the
// kernel allows on the range.
func uffdRegister(fd int, addr, n uintptr, mode uint64) (uint64, error) {
	reg := uffdioRegister{Range: uffdioRange{Start: uint64(addr), Len: uint64(n)}, Mode: mode}
	if err := ioctl(fd, ioctlRegister, unsafe.Pointer(&reg)); err != nil {
		return 0, fmt.Errorf("userfaultfd: UFFDIO_REGISTER %#x+%d mode %#x: %w", addr, n, mode, err)
	}
	return reg.Ioctls, nil
}

// uffdCopy atomically installs src at dst in the registered mm and wakes the
// threads waiting there. It retries EAGAIN (the mm is changing under a
// fork or mremap) and resumes after a partial copy; EEXIST (a page is there
// already) is returned with the bytes copied so far so the caller can decide.
func uffdCopy(fd int, dst uint64, src []byte, mode uint64) (int, error) {
	done := 0
	for done < len(src) {
		c := uffdioCopy{
			Dst:  dst + uint64(done),
			Src:  uint64(uintptr(unsafe.Pointer(&src[done]))),
			Len:  uint64(len(src) - done),
			Mode: mode,
		}
		err := ioctl(fd, ioctlCopy, unsafe.Pointer(&c))
		runtime.KeepAlive(src)
		if c.Copy > 0 {
			done += int(c.Copy)
		}
		switch {
		case err == nil:
		case errors.Is(err, unix.EAGAIN):
			continue
		default:
			return done, err
		}
	}
	return done, nil
}

// uffdWriteProtect sets (wp) or clears write protection on a range; clearing
// also wakes the threads that faulted on it.
func uffdWriteProtect(fd int, addr, n uint64, wp bool) error {
	w := uffdioWriteProtect{Range: uffdioRange{Start: addr, Len: n}}
	if wp {
		w.Mode = writeProtectModeWP
	}
	for {
		err := ioctl(fd, ioctlWriteProtect, unsafe.Pointer(&w))
		if errors.Is(err, unix.EAGAIN) {
			continue
		}
		return err
	}
}

// uffdWake wakes the threads waiting on a range without resolving anything:
// they retry the access and fault again if the page is still missing.
func uffdWake(fd int, addr, n uint64) error {
	r := uffdioRange{Start: addr, Len: n}
	return ioctl(fd, ioctlWake, unsafe.Pointer(&r))
}

// uffdPoison marks the missing pages of [addr, addr+n) poisoned and wakes
// the threads waiting there: an access to them raises SIGBUS from now on
// (until the pages are zapped), as a memory error would. Pages already
// present are left as they are. It needs UFFD_FEATURE_POISON on fd.
func uffdPoison(fd int, addr, n uint64, pageSize int) error {
	for done := uint64(0); done < n; {
		p := uffdioPoison{Range: uffdioRange{Start: addr + done, Len: n - done}}
		err := ioctl(fd, ioctlPoison, unsafe.Pointer(&p))
		if p.Updated > 0 {
			done += uint64(p.Updated)
		}
		switch {
		case err == nil:
			return nil // the rest of the range
		case errors.Is(err, unix.EAGAIN):
		case errors.Is(err, unix.EEXIST):
			// A present page: step over it.
			done += uint64(pageSize) - done%uint64(pageSize)
		default:
			return err
		}
	}
	return nil
}
