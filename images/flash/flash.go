// Package flash owns writing a BlueField boot stream onto a card the way
// NVIDIA's bfb-install does: it validates the stream, checks the rshim
// device, pushes the stream (and an optional bf.cfg) into the rshim boot
// device with a progress bar, then follows the rshim log in the misc device
// until the card reports success or failure, or a timeout passes. The rshim
// may be local (/dev/rshim0 on the host or BMC that runs the rshim driver) or
// behind ssh on a BMC.
package flash

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/lovelock-dpu/lovelock/images/bfb"
	"github.com/lovelock-dpu/lovelock/images/manifest"
)

// Errors callers test for.
var (
	// ErrFailed reports that the card logged a critical error.
	ErrFailed = errors.New("card reported CRITICAL ERROR")
	// ErrTimeout reports that the card reported neither success nor
	// failure in time.
	ErrTimeout = errors.New("timed out waiting for the card")
	// ErrNoRshim reports a missing or unusable rshim device.
	ErrNoRshim = errors.New("no usable rshim device")
	// ErrNoFirmware reports an OS-only stream flashed without firmware.
	ErrNoFirmware = errors.New("stream has no boot firmware")
)

// Log lines the card's firmware and OS write into the rshim log.
const (
	// linuxUp: the kernel runs (Lovelock's /init writes it before
	// lovelockd starts, NVIDIA's bfup once the OS is up).
	linuxUp = "Linux up"
	// dpuReady: the OS is up. Lovelock's /init writes it with its version
	// (bfb.ReadyMessage) once lovelockd reports health ok.
	dpuReady = "DPU is ready"
	// dpuNotReady: lovelockd runs but is not healthy; the reason follows.
	dpuNotReady = "DPU is not ready"
	failure     = "CRITICAL ERROR"
	reboot      = "Rebooting..."
)

// Options says what to flash where.
type Options struct {
	// BFB is the boot stream file.
	BFB string
	// Config is an optional bf.cfg, appended to the stream as bfb-install
	// does.
	Config string
	// Firmware is an optional firmware stream (the card's default.bfb)
	// to lay an OS-only BFB over before flashing.
	Firmware string
	// AllowOSOnly flashes a stream without boot firmware anyway.
	AllowOSOnly bool
	// Rshim is the rshim device directory, e.g. /dev/rshim0.
	Rshim string
	// Remote, when set (user@bmc), runs every rshim access through ssh.
	Remote string
	// SSH is the ssh command and its options; default
	// {"ssh", "-o", "BatchMode=yes"}.
	SSH []string
	// Timeout bounds the wait for the card after the stream is pushed.
	Timeout time.Duration
	// Poll is how often the rshim log is read; default 1s.
	Poll time.Duration
	// Out receives progress and the card's log.
	Out io.Writer
	// NoProgress turns the progress bar off (it is plain text either way).
	NoProgress bool
}

// Result is what a successful flash saw.
type Result struct {
	// Bytes pushed into the boot device.
	Bytes int64
	// Outcome is the log line that ended the wait.
	Outcome string
	// Rebooted says whether the card logged a reboot on the way.
	Rebooted bool
	// Lovelock is the version of the Lovelock image flashed (from the
	// stream's boot description); empty for another OS's stream.
	Lovelock string
}

// Flash validates, pushes and follows. It returns an error wrapping
// ErrFailed, ErrTimeout, ErrNoRshim or ErrNoFirmware in those cases.
func Flash(ctx context.Context, o Options) (Result, error) {
	var res Result
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.Poll == 0 {
		o.Poll = time.Second
	}
	if o.Timeout == 0 {
		o.Timeout = 20 * time.Minute
	}
	p, err := prepare(o)
	if err != nil {
		return res, err
	}
	t := o.target()
	if err := t.check(ctx); err != nil {
		return res, err
	}
	fmt.Fprintf(o.Out, "flash: pushing %d bytes to %s\n", len(p.stream), t)
	n, err := push(ctx, t, p.stream, o)
	res.Bytes = n
	if err != nil {
		return res, err
	}
	w := newWatch(p.images)
	w.noRshimLog = p.noRshimLog
	res.Lovelock = w.lovelock
	if w.noRshimLog != "" {
		fmt.Fprintf(o.Out, "flash: warning: %s: the card cannot write %s into the rshim log, so this flash will see "+
			"the firmware's lines and then time out even if the card is up; watch its UART console (%s)\n",
			w.noRshimLog, w.success(), uartConsoles)
	}
	fmt.Fprintf(o.Out, "flash: stream pushed; following the rshim log (up to %v) until %s\n", o.Timeout, w.success())
	outcome, err := follow(ctx, t, o, w)
	res.Outcome, res.Rebooted = outcome, w.rebooted
	return res, err
}

