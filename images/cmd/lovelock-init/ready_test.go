package main

import (
	"strings"
	"testing"

	"github.com/lovelock-dpu/lovelock/control/api"
)

// TestHealthy: the init calls the DPU ready only when lovelockd's status
// says ok; a degraded one is not ready, and says why.
func TestHealthy(t *testing.T) {
	for _, c := range []struct {
		st   api.Status
		want string // "" ready, else part of the error
	}{
		{api.Status{Health: api.HealthOK}, ""},
		{api.Status{Health: api.HealthDegraded, Failures: []api.Failure{
			{What: "attachment p0 xdp", Cause: "interface p0: device or resource busy"},
			{What: "service messaging", Cause: "failed: no node dpu9"},
		}}, "attachment p0 xdp: interface p0: device or resource busy; service messaging: failed: no node dpu9"},
		{api.Status{Health: api.HealthStarting}, "starting"},
		{api.Status{}, "no health"},
	} {
		err := healthy(c.st)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("healthy(%+v) = %v, want %q", c.st, err, c.want)
		}
	}
}
