package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/client/clienttest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
)

// fakeIngestDPU serves a stand-in ingest agent on a loopback UDP socket
// and returns its address.
func fakeIngestDPU(t *testing.T, handle func(*clienttest.Request) clienttest.Answer) string {
	t.Helper()
	tr, err := udp.Listen(netip.MustParseAddrPort("127.0.0.1:0"), udp.Options{})
	if err != nil {
		t.Fatal(err)
	}
	d := clienttest.Start(tr, clienttest.Options{Handle: handle})
	t.Cleanup(func() {
		d.Close()
		tr.Close()
	})
	return tr.LocalAddr().String()
}

func runInfer(dpu string, args ...string) (string, error) {
	var out bytes.Buffer
	err := Run(context.Background(), App(&out, &out), append([]string{"lovelock", "infer", "--dpu", dpu, "--bind", "127.0.0.1"}, args...))
	return out.String(), err
}

func TestInfer(t *testing.T) {
	dpu := fakeIngestDPU(t, nil)
	in := filepath.Join(t.TempDir(), "in.bin")
	os.WriteFile(in, []byte("hello, gpu"), 0o600)
	sum := model.Checksum([]byte("hello, gpu"))
	for _, tc := range []struct {
		name string
		args []string
		want []string // regexps
	}{
		{"one request", []string{"--size", "100KiB", "--check"},
			[]string{`model checksum, tenant 0, 102400-byte input`, `output: +[0-9a-f]{16}\n`, `slice ref@0`, `check: +ok`}},
		{"file input", []string{"--input", in, "--check"}, []string{`output: +` + regexp.QuoteMeta(string(hexOf(sum[:])))}},
		{"mlp", []string{"--model", "mlp", "--size", "2560", "--check"}, []string{`\(640 bytes\)`, `check: +ok`}},
		{"closed loop", []string{"--size", "3000", "--count", "40", "--concurrency", "4", "--check"},
			[]string{`SENT +OK +FAILED .* P50 +P90 +P99 +MAX`, `\n40 +40 +0 +0 +0 +0 `, `check: +ok`}},
		{"open loop", []string{"--size", "64", "--rate", "2000", "--count", "20", "--deadline", "1h"}, []string{`\n20 +20 +0 +0 +0 +0 `}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runInfer(dpu, tc.args...)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			matchOutput(t, out, tc.want, nil)
		})
	}
}

func hexOf(b []byte) string {
	const digits = "0123456789abcdef"
	var s strings.Builder
	for _, v := range b {
		s.WriteByte(digits[v>>4])
		s.WriteByte(digits[v&15])
	}
	return s.String()
}

func TestInferJSON(t *testing.T) {
	dpu := fakeIngestDPU(t, nil)
	out, err := runInfer(dpu, "--size", "5000", "--count", "10", "--check", "-o", "json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var rep inferReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if rep.Load == nil || rep.Load.OK != 10 || rep.Check != "ok" || rep.Size != 5000 || rep.Client.Requests != 10 {
		t.Errorf("report %+v", rep)
	}
}

// TestInferFlagRanges: a flag out of range is refused before anything is
// sent, naming the flag, the value and what is allowed. Before, --duration
// -1s said "a load needs --count or --duration", --rate -5 said "rate -5",
// --mtu 10 "udp: max payload -18 outside 1..65507", and a negative
// --concurrency, --deadline or --timeout ran as if left out.
func TestInferFlagRanges(t *testing.T) {
	var sent atomic.Int64
	dpu := fakeIngestDPU(t, func(r *clienttest.Request) clienttest.Answer { sent.Add(1); return clienttest.Reference(r) })
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--duration", "-1s"}, "--duration -1s: want a time > 0"},
		{[]string{"--duration", "0s"}, "--duration 0s: want a time > 0"},
		{[]string{"--count", "-3"}, "--count -3: want 1 or more requests"},
		{[]string{"--count", "0"}, "--count 0: want 1 or more requests"},
		{[]string{"--count", "5", "--concurrency", "-2"}, "--concurrency -2: want 1 or more (left out: 1, or 1024 with --rate)"},
		{[]string{"--deadline", "-1s"}, "--deadline -1s: want a time ≥ 0 (0: none)"},
		{[]string{"--timeout", "-1s"}, "--timeout -1s: want a time > 0"},
		{[]string{"--timeout", "0s"}, "--timeout 0s: want a time > 0"},
		{[]string{"--retries", "-1"}, "--retries -1: want 0 or more (0: none)"},
		{[]string{"--count", "5", "--rate", "-5"}, "--rate -5: want requests per second, finite and > 0 (left out: a closed loop)"},
		{[]string{"--count", "5", "--rate", "0"}, "--rate 0: want requests per second"},
		{[]string{"--count", "5", "--rate", "NaN"}, "--rate NaN: want requests per second"},
		{[]string{"--count", "5", "--rate", "+Inf"}, "--rate +Inf: want requests per second"},
		{[]string{"--mtu", "10"}, "--mtu 10: want 0 (datagrams up to 64 KiB, in IP fragments) or 340 to 65535"},
		{[]string{"--mtu", "339"}, "--mtu 339: want 0 (datagrams up to 64 KiB, in IP fragments) or 340 to 65535 (the path's MTU; 340 is the least whose datagrams carry a request for model checksum)"},
		{[]string{"--mtu", "-1"}, "--mtu -1: want 0"},
		{[]string{"--mtu", "65536"}, "--mtu 65536: want 0"},
		// Cut to 32 bits it was tenant 0, infrastructure.
		{[]string{"--tenant", "4294967296"}, "--tenant 4294967296: want 0 to 4294967295"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, err := runInfer(dpu, append([]string{"--size", "100"}, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q\n%s", err, tc.want, out)
			}
		})
	}
	if n := sent.Load(); n != 0 {
		t.Errorf("%d requests sent", n)
	}
	if out, err := runInfer(dpu, "--size", "100", "--mtu", "1280"); err != nil {
		t.Errorf("--mtu 1280: %v\n%s", err, out)
	}
}

