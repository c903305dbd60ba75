// Command boottest is `make image-test`: it boots the images `make image`
// built in QEMU (software emulation, never KVM) and passes when, on every
// boot, lovelockd reports its data plane ready on the console and the
// image's /init, in check mode, confirms from inside the guest that the
// steering program is attached to the virtio-net port, pinned, and counting
// received packets, then powers the machine off. Each boot has a guard (90 s
// by default); a boot that fails prints its whole console log.
//
// Boots: amd64 (direct kernel boot), arm64 on a Cortex-A72 like
// BlueField-2's (direct kernel boot), and arm64 through UEFI firmware
// (qemu-efi-aarch64) with ACPI forced, as the card boots.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// bootCase is one way of booting an image.
type bootCase struct {
	name    string
	arch    string
	qemu    string
	machine []string
	console string
	// firmware, when set, boots through UEFI instead of QEMU's direct
	// kernel loader.
	firmware string
	// extra kernel arguments; want lists console lines that must appear.
	extra []string
	want  []string
}

const uefiFirmware = "/usr/share/qemu-efi-aarch64/QEMU_EFI.fd"

var cases = []bootCase{
	{
		name: "amd64", arch: "amd64", qemu: "qemu-system-x86_64",
		machine: []string{"-M", "pc"}, console: "ttyS0",
	},
	{
		name: "arm64", arch: "arm64", qemu: "qemu-system-aarch64",
		machine: []string{"-M", "virt", "-cpu", "cortex-a72"}, console: "ttyAMA0",
	},
	{
		name: "arm64-uefi", arch: "arm64", qemu: "qemu-system-aarch64",
		machine: []string{"-M", "virt", "-cpu", "cortex-a72"}, console: "ttyAMA0",
		firmware: uefiFirmware, extra: []string{"acpi=force"},
		want: []string{"EFI stub: Booting Linux Kernel", "ACPI: SPCR"},
	},
}

func main() {
	var (
		imageDir = flag.String("image", "bin/image", "directory make image wrote (<arch>/ below it)")
		only     = flag.String("cases", "amd64,arm64,arm64-uefi", "boots to run, comma-separated")
		guard    = flag.Duration("timeout", 90*time.Second, "guard per boot")
		memory   = flag.String("m", "1024", "guest memory (MiB)")
	)
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	var results []result
	failed := false
	for _, name := range strings.Split(*only, ",") {
		c, ok := findCase(name)
		if !ok {
			fmt.Fprintf(os.Stderr, "boottest: unknown boot %q\n", name)
			os.Exit(2)
		}
		r := boot(ctx, c, *imageDir, *memory, *guard)
		results = append(results, r)
		if r.Err != "" {
			failed = true
			fmt.Fprintf(os.Stderr, "\n===== %s FAILED: %s\n===== console log (%s):\n%s===== end of %s console log\n\n",
				c.name, r.Err, r.LogFile, r.console, c.name)
		}
	}
	fmt.Println()
	fmt.Printf("%-11s %-6s %9s %9s %9s  %s\n", "boot", "result", "ready", "checked", "off", "notes")
	for _, r := range results {
		status := "PASS"
		if r.Err != "" {
			status = "FAIL"
		}
		fmt.Printf("%-11s %-6s %8.2fs %8.2fs %8.2fs  %s\n", r.Name, status, r.ReadyS, r.CheckedS, r.OffS, r.Notes)
	}
	if b, err := json.MarshalIndent(results, "", "  "); err == nil {
		_ = os.WriteFile(filepath.Join(*imageDir, "boottest.json"), append(b, '\n'), 0o644)
	}
	passed, nfailed := 0, 0
	for _, r := range results {
		if r.Err == "" {
			passed++
		} else {
			nfailed++
		}
	}
	// The closing line CI reads.
	fmt.Printf("boottest: %d passed, %d failed\n", passed, nfailed)
	if failed {
		os.Exit(1)
	}
}

func findCase(name string) (bootCase, bool) {
	for _, c := range cases {
		if c.name == strings.TrimSpace(name) {
			return c, true
		}
	}
	return bootCase{}, false
}

// result is one boot's outcome; times are seconds since QEMU started.
type result struct {
	Name     string  `json:"name"`
	Err      string  `json:"error,omitempty"`
	ReadyS   float64 `json:"ready_s"`
	CheckedS float64 `json:"checked_s"`
	OffS     float64 `json:"powered_off_s"`
	Notes    string  `json:"notes,omitempty"`
	LogFile  string  `json:"console_log"`
	console  string
}

