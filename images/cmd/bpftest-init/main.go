// Command bpftest-init is /init of the initramfs `make image-bpf-test` boots
// (images/cmd/bpftest): it mounts what Go tests of the data plane need
// (proc, sys, dev, a tmpfs /tmp, the bpffs), loads every module of the
// archive's modules.dep (veth, the TC hooks), runs the test binaries that
// /bpftest/run.json lists, one after the other, with their output on the
// console, and powers the machine off.
//
// Console protocol (read by images/cmd/bpftest):
//
//	BPFTEST kernel <release>
//	BPFTEST start <name>
//	... the test binary's output ...
//	BPFTEST end <name> ok|FAIL <exit status> <seconds>
//	BPFTEST DONE PASS|FAIL <n> passed, <n> failed
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/images/kmod"
)

// RunFile is where the host puts the list of tests.
const RunFile = "/bpftest/run.json"

// Test is one test binary to run.
type Test struct {
	Name string   `json:"name"` // package path, for the console
	Bin  string   `json:"bin"`  // the binary in the archive
	Dir  string   `json:"dir"`  // working directory (holds the package's testdata)
	Args []string `json:"args"` // -test.* flags
}

// Run is RunFile's content.
type Run struct {
	// Objects are BPF ELF objects whose programs are loaded one by one
	// before the tests, each reported with the verifier's full log when the
	// kernel rejects it (a test sees only the first rejection).
	Objects []string `json:"objects"`
	Env     []string `json:"env"`
	Tests   []Test   `json:"tests"`
}

func main() {
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "bpftest-init runs only as PID 1 of the image-bpf-test initramfs")
		os.Exit(2)
	}
	if err := run(); err != nil {
		fmt.Printf("BPFTEST DONE FAIL init: %v\n", err)
	}
	unix.Sync()
	// PID 1 must not exit (the kernel would panic); power off instead.
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		fmt.Printf("BPFTEST reboot: %v\n", err)
	}
	for {
		time.Sleep(time.Hour)
	}
}

func run() error {
	if err := mountAll(); err != nil {
		return err
	}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return err
	}
	release := unix.ByteSliceToString(uts.Release[:])
	fmt.Printf("BPFTEST kernel %s %s\n", release, unix.ByteSliceToString(uts.Machine[:]))
	if err := loadModules(filepath.Join("/lib/modules", release)); err != nil {
		return err
	}
	raw, err := os.ReadFile(RunFile)
	if err != nil {
		return err
	}
	var r Run
	if err := json.Unmarshal(raw, &r); err != nil {
		return fmt.Errorf("%s: %w", RunFile, err)
	}
	env := append([]string{"PATH=/bin", "HOME=/tmp", "TMPDIR=/tmp"}, r.Env...)
	passed, failed := 0, 0
	if len(r.Objects) > 0 {
		fmt.Printf("BPFTEST start verifier\n")
		start := time.Now()
		if n := loadObjects(r.Objects); n > 0 {
			fmt.Printf("BPFTEST end verifier FAIL %d programs rejected %.2fs\n", n, time.Since(start).Seconds())
			failed++
		} else {
			fmt.Printf("BPFTEST end verifier ok every program loaded %.2fs\n", time.Since(start).Seconds())
			passed++
		}
	}
	for _, t := range r.Tests {
		fmt.Printf("BPFTEST start %s\n", t.Name)
		start := time.Now()
		cmd := exec.Command(t.Bin, t.Args...)
		cmd.Dir, cmd.Env = t.Dir, env
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout
		err := cmd.Run()
		status := "exit status 0"
		if err != nil {
			status = err.Error()
		}
		verdict := "ok"
		if err != nil {
			verdict = "FAIL"
			failed++
		} else {
			passed++
		}
		fmt.Printf("BPFTEST end %s %s %s %.2fs\n", t.Name, verdict, status, time.Since(start).Seconds())
	}
	verdict := "PASS"
	if failed > 0 || passed == 0 {
		verdict = "FAIL"
	}
	fmt.Printf("BPFTEST DONE %s %d passed, %d failed\n", verdict, passed, failed)
	return nil
}

func mountAll() error {
	for _, m := range []struct{ src, dst, fstype, data string }{
		{"proc", "/proc", "proc", ""},
		{"sysfs", "/sys", "sysfs", ""},
		{"devtmpfs", "/dev", "devtmpfs", "mode=0755"},
		{"tmpfs", "/tmp", "tmpfs", "mode=1777"},
		{"tmpfs", "/run", "tmpfs", "mode=0755"},
		{"bpf", "/sys/fs/bpf", "bpf", "mode=0700"},
	} {
		if err := os.MkdirAll(m.dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.src, m.dst, m.fstype, 0, m.data); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s on %s: %w", m.fstype, m.dst, err)
		}
	}
	// netns(8)'s directory, for tests that name namespaces.
	return os.MkdirAll("/run/netns", 0o755)
}

// loadModules loads every module of dir/modules.dep, dependencies first.
func loadModules(dir string) error {
	f, err := os.Open(filepath.Join(dir, "modules.dep"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	dep, err := kmod.ParseDep(f)
	f.Close()
	if err != nil {
		return err
	}
	order, err := dep.LoadOrder(dep.Names())
	if err != nil {
		return err
	}
	for _, p := range order {
		if err := kmod.Load(filepath.Join(dir, p)); err != nil {
			return err
		}
	}
	fmt.Printf("BPFTEST modules %d loaded\n", len(order))
	return nil
}

// loadObjects loads every program of every object on its own (with the maps
// it needs) and prints one line per program, followed by the verifier's
// whole log when it is rejected. It returns how many were rejected.
func loadObjects(objects []string) int {
	rejected := 0
	for _, obj := range objects {
		spec, err := ebpf.LoadCollectionSpec(obj)
		if err != nil {
			fmt.Printf("BPFTEST verifier %s: %v\n", obj, err)
			rejected++
			continue
		}
		names := slices.Sorted(func(yield func(string) bool) {
			for n := range spec.Programs {
				if !yield(n) {
					return
				}
			}
		})
		for _, name := range names {
			one := spec.Copy()
			for n := range one.Programs {
				if n != name {
					delete(one.Programs, n)
				}
			}
			start := time.Now()
			coll, err := ebpf.NewCollection(one)
			took := time.Since(start)
			var verr *ebpf.VerifierError
			switch {
			case errors.As(err, &verr):
				rejected++
				fmt.Printf("BPFTEST verifier %s %s REJECTED: %v\n%+v\nBPFTEST verifier %s %s end of log\n",
					filepath.Base(obj), name, verr, verr, filepath.Base(obj), name)
			case err != nil:
				rejected++
				fmt.Printf("BPFTEST verifier %s %s REJECTED: %v\n", filepath.Base(obj), name, err)
			default:
				insns := "?"
				if info, err := coll.Programs[name].Info(); err == nil {
					if n, ok := info.VerifiedInstructions(); ok {
						insns = fmt.Sprint(n)
					}
				}
				fmt.Printf("BPFTEST verifier %s %s ok: %d instructions, %s verified, %v\n",
					filepath.Base(obj), name, len(spec.Programs[name].Instructions), insns, took.Round(time.Millisecond))
				coll.Close()
			}
		}
	}
	return rejected
}
