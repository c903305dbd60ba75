package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// cpuTimes are one CPU's /proc/stat counters, in USER_HZ ticks.
type cpuTimes struct {
	user, system, softirq, idle, steal, total uint64
}

// readCPUTimes reads every CPU's line of /proc/stat ("cpuN ...").
func readCPUTimes() ([]cpuTimes, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []cpuTimes
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 9 || !strings.HasPrefix(fields[0], "cpu") || fields[0] == "cpu" {
			continue
		}
		var v [8]uint64 // user nice system idle iowait irq softirq steal
		for i := range v {
			if v[i], err = strconv.ParseUint(fields[i+1], 10, 64); err != nil {
				return nil, fmt.Errorf("/proc/stat: %q: %w", sc.Text(), err)
			}
		}
		t := cpuTimes{user: v[0] + v[1], system: v[2] + v[5], softirq: v[6], idle: v[3] + v[4], steal: v[7]}
		t.total = t.user + t.system + t.softirq + t.idle + t.steal
		out = append(out, t)
	}
	return out, sc.Err()
}

// cpuUse is the share of one CPU's time spent in each state over a window.
type cpuUse struct {
	user, system, softirq, steal float64
}

func (u cpuUse) busy() float64 { return u.user + u.system + u.softirq }

func cpuDelta(a, b []cpuTimes) []cpuUse {
	if len(a) != len(b) {
		return nil
	}
	// Differences are signed: /proc/stat's iowait may go backwards (the
	// kernel documents it as unreliable), and an unsigned difference of a
	// total that did would wrap to ~1.8e19, making every share ~0.
	diff := func(x, y uint64) float64 { return max(float64(int64(y-x)), 0) }
	out := make([]cpuUse, len(a))
	for i := range a {
		tot := float64(int64(b[i].total - a[i].total))
		if tot <= 0 {
			continue
		}
		out[i] = cpuUse{
			user:    diff(a[i].user, b[i].user) / tot,
			system:  diff(a[i].system, b[i].system) / tot,
			softirq: diff(a[i].softirq, b[i].softirq) / tot,
			steal:   diff(a[i].steal, b[i].steal) / tot,
		}
	}
	return out
}

// readNetRX reads the NET_RX softirq count of every CPU (/proc/softirqs).
func readNetRX() ([]uint64, error) {
	b, err := os.ReadFile("/proc/softirqs")
	if err != nil {
		return nil, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || fields[0] != "NET_RX:" {
			continue
		}
		out := make([]uint64, 0, len(fields)-1)
		for _, f := range fields[1:] {
			n, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("/proc/softirqs: %q: %w", line, err)
			}
			out = append(out, n)
		}
		return out, nil
	}
	return nil, fmt.Errorf("/proc/softirqs: no NET_RX line")
}
