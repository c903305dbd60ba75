package flash

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/images/bfb"
)

const settings = `DISPLAY_LEVEL   2 (0:basic, 1:advanced, 2:log)
BOOT_MODE       1 (0:rshim, 1:emmc, 2:emmc-boot-swap)
DEV_NAME        pcie-0000:04:00.2
---------------------------------------
             Log Messages
---------------------------------------
`

// fakeRshim is a directory shaped like /dev/rshim0: boot is a FIFO the fake
// card reads the stream from, misc a file it writes its log into.
type fakeRshim struct {
	dir      string
	mu       sync.Mutex
	received []byte
	done     chan struct{}
}

// newFakeRshim starts a card that reads the whole stream, waits for the
// flasher's DISPLAY_LEVEL command, then logs lines one by one, rewriting
// misc each time as the rshim driver presents it.
func newFakeRshim(t *testing.T, log []string) *fakeRshim {
	t.Helper()
	f := &fakeRshim{dir: t.TempDir(), done: make(chan struct{})}
	if err := unix.Mkfifo(filepath.Join(f.dir, "boot"), 0o600); err != nil {
		t.Fatal(err)
	}
	misc := filepath.Join(f.dir, "misc")
	if err := os.WriteFile(misc, []byte(settings), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		// Unblock a reader still waiting for a writer.
		if w, err := os.OpenFile(filepath.Join(f.dir, "boot"), os.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
			w.Close()
		}
		<-f.done
	})
	go func() {
		defer close(f.done)
		r, err := os.Open(filepath.Join(f.dir, "boot"))
		if err != nil {
			return
		}
		b, _ := io.ReadAll(r)
		r.Close()
		f.mu.Lock()
		f.received = b
		f.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		for {
			m, _ := os.ReadFile(misc)
			if strings.Contains(string(m), "DISPLAY_LEVEL 2") {
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
		text := settings
		for _, l := range log {
			text += " " + l + "\n"
			_ = os.WriteFile(misc, []byte(text), 0o600)
			select {
			case <-ctx.Done():
				return
			case <-time.After(15 * time.Millisecond):
			}
		}
	}()
	return f
}

func (f *fakeRshim) got() []byte {
	<-f.done
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.received
}

// testVersion is the version of the Lovelock image the test streams carry.
const testVersion = "v1.2.3-4-gabcdef"

// streams writes a Lovelock image's stream with firmware, its OS-only
// stream and a firmware stream into dir.
func streams(t *testing.T) (full, osOnly, firmware string) {
	t.Helper()
	return streamsOf(t, bfb.LovelockDescription(testVersion))
}

// streamsOf is streams with another boot description (another OS's).
func streamsOf(t *testing.T, desc string) (full, osOnly, firmware string) {
	t.Helper()
	dir := t.TempDir()
	osImages := bfb.OS{Kernel: bytes.Repeat([]byte("K"), 3<<20+5), Initramfs: []byte("initrd"),
		Description: desc, ArgsBF2: "console=ttyAMA1", ArgsBF3: "console=ttyAMA0"}.Images()
	fw := []bfb.Image{{ID: bfb.IDBL2, Data: []byte("bl2")}, {ID: bfb.IDBL31, Data: []byte("bl31")}, {ID: bfb.IDBL33, Data: []byte("uefi")}}
	write := func(name string, images []bfb.Image) string {
		b, err := bfb.Marshal(images)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("full.bfb", bfb.Merge(fw, osImages)), write("os.bfb", osImages), write("default.bfb", fw)
}

// bootLog is what firmware logs on the way to the OS.
var bootLog = []string{"INFO[PSC]: PSC BL1 START", "INFO[BL2]: start", "INFO[BL31]: start",
	"INFO[UEFI]: UEFI loaded", "INFO[MISC]: Rebooting..."}

// okLog is a Lovelock image of testVersion coming up.
var okLog = append(slices.Clone(bootLog), "INFO[MISC]: Linux up",
	"INFO[MISC]: DPU is not ready: lovelockd is starting", "INFO[MISC]: "+bfb.ReadyMessage(testVersion))

func TestFlashSuccess(t *testing.T) {
	full, _, _ := streams(t)
	cfg := filepath.Join(t.TempDir(), "bf.cfg")
	os.WriteFile(cfg, []byte("ENABLE_SFC_HBN=no\n"), 0o644)
	card := newFakeRshim(t, okLog)
	var out bytes.Buffer
	res, err := Flash(context.Background(), Options{BFB: full, Config: cfg, Rshim: card.dir,
		Timeout: 10 * time.Second, Poll: 10 * time.Millisecond, Out: &out})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	want, _ := os.ReadFile(full)
	want = append(want, "ENABLE_SFC_HBN=no\n"...)
	if !bytes.Equal(card.got(), want) {
		t.Fatalf("card received %d bytes, want the bfb and bf.cfg (%d bytes)", len(card.got()), len(want))
	}
	if res.Bytes != int64(len(want)) || res.Outcome != "INFO[MISC]: "+bfb.ReadyMessage(testVersion) ||
		!res.Rebooted || res.Lovelock != testVersion {
		t.Fatalf("result %+v", res)
	}
	for _, s := range []string{"flash", "card: INFO[BL2]: start", "card: INFO[MISC]: Rebooting...",
		"card: INFO[MISC]: Linux up", "not ready yet: lovelockd is starting", "flash: done: Lovelock " + testVersion} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("output lacks %q:\n%s", s, out.String())
		}
	}
	if strings.Contains(out.String(), "DEV_NAME") {
		t.Errorf("settings lines printed as log:\n%s", out.String())
	}
}

