//go:build race

package udp

// raceEnabled: under the race detector sync.Pool drops items at random and
// allocations are counted differently, so allocation checks do not hold.
const raceEnabled = true
