// Command lovelock-init is /init of the Lovelock image: the first and only
// long-lived process besides lovelockd. It mounts proc, sys, dev and the
// bpffs, loads the kernel modules the image carries in modules.dep order,
// brings up the interfaces of the appliance configuration
// (/etc/lovelock/appliance.json), then starts lovelockd and restarts it
// whenever it dies, its output going to the console. As PID 1 it also reaps
// orphans, and powers off or reboots on SIGTERM/SIGPWR or SIGINT
// (ctrl-alt-del).
//
// Kernel command line options:
//
//	lovelock.config=PATH  read this appliance configuration instead
//	lovelock.check        boot test: once lovelockd is ready, check from
//	                      inside that the steering program is attached and
//	                      pinned, print LOVELOCK-CHECK lines, power off
package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/control/attach"
	"github.com/lovelock-dpu/lovelock/control/buildinfo"
	"github.com/lovelock-dpu/lovelock/images/appconfig"
	"github.com/lovelock-dpu/lovelock/images/bfb"
	"github.com/lovelock-dpu/lovelock/images/kmod"
)

// Paths inside the image.
const (
	lovelockdPath = "/usr/bin/lovelockd"
	modulesRoot   = "/lib/modules"
)

// options are what /init takes from the kernel command line.
type options struct {
	config string
	check  bool
}

func parseCmdline(cmdline string) options {
	o := options{config: appconfig.Path}
	for _, f := range strings.Fields(cmdline) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "lovelock.config":
			o.config = v
		case "lovelock.check":
			o.check = v == "" || v == "1" || v == "true"
		}
	}
	return o
}

func main() {
	log := slog.New(slog.NewTextHandler(os.Stdout, nil)).With("src", "init")
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "lovelock-init is the image's /init; it runs only as PID 1")
		os.Exit(2)
	}
	err := run(log)
	// PID 1 must never exit: the kernel would panic and the console
	// would lose the reason.
	log.Error("init stopped", "err", err)
	powerOff(log, unix.LINUX_REBOOT_CMD_POWER_OFF)
}

func run(log *slog.Logger) error {
	log.Info("lovelock appliance starting", "version", buildinfo.Version)
	if err := mountAll(); err != nil {
		log.Error("mount", "err", err)
	}
	cmdline, _ := os.ReadFile("/proc/cmdline")
	opts := parseCmdline(string(cmdline))

	// ctrl-alt-del becomes SIGINT to us instead of an immediate reboot.
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_CAD_OFF)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT, unix.SIGPWR)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The reaper outlives ctx: stopping lovelockd at shutdown needs it.
	reap := newReaper(log)
	go reap.run(context.Background())

	cfg, err := appconfig.Load(opts.config)
	if err != nil {
		// Without a config there is nothing to attach to; keep the
		// console alive for whoever looks.
		return err
	}
	if cfg.Hostname != "" {
		if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
			log.Warn("hostname", "err", err)
		}
	}
	loadModules(log, cfg.Modules)
	if err := setupNetwork(ctx, log, cfg); err != nil {
		log.Error("network", "err", err)
	}
	rs := newRshim(log)
	rs.write("Linux up")

	ready := make(chan struct{}, 1)
	sup := &supervisor{
		log:     log,
		path:    lovelockdPath,
		args:    cfg.LovelockdArgs(),
		start:   reap.start,
		onLine:  readyWatcher(ready),
		backoff: backoff{min: time.Second, max: 30 * time.Second},
	}
	supDone := make(chan error, 1)
	go func() { supDone <- sup.run(ctx) }()

	var checkDone <-chan error
	if opts.check {
		ch := make(chan error, 1)
		checkDone = ch
		go func() { ch <- bootCheck(ctx, log, cfg, attach.DefaultDir, ready) }()
	} else {
		go func() {
			socket := apiSocket(cfg)
			confirm := func(ctx context.Context) error { return confirmReady(ctx, socket) }
			if announceReady(ctx, ready, confirm, readyRetry, rs.write) {
				// With the version: the flash counts only the image it
				// flashed as up, not an OS the card fell back to.
				rs.write(bfb.ReadyMessage(buildinfo.Version))
				rs.osUp()
			}
		}()
	}

	cmd := unix.LINUX_REBOOT_CMD_POWER_OFF
	select {
	case s := <-sigs:
		log.Info("signal", "signal", s.String())
		if s == unix.SIGINT {
			cmd = unix.LINUX_REBOOT_CMD_RESTART
		}
	case err := <-checkDone:
		if err != nil {
			fmt.Printf("LOVELOCK-CHECK FAIL %v\n", err)
		} else {
			fmt.Println("LOVELOCK-CHECK PASS")
		}
	case err := <-supDone:
		log.Error("supervisor stopped", "err", err)
	}
	cancel()
	sup.stop(10 * time.Second)
	powerOff(log, cmd)
	return errors.New("unreachable: reboot returned")
}

