package client

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/client/clienttest"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/memnet"
)

// corruptOdd answers with the reference, but flips the output of inputs
// whose first byte is odd.
func corruptOdd(r *clienttest.Request) clienttest.Answer {
	a := clienttest.Reference(r)
	if r.Input[0]%2 == 1 {
		a.Output[0] ^= 0xff
	}
	return a
}

// deadlineOdd refuses inputs whose first byte is odd with the deadline
// status.
func deadlineOdd(r *clienttest.Request) clienttest.Answer {
	if r.Input[0]%2 == 1 {
		return clienttest.Answer{Status: ingest.StatusDeadline, Text: "too late"}
	}
	return clienttest.Reference(r)
}

func TestLoad(t *testing.T) {
	check, err := Verify("checksum")
	if err != nil {
		t.Fatal(err)
	}
	byIndex := func(size int) func(int) []byte {
		return func(i int) []byte {
			b := randomBytes(uint64(i), size)
			b[0] = byte(i)
			return b
		}
	}
	for _, tc := range []struct {
		name   string
		handle func(*clienttest.Request) clienttest.Answer
		o      LoadOptions
		want   Report // the counts compared
	}{
		{"closed loop", nil, LoadOptions{Model: "checksum", Size: 3000, Concurrency: 8, Count: 100, Check: check},
			Report{Sent: 100, OK: 100}},
		{"closed loop, varied inputs", nil, LoadOptions{Model: "checksum", Input: byIndex(20_000), Concurrency: 4, Count: 40, Check: check},
			Report{Sent: 40, OK: 40}},
		{"open loop", nil, LoadOptions{Model: "checksum", Size: 100, Rate: 20_000, Concurrency: 64, Count: 50, Check: check},
			Report{Sent: 50, OK: 50}},
		{"wrong results", corruptOdd, LoadOptions{Model: "checksum", Input: byIndex(64), Concurrency: 3, Count: 30, Check: check},
			Report{Sent: 30, OK: 30, Wrong: 15}},
		{"deadline status", deadlineOdd, LoadOptions{Model: "checksum", Input: byIndex(64), Concurrency: 3, Count: 30, Deadline: time.Hour},
			Report{Sent: 30, OK: 15, DeadlineMisses: 15, Failed: map[string]int{"deadline": 15}}},
		{"deadline passed locally", nil, LoadOptions{Model: "checksum", Size: 10, Concurrency: 2, Count: 10, Deadline: time.Nanosecond},
			Report{Sent: 10, DeadlineMisses: 10, Failed: map[string]int{"deadline": 10}}},
		{"late results", func(r *clienttest.Request) clienttest.Answer {
			time.Sleep(60 * time.Millisecond) // past the 20ms deadline
			return clienttest.Reference(r)
		}, LoadOptions{Model: "checksum", Size: 10, Concurrency: 1, Count: 3, Deadline: 20 * time.Millisecond},
			Report{Sent: 3, OK: 3, DeadlineMisses: 3}},
		{"unknown model", nil, LoadOptions{Model: "resnet", Size: 10, Concurrency: 2, Count: 6},
			Report{Sent: 6, Failed: map[string]int{"unknown-model": 6}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, memnet.Options{MaxPayload: 9000}, Options{Timeout: time.Second}, clienttest.Options{Handle: tc.handle})
			rep, err := Load(context.Background(), r.c, tc.o)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Sent != tc.want.Sent || rep.OK != tc.want.OK || rep.Wrong != tc.want.Wrong || rep.DeadlineMisses != tc.want.DeadlineMisses ||
				rep.Dropped != 0 || len(rep.Failed) != len(tc.want.Failed) {
				t.Errorf("report %+v, want %+v", rep, tc.want)
			}
			for k, v := range tc.want.Failed {
				if rep.Failed[k] != v {
					t.Errorf("failed %s: %d, want %d", k, rep.Failed[k], v)
				}
			}
			if tc.want.Wrong > 0 && !strings.Contains(rep.FirstWrong, "differs from the reference") {
				t.Errorf("first wrong: %q", rep.FirstWrong)
			}
			if rep.OK > 0 {
				l := rep.Latency
				if !(0 < l.P50 && l.P50 <= l.P90 && l.P90 <= l.P99 && l.P99 <= l.Max) || rep.Throughput <= 0 || rep.MBps <= 0 {
					t.Errorf("latency %+v, throughput %v req/s %v MB/s", l, rep.Throughput, rep.MBps)
				}
			}
		})
	}
}