// TestFlashLovelockReady: a Lovelock image counts as flashed only when its
// /init says ready with the version flashed. "Linux up" comes before
// lovelockd runs, and another version's (or another OS's) ready line is a
// card that booted something else.
func TestFlashLovelockReady(t *testing.T) {
	full, _, _ := streams(t)
	for _, tc := range []struct {
		name string
		log  []string
		want []string // in the timeout error; none: success
	}{
		{"right version", okLog, nil},
		{"linux up only", append(slices.Clone(bootLog), "INFO[MISC]: Linux up"),
			[]string{"Linux up, lovelockd never reported"}},
		{"other version", append(slices.Clone(bootLog), "INFO[MISC]: Linux up", "INFO[MISC]: DPU is ready (Lovelock v0.9.0)"),
			[]string{`"INFO[MISC]: DPU is ready (Lovelock v0.9.0)", which is not the flashed image`}},
		{"another OS", append(slices.Clone(bootLog), "INFO[MISC]: Linux up", "INFO[MISC]: DPU is ready"),
			[]string{`"INFO[MISC]: DPU is ready", which is not the flashed image`}},
		{"not ready", append(slices.Clone(bootLog), "INFO[MISC]: Linux up", "INFO[MISC]: DPU is not ready: lovelockd runs degraded: attachment p0 xdp: busy"),
			[]string{"last not-ready reason: lovelockd runs degraded: attachment p0 xdp: busy"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			card := newFakeRshim(t, tc.log)
			var out bytes.Buffer
			res, err := Flash(context.Background(), Options{BFB: full, Rshim: card.dir, NoProgress: true,
				Timeout: time.Second, Poll: 10 * time.Millisecond, Out: &out})
			if tc.want == nil {
				if err != nil {
					t.Fatalf("%v\n%s", err, out.String())
				}
				return
			}
			if !errors.Is(err, ErrTimeout) {
				t.Fatalf("err = %v (result %+v), want ErrTimeout\n%s", err, res, out.String())
			}
			for _, w := range append(tc.want, bfb.ReadyMessage(testVersion)) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q: %v", w, err)
				}
			}
		})
	}
}

// TestFlashOtherOS: for another OS's stream (NVIDIA's, to go back) its own
// "Linux up" still ends the wait.
func TestFlashOtherOS(t *testing.T) {
	full, _, _ := streamsOf(t, "DOCA BlueField OS")
	card := newFakeRshim(t, append(slices.Clone(bootLog), "INFO[MISC]: Linux up"))
	res, err := Flash(context.Background(), Options{BFB: full, Rshim: card.dir, NoProgress: true,
		Timeout: 10 * time.Second, Poll: 10 * time.Millisecond})
	if err != nil || res.Outcome != "INFO[MISC]: Linux up" || res.Lovelock != "" {
		t.Fatalf("result %+v, err %v", res, err)
	}
}

