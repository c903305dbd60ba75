// Command bpftest is `make image-bpf-test`: it runs Go test packages of the
// data plane (-pkgs; images/image.mk's IMAGE_BPF_TEST_PKGS) inside the
// image's kernel, so the BPF programs meet the verifier of the kernel the
// appliance boots (Debian's 6.12) and not only the build machine's. Before
// the tests, the guest loads every program of the committed objects on its
// own and prints the verifier's whole log for each it rejects.
//
// It cross-builds static test binaries (CGO_ENABLED=0 go test -c) and
// images/cmd/bpftest-init, takes the kernel and the modules the tests need
// (veth, the TC hooks, bridge, macvlan) from the pinned Debian package (the one
// `make image` uses, images/kernel.lock.json), writes an uncompressed
// initramfs, boots it in QEMU (software emulation, never KVM) and streams the
// console: the guest's /init runs each test binary as root with
// LOVELOCK_REQUIRE_PRIV=1 (a privilege skip is a failure) and powers off.
// It fails, with the console log, when a program is rejected, a test fails
// or skips, the guest panics twice (a panic boots it once more, with a
// warning) or does not power off within the guard
// (--timeout; make image-bpf-test gives 480 s: the packages' tests run
// under emulation, slowly on a busy 2-core machine).
//
// -kernel older boots the lock file's older kernel instead (Debian's 6.1,
// `make image-bpf-test-older`): the paths that differ by kernel version.
// -deb and -release boot any other kernel package for a one-off look; the
// lock file is not consulted then.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/lovelock-dpu/lovelock/images/initramfs"
	"github.com/lovelock-dpu/lovelock/images/kernel"
	"github.com/lovelock-dpu/lovelock/images/kmod"
)

// Modules the tests need on top of what the kernel builds in: veth pairs
// between namespaces, the TC hooks (tcx is built in from 6.6 on), and the
// bridge and macvlan that control/rules' redirect checks send to.
var testModules = []string{"veth", "sch_ingress", "cls_bpf", "bridge", "macvlan"}

// machine is how one architecture boots under QEMU.
type machine struct {
	qemu    string
	args    []string
	console string
	kernel  string // file name of the kernel we write
}

var machines = map[string]machine{
	"amd64": {qemu: "qemu-system-x86_64", args: []string{"-M", "pc"}, console: "ttyS0", kernel: "vmlinuz"},
	"arm64": {qemu: "qemu-system-aarch64", args: []string{"-M", "virt", "-cpu", "cortex-a72"}, console: "ttyAMA0", kernel: "Image"},
}

const marker = "BPFTEST"

