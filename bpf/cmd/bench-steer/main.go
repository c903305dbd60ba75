// Command bench-steer measures the steering classifier's per-packet cost with
// BPF_PROG_TEST_RUN and prints a table: a bare XDP_PASS program (the floor,
// measured in the same run) against the classifier holding 1, 1k and 64k
// rules spread over 1, 4 and 16 mask shapes, for a hit and a miss. Needs root.
//
// The hit packet matches a rule of the lowest-priority shape, so the lookup
// visits every shape, as a miss does: both are the worst case for their rule
// set. Numbers vary with the machine; compare ratios taken in one run.
package main

import (
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/lovelock-dpu/lovelock/bpf"
)

func main() {
	repeat := flag.Int("repeat", 1_000_000, "BPF_PROG_TEST_RUN repetitions per measurement")
	rounds := flag.Int("rounds", 3, "measurements per row; the fastest is kept")
	flag.Parse()
	if err := run(*repeat, *rounds); err != nil {
		fmt.Fprintln(os.Stderr, "bench-steer:", err)
		os.Exit(1)
	}
}

func run(repeat, rounds int) error {
	s, err := bpf.Load(bpf.Options{})
	if err != nil {
		return err
	}
	defer s.Close()

	measure := func(frame []byte, useFloor bool) (time.Duration, error) {
		prog := s.XDP
		if useFloor {
			prog = s.XDPPass
		}
		best := time.Duration(1 << 62)
		for range rounds {
			_, d, err := prog.Benchmark(frame, repeat, nil)
			if err != nil {
				return 0, err
			}
			best = min(best, d)
		}
		return best, nil
	}

	floor, err := measure(frame(1000, 10, 0, 0, 1), true)
	if err != nil {
		return fmt.Errorf("floor: %w", err)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "program\trules\tshapes\tpacket\tns/packet\tx floor\t\n")
	fmt.Fprintf(tw, "XDP_PASS (floor)\t-\t-\t-\t%.1f\t1.00\t\n", ns(floor))
	for _, shapes := range []int{1, 4, 16} {
		for _, n := range []int{1, 1000, 65535} {
			rs := ruleset(n, shapes)
			if err := s.Apply(rs); err != nil {
				return fmt.Errorf("%d rules over %d shapes: %w", n, shapes, err)
			}
			// The hit matches the last rule of the lowest-priority shape.
			last := n - 1 - (n-1)%shapes + (shapes - 1)
			if last >= n {
				last = n - 1
			}
			hit := frame(dportOf(last), 10, 0, 0, 1)
			miss := frame(65535, 10, 0, 0, 1)
			for _, p := range []struct {
				name  string
				frame []byte
			}{{"hit", hit}, {"miss", miss}} {
				d, err := measure(p.frame, false)
				if err != nil {
					return err
				}
				fmt.Fprintf(tw, "classifier\t%d\t%d\t%s\t%.1f\t%.2f\t\n", n, shapes, p.name, ns(d), float64(d)/float64(floor))
			}
		}
	}
	return tw.Flush()
}

func ns(d time.Duration) float64 { return float64(d.Nanoseconds()) }

// ruleset spreads n rules over shapes mask shapes: shape j matches UDP, an
// exact destination port and a /(32-j) source prefix; rule i lives in shape
// i % shapes with its own port, dportOf(i). Each shape has its own priority,
// so no two rules of one priority overlap.
func ruleset(n, shapes int) *bpf.Ruleset {
	rs := &bpf.Ruleset{DefaultAction: bpf.ActionPass}
	for j := range shapes {
		rs.Shapes = append(rs.Shapes, bpf.Shape{
			Fields: bpf.FieldProto | bpf.FieldDport, SrcLen: uint8(32 - j), MaxPrio: uint32(100 * (shapes - j)),
		})
	}
	for i := range n {
		j := i % shapes
		var k bpf.RuleKey
		k.Shape = uint32(j)
		k.Flow.Proto, k.Flow.Dport = 17, dportOf(i)
		src := uint32(10<<24|1) & ^(uint32(1)<<j - 1)
		binary.BigEndian.PutUint32(k.Flow.Src[:], src)
		rs.Entries = append(rs.Entries, bpf.Entry{Key: k, Val: bpf.RuleVal{
			Prio: uint32(100 * (shapes - j)), Id: uint32(i + 1), Action: uint16(bpf.ActionPass),
		}})
	}
	return rs
}

func dportOf(i int) uint16 { return uint16(i) }

// frame is an Ethernet/IPv4/UDP frame from 10.a.b.c to dport.
func frame(dport uint16, a, b, c, d byte) []byte {
	f := make([]byte, 14+20+8+18)
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:]
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(ip[2:], uint16(len(f)-14))
	copy(ip[12:], []byte{a, b, c, d, 10, 99, 0, 1})
	udp := ip[20:]
	binary.BigEndian.PutUint16(udp[0:], 5555)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	return f
}
