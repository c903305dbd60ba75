package cli

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/control/api"
)

// TestServices: lovelock services lists each service and exits non-zero,
// naming them, unless every service runs as asked; degraded ones say why.
func TestServices(t *testing.T) {
	svc := &fakeService{}
	sock := serveFake(t, svc)
	for _, c := range []struct {
		name     string
		services []api.ServiceStatus
		wantOut  []string
		wantErr  string
	}{
		{"none", nil, []string{"runs no service"}, ""},
		{"running", []api.ServiceStatus{{Name: "messaging", State: api.ServiceRunning, Binding: "kernel sockets"}},
			[]string{"messaging", "running", "kernel sockets"}, ""},
		{"degraded", []api.ServiceStatus{
			{Name: "messaging", State: api.ServiceDegraded, Binding: "AF_XDP on p0", Degraded: []string{"no steering program in XDP on p0"}},
			{Name: "farmem", State: api.ServiceFailed, Error: "cluster file: no such file", Restarts: 3, NextTry: time.Date(2026, 11, 23, 9, 41, 37, 0, time.UTC)},
		}, []string{"messaging degraded: no steering program in XDP on p0", "cluster file: no such file (next try 2026-11-23T09:41:37Z)"}, "messaging degraded, farmem failed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			svc.services = c.services
			out, _, err := runCLI(sock, "services")
			for _, w := range c.wantOut {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if c.wantErr == "" && err != nil || c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
				t.Errorf("err = %v, want %q", err, c.wantErr)
			}
			out, _, jerr := runCLI(sock, "services", "-o", "json")
			if (jerr == nil) != (err == nil) {
				t.Errorf("-o json exits with %v, the table with %v: want the same exit", jerr, err)
			}
			var got []api.ServiceStatus
			if err := json.Unmarshal([]byte(out), &got); err != nil || len(got) != len(c.services) {
				t.Errorf("-o json: %v, %d services:\n%s", err, len(got), out)
			}
		})
	}
}

func TestServiceMissing(t *testing.T) {
	for _, tc := range []struct {
		name    string
		err     error
		missing bool
	}{
		{"no service", &api.NotFoundError{Err: errors.New("this node runs no memserver service (see lovelockd's config)")}, true},
		{"no such call", &api.NotFoundError{Err: errors.New("DELETE /v1/services/memserver/x: this node runs no memserver service with such a call")}, true},
		{"unknown region", &api.NotFoundError{Err: errors.New("farmem: unknown region: 999")}, false},
		{"not a 404", errors.New("this node runs no memserver service"), false},
		{"nil", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := serviceMissing(tc.err); got != tc.missing {
				t.Errorf("serviceMissing(%v) = %v, want %v", tc.err, got, tc.missing)
			}
			if tc.err == nil {
				return
			}
			hinted := strings.Contains(noMemServer(tc.err).Error(), "see memory_server in its config")
			if hinted != tc.missing {
				t.Errorf("noMemServer(%v) hints at the config: %v, want %v", tc.err, hinted, tc.missing)
			}
		})
	}
}