func TestFlashCardFails(t *testing.T) {
	full, _, _ := streams(t)
	card := newFakeRshim(t, []string{"INFO[BL2]: start", "ERR[BL2]: CRITICAL ERROR: DDR training failed"})
	_, err := Flash(context.Background(), Options{BFB: full, Rshim: card.dir, NoProgress: true,
		Timeout: 10 * time.Second, Poll: 10 * time.Millisecond})
	if !errors.Is(err, ErrFailed) || !strings.Contains(err.Error(), "DDR training failed") {
		t.Fatalf("err = %v, want ErrFailed with the card's line", err)
	}
}

func TestFlashTimeout(t *testing.T) {
	full, _, _ := streams(t)
	card := newFakeRshim(t, []string{"INFO[BL2]: start"})
	start := time.Now()
	_, err := Flash(context.Background(), Options{BFB: full, Rshim: card.dir, NoProgress: true,
		Timeout: 300 * time.Millisecond, Poll: 10 * time.Millisecond})
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("timeout took %v", time.Since(start))
	}
	// The flasher leaves clear-on-read off, as bfb-install does.
	m, _ := os.ReadFile(filepath.Join(card.dir, "misc"))
	if !strings.Contains(string(m), "CLEAR_ON_READ 0") {
		t.Errorf("misc after flash = %q, want CLEAR_ON_READ 0 written", m)
	}
}

