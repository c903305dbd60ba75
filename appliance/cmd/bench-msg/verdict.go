package main

import (
	"fmt"
	"strings"
)

// tenXSizes are the message sizes of issue 15's "≥ 10x the
// one-datagram-per-message baseline for 16 and 64 B messages".
var tenXSizes = []int{16, 64}

// tenX is the verdict on that target for one path, from its rates and the
// baseline's by message size, both of this run. Both sizes must have been
// run and delivered something: a missing row, or a ratio to a baseline of
// zero (+Inf), is not measured rather than met.
func tenX(rate, base map[int]float64) string {
	var parts []string
	ok := true
	for _, sz := range tenXSizes {
		r, in := rate[sz]
		b, inBase := base[sz]
		switch {
		case !in || !inBase:
			return fmt.Sprintf("not measured (no %d B row)", sz)
		case b <= 0:
			return fmt.Sprintf("not measured (%d B: the baseline delivered nothing)", sz)
		case r <= 0:
			return fmt.Sprintf("not measured (%d B: the path delivered nothing)", sz)
		}
		ok = ok && r >= 10*b
		parts = append(parts, fmt.Sprintf("%d B %.1fx", sz, r/b))
	}
	return fmt.Sprintf("%s (%s)", met(ok), strings.Join(parts, ", "))
}

// transportVerdicts is the transport table's target line: the DPU agents
// on kernel UDP and on AF_XDP against the baseline. When the AF_XDP rows'
// datagrams did not stay on the AF_XDP sockets (xdpPath false), their
// rates are not AF_XDP's, and that verdict is not measured.
func transportVerdicts(udp, xdp, base map[int]float64, xdpPath bool) string {
	x := tenX(xdp, base)
	if !xdpPath {
		x = "not measured (the AF_XDP rows left the AF_XDP sockets: see the warning above)"
	}
	return fmt.Sprintf("target ≥10x over the baseline for 16 and 64 B messages: DPU agents on kernel UDP %s, on AF_XDP %s", tenX(udp, base), x)
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "not met"
}