func main() {
	var (
		arch    = flag.String("arch", "amd64", "guest architecture: amd64 or arm64")
		pkgs    = flag.String("pkgs", "./bpf/,./control/attach/,./dataplane/wire/", "test packages, comma-separated; each may carry flags for its test binary after a space (\"./control/rules/ -rules.sets=4\")")
		runRe   = flag.String("run", "", "passed to the test binaries as -test.run")
		out     = flag.String("out", "bin/image/bpftest", "work and log directory")
		guard   = flag.Duration("timeout", 120*time.Second, "guard for the boot (QEMU start to power-off)")
		lock    = flag.String("lock", "images/kernel.lock.json", "kernel lock file")
		cache   = flag.String("cache", "images/.cache", "where downloaded kernel packages are kept")
		goCmd   = flag.String("go", "go", "Go command that builds the binaries")
		which   = flag.String("kernel", "image", "pinned kernel to boot: image (the image's, images/kernel.lock.json's kernels) or older (its older section: Debian's 6.1)")
		fetch   = flag.Bool("fetch", false, "only fetch and check the pinned kernel package (CI re-pins when it has left the mirror)")
		objects = flag.Bool("objects", true, "load every program of the committed BPF objects first, each on its own, and fail on a rejection")
		deb     = flag.String("deb", "", "boot this kernel .deb instead of the pinned one (with -release)")
		release = flag.String("release", "", "kernel release inside -deb (6.1.0-41-cloud-amd64, say)")
		smp     = flag.Int("smp", 2, "guest CPUs")
		memory  = flag.String("m", "1024", "guest memory (MiB)")
	)
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	dir := *arch
	if *which != "image" {
		dir += "-" + *which
	}
	r := runner{ctx: ctx, arch: *arch, out: filepath.Join(*out, dir), goCmd: *goCmd, runRe: *runRe, objects: *objects}
	for _, p := range strings.Split(*pkgs, ",") {
		if f := strings.Fields(p); len(f) > 0 {
			r.pkgs = append(r.pkgs, testPkg{path: f[0], args: f[1:]})
		}
	}
	var pkg kernel.Package
	if *deb != "" {
		if *release == "" {
			fail("-deb needs -release")
		}
		pkg = kernel.Package{Package: filepath.Base(*deb), Release: *release}
	} else {
		l, err := kernel.LoadLock(*lock)
		if err != nil {
			fail("%v", err)
		}
		switch *which {
		case "image":
			pkg, err = l.For(*arch)
		case "older":
			pkg, err = l.OlderFor(*arch)
		default:
			err = fmt.Errorf("-kernel %q: want image or older", *which)
		}
		if err != nil {
			fail("%v", err)
		}
	}
	pkg.Modules = testModules
	if *fetch {
		if *deb != "" {
			fail("-fetch fetches a pinned kernel, not -deb")
		}
		if _, err := kernel.Fetch(ctx, pkg, *arch, *cache, os.Stdout); err != nil {
			fail("%v", err)
		}
		return
	}
	if err := r.run(pkg, *deb, *cache, *guard, *smp, *memory); err != nil {
		fail("%v", err)
	}
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "bpftest: FAIL: "+format+"\n", a...)
	os.Exit(1)
}

type runner struct {
	ctx   context.Context
	arch  string
	out   string
	goCmd string
	pkgs  []testPkg
	runRe string
	// objects loads the committed programs first (the verifier step).
	objects bool
}

func (r *runner) logf(format string, a ...any) {
	fmt.Printf("bpftest: "+format+"\n", a...)
}

