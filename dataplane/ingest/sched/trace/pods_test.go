package trace

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/sched"
)

const header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"

func TestReadPodsMalformed(t *testing.T) {
	good := "openb-pod-0000,12000,16384,1,1000,,LS,Running,0,12537496,0\n"
	for _, tc := range []struct {
		name, body, want string
	}{
		{"bad integer", good + "p1,4000,abc,1,500,,LS,Running,5,10,6\n", "line 3: column memory_mib: \"abc\""},
		{"negative", good + "p1,-1,10,1,500,,LS,Running,5,10,6\n", "line 3: column cpu_milli"},
		{"share above a GPU", good + good + "p1,1,10,1,1500,,LS,Running,5,10,6\n", "line 4: column gpu_milli: 1500"},
		{"fraction of several GPUs", "p1,1,10,2,500,,LS,Running,5,10,6\n", "line 2: num_gpu 2 with gpu_milli 500"},
		{"deleted before created", "p1,1,10,1,500,,LS,Running,5,4,5\n", "line 2: deletion_time 4 before creation_time 5"},
		{"short row", "p1,1,10,1,500,,LS\n", "line 2: 7 fields, header has 11"},
		{"empty creation", "p1,1,10,1,500,,LS,Running,,10,5\n", "line 2: column creation_time"},
		{"bare quote in the first field", good + "p\"1,1000,1024,1,480,,LS,Succeeded,0,1000,0\n", "line 3: malformed trace: parse error on line 3"},
		{"bare quote later", "p1,1\"0,1024,1,480,,LS,Succeeded,0,1000,0\n", "line 2: malformed trace: parse error on line 2"},
		{"unterminated quote", good + "\"p2,1000\n", "line 3: malformed trace:"},
		{"time past what a trace holds", "p1,1,10,1,500,,LS,Running,1700000000000,1700000000010,\n", "line 2: times past 9223372036 s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadPods(strings.NewReader(header + tc.body))
			if err == nil || !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	if _, err := ReadPods(strings.NewReader("name,cpu_milli\np,1\n")); err == nil || !strings.Contains(err.Error(), `lacks column "memory_mib"`) {
		t.Fatalf("missing column: %v", err)
	}
}

func TestMapAsDocumented(t *testing.T) {
	body := header +
		"cpu,8000,100,0,0,,BE,Succeeded,0,100,0\n" + // CPU only: left out
		"half,8000,100,1,500,,LS,Succeeded,10,110,20\n" + // 90 s from its scheduling
		"never-scheduled,8000,100,1,100,,LS,Failed,30,50,\n" + // from creation
		"pair,8000,100,2,1000,V100M32,LS,Running,40,100,40\n" + // two whole GPUs
		"open,8000,100,1,250,,LS,Running,50,,50\n" // no deletion: left out
	pods, err := ReadPods(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	reqs, st, err := Map(pods, MapOptions{Slack: 2})
	if err != nil {
		t.Fatal(err)
	}
	want := []sched.Request{
		{ID: 1, Throughput: 0.5, Share: 500, Arrival: 10 * time.Second, Duration: 90 * time.Second, Deadline: 190 * time.Second},
		{ID: 2, Throughput: 0.1, Share: 100, Arrival: 30 * time.Second, Duration: 20 * time.Second, Deadline: 70 * time.Second},
		{ID: 3, Throughput: 1, Share: 1000, Arrival: 40 * time.Second, Duration: 60 * time.Second, Deadline: 160 * time.Second},
		{ID: 4, Throughput: 1, Share: 1000, Arrival: 40 * time.Second, Duration: 60 * time.Second, Deadline: 160 * time.Second},
	}
	if !reflect.DeepEqual(reqs, want) {
		t.Fatalf("requests:\n%+v\nwant\n%+v", reqs, want)
	}
	if st != (MapStats{Pods: 5, Requests: 4, CPUOnly: 1, NoDeletion: 1, MultiGPU: 1}) {
		t.Fatalf("stats %+v", st)
	}
}

func TestSynthRoundTrip(t *testing.T) {
	mix, err := ParseMix("100:3,500:1,1000x2:1")
	if err != nil {
		t.Fatal(err)
	}
	pods, err := Synth(SynthOptions{Pods: 500, Mix: mix, Seed: 7, MeanGap: 1, MeanDuration: 60, MaxWait: 5})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WritePods(&buf, pods); err != nil {
		t.Fatal(err)
	}
	back, err := ReadPods(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, pods) {
		t.Fatal("synthetic trace changed through CSV")
	}
	count := map[int]int{}
	for _, p := range pods {
		count[p.GPUMilli*10+p.NumGPU]++
	}
	// 3:1:1 over 500 pods: expect about 300, 100, 100.
	if count[1001] < 240 || count[5001] < 60 || count[10002] < 60 || len(count) != 3 {
		t.Fatalf("share mix not followed: %v", count)
	}
	if _, err := ParseMix("500x2:1"); err == nil {
		t.Fatal("fractional multi-GPU share accepted")
	}
}

func TestReadNodes(t *testing.T) {
	nodes, err := ReadNodes(strings.NewReader("sn,cpu_milli,memory_mib,gpu,model\nn0,32000,262144,0,\nn1,96000,786432,8,G2\nn2,64000,262144,2,T4\n"))
	if err != nil {
		t.Fatal(err)
	}
	fleet, err := Fleet(nodes, "H100-80GB")
	if err != nil || len(fleet) != 1 || fleet[0].Count != 10 {
		t.Fatalf("fleet %+v, %v", fleet, err)
	}
	for _, tc := range []struct{ name, body, want string }{
		{"bad gpu count", "n0,1,1,x,G2\n", "line 2: column gpu"},
		{"bare quote", "n0,1,1,8,G2\nn\"1,1,1,8,G2\n", "line 3: malformed trace: parse error on line 3"},
		{"unterminated quote", "\"n0,1,1,8,G2\n", "line 2: malformed trace:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadNodes(strings.NewReader("sn,cpu_milli,memory_mib,gpu,model\n" + tc.body))
			if err == nil || !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestSynthRefusesBadNumbers: weights and means must be finite and above 0;
// NaN panicked, an infinite weight drew only its share, a NaN gap wrote
// creation times the reader refuses.
func TestSynthRefusesBadNumbers(t *testing.T) {
	for _, tc := range []struct{ mix, want string }{
		{"100:NaN", `"100:NaN": weight NaN: want a finite number > 0`},
		{"100:1,500:inf", `"500:inf": weight +Inf: want a finite number > 0`},
		{"100:1,500:-Inf", `"500:-Inf": weight -Inf: want a finite number > 0`},
		{"100:0", `"100:0": weight 0: want a finite number > 0`},
		{"100:-1", `"100:-1": weight -1: want a finite number > 0`},
		{"100:x", `"100:x": weight "x" is not a number`},
	} {
		t.Run("mix "+tc.mix, func(t *testing.T) {
			if _, err := ParseMix(tc.mix); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	nan, inf := math.NaN(), math.Inf(1)
	good := SynthOptions{Pods: 10, Mix: []Share{{100, 1, 1}}, MeanGap: 1, MeanDuration: 60}
	for _, tc := range []struct {
		name string
		edit func(*SynthOptions)
		want string
	}{
		{"gap NaN", func(o *SynthOptions) { o.MeanGap = nan }, "mean gap NaN s: want a finite number > 0"},
		{"gap infinite", func(o *SynthOptions) { o.MeanGap = inf }, "mean gap +Inf s: want a finite number > 0"},
		{"gap 0", func(o *SynthOptions) { o.MeanGap = 0 }, "mean gap 0 s: want a finite number > 0"},
		{"duration NaN", func(o *SynthOptions) { o.MeanDuration = nan }, "mean duration NaN s: want a finite number > 0"},
		{"duration negative", func(o *SynthOptions) { o.MeanDuration = -1 }, "mean duration -1 s: want a finite number > 0"},
		{"weight NaN", func(o *SynthOptions) { o.Mix = []Share{{100, 1, 1}, {500, 1, nan}} }, "share 500x1: weight NaN: want a finite number > 0"},
		{"weight infinite", func(o *SynthOptions) { o.Mix = []Share{{100, 1, 1}, {500, 1, inf}} }, "share 500x1: weight +Inf: want a finite number > 0"},
		{"weights overflow", func(o *SynthOptions) { o.Mix = []Share{{100, 1, math.MaxFloat64}, {500, 1, math.MaxFloat64}} }, "weights sum to +Inf"},
		{"no pods", func(o *SynthOptions) { o.Pods = 0 }, "0 pods"},
		{"times past the trace's range", func(o *SynthOptions) { o.MeanGap = 1e18 }, "past"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := good
			tc.edit(&o)
			if _, err := Synth(o); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	if _, err := Synth(good); err != nil {
		t.Fatal(err)
	}
}

// TestMapRefusesBadSlack: a slack that is not a finite number ≥ 0 quietly
// meant "no deadlines" (NaN, negative) or a deadline before arrival (+Inf).
func TestMapRefusesBadSlack(t *testing.T) {
	pods, err := ReadPods(strings.NewReader(header + "p,8000,100,1,500,,LS,Succeeded,10,110,10\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		slack    float64
		want     string // "" for none
		deadline time.Duration
	}{
		{0, "", 0},
		{2, "", 210 * time.Second},
		{0.5, "", 60 * time.Second},
		{math.NaN(), "slack NaN: want a finite number ≥ 0", 0},
		{-1, "slack -1: want a finite number ≥ 0", 0},
		{math.Inf(1), "slack +Inf: want a finite number ≥ 0", 0},
		{1e300, "slack 1e+300 puts the deadline of pod p (line 2) past", 0},
	} {
		reqs, _, err := Map(pods, MapOptions{Slack: tc.slack})
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("slack %g: %v", tc.slack, err)
		case tc.want == "" && reqs[0].Deadline != tc.deadline:
			t.Errorf("slack %g: deadline %v, want %v", tc.slack, reqs[0].Deadline, tc.deadline)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("slack %g: error %v, want one containing %q", tc.slack, err, tc.want)
		}
	}
}