// TestInferFailures: failures and wrong outputs make the command fail,
// with the reason.
func TestInferFailures(t *testing.T) {
	for _, tc := range []struct {
		name   string
		handle func(*clienttest.Request) clienttest.Answer
		args   []string
		want   string // in the error
		out    string // in the output
	}{
		{"wrong output", func(r *clienttest.Request) clienttest.Answer {
			a := clienttest.Reference(r)
			a.Output[0] ^= 1
			return a
		}, []string{"--size", "100", "--check"}, "output wrong", "check:   wrong"},
		{"wrong in a load", func(r *clienttest.Request) clienttest.Answer {
			a := clienttest.Reference(r)
			a.Output[0] ^= 1
			return a
		}, []string{"--size", "100", "--count", "5", "--check"}, "5 of 5 outputs wrong", "check:   wrong: 5 outputs"},
		{"not granted", func(*clienttest.Request) clienttest.Answer {
			return clienttest.Answer{Status: ingest.StatusNotGranted, Text: "tenant 0 may not use checksum"}
		}, []string{"--size", "100"}, "check --tenant", "error:   not-granted: tenant 0 may not use checksum"},
		{"overloaded load", func(*clienttest.Request) clienttest.Answer {
			return clienttest.Answer{Status: ingest.StatusOverloaded, Text: "queue full"}
		}, []string{"--size", "100", "--count", "3", "--retries", "0"}, "3 of 3 requests failed", "failed overloaded: 3"},
		{"unknown model", nil, []string{"--model", "resnet", "--size", "100"}, "unknown-model", ""},
		{"no input", nil, nil, "give an input", ""},
		{"both inputs", nil, []string{"--size", "1", "--input", "x"}, "not both", ""},
		{"mlp rows", nil, []string{"--model", "mlp", "--size", "100"}, "not a whole number", ""},
		{"check unknown model", nil, []string{"--model", "resnet", "--size", "1", "--check"}, "--check", ""},
		{"bad size", nil, []string{"--size", "lots"}, "--size", ""},
		{"load without end", nil, []string{"--size", "1", "--rate", "10"}, "--count or --duration", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dpu := fakeIngestDPU(t, tc.handle)
			out, err := runInfer(dpu, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to say %q\n%s", err, tc.want, out)
			}
			if !strings.Contains(out, tc.out) {
				t.Errorf("output does not say %q:\n%s", tc.out, out)
			}
		})
	}
	if _, err := runInfer("dpu2"); err == nil || !strings.Contains(err.Error(), "ADDR:PORT") {
		t.Errorf("--dpu dpu2: %v", err)
	}
}

// TestInferLoadCheckOnlyWhatCameBack: --check in a load says how many
// outputs it checked, and a load in which no request completed shows no
// latency. Before, a load whose every request failed printed "check: ok"
// and latencies of 0s, measured from nothing.
func TestInferLoadCheckOnlyWhatCameBack(t *testing.T) {
	var n atomic.Int64
	dpu := fakeIngestDPU(t, func(r *clienttest.Request) clienttest.Answer {
		// 7-byte inputs always fail, others every second time.
		if len(r.Input) == 7 || n.Add(1)%2 == 0 {
			return clienttest.Answer{Status: ingest.StatusOverloaded, Text: "queue full"}
		}
		return clienttest.Reference(r)
	})
	for _, tc := range []struct {
		name    string
		args    []string
		want    []string // regexps
		notWant []string
	}{
		{"none came back", []string{"--size", "7", "--count", "3", "--retries", "0", "--check"},
			[]string{`\n3 +0 +3 +0 +0 +0 +0 +0\.0 +- +- +- +- +0\n`, `check: +not checked: no output came back`}, []string{`check: +ok`, ` 0s `}},
		{"half came back", []string{"--size", "8", "--count", "4", "--retries", "0", "--check"},
			[]string{`\n4 +2 +2 `, `check: +ok: the 2 outputs that came back \(2 of 4 requests failed\)`}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n.Store(0)
			out, err := runInfer(dpu, tc.args...)
			if err == nil || !strings.Contains(err.Error(), "requests failed") {
				t.Errorf("err = %v, want the failures", err)
			}
			matchOutput(t, out, tc.want, tc.notWant)
		})
	}
}