func (c bootCase) args(dir, memory string) []string {
	kernel := filepath.Join(dir, c.arch, "vmlinuz")
	if c.arch == "arm64" {
		kernel = filepath.Join(dir, c.arch, "Image")
	}
	cmdline := append([]string{"console=" + c.console, "panic=-1",
		"lovelock.config=/etc/lovelock/qemu.json", "lovelock.check"}, c.extra...)
	args := append([]string{}, c.machine...)
	args = append(args,
		// Software emulation only: KVM is not available here, and the
		// test must behave the same everywhere.
		"-accel", "tcg",
		"-m", memory, "-smp", "1",
		"-nodefaults", "-display", "none", "-serial", "stdio", "-no-reboot",
		"-kernel", kernel,
		"-initrd", filepath.Join(dir, c.arch, "initramfs.cpio.gz"),
		"-append", strings.Join(cmdline, " "),
		"-netdev", "user,id=n0",
		// No option ROM: the UEFI boot does not need iPXE.
		"-device", "virtio-net-pci,netdev=n0,romfile=",
	)
	if c.firmware != "" {
		args = append(args, "-bios", c.firmware)
	}
	return args
}

// boot runs one case under its guard.
func boot(ctx context.Context, c bootCase, dir, memory string, guard time.Duration) result {
	r := result{Name: c.name, LogFile: filepath.Join(dir, c.name+".console.log")}
	fail := func(format string, a ...any) result {
		r.Err = fmt.Sprintf(format, a...)
		return r
	}
	if c.firmware != "" {
		if _, err := os.Stat(c.firmware); err != nil {
			return fail("UEFI firmware: %v (install qemu-efi-aarch64: make image-deps)", err)
		}
	}
	logf, err := os.Create(r.LogFile)
	if err != nil {
		return fail("%v", err)
	}
	defer logf.Close()
	var console strings.Builder
	var mu sync.Mutex
	out := io.MultiWriter(logf, lockedWriter{&mu, &console})

	ctx, cancel := context.WithTimeout(ctx, guard)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.qemu, c.args(dir, memory)...)
	cmd.Stdin = nil
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		return fail("%v", err)
	}
	cmd.Stderr = cmd.Stdout
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return fail("start %s: %v (install it: make image-deps)", c.qemu, err)
	}
	fmt.Printf("boottest: %s: %s %s\n", c.name, c.qemu, strings.Join(c.args(dir, memory), " "))
	ev := watch(pipe, out, start)
	waitErr := cmd.Wait()
	r.OffS = time.Since(start).Seconds()
	r.ReadyS, r.CheckedS = ev.ready.Seconds(), ev.checked.Seconds()
	r.Notes = ev.note
	// watch has read everything QEMU wrote.
	mu.Lock()
	r.console = console.String()
	mu.Unlock()

	switch {
	case ctx.Err() == context.DeadlineExceeded && ev.pass:
		return fail("check passed but the guest did not power off within the %v guard", guard)
	case ctx.Err() == context.DeadlineExceeded:
		return fail("no verdict within the %v guard (ready seen: %v, check passed: %v)", guard, ev.ready > 0, ev.pass)
	case ev.failure != "":
		return fail("%s", ev.failure)
	case !ev.pass:
		return fail("QEMU exited (%v) without LOVELOCK-CHECK PASS", waitErr)
	case ev.ready == 0:
		return fail("check passed but lovelockd never logged that it is ready")
	case waitErr != nil:
		return fail("QEMU: %v", waitErr)
	}
	for _, w := range c.want {
		if !strings.Contains(r.console, w) {
			return fail("console never showed %q", w)
		}
	}
	fmt.Printf("boottest: %s: lovelockd ready after %.2fs, checked at %.2fs, powered off at %.2fs\n",
		c.name, r.ReadyS, r.CheckedS, r.OffS)
	return r
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// checkMarker starts the lines the image's /init prints in check mode.
const checkMarker = "LOVELOCK-CHECK"

// isReady reports whether a console line is lovelockd saying it is ready:
// "data plane ready", or msg=ready from the release that serves an API.
// (The same test as the image's /init.)
func isReady(line string) bool {
	return strings.Contains(line, "data plane ready") ||
		strings.Contains(line, "msg=ready ") || strings.HasSuffix(line, "msg=ready") ||
		strings.Contains(line, `"msg":"ready"`)
}

// events is what the console showed, with times since start.
type events struct {
	ready, checked time.Duration
	pass           bool
	failure        string
	note           string
}

// watch copies the console to out until EOF (QEMU exits when the guest
// powers off) and records the markers it sees.
func watch(r io.Reader, out io.Writer, start time.Time) events {
	var ev events
	var notes []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(out, line)
		switch {
		case isReady(line) && ev.ready == 0:
			ev.ready = time.Since(start)
		case strings.Contains(line, checkMarker+" PASS"):
			ev.pass = true
			ev.checked = time.Since(start)
		case strings.Contains(line, checkMarker+" FAIL"):
			ev.failure = strings.TrimSpace(line[strings.Index(line, checkMarker):])
		case strings.Contains(line, checkMarker+" todo"):
			notes = append(notes, strings.TrimSpace(line[strings.Index(line, checkMarker+" todo")+len(checkMarker)+1:]))
		case strings.Contains(line, "Kernel panic"):
			if ev.failure == "" {
				ev.failure = strings.TrimSpace(line)
			}
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, os.ErrClosed) && ev.failure == "" {
		ev.failure = "reading the console: " + err.Error()
	}
	ev.note = strings.Join(notes, "; ")
	return ev
}