// TestFlashTimeoutFirmwareOnly: a card whose log shows the boot firmware
// and then nothing (a kernel without mlxbf-bootctl cannot write the rshim
// log) times out with an error that says so and where to look instead; a
// manifest beside the stream that says the kernel lacks it makes the flash
// warn before it waits.
func TestFlashTimeoutFirmwareOnly(t *testing.T) {
	firmwareLog := []string{"INFO[PSC]: PSC BL1 START", "INFO[BL2]: start", "INFO[BL31]: start",
		"INFO[UEFI]: UEFI loaded", "INFO[UEFI]: PXE boot disabled"}
	for _, tc := range []struct {
		name     string
		manifest string // sha256 of the stream in manifest.json; "" none
		want     []string
	}{
		{"no manifest", "", []string{"boot firmware (ATF/UEFI) lines and nothing from the OS",
			"lacks mlxbf-bootctl (CONFIG_MLXBF_BOOTCTL, as Debian's does)", "UART console (ttyAMA1 on BlueField-2"}},
		{"manifest says no rshim log", "stream", []string{"boot firmware (ATF/UEFI) lines and nothing from the OS",
			"the image's kernel 6.12.99+deb12-arm64 lacks mlxbf-bootctl", "UART console (ttyAMA1 on BlueField-2"}},
		{"another build's manifest", strings.Repeat("0", 64), []string{"as Debian's does"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			full, _, _ := streams(t)
			sum := tc.manifest
			if sum == "stream" {
				raw, _ := os.ReadFile(full)
				h := sha256.Sum256(raw)
				sum = hex.EncodeToString(h[:])
			}
			if sum != "" {
				m := `{"kernel": {"release": "6.12.99+deb12-arm64", "rshim_log": false}, "bfb": {"sha256": "` + sum + `"}}`
				if err := os.WriteFile(filepath.Join(filepath.Dir(full), "manifest.json"), []byte(m), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			card := newFakeRshim(t, firmwareLog)
			var out bytes.Buffer
			_, err := Flash(context.Background(), Options{BFB: full, Rshim: card.dir, NoProgress: true,
				Timeout: time.Second, Poll: 10 * time.Millisecond, Out: &out})
			if !errors.Is(err, ErrTimeout) {
				t.Fatalf("err = %v, want ErrTimeout\n%s", err, out.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
			warned := strings.Index(out.String(), "flash: warning: the image's kernel 6.12.99+deb12-arm64 lacks mlxbf-bootctl")
			waiting := strings.Index(out.String(), "following the rshim log")
			if wantWarn := tc.manifest == "stream"; wantWarn != (warned >= 0) || warned > waiting {
				t.Errorf("warning at %d, wait at %d; want a warning before the wait: %v\n%s", warned, waiting, wantWarn, out.String())
			}
		})
	}
}

func TestFlashRefuses(t *testing.T) {
	full, osOnly, _ := streams(t)
	corrupt := filepath.Join(t.TempDir(), "corrupt.bfb")
	b, _ := os.ReadFile(full)
	b[len(b)-3] ^= 0xff
	os.WriteFile(corrupt, b, 0o644)
	truncated := filepath.Join(t.TempDir(), "truncated.bfb")
	os.WriteFile(truncated, b[:len(b)/2], 0o644)

	noBoot := t.TempDir()
	os.WriteFile(filepath.Join(noBoot, "misc"), nil, 0o644)
	regular := t.TempDir()
	os.WriteFile(filepath.Join(regular, "boot"), nil, 0o644)
	os.WriteFile(filepath.Join(regular, "misc"), nil, 0o644)

	tests := []struct {
		name string
		o    Options
		want error
	}{
		{"corrupt CRC", Options{BFB: corrupt, Rshim: noBoot}, bfb.ErrCRC},
		{"truncated", Options{BFB: truncated, Rshim: noBoot}, bfb.ErrTruncated},
		{"os-only without firmware", Options{BFB: osOnly, Rshim: noBoot}, ErrNoFirmware},
		{"firmware that is not", Options{BFB: osOnly, Firmware: osOnly, Rshim: noBoot}, ErrNoFirmware},
		{"no rshim", Options{BFB: full, Rshim: filepath.Join(noBoot, "nope")}, ErrNoRshim},
		{"no boot node", Options{BFB: full, Rshim: noBoot}, ErrNoRshim},
		{"boot is a regular file", Options{BFB: full, Rshim: regular}, ErrNoRshim},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.o.NoProgress = true
			if _, err := Flash(context.Background(), tt.o); !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}
}

// TestFlashOSOnlyWithFirmware lays an OS-only stream over a firmware stream
// at flash time: the card must receive one valid stream with both.
func TestFlashOSOnlyWithFirmware(t *testing.T) {
	_, osOnly, firmware := streams(t)
	card := newFakeRshim(t, okLog)
	_, err := Flash(context.Background(), Options{BFB: osOnly, Firmware: firmware, Rshim: card.dir,
		NoProgress: true, Timeout: 10 * time.Second, Poll: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	images, err := bfb.ReadValid(bytes.NewReader(card.got()))
	if err != nil {
		t.Fatalf("card received an invalid stream: %v", err)
	}
	if !bfb.HasFirmware(images) {
		t.Fatal("merged stream lacks the firmware")
	}
	if _, ok := bfb.Find(images, bfb.IDImage, 0); !ok {
		t.Fatal("merged stream lacks the kernel")
	}
}

// TestFlashRemote runs the same flow through a stand-in for ssh that runs
// the remote command locally.
func TestFlashRemote(t *testing.T) {
	full, _, _ := streams(t)
	card := newFakeRshim(t, okLog)
	fakeSSH := filepath.Join(t.TempDir(), "ssh")
	// Drops the options and the destination, runs the command with sh.
	script := "#!/bin/sh\nfor last; do :; done\nexec sh -c \"$last\"\n"
	if err := os.WriteFile(fakeSSH, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	res, err := Flash(context.Background(), Options{BFB: full, Rshim: card.dir, Remote: "root@bmc",
		SSH: []string{fakeSSH, "-o", "BatchMode=yes"}, NoProgress: true,
		Timeout: 10 * time.Second, Poll: 10 * time.Millisecond, Out: &out})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	want, _ := os.ReadFile(full)
	if !bytes.Equal(card.got(), want) || res.Outcome == "" {
		t.Fatalf("remote flash: card got %d bytes, want %d; result %+v", len(card.got()), len(want), res)
	}
	if !strings.Contains(out.String(), "root@bmc:"+card.dir) {
		t.Errorf("output does not name the remote target:\n%s", out.String())
	}
}

func TestLogLines(t *testing.T) {
	first := logLines(settings + " INFO[BL2]: start\n INFO[BL31]: start\n")
	if len(first) != 2 || first[0] != "INFO[BL2]: start" {
		t.Fatalf("logLines = %q", first)
	}
	// Cumulative log: only the new line.
	second := logLines(settings + " INFO[BL2]: start\n INFO[BL31]: start\n INFO[UEFI]: up\n")
	if got := newLines(first, second); len(got) != 1 || got[0] != "INFO[UEFI]: up" {
		t.Fatalf("newLines = %q", got)
	}
	// Cleared on read: everything is new.
	third := logLines(settings + " INFO[MISC]: Linux up\n")
	if got := newLines(second, third); len(got) != 1 || got[0] != "INFO[MISC]: Linux up" {
		t.Fatalf("newLines after clear = %q", got)
	}
	// No banner: from the first INFO line on.
	if got := logLines("FOO 1\n INFO[BL2]: x\n"); len(got) != 1 {
		t.Fatalf("logLines without banner = %q", got)
	}
}
