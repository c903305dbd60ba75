package cli

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ucli "github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/images/bfb"
)

// imageRun runs `lovelock image ARGS...` in-process on an app holding only
// the image command.
func imageRun(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	app := &ucli.App{
		Name:           "lovelock",
		Commands:       []*ucli.Command{imageCommand()},
		Writer:         &out,
		ErrWriter:      &out,
		ExitErrHandler: func(*ucli.Context, error) {},
	}
	setupCommands(app)
	err := app.Run(append([]string{"lovelock", "image"}, args...))
	return out.String(), err
}

// imageTestStream writes a small firmware+OS stream and returns its path
// and bytes.
func imageTestStream(t *testing.T) (string, []byte) {
	t.Helper()
	images := bfb.Merge([]bfb.Image{{ID: bfb.IDBL2, Data: []byte("bl2")}},
		bfb.OS{Kernel: []byte("kernel image"), Initramfs: []byte("initramfs"), Description: "Lovelock test",
			ArgsBF2: "console=ttyAMA1 initrd=initramfs", ArgsBF3: "console=ttyAMA0 initrd=initramfs"}.Images())
	b, err := bfb.Marshal(images)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "lovelock.bfb")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p, b
}

func TestImageHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"inspect", "--help"}, {"flash", "--help"}} {
		out, err := imageRun(t, args...)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if !strings.Contains(out, "USAGE:") {
			t.Errorf("%v: no usage in:\n%s", args, out)
		}
	}
}

func TestImageInspect(t *testing.T) {
	file, _ := imageTestStream(t)
	out, err := imageRun(t, "inspect", file)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"bl2", "boot-desc", "boot-path", "boot-args", "image", "initramfs",
		"console=ttyAMA1 initrd=initramfs", "7 images", "boot firmware: yes", "stream valid"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out)
		}
	}

	out, err = imageRun(t, "inspect", "--output", "json", file)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Images []struct {
			Name    string `json:"name"`
			Version uint8  `json:"version"`
			Length  uint32 `json:"length"`
			CRCOK   bool   `json:"crc_ok"`
		} `json:"images"`
		Valid bool `json:"valid"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("json: %v\n%s", err, out)
	}
	if !got.Valid || len(got.Images) != 7 || got.Images[4].Name != "boot-args" || got.Images[4].Version != 2 ||
		got.Images[5].Name != "image" || got.Images[5].Length != uint32(len("kernel image")) || !got.Images[5].CRCOK {
		t.Fatalf("json inspect: %+v", got)
	}
}

func TestImageInspectRejects(t *testing.T) {
	file, b := imageTestStream(t)
	// Corrupt the kernel's data: listed with BAD, and an error.
	i := bytes.Index(b, []byte("kernel image"))
	b[i] ^= 0xff
	os.WriteFile(file, b, 0o644)
	out, err := imageRun(t, "inspect", file)
	if err == nil || !strings.Contains(err.Error(), "CRC mismatch") {
		t.Fatalf("corrupt CRC: err = %v", err)
	}
	if !strings.Contains(out, "BAD") {
		t.Errorf("corrupt image not marked BAD:\n%s", out)
	}
	// Truncated.
	os.WriteFile(file, b[:len(b)-9], 0o644)
	if _, err := imageRun(t, "inspect", file); err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("truncated: err = %v", err)
	}
	if _, err := imageRun(t, "inspect"); err == nil {
		t.Fatal("inspect without a file succeeded")
	}
	// Not an image at all: the error, and no table before it.
	os.WriteFile(file, []byte("#!/bin/sh\necho not a boot stream\n"), 0o644)
	out, err = imageRun(t, "inspect", file)
	if err == nil || !strings.Contains(err.Error(), "not a .bfb boot stream") {
		t.Fatalf("non-image: err = %v", err)
	}
	if out != "" {
		t.Errorf("non-image printed before its error:\n%s", out)
	}
}

// TestImageFlash flashes through the CLI into a fake rshim: a FIFO boot
// node read by a fake card, and a misc file it logs into.
func TestImageFlash(t *testing.T) {
	file, want := imageTestStream(t)
	dir := t.TempDir()
	if err := unix.Mkfifo(filepath.Join(dir, "boot"), 0o600); err != nil {
		t.Fatal(err)
	}
	misc := filepath.Join(dir, "misc")
	os.WriteFile(misc, []byte("BOOT_MODE 1\n"), 0o600)
	got := make(chan []byte, 1)
	go func() {
		r, err := os.Open(filepath.Join(dir, "boot"))
		if err != nil {
			got <- nil
			return
		}
		b, _ := io.ReadAll(r)
		r.Close()
		got <- b
		for i := 0; i < 500; i++ {
			if m, _ := os.ReadFile(misc); strings.Contains(string(m), "DISPLAY_LEVEL 2") {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		os.WriteFile(misc, []byte("BOOT_MODE 1\n----\n Log Messages\n----\n INFO[BL2]: start\n INFO[MISC]: DPU is ready\n"), 0o600)
	}()
	out, err := imageRun(t, "flash", "--bfb", file, "--rshim", dir, "--poll", "10ms", "--timeout", "10s")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("card received %d bytes, want %d", len(b), len(want))
	}
	if !strings.Contains(out, `card says "INFO[MISC]: DPU is ready"`) {
		t.Errorf("output:\n%s", out)
	}

	// A missing rshim fails before anything is written.
	if _, err := imageRun(t, "flash", "--bfb", file, "--rshim", filepath.Join(dir, "none")); err == nil ||
		!strings.Contains(err.Error(), "rshim") {
		t.Fatalf("missing rshim: err = %v", err)
	}
}