// TestLoadDrops: an open loop that finds Concurrency requests outstanding
// drops the next ones and says so.
func TestLoadDrops(t *testing.T) {
	release := make(chan struct{})
	r := newRig(t, memnet.Options{}, Options{Timeout: time.Hour}, clienttest.Options{Handle: func(req *clienttest.Request) clienttest.Answer {
		<-release // nothing completes until the load has issued everything
		return clienttest.Reference(req)
	}})
	o := LoadOptions{Model: "checksum", Size: 10, Rate: 1e6, Concurrency: 2, Count: 10}
	o.issued = func() { close(release) }
	rep, err := Load(context.Background(), r.c, o)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Sent != 2 || rep.OK != 2 || rep.Dropped != 8 {
		t.Errorf("report %+v, want 2 sent and ok, 8 dropped", rep)
	}
}

// TestLoadDuration: a duration ends the load; a cancelled context ends it
// early with ctx's error and the report so far.
func TestLoadDuration(t *testing.T) {
	r := newRig(t, memnet.Options{}, Options{}, clienttest.Options{})
	rep, err := Load(context.Background(), r.c, LoadOptions{Model: "checksum", Size: 100, Concurrency: 2, Duration: 20 * time.Millisecond})
	if err != nil || rep.Sent == 0 || rep.OK != rep.Sent {
		t.Errorf("duration: %+v, %v", rep, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rep, err = Load(ctx, r.c, LoadOptions{Model: "checksum", Size: 100, Rate: 1000, Count: 1000})
	if err != context.Canceled || rep.Sent != 0 {
		t.Errorf("cancelled: %+v, %v", rep, err)
	}
}

func TestLoadOptionsInvalid(t *testing.T) {
	r := newRig(t, memnet.Options{}, Options{}, clienttest.Options{})
	for _, o := range []LoadOptions{
		{Model: "checksum", Size: 10},
		{Model: "checksum", Count: 1},
		{Model: "checksum", Size: 10, Count: 1, Rate: -1},
	} {
		if _, err := Load(context.Background(), r.c, o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}

func TestVerify(t *testing.T) {
	in := make([]byte, 64*4*3)
	for _, name := range []string{"checksum", "mlp"} {
		check, err := Verify(name)
		if err != nil {
			t.Fatal(err)
		}
		out := clienttest.Reference(&clienttest.Request{Model: name, Input: in}).Output
		if err := check(in, out); err != nil {
			t.Errorf("%s: reference refused: %v", name, err)
		}
		out[3] ^= 0x40 // an exponent bit of the first float
		if err := check(in, out); err == nil {
			t.Errorf("%s: corrupted output accepted", name)
		}
		if err := check(in, out[:len(out)-1]); err == nil {
			t.Errorf("%s: short output accepted", name)
		}
	}
	if _, err := Verify("resnet"); err == nil {
		t.Error("Verify of an unknown model")
	}
}

// TestReportJSONNoLatency: a load with no completed request has no
// latency in JSON; before, it showed percentiles of 0 ns, measured from
// nothing.
func TestReportJSONNoLatency(t *testing.T) {
	for _, tc := range []struct {
		rep  Report
		want bool
	}{
		{Report{Sent: 5}, false},
		{Report{Sent: 5, OK: 1, Latency: Latency{P50: 3, P90: 3, P99: 3, Max: 3}}, true},
	} {
		b, err := json.Marshal(tc.rep)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(string(b), `"latency"`); got != tc.want {
			t.Errorf("%+v: latency in JSON %v, want %v: %s", tc.rep, got, tc.want, b)
		}
	}
}