func (r *runner) run(pkg kernel.Package, deb, cache string, guard time.Duration, smp int, memory string) error {
	m, ok := machines[r.arch]
	if !ok {
		return fmt.Errorf("unknown arch %q (amd64, arm64)", r.arch)
	}
	start := time.Now()
	if err := os.MkdirAll(r.out, 0o755); err != nil {
		return err
	}
	bins := filepath.Join(r.out, "bin")
	if err := os.RemoveAll(bins); err != nil {
		return err
	}
	if err := os.MkdirAll(bins, 0o755); err != nil {
		return err
	}

	// The kernel package and the Go builds are independent: do them at once.
	var (
		wg     sync.WaitGroup
		kc     *kernel.Contents
		kerr   error
		mu     sync.Mutex
		errs   []error
		tested []string // packages that have a test binary
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		if deb == "" {
			if deb, kerr = kernel.Fetch(r.ctx, pkg, r.arch, cache, os.Stdout); kerr != nil {
				return
			}
		}
		kc, kerr = kernel.Extract(r.ctx, deb, pkg)
	}()
	build := func(args ...string) {
		defer wg.Done()
		cmd := exec.CommandContext(r.ctx, r.goCmd, args...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+r.arch)
		if b, err := cmd.CombinedOutput(); err != nil {
			mu.Lock()
			errs = append(errs, fmt.Errorf("%s %s: %w\n%s", r.goCmd, strings.Join(args, " "), err, b))
			mu.Unlock()
		}
	}
	wg.Add(1)
	go build("build", "-trimpath", "-buildvcs=false", "-o", filepath.Join(bins, "init"), "./images/cmd/bpftest-init")
	for _, p := range r.pkgs {
		wg.Add(1)
		go build("test", "-c", "-trimpath", "-buildvcs=false", "-o", filepath.Join(bins, testName(p.path)+".test"), p.path)
	}
	wg.Wait()
	if kerr != nil {
		return kerr
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	r.logf("%s: kernel %s, modules %s; test binaries built (%.1fs)", r.arch, kc.Release, moduleNames(kc.Modules), time.Since(start).Seconds())

	initrd, err := r.initramfs(kc, bins, &tested)
	if err != nil {
		return err
	}
	kernelFile := filepath.Join(r.out, m.kernel)
	if err := os.WriteFile(kernelFile, kc.Kernel, 0o644); err != nil {
		return err
	}
	r.logf("%s: initramfs %s (%.1f MiB), %d test binaries (%.1fs)", r.arch, initrd, float64(fileSize(initrd))/(1<<20), len(tested), time.Since(start).Seconds())
	if len(tested) == 0 {
		return errors.New("no package has tests")
	}

	logf := func(f string, a ...any) { r.logf(r.arch+": "+f, a...) }
	res, panicked, err := bootAgain(logf, func(boot int) (*result, error) {
		logFile := filepath.Join(r.out, "console.log")
		if boot > 1 {
			logFile = filepath.Join(r.out, fmt.Sprintf("console-boot%d.log", boot))
		}
		res, err := r.boot(m, kernelFile, initrd, logFile, guard, smp, memory)
		r.logf("%s: console log in %s", r.arch, res.logFile)
		return res, err
	})
	if err != nil {
		return fmt.Errorf("%s: %v\n%s", r.arch, err, res.summary())
	}
	fmt.Print(res.summary())
	if panicked != "" {
		r.logf("%s: WARNING: passed after a guest kernel panic: %s", r.arch, panicked)
	}
	loaded := "every program loaded, "
	if !r.objects {
		loaded = ""
	}
	r.logf("%s: PASS on %s: %s%s passed; QEMU %.1fs, total %.1fs",
		r.arch, kc.Release, loaded, strings.Join(tested, " "), res.took.Seconds(), time.Since(start).Seconds())
	return nil
}

// bootAgain calls boot (numbered from 1) until a boot ends without a guest
// kernel panic, at most panicBoots times, and returns the last boot's
// result and error, and what the panicked boots said. A panic gets another
// boot because under TCG the emulated guest has double-faulted in code we
// do not touch (kmalloc inside a sysctl write, garbage EFLAGS) and passed
// when booted again; a panic that our programs or tests cause comes back
// and fails. Any other failure fails at once.
func bootAgain(logf func(string, ...any), boot func(int) (*result, error)) (*result, string, error) {
	var panicked []string
	for n := 1; ; n++ {
		res, err := boot(n)
		if err == nil || res.panic == "" {
			if err != nil && len(panicked) > 0 {
				err = fmt.Errorf("%w (earlier: %s)", err, strings.Join(panicked, "; "))
			}
			return res, strings.Join(panicked, "; "), err
		}
		panicked = append(panicked, fmt.Sprintf("boot %d: %s (console log %s)", n, res.panic, res.logFile))
		if n == panicBoots {
			return res, strings.Join(panicked, "; "), fmt.Errorf("guest kernel panicked on all %d boots: %s", n, strings.Join(panicked, "; "))
		}
		logf("WARNING: guest kernel panic on boot %d of at most %d: %s; booting again", n, panicBoots, res.panic)
	}
}

// panicBoots is how many times the guest boots when its kernel panics.
const panicBoots = 2

// testPkg is a package to test and flags for its test binary.
type testPkg struct {
	path string
	args []string
}

func testName(pkg string) string {
	return strings.ReplaceAll(strings.Trim(filepath.Clean(pkg), "./"), "/", "_")
}

func moduleNames(mods []kmod.Info) string {
	var s []string
	for _, m := range mods {
		s = append(s, m.Name)
	}
	return strings.Join(s, " ")
}

func fileSize(p string) int64 {
	st, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return st.Size()
}

// initramfs writes the guest's archive, uncompressed (the kernel takes it
// as is, and gzip would cost more time than it saves): /init, the test
// binaries, each package's testdata under /src/<package>, the modules and
// /bpftest/run.json.
func (r *runner) initramfs(kc *kernel.Contents, bins string, tested *[]string) (string, error) {
	a := initramfs.New()
	for _, d := range []string{"/proc", "/sys", "/dev", "/run", "/tmp", "/bin"} {
		if err := a.Add(initramfs.Entry{Path: d, Kind: initramfs.Dir}); err != nil {
			return "", err
		}
	}
	if err := a.Add(initramfs.Entry{Path: "/dev/console", Kind: initramfs.CharDev, Perm: 0o600, Major: 5, Minor: 1}); err != nil {
		return "", err
	}
	addFile := func(dst, src string, perm uint64) error {
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		return a.AddFile(dst, perm, b)
	}
	if err := addFile("/init", filepath.Join(bins, "init"), 0o755); err != nil {
		return "", err
	}
	run := struct {
		Objects []string         `json:"objects"`
		Env     []string         `json:"env"`
		Tests   []map[string]any `json:"tests"`
	}{Env: []string{"LOVELOCK_REQUIRE_PRIV=1"}}
	// Every committed BPF object, each program loaded on its own first, so
	// the console shows every rejection with its verifier log. Test-only
	// objects live in subpackages (bpf/wirecheck).
	var patterns []string
	if r.objects {
		patterns = []string{"bpf/*_bpfel.o", "bpf/*/*_bpfel.o"}
	}
	var objs []string
	for _, pattern := range patterns {
		m, err := filepath.Glob(pattern)
		if err != nil {
			return "", err
		}
		objs = append(objs, m...)
	}
	for _, o := range objs {
		dst := "/bpftest/objects/" + filepath.Base(o)
		if err := addFile(dst, o, 0o644); err != nil {
			return "", err
		}
		run.Objects = append(run.Objects, dst)
	}
	for _, tp := range r.pkgs {
		p := tp.path
		name := testName(p)
		bin := filepath.Join(bins, name+".test")
		if _, err := os.Stat(bin); errors.Is(err, os.ErrNotExist) {
			r.logf("%s: no test files, skipped", p)
			continue
		}
		if err := addFile("/tests/"+name+".test", bin, 0o755); err != nil {
			return "", err
		}
		rel := strings.Trim(filepath.Clean(p), "./")
		dir := "/src/" + rel
		if err := a.Add(initramfs.Entry{Path: dir, Kind: initramfs.Dir}); err != nil {
			return "", err
		}
		td := filepath.Join(rel, "testdata")
		err := filepath.WalkDir(td, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			return addFile("/src/"+filepath.ToSlash(path), path, 0o644)
		})
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", err
		}
		args := []string{"-test.v", "-test.count=1", "-test.timeout=480s"}
		if r.runRe != "" {
			args = append(args, "-test.run="+r.runRe)
		}
		args = append(args, tp.args...)
		run.Tests = append(run.Tests, map[string]any{"name": rel, "bin": "/tests/" + name + ".test", "dir": dir, "args": args})
		*tested = append(*tested, rel)
	}
	js, err := json.MarshalIndent(run, "", "  ")
	if err != nil {
		return "", err
	}
	if err := a.AddFile("/bpftest/run.json", 0o644, js); err != nil {
		return "", err
	}
	modDir := "/lib/modules/" + kc.Release
	var dep bytes.Buffer
	if err := kmod.WriteDep(&dep, kc.Modules); err != nil {
		return "", err
	}
	if err := a.AddFile(modDir+"/modules.dep", 0o644, dep.Bytes()); err != nil {
		return "", err
	}
	for _, mod := range kc.Modules {
		if err := a.AddFile(modDir+"/"+mod.Path, 0o644, kc.ModuleData[mod.Path]); err != nil {
			return "", err
		}
	}
	file := filepath.Join(r.out, "initramfs.cpio")
	f, err := os.Create(file)
	if err != nil {
		return "", err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	if err := a.WriteCPIO(w); err != nil {
		f.Close()
		return "", err
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return "", err
	}
	return file, f.Close()
}

