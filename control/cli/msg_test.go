package cli

import (
	"regexp"
	"testing"

	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
)

// TestMsgStatsPeerDead: `lovelock msg stats` says which next hops are dead
// (silent for peer_timeout), beside their resets.
func TestMsgStatsPeerDead(t *testing.T) {
	sock := serveFake(t, &fakeService{msg: &messaging.Stats{Role: "agent", Node: "dpu0", Mode: messaging.ModeDPU,
		Destinations: []messaging.DestStats{
			{Name: "dpu1", Addr: "10.0.0.11:61440", PeerResets: 2, PeerDead: true},
			{Name: "dpu0/app0", Addr: "10.0.1.10:7000"},
		}}})
	out, _, err := runCLI(sock, "msg", "stats")
	if err != nil {
		t.Fatal(err)
	}
	for _, re := range []string{`PEER RESETS +PEER\n`, `dpu1 +10\.0\.0\.11:61440 .* 2 +dead\n`, `dpu0/app0 +10\.0\.1\.10:7000 .* 0 +up\n`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("msg stats output does not match %q:\n%s", re, out)
		}
	}
}

// TestMsgStatsRefused: bundles refused while draining and bundles refused
// on an unconfirmed link are printed apart, each with what it means.
func TestMsgStatsRefused(t *testing.T) {
	sock := serveFake(t, &fakeService{msg: &messaging.Stats{Role: "client", Node: "node0", Mode: messaging.ModeDPU,
		Received: messaging.RecvStats{Bundles: 9, Refused: 2, Unconfirmed: 5}}})
	out, _, err := runCLI(sock, "msg", "stats")
	if err != nil {
		t.Fatal(err)
	}
	for _, re := range []string{`, 2 refused while draining \(sent again to the next run\)`,
		`, 5 refused until the sender confirmed the link's start \(sent again\)`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("msg stats output does not match %q:\n%s", re, out)
		}
	}
}