// Prepare reads and validates the stream the options describe and returns
// the bytes to push: the BFB (laid over Firmware when given), then bf.cfg.
func Prepare(o Options) ([]byte, error) {
	p, err := prepare(o)
	return p.stream, err
}

// prepared is a validated stream.
type prepared struct {
	// stream is what is pushed: the images, then bf.cfg.
	stream []byte
	// images are the stream's images (after laying it over Firmware).
	images []bfb.Image
	// noRshimLog, when set, says why the image's kernel cannot write the
	// rshim log (from the build's manifest.json beside the stream).
	noRshimLog string
}

// uartConsoles is where a card's console is when the rshim log is silent.
const uartConsoles = "ttyAMA1 on BlueField-2, ttyAMA0 on BlueField-3"

// noRshimLog reads manifest.json beside the stream file bfbFile and, when
// it describes that very stream (same sha256), says whether its kernel
// lacks the rshim log. Anything else (no manifest, another build's) says
// nothing.
func noRshimLog(bfbFile string, raw []byte) string {
	b, err := os.ReadFile(filepath.Join(filepath.Dir(bfbFile), manifest.Name))
	if err != nil {
		return ""
	}
	var m manifest.Manifest
	if json.Unmarshal(b, &m) != nil || m.BFB == nil || !m.NoRshimLog() {
		return ""
	}
	h := sha256.Sum256(raw)
	if m.BFB.SHA256 != hex.EncodeToString(h[:]) {
		return ""
	}
	return fmt.Sprintf("the image's kernel %s lacks mlxbf-bootctl (CONFIG_MLXBF_BOOTCTL, says %s)",
		m.Kernel.Release, filepath.Join(filepath.Dir(bfbFile), manifest.Name))
}

func prepare(o Options) (prepared, error) {
	raw, err := os.ReadFile(o.BFB)
	if err != nil {
		return prepared{}, fmt.Errorf("bfb: %w", err)
	}
	images, err := bfb.ReadValid(bytes.NewReader(raw))
	if err != nil {
		return prepared{}, fmt.Errorf("bfb %s: %w", o.BFB, err)
	}
	noLog := noRshimLog(o.BFB, raw)
	if o.Firmware != "" {
		fwRaw, err := os.ReadFile(o.Firmware)
		if err != nil {
			return prepared{}, fmt.Errorf("firmware: %w", err)
		}
		fw, err := bfb.ReadValid(bytes.NewReader(fwRaw))
		if err != nil {
			return prepared{}, fmt.Errorf("firmware %s: %w", o.Firmware, err)
		}
		if !bfb.HasFirmware(fw) {
			return prepared{}, fmt.Errorf("firmware %s: holds no BL2 image: %w", o.Firmware, ErrNoFirmware)
		}
		images = bfb.Merge(fw, images)
		if raw, err = bfb.Marshal(images); err != nil {
			return prepared{}, err
		}
	} else if !bfb.HasFirmware(images) && !o.AllowOSOnly {
		return prepared{}, fmt.Errorf("bfb %s: %w: a card boots a pushed stream from reset, so it needs ATF and UEFI; "+
			"pass --firmware /lib/firmware/mellanox/boot/default.bfb (from mlxbf-bootimages) or build the image "+
			"with DEFAULT_BFB=..., or --allow-os-only if you know better", o.BFB, ErrNoFirmware)
	}
	if o.Config != "" {
		cfg, err := os.ReadFile(o.Config)
		if err != nil {
			return prepared{}, fmt.Errorf("bf.cfg: %w", err)
		}
		raw = append(raw, cfg...)
	}
	return prepared{stream: raw, images: images, noRshimLog: noLog}, nil
}