// mountAll mounts what the appliance needs; an already-mounted target is
// fine.
func mountAll() error {
	var errs []error
	for _, m := range []struct{ src, dst, fstype, data string }{
		{"proc", "/proc", "proc", ""},
		{"sysfs", "/sys", "sysfs", ""},
		{"devtmpfs", "/dev", "devtmpfs", "mode=0755"},
		{"tmpfs", "/run", "tmpfs", "mode=0755"},
		{"tmpfs", "/tmp", "tmpfs", "mode=1777"},
		{"bpf", "/sys/fs/bpf", "bpf", "mode=0700"},
	} {
		if err := os.MkdirAll(m.dst, 0o755); err != nil {
			errs = append(errs, err)
			continue
		}
		flags := uintptr(unix.MS_NOSUID)
		if m.fstype != "devtmpfs" {
			flags |= unix.MS_NODEV
		}
		if err := unix.Mount(m.src, m.dst, m.fstype, flags, m.data); err != nil && !errors.Is(err, unix.EBUSY) {
			errs = append(errs, fmt.Errorf("mount %s on %s: %w", m.fstype, m.dst, err))
		}
	}
	return errors.Join(errs...)
}

// loadModules loads names (every module in modules.dep when empty) and what
// they need. A module that fails is logged: the rest may still be enough.
func loadModules(log *slog.Logger, names []string) {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		log.Error("uname", "err", err)
		return
	}
	dir := filepath.Join(modulesRoot, unix.ByteSliceToString(uts.Release[:]))
	f, err := os.Open(filepath.Join(dir, "modules.dep"))
	if err != nil {
		log.Warn("no modules", "err", err)
		return
	}
	dep, err := kmod.ParseDep(f)
	f.Close()
	if err != nil {
		log.Error("modules", "err", err)
		return
	}
	if len(names) == 0 {
		names = dep.Names()
	}
	order, err := dep.LoadOrder(names)
	if err != nil {
		log.Error("modules", "err", err)
		return
	}
	start := time.Now()
	loaded := 0
	for _, p := range order {
		if err := kmod.Load(filepath.Join(dir, p)); err != nil {
			log.Error("module", "err", err)
			continue
		}
		loaded++
	}
	log.Info("modules loaded", "count", loaded, "of", len(order), "took", time.Since(start).Round(time.Millisecond))
}

// powerOff stops everything and turns the machine off (or restarts it).
func powerOff(log *slog.Logger, cmd int) {
	unix.Sync()
	log.Info("powering off", "restart", cmd == unix.LINUX_REBOOT_CMD_RESTART)
	if err := unix.Reboot(cmd); err != nil {
		log.Error("reboot", "err", err)
	}
	// Not reached on success; if reboot failed, idle rather than exit.
	for {
		time.Sleep(time.Hour)
	}
}

// rshim writes the rshim log, which the BMC or host reads from
// /dev/rshim0/misc (what `lovelock image flash` follows), and sets the
// card's os_up flag. The driver that offers them (mlxbf-bootctl) is in
// NVIDIA's BlueField kernel, not in Debian's: without it the flash cannot
// see the card come up, so /init says so on the console, once.
type rshim struct {
	log      *slog.Logger
	logPaths []string
	upPaths  []string
	missing  sync.Once
}

func newRshim(log *slog.Logger) *rshim {
	return &rshim{
		log:      log,
		logPaths: []string{"/sys/devices/platform/MLNXBF04:00/driver/rsh_log"},
		upPaths: []string{
			"/sys/devices/platform/MLNXBF04:00/driver/os_up",
			"/sys/devices/platform/MLNXBF04:00/os_up",
		},
	}
}

// write appends msg to the rshim log; it logs msg on the console either way.
func (r *rshim) write(msg string) {
	if err := writeFirst(r.logPaths, msg+"\n"); err != nil {
		r.absent(err)
		r.log.Info("rshim log unavailable", "msg", msg)
		return
	}
	r.log.Info("rshim log", "msg", msg)
}

// osUp sets the card's os_up flag.
func (r *rshim) osUp() {
	if err := writeFirst(r.upPaths, "1\n"); err != nil {
		r.absent(err)
		return
	}
	r.log.Info("os_up set")
}

func (r *rshim) absent(err error) {
	if !errors.Is(err, fs.ErrNotExist) {
		r.log.Warn("rshim", "err", err)
		return
	}
	r.missing.Do(func() {
		r.log.Warn("no rshim log: this kernel lacks mlxbf-bootctl (CONFIG_MLXBF_BOOTCTL), so `lovelock image flash` "+
			"cannot see this boot and will time out although the card runs; follow this console instead",
			"tried", strings.Join(r.logPaths, " "))
	})
}

// writeFirst writes data into the first of paths that exists (sysfs
// attributes: never created). It fails with fs.ErrNotExist when none does.
func writeFirst(paths []string, data string) error {
	for _, p := range paths {
		f, err := os.OpenFile(p, os.O_WRONLY, 0)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		_, err = f.WriteString(data)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		return nil
	}
	return fmt.Errorf("%s: %w", strings.Join(paths, ", "), fs.ErrNotExist)
}
