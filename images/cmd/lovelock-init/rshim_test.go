package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRshimLog: with mlxbf-bootctl's rsh_log the message goes there; without
// it (Debian's kernel) the console says once that the flash cannot see this
// boot, and every message still reaches the console.
func TestRshimLog(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	r := &rshim{log: slog.New(slog.NewTextHandler(&out, nil)),
		logPaths: []string{filepath.Join(dir, "driver/rsh_log")}, upPaths: []string{filepath.Join(dir, "driver/os_up")}}
	r.write("Linux up")
	r.write("DPU is ready (Lovelock v1)")
	r.osUp()
	if n := strings.Count(out.String(), "no rshim log"); n != 1 {
		t.Errorf("missing rsh_log reported %d times, want once:\n%s", n, out.String())
	}
	for _, want := range []string{"lacks mlxbf-bootctl", `msg="Linux up"`, `msg="DPU is ready (Lovelock v1)"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("console lacks %q:\n%s", want, out.String())
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "driver")); !os.IsNotExist(err) {
		t.Errorf("a missing sysfs attribute was created: %v", err)
	}

	// With the driver.
	os.Mkdir(filepath.Join(dir, "driver"), 0o755)
	os.WriteFile(filepath.Join(dir, "driver/rsh_log"), nil, 0o644)
	os.WriteFile(filepath.Join(dir, "driver/os_up"), nil, 0o644)
	out.Reset()
	r = &rshim{log: slog.New(slog.NewTextHandler(&out, nil)), logPaths: r.logPaths, upPaths: r.upPaths}
	r.write("Linux up")
	r.osUp()
	if b, _ := os.ReadFile(r.logPaths[0]); string(b) != "Linux up\n" {
		t.Errorf("rsh_log got %q", b)
	}
	if b, _ := os.ReadFile(r.upPaths[0]); string(b) != "1\n" {
		t.Errorf("os_up got %q", b)
	}
	if strings.Contains(out.String(), "no rshim log") {
		t.Errorf("warned with the driver present:\n%s", out.String())
	}
}
