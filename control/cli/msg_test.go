package cli

import (
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
)

// TestMsgStatsPeerDead: `lovelock msg stats` says which next hops are dead
// (silent for peer_timeout), beside their resets.
func TestMsgStatsPeerDead(t *testing.T) {
	out := runFake(t, &fakeService{msg: &messaging.Stats{Role: "agent", Node: "dpu0", Mode: messaging.ModeDPU,
		Destinations: []messaging.DestStats{
			{Name: "dpu1", Addr: "10.0.0.11:61440", PeerResets: 2, PeerDead: true},
			{Name: "dpu0/app0", Addr: "10.0.1.10:7000"},
		}}}, "msg", "stats")
	matchOutput(t, out, []string{`PEER RESETS +PEER\n`, `dpu1 +10\.0\.0\.11:61440 .* 2 +dead\n`, `dpu0/app0 +10\.0\.1\.10:7000 .* 0 +up\n`}, nil)
}

// TestMsgStatsRefused: bundles refused while draining and bundles refused
// on an unconfirmed link are printed apart, each with what it means.
func TestMsgStatsRefused(t *testing.T) {
	out := runFake(t, &fakeService{msg: &messaging.Stats{Role: "client", Node: "node0", Mode: messaging.ModeDPU,
		Received: messaging.RecvStats{Bundles: 9, Refused: 2, Unconfirmed: 5}}}, "msg", "stats")
	matchOutput(t, out, []string{`, 2 refused while draining \(sent again to the next run\)`,
		`, 5 refused until the sender confirmed the link's start \(sent again\)`}, nil)
}

// TestMsgStatsDropsBreakdown: the drops line names every counter its total
// sums, closed (messages a client's Close could not send) among them, so
// that the parts add up to the total.
func TestMsgStatsDropsBreakdown(t *testing.T) {
	var dr messaging.DropStats
	v := reflect.ValueOf(&dr).Elem()
	for i := range v.NumField() {
		v.Field(i).SetUint(1 << i) // each counter a bit of its own
	}
	out := runFake(t, &fakeService{msg: &messaging.Stats{Role: "client", Node: "node0", Client: "c0", Mode: messaging.ModeDPU, Drops: dr}}, "msg", "stats")
	m := regexp.MustCompile(`(?m)^drops: (\d+) in all: (.*)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no drops line:\n%s", out)
	}
	var sum uint64
	for _, n := range regexp.MustCompile(`\d+`).FindAllString(m[2], -1) {
		k, _ := strconv.ParseUint(n, 10, 64)
		sum += k
	}
	if m[1] != strconv.FormatUint(dr.Total(), 10) || sum != dr.Total() {
		t.Errorf("drops line: total %s, its parts sum to %d; want both %d:\n%s", m[1], sum, dr.Total(), m[0])
	}
	if want := fmt.Sprintf("closed %d", dr.Closed); !strings.Contains(m[2], want) {
		t.Errorf("drops line does not say %q:\n%s", want, m[0])
	}
}
