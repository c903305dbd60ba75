package wirecheck_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNotShipped: no shipped binary imports this package, so none carries
// the test program. The commands are composition roots: a new import of
// bpf/wirecheck from library code would show here.
func TestNotShipped(t *testing.T) {
	const self = "github.com/lovelock-dpu/lovelock/bpf/wirecheck"
	for _, cmd := range []string{"appliance/cmd/lovelockd", "control/cmd/lovelock"} {
		out, err := exec.Command("go", "list", "-deps", "github.com/lovelock-dpu/lovelock/"+cmd).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", cmd, err)
		}
		deps := strings.Fields(string(out))
		if len(deps) < 10 {
			t.Fatalf("go list -deps %s listed %d packages", cmd, len(deps))
		}
		for _, d := range deps {
			if d == self {
				t.Errorf("%s imports %s", cmd, self)
			}
		}
	}
}
