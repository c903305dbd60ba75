package cuda

import (
	"strconv"
	"strings"
	"testing"
)

// TestPTX holds the embedded module to what the Go side launches: a PTX
// version and target the drivers of A100/H100/H200 JIT, every entry with
// the parameter count its launch passes, and no call to a function the
// module does not define (an OpenCL builtin left to a libclc the driver
// does not have would fail only at load, on a GPU).
func TestPTX(t *testing.T) {
	info, err := parsePTX(kernelsPTX)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := strconv.ParseFloat(info.Version, 64); err != nil || v < 7.0 {
		t.Errorf(".version %q: want 7.0 or later", info.Version)
	}
	if info.Target != "sm_70" {
		t.Errorf(".target %q: want sm_70 (Volta and later JIT it)", info.Target)
	}
	for name, params := range entries {
		got, ok := info.Entries[name]
		if !ok {
			t.Errorf("no entry %s (entries %v)", name, info.Entries)
			continue
		}
		if got != params {
			t.Errorf("entry %s takes %d parameters, the launch passes %d", name, got, params)
		}
	}
	if len(info.Entries) != len(entries) {
		t.Errorf("entries %v, want exactly %v", info.Entries, entries)
	}
	for _, bad := range []string{".extern", "call.uni", "call "} {
		if strings.Contains(kernelsPTX, bad) {
			t.Errorf("the PTX contains %q: a call the driver cannot resolve", bad)
		}
	}
	for _, want := range []string{".visible .entry checksum(", ".visible .entry mlp(", "atom.global.add.u32", "bar.sync"} {
		if !strings.Contains(kernelsPTX, want) {
			t.Errorf("the PTX lacks %q", want)
		}
	}
	if !strings.Contains(kernelsPTX, "["+strconv.Itoa(threadsPerBlock*4)+"]") {
		t.Errorf("no shared array of %d bytes: THREADS in kernels.cl and threadsPerBlock disagree", threadsPerBlock*4)
	}
}

func TestParsePTX(t *testing.T) {
	const text = `
//
// a comment .version 1.0
.version 7.8
.target sm_90, texmode_independent
.address_size 64

.visible .entry one(
	.param .u64 one_param_0,
	.param .u32 one_param_1
)
{
	ret;
}
.entry two()
{
	ret;
}
`
	info, err := parsePTX(text)
	if err != nil {
		t.Fatal(err)
	}
	if info.Version != "7.8" || info.Target != "sm_90" {
		t.Errorf("version %q target %q", info.Version, info.Target)
	}
	if len(info.Entries) != 2 || info.Entries["one"] != 2 || info.Entries["two"] != 0 {
		t.Errorf("entries %v, want one:2 two:0", info.Entries)
	}
	if _, err := parsePTX("not ptx"); err == nil {
		t.Error("parsePTX of text without directives: no error")
	}
}