// result is what the console showed.
type result struct {
	logFile string
	took    time.Duration
	kernel  string
	ends    []string // "BPFTEST end" lines
	fails   []string // "--- FAIL" lines
	skips   []string // "--- SKIP" lines
	done    string   // the DONE line
	panic   string
}

func (res *result) summary() string {
	var b strings.Builder
	for _, f := range append(res.fails, res.skips...) {
		fmt.Fprintf(&b, "  %s\n", f)
	}
	for _, e := range res.ends {
		fmt.Fprintf(&b, "  %s\n", e)
	}
	if res.done != "" {
		fmt.Fprintf(&b, "  %s\n", res.done)
	}
	return b.String()
}

// boot runs QEMU under the guard, copying the console to stdout and the log
// file, and judges the run.
func (r *runner) boot(m machine, kernelFile, initrd, logFile string, guard time.Duration, smp int, memory string) (*result, error) {
	res := &result{logFile: logFile}
	logf, err := os.Create(res.logFile)
	if err != nil {
		return res, err
	}
	defer logf.Close()
	args := append(append([]string{}, m.args...),
		// Software emulation only, as the boot test: KVM is not there in CI.
		"-accel", "tcg",
		"-smp", fmt.Sprint(smp), "-m", memory,
		"-nodefaults", "-display", "none", "-serial", "stdio", "-no-reboot",
		"-kernel", kernelFile, "-initrd", initrd,
		"-append", "console="+m.console+" panic=-1 loglevel=5",
	)
	ctx, cancel := context.WithTimeout(r.ctx, guard)
	defer cancel()
	cmd := exec.CommandContext(ctx, m.qemu, args...)
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		return res, err
	}
	cmd.Stderr = cmd.Stdout
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return res, fmt.Errorf("start %s: %w (install it: make image-deps)", m.qemu, err)
	}
	r.logf("%s: %s %s", r.arch, m.qemu, strings.Join(args, " "))
	watch(pipe, io.MultiWriter(os.Stdout, logf), res)
	waitErr := cmd.Wait()
	res.took = time.Since(start)
	switch {
	case ctx.Err() == context.DeadlineExceeded:
		return res, fmt.Errorf("timed out: no power-off within the %v guard (last verdict: %q)", guard, res.done)
	case res.panic != "":
		return res, fmt.Errorf("guest: %s", res.panic)
	case res.done == "":
		return res, fmt.Errorf("QEMU exited (%v) before the guest said BPFTEST DONE", waitErr)
	case !strings.HasPrefix(res.done, marker+" DONE PASS"):
		return res, fmt.Errorf("tests failed: %s", res.done)
	case len(res.skips) > 0:
		// As in CI: a skipped test is a test that did not run.
		return res, fmt.Errorf("%d tests skipped", len(res.skips))
	case waitErr != nil:
		return res, fmt.Errorf("QEMU: %w", waitErr)
	}
	return res, nil
}

// watch copies the console to out until QEMU closes it and notes the
// markers.
func watch(rd io.Reader, out io.Writer, res *result) {
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		fmt.Fprintln(out, line)
		i := strings.Index(line, marker+" ")
		switch {
		case i >= 0 && strings.HasPrefix(line[i:], marker+" end "):
			res.ends = append(res.ends, line[i:])
		case i >= 0 && strings.HasPrefix(line[i:], marker+" DONE "):
			res.done = line[i:]
		case i >= 0 && strings.HasPrefix(line[i:], marker+" kernel "):
			res.kernel = line[i+len(marker+" kernel "):]
		case strings.Contains(line, "--- FAIL"):
			res.fails = append(res.fails, strings.TrimSpace(line))
		case strings.Contains(line, "--- SKIP"):
			res.skips = append(res.skips, strings.TrimSpace(line))
		case strings.Contains(line, "Kernel panic") && res.panic == "":
			res.panic = strings.TrimSpace(line)
		}
	}
}
