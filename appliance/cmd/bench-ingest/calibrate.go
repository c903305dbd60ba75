package main

import (
	"math/rand/v2"
	"runtime"
	"time"

	"github.com/lovelock-dpu/lovelock/appliance/internal/cpupin"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
)

// modelCost is the model's CPU reference on one input, run back to back
// on the host's CPU for about 200 ms with the input hot in cache: the
// share of every path's host CPU that the shared-memory device's compute
// accounts for (a GPU would take it off the host).
func modelCost() (time.Duration, error) {
	m, err := model.Builtin(*modelName)
	if err != nil {
		return 0, err
	}
	in := make([]byte, *size)
	rng := rand.New(rand.NewPCG(1, 1))
	for i := range in {
		in[i] = byte(rng.Uint32())
	}
	out := make([]byte, max(m.OutputSize(len(in)), 1))
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var per time.Duration
	err = cpupin.Thread(hostCPU, func() error {
		m.Reference(in, out)
		n, start := 0, time.Now()
		for time.Since(start) < 200*time.Millisecond {
			m.Reference(in, out)
			n++
		}
		per = time.Since(start) / time.Duration(n)
		return nil
	})
	return per, err
}