func push(ctx context.Context, t target, stream []byte, o Options) (int64, error) {
	w, err := t.openBoot(ctx)
	if err != nil {
		return 0, err
	}
	var dst io.Writer = w
	if !o.NoProgress {
		bar := progressbar.NewOptions64(int64(len(stream)),
			progressbar.OptionSetWriter(o.Out),
			progressbar.OptionSetDescription("flash"),
			progressbar.OptionShowBytes(true),
			progressbar.OptionSetWidth(30),
			progressbar.OptionThrottle(200*time.Millisecond),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(o.Out) }),
		)
		dst = io.MultiWriter(w, bar)
	}
	// 1 MiB writes: the rshim driver drains the boot FIFO at the card's
	// pace, so bigger writes only block longer.
	n, err := io.CopyBuffer(dst, bytes.NewReader(stream), make([]byte, 1<<20))
	cerr := w.Close()
	if err != nil {
		return n, fmt.Errorf("push to %s: %w", t, err)
	}
	if cerr != nil {
		return n, fmt.Errorf("push to %s: %w", t, cerr)
	}
	return n, nil
}

// follow reads the rshim log until w says the card succeeded or failed, or
// the timeout. Like bfb-install, it turns on the log display and
// clear-on-read first and turns clear-on-read off at the end.
func follow(ctx context.Context, t target, o Options, w *watch) (string, error) {
	for _, cmd := range []string{"CLEAR_ON_READ 1", "DISPLAY_LEVEL 2"} {
		if err := t.writeMisc(ctx, cmd); err != nil {
			return "", err
		}
	}
	defer func() {
		// Best effort, also when ctx is cancelled.
		_ = t.writeMisc(context.WithoutCancel(ctx), "CLEAR_ON_READ 0")
	}()
	deadline := time.NewTimer(o.Timeout)
	defer deadline.Stop()
	tick := time.NewTicker(o.Poll)
	defer tick.Stop()
	var last []string
	for {
		misc, err := t.readMisc(ctx)
		if err != nil {
			return "", err
		}
		cur := logLines(misc)
		for _, line := range newLines(last, cur) {
			fmt.Fprintf(o.Out, "card: %s\n", line)
			if done, err := w.line(o.Out, line); done || err != nil {
				return line, err
			}
		}
		last = cur
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-deadline.C:
			return "", w.timeout(o.Timeout)
		case <-tick.C:
		}
	}
}

// watch decides what the card's log lines mean for one flash.
type watch struct {
	// lovelock is the version of the Lovelock image flashed, from the
	// stream's boot description; empty for another OS's stream.
	lovelock string
	rebooted bool
	// linuxUp: the flashed OS's kernel logged that it runs.
	linuxUp bool
	// notReady is the last "DPU is not ready" reason.
	notReady string
	// otherReady is the last ready line that was not the flashed image's.
	otherReady string
	// lines: the card logged anything; firmware: lines from ATF or UEFI.
	lines, firmware bool
	// os: the OS wrote anything at all (Linux up, ready, not ready).
	os bool
	// noRshimLog says why the image cannot write the rshim log, if known.
	noRshimLog string
}

func newWatch(images []bfb.Image) *watch {
	w := &watch{}
	if desc, ok := bfb.Find(images, bfb.IDBootDesc, 0); ok {
		w.lovelock, _ = bfb.LovelockVersion(string(desc.Data))
	}
	return w
}

// success names, quoted, the lines that end the wait successfully.
func (w *watch) success() string {
	if w.lovelock != "" {
		return strconv.Quote(bfb.ReadyMessage(w.lovelock))
	}
	return strconv.Quote(dpuReady) + " or " + strconv.Quote(linuxUp)
}

// line takes one new log line: done on success, an error wrapping ErrFailed
// on failure.
func (w *watch) line(out io.Writer, line string) (done bool, err error) {
	w.lines = true
	w.firmware = w.firmware || isFirmwareLine(line)
	if strings.Contains(line, linuxUp) || strings.Contains(line, dpuReady) || strings.Contains(line, dpuNotReady) {
		w.os = true
	}
	switch {
	case strings.Contains(line, failure):
		return false, fmt.Errorf("%s: %w", strings.TrimSpace(line), ErrFailed)
	case strings.Contains(line, reboot):
		w.rebooted = true
	case w.lovelock == "":
		// Another OS's stream (NVIDIA's, to go back): its own bfup says
		// Linux up once the OS runs.
		if strings.Contains(line, dpuReady) || strings.Contains(line, linuxUp) {
			fmt.Fprintf(out, "flash: done: %s\n", strings.TrimSpace(line))
			return true, nil
		}
	case strings.Contains(line, bfb.ReadyMessage(w.lovelock)):
		fmt.Fprintf(out, "flash: done: Lovelock %s is up and lovelockd healthy\n", w.lovelock)
		return true, nil
	case strings.Contains(line, dpuNotReady):
		_, reason, _ := strings.Cut(line, dpuNotReady)
		w.notReady = strings.TrimSpace(strings.TrimPrefix(reason, ":"))
		fmt.Fprintf(out, "flash: Lovelock is up but lovelockd is not ready yet: %s; waiting\n", w.notReady)
	case strings.Contains(line, dpuReady):
		// A stale line from before the reset, or the card fell back to
		// the OS on its eMMC: either way not the image just flashed.
		w.otherReady = strings.TrimSpace(line)
		fmt.Fprintf(out, "flash: %q is not %q: another OS (or an earlier boot) says so; waiting\n", w.otherReady, bfb.ReadyMessage(w.lovelock))
	case strings.Contains(line, linuxUp):
		w.linuxUp = true
		fmt.Fprintf(out, "flash: the kernel runs; waiting for lovelockd to report healthy\n")
	}
	return false, nil
}

