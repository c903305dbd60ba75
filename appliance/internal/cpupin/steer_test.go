package cpupin

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/lovelock-dpu/lovelock/control/testenv"
)

// TestSteerReceive: SteerReceive sets rps_cpus on every interface of the
// namespace but lo, and a mask of 0 turns it off again; SteerAll steers
// several and turns them off, also when one fails.
func TestSteerReceive(t *testing.T) {
	testenv.RequirePriv(t)
	ns := fmt.Sprintf("cpupin-test-%d", os.Getpid())
	ip := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	ip("netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	ip("-n", ns, "link", "add", "name", "va", "type", "veth", "peer", "name", "vb")
	rps := func(dev string) uint64 {
		t.Helper()
		s := strings.ReplaceAll(strings.TrimSpace(ip("netns", "exec", ns, "cat", "/sys/class/net/"+dev+"/queues/rx-0/rps_cpus")), ",", "")
		v, err := strconv.ParseUint(s, 16, 64)
		if err != nil {
			t.Fatalf("%s's rps_cpus %q: %v", dev, s, err)
		}
		return v
	}
	for _, mask := range []uint64{1, 0} {
		if err := SteerReceive(ns, mask); err != nil {
			t.Fatal(err)
		}
		for _, dev := range []string{"va", "vb"} {
			if got := rps(dev); got != mask {
				t.Errorf("after SteerReceive(%#x): %s's rps_cpus %#x", mask, dev, got)
			}
		}
		if got := rps("lo"); got != 0 {
			t.Errorf("after SteerReceive(%#x): lo's rps_cpus %#x, want it left alone (0)", mask, got)
		}
	}
	off, err := SteerAll(map[string]int{ns: 0})
	if err != nil {
		t.Fatal(err)
	}
	if got := rps("va"); got != 1 {
		t.Errorf("after SteerAll to CPU 0: va's rps_cpus %#x, want 0x1", got)
	}
	if err := off(); err != nil {
		t.Fatal(err)
	}
	if got := rps("va"); got != 0 {
		t.Errorf("after SteerAll's off: va's rps_cpus %#x, want 0", got)
	}
	if _, err := SteerAll(map[string]int{ns: 0, ns + "-missing": 0}); err == nil {
		t.Error("SteerAll with a namespace that does not exist: no error")
	} else if got := rps("va"); got != 0 {
		t.Errorf("after a failed SteerAll: va's rps_cpus %#x, want 0 (turned off again)", got)
	}
	if err := SteerReceive(ns+"-missing", 1); err == nil || !strings.Contains(err.Error(), ns+"-missing") {
		t.Errorf("SteerReceive in a namespace that does not exist: %v, want an error naming it", err)
	}
}
