package cli

import (
	"testing"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
)

// TestMemCacheNoneYet: before the adaptive switch's first window ends and
// before the first entry fill, lovelock mem stats says "none yet" and "not
// measured yet" instead of a hit rate and a B_net of 0, as if measured;
// once they are, it prints them.
func TestMemCacheNoneYet(t *testing.T) {
	cache := farmem.CacheStats{Dynamic: true, On: true, BNetMeasured: true, BIntra: 2e9, BIntraMeasured: true, Window: 1024}
	measured := cache
	measured.BNet, measured.Threshold, measured.Windows, measured.WindowHitRate = 1e9, 0.5, 3, 0.75
	for _, tc := range []struct {
		name    string
		cache   farmem.CacheStats
		want    []string // regexps
		notWant []string
	}{
		{"nothing yet", cache,
			[]string{`B_net not measured yet \(no entry fill yet: the switch stays on\)`, `threshold none yet`, `last window of 1024 reads: none yet`},
			[]string{`B_net 0 `, `hit rate 0\.000`, `threshold 0\.000`}},
		{"measured", measured,
			[]string{`B_net 1e\+09 B/s \(measured\)`, `threshold 0\.500`, `last window of 1024 reads \(3 so far\): hit rate 0\.750`},
			[]string{`none yet`, `not measured yet`}},
		{"no dynamic cache", farmem.CacheStats{StaticLimit: 1 << 20, Window: 1024, BNetMeasured: true},
			[]string{`switch: none \(no dynamic cache\)`}, []string{`B_net`, `hit rate`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &fakeService{services: []api.ServiceStatus{{Name: memAgent, State: api.ServiceRunning}},
				svcStats: map[string]any{memAgent: farmem.AgentStats{Cache: tc.cache}}}
			matchOutput(t, runFake(t, svc, "mem", "stats"), tc.want, tc.notWant)
		})
	}
}