// timeout explains a wait that ran out.
func (w *watch) timeout(after time.Duration) error {
	var why []string
	if w.notReady != "" {
		why = append(why, "last not-ready reason: "+w.notReady)
	}
	if w.otherReady != "" {
		why = append(why, fmt.Sprintf("the card said %q, which is not the flashed image (did it boot another OS?)", w.otherReady))
	}
	if w.linuxUp && w.notReady == "" {
		why = append(why, "the kernel said Linux up, lovelockd never reported")
	}
	if !w.os {
		// The OS writes its lines through mlxbf-bootctl's rsh_log; a
		// kernel without it is silent here even when it runs.
		seen := "the card logged nothing"
		if w.firmware {
			seen = "the card logged boot firmware (ATF/UEFI) lines and nothing from the OS"
		} else if w.lines {
			seen = "the card logged lines, none from the boot firmware (ATF/UEFI) or the OS"
		}
		cause := "if the OS's kernel lacks mlxbf-bootctl (CONFIG_MLXBF_BOOTCTL, as Debian's does) it cannot write here even when it runs"
		if w.noRshimLog != "" {
			cause = w.noRshimLog + ", so it cannot write here even when it runs"
		}
		why = append(why, fmt.Sprintf("%s; %s: look at the card's UART console (%s)", seen, cause, uartConsoles))
	}
	msg := fmt.Sprintf("no %s after %v", w.success(), after)
	if len(why) > 0 {
		msg += ": " + strings.Join(why, "; ")
	}
	return fmt.Errorf("%s: %w", msg, ErrTimeout)
}

// isFirmwareLine reports whether a log line comes from the boot firmware:
// the PSC, ATF (BL1, BL2, BL31) or UEFI ("INFO[UEFI]: ...").
func isFirmwareLine(line string) bool {
	for _, src := range []string{"[PSC]", "[BL1]", "[BL2]", "[BL2R]", "[BL31]", "[UEFI]"} {
		if strings.Contains(line, src) {
			return true
		}
	}
	return false
}

// logLines returns the log part of the misc device's text: the lines after
// the "Log Messages" banner (or, without one, from the first INFO/WARN/ERR
// line on), without blank lines and banner dashes.
func logLines(misc string) []string {
	lines := strings.Split(misc, "\n")
	start := -1
	for i, l := range lines {
		if strings.Contains(l, "Log Messages") {
			start = i + 1
			break
		}
	}
	if start < 0 {
		for i, l := range lines {
			t := strings.TrimSpace(l)
			if strings.HasPrefix(t, "INFO") || strings.HasPrefix(t, "WARN") || strings.HasPrefix(t, "ERR") {
				start = i
				break
			}
		}
	}
	if start < 0 {
		return nil
	}
	var out []string
	for _, l := range lines[start:] {
		t := strings.TrimSpace(l)
		if t == "" || strings.Trim(t, "-") == "" {
			continue
		}
		out = append(out, t)
	}
	return out
}

// newLines returns the lines of cur not yet shown: the suffix after last
// when cur continues it, all of cur when the log was cleared on read or
// restarted.
func newLines(last, cur []string) []string {
	if len(cur) >= len(last) {
		same := true
		for i := range last {
			if last[i] != cur[i] {
				same = false
				break
			}
		}
		if same {
			return cur[len(last):]
		}
	}
	return cur
}

// target is an rshim device, local or behind ssh.
type target interface {
	fmt.Stringer
	check(ctx context.Context) error
	openBoot(ctx context.Context) (io.WriteCloser, error)
	readMisc(ctx context.Context) (string, error)
	writeMisc(ctx context.Context, cmd string) error
}

