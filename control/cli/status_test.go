package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/attach"
)

// TestStatus: lovelock status prints health, each attachment as the kernel
// runs it, the services and every failure with its cause, and exits
// non-zero unless the node is healthy.
func TestStatus(t *testing.T) {
	svc := &fakeService{}
	sock := serveFake(t, svc)
	xdp := attach.Attachment{Iface: "pf0hpf", Hook: attach.HookXDP}
	for _, c := range []struct {
		name    string
		status  api.Status
		wantOut []string
		wantErr string
	}{
		{"ok", api.Status{Health: api.HealthOK, Links: []attach.LinkStatus{{Attachment: xdp, Ifindex: 7, Live: true}},
			Services: []api.ServiceStatus{{Name: "messaging", State: api.ServiceRunning}}},
			[]string{"health:   ok", "pf0hpf", "7", "running", "messaging"}, ""},
		{"degraded", api.Status{Health: api.HealthDegraded,
			Links: []attach.LinkStatus{{Attachment: xdp, Problem: "the link's interface was deleted"}},
			Failures: []api.Failure{
				{What: "attachment pf0hpf xdp", Cause: "the link's interface was deleted"},
				{What: "service messaging", Cause: "failed: node dpu9 is not in the cluster file"},
			}},
			[]string{"health:   degraded", "NOT RUNNING", "attachment pf0hpf xdp: the link's interface was deleted", "node dpu9"},
			"runs degraded: attachment pf0hpf xdp, service messaging"},
		{"rules pending", api.Status{Health: api.HealthDegraded, Rules: 2, RulesPending: true,
			Failures: []api.Failure{{What: "rules", Cause: `unknown interface "late0"; the data plane keeps the rule set it had`}}},
			[]string{"rules:    2 pending: not installed (see failures)", "the data plane keeps the rule set it had"}, "runs degraded: rules"},
		{"starting", api.Status{Health: api.HealthStarting, Rules: 2}, []string{"health:   starting", "rules:    2 live"}, "starting"},
		{"old daemon", api.Status{}, nil, "no health"},
	} {
		t.Run(c.name, func(t *testing.T) {
			svc.status = c.status
			out, _, err := runCLI(sock, "status")
			for _, w := range c.wantOut {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if c.wantErr == "" && err != nil || c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
				t.Errorf("err = %v, want %q", err, c.wantErr)
			}
			out, _, err = runCLI(sock, "status", "-o", "json")
			var got api.Status
			if jerr := json.Unmarshal([]byte(out), &got); jerr != nil || got.Health != c.status.Health || len(got.Failures) != len(c.status.Failures) {
				t.Errorf("-o json: %v, %+v:\n%s", jerr, got, out)
			}
			if (err == nil) != (c.wantErr == "") {
				t.Errorf("-o json: err = %v, want the same exit as the table", err)
			}
		})
	}
}
