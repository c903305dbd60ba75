package main

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"
)

// formatTable renders the rows and the ratios the targets are
// stated in, all from this run: (4)'s host CPU per request against (1)'s,
// and each path's loaded throughput against its unloaded one.
func formatTable(rows []row) string {
	var sb strings.Builder
	tw := tabwriter.NewWriter(&sb, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "path\thost load\treq/s\tp50 µs\tp99 µs\thost CPU µs/req\tDPU CPU µs/req\tloaded/unloaded req/s\t(1)/this host CPU\twrong\tfailed\tretrans\t")
	find := func(num int, loaded bool) (row, bool) {
		for _, r := range rows {
			if r.path.num == num && r.loaded == loaded && r.measured() {
				return r, true
			}
		}
		return row{}, false
	}
	var notes []string
	for _, r := range rows {
		load := "none"
		if r.loaded {
			load = "80%"
		}
		name := fmt.Sprintf("(%d) %s", r.path.num, r.path.name)
		if !r.measured() {
			fmt.Fprintf(tw, "%s\t%s\t%s\t\t\t\t\t\t\t\t\t\t\n", name, load, "not measured")
			notes = append(notes, fmt.Sprintf("(%d) with host load %s: %s", r.path.num, load, r.note))
			continue
		}
		dpu := "-"
		if r.path.num == 4 {
			dpu = us(r.perReq(r.dpuCPU))
		}
		ratio := "-"
		if r.loaded {
			if u, ok := find(r.path.num, false); ok && u.rps > 0 {
				ratio = fmt.Sprintf("%.0f%%", 100*r.rps/u.rps)
			}
		}
		vs1 := "-"
		if one, ok := find(1, r.loaded); ok && r.hostCPU > 0 {
			vs1 = fmt.Sprintf("%.1fx", float64(one.perReq(one.hostCPU))/float64(r.perReq(r.hostCPU)))
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t\n", name, load, r.rps, us(r.p50), us(r.p99),
			us(r.perReq(r.hostCPU)), dpu, ratio, vs1, r.wrong, r.failed, r.retrans)
		if r.loaded {
			notes = append(notes, fmt.Sprintf("(%d) with host load: the busy loop got %.0f%% of CPU %d", r.path.num, 100*r.busy, hostCPU))
		}
	}
	_ = tw.Flush()
	// usable is the row a target is judged on, or why there is none: a row
	// with wrong results, or (cpu) with host CPU not above zero over its
	// window, measured something other than the path.
	usable := func(num int, loaded, cpu bool) (row, string, bool) {
		r, ok := find(num, loaded)
		name := fmt.Sprintf("(%d) unloaded", num)
		if loaded {
			name = fmt.Sprintf("(%d) loaded", num)
		}
		switch {
		case !ok:
			return r, "not measured", false
		case r.wrong > 0:
			return r, fmt.Sprintf("not measured (%s: %d wrong results)", name, r.wrong), false
		case cpu && r.hostCPU <= 0:
			return r, fmt.Sprintf("not measured (%s: host CPU %v over the window, no measurement)", name, r.hostCPU), false
		}
		return r, "", true
	}
	for _, loaded := range []bool{false, true} {
		load := "unloaded"
		if loaded {
			load = "80% host load"
		}
		one, why, ok := usable(1, loaded, true)
		var four row
		if ok {
			four, why, ok = usable(4, loaded, true)
		}
		if !ok {
			fmt.Fprintf(&sb, "target (4) host CPU per request ≥ 5x less than (1), %s: %s\n", load, why)
			continue
		}
		x := float64(one.perReq(one.hostCPU)) / float64(four.perReq(four.hostCPU))
		fmt.Fprintf(&sb, "target (4) host CPU per request ≥ 5x less than (1), %s: %.1fx (%s)\n", load, x, met(x >= 5))
	}
	for _, num := range []int{1, 3, 4} {
		what := fmt.Sprintf("(%d) throughput kept under 80%% host load", num)
		if num == 4 {
			what = "target (4) keeps ≥ 90% of its unloaded throughput under load"
		}
		u, why, ok := usable(num, false, false)
		var l row
		if ok {
			l, why, ok = usable(num, true, false)
		}
		if ok && u.rps <= 0 {
			why, ok = "not measured", false
		}
		if !ok {
			fmt.Fprintf(&sb, "%s: %s\n", what, why)
			continue
		}
		k := l.rps / u.rps
		if num == 4 {
			fmt.Fprintf(&sb, "target (4) keeps ≥ 90%% of its unloaded throughput under load: %.0f%% (%s)\n", 100*k, met(k >= 0.9))
		} else {
			fmt.Fprintf(&sb, "(%d) keeps %.0f%% of its unloaded throughput under load\n", num, 100*k)
		}
	}
	// The host-side process alone, for diagnosis: no soft interrupts, but
	// no one else's work on CPU 0 either.
	var procs []string
	for _, r := range rows {
		if r.measured() && r.procCPU > 0 {
			load := "unloaded"
			if r.loaded {
				load = "loaded"
			}
			procs = append(procs, fmt.Sprintf("(%d) %s %s", r.path.num, load, us(r.perReq(r.procCPU))))
		}
	}
	if len(procs) > 0 {
		fmt.Fprintf(&sb, "host-side process alone, utime+stime µs/req (part of host CPU; 10 ms ticks): %s\n", strings.Join(procs, ", "))
	}
	for _, n := range notes {
		fmt.Fprintln(&sb, n)
	}
	return sb.String()
}

func us(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Microsecond)) }

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "not met"
}