func (o Options) target() target {
	if o.Remote == "" {
		return local{dir: o.Rshim}
	}
	ssh := o.SSH
	if len(ssh) == 0 {
		ssh = []string{"ssh", "-o", "BatchMode=yes"}
	}
	return remote{dir: o.Rshim, dest: o.Remote, ssh: ssh}
}

type local struct{ dir string }

func (l local) String() string { return l.dir }

func (l local) check(context.Context) error {
	boot := path.Join(l.dir, "boot")
	st, err := os.Stat(boot)
	if err != nil {
		return fmt.Errorf("rshim %s: %w (is the rshim driver running? systemctl status rshim): %w", l.dir, err, ErrNoRshim)
	}
	// The real boot node is a character device; tests use a FIFO. A
	// regular file would swallow the stream without a card behind it.
	if st.Mode()&(fs.ModeCharDevice|fs.ModeNamedPipe) == 0 {
		return fmt.Errorf("rshim %s: boot is a %v, not a device: %w", l.dir, st.Mode().Type(), ErrNoRshim)
	}
	if _, err := os.ReadFile(path.Join(l.dir, "misc")); err != nil {
		return fmt.Errorf("rshim %s: misc: %w: %w", l.dir, err, ErrNoRshim)
	}
	return nil
}

func (l local) openBoot(context.Context) (io.WriteCloser, error) {
	f, err := os.OpenFile(path.Join(l.dir, "boot"), os.O_WRONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("rshim %s: %w", l.dir, err)
	}
	return f, nil
}

func (l local) readMisc(context.Context) (string, error) {
	b, err := os.ReadFile(path.Join(l.dir, "misc"))
	if err != nil {
		return "", fmt.Errorf("rshim %s: %w", l.dir, err)
	}
	return string(b), nil
}

func (l local) writeMisc(_ context.Context, cmd string) error {
	f, err := os.OpenFile(path.Join(l.dir, "misc"), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return fmt.Errorf("rshim %s: %w", l.dir, err)
	}
	_, err = f.WriteString(cmd + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("rshim %s: misc %q: %w", l.dir, cmd, err)
	}
	return nil
}

// remote reaches the rshim on a BMC (or any host running the rshim driver)
// through ssh, as bfb-install's scp mode does.
type remote struct {
	dir, dest string
	ssh       []string
}

func (r remote) String() string { return r.dest + ":" + r.dir }

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func (r remote) command(ctx context.Context, shell string) *exec.Cmd {
	args := append(append([]string{}, r.ssh[1:]...), r.dest, shell)
	return exec.CommandContext(ctx, r.ssh[0], args...)
}

func (r remote) run(ctx context.Context, shell string) (string, error) {
	cmd := r.command(ctx, shell)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("ssh %s %s: %w: %s", r.dest, shell, err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

func (r remote) check(ctx context.Context) error {
	boot, misc := quote(path.Join(r.dir, "boot")), quote(path.Join(r.dir, "misc"))
	if _, err := r.run(ctx, fmt.Sprintf("{ test -c %s || test -p %s; } && test -r %s", boot, boot, misc)); err != nil {
		return fmt.Errorf("rshim %s: %w: %w", r, err, ErrNoRshim)
	}
	return nil
}

func (r remote) openBoot(ctx context.Context) (io.WriteCloser, error) {
	cmd := r.command(ctx, "cat > "+quote(path.Join(r.dir, "boot")))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("ssh %s: %w", r.dest, err)
	}
	return &remoteWriter{WriteCloser: stdin, cmd: cmd, stderr: &stderr}, nil
}

// remoteWriter's Close ends the stream and waits for the remote cat.
type remoteWriter struct {
	io.WriteCloser
	cmd    *exec.Cmd
	stderr *bytes.Buffer
}

func (w *remoteWriter) Close() error {
	cerr := w.WriteCloser.Close()
	if err := w.cmd.Wait(); err != nil {
		return fmt.Errorf("ssh: remote cat: %w: %s", err, strings.TrimSpace(w.stderr.String()))
	}
	return cerr
}

func (r remote) readMisc(ctx context.Context) (string, error) {
	return r.run(ctx, "cat "+quote(path.Join(r.dir, "misc")))
}

func (r remote) writeMisc(ctx context.Context, cmd string) error {
	_, err := r.run(ctx, "echo "+quote(cmd)+" > "+quote(path.Join(r.dir, "misc")))
	return err
}
