// Command bench-steer measures the steering classifier. Needs root.
//
// By default it measures the per-packet cost with BPF_PROG_TEST_RUN and
// prints a table: a bare XDP_PASS program (the floor, measured in the same
// run) against the classifier holding 1, 1k and 64k rules spread over 1, 4
// and 16 mask shapes, for a hit and a miss.
//
// The hit packet matches a rule of the lowest-priority shape, so the lookup
// visits every shape, as a miss does: both are the worst case for their rule
// set. Numbers vary with the machine; compare ratios taken in one run.
//
// With -throughput it measures packets per second through a veth testbed
// instead (throughput.go): three fresh network namespaces gen ⇄ dut ⇄ sink,
// the classifier in native XDP on dut's ingress veth, a generator in gen, and
// one row per path: a counting XDP_DROP program (the floor), the classifier
// dropping, redirect to the sink and xsk to an AF_XDP worker.
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/cilium/ebpf"

	"github.com/lovelock-dpu/lovelock/bpf"
)

func main() {
	repeat := flag.Int("repeat", 1_000_000, "BPF_PROG_TEST_RUN repetitions per measurement")
	rounds := flag.Int("rounds", 3, "measurements per row; the best is kept")
	throughput := flag.Bool("throughput", false, "measure packets/s through a veth testbed (gen ⇄ dut ⇄ sink) instead")
	duration := flag.Duration("duration", 3*time.Second, "with -throughput: timed window per row and round (100ms..1m)")
	warmup := flag.Duration("warmup", 500*time.Millisecond, "with -throughput: traffic before each window opens (0..10s)")
	gen := flag.String("gen", genXSK, "with -throughput: generator, "+genXSK+" (AF_XDP copy mode) or "+genPacket+" (AF_PACKET sendmmsg, qdisc bypass)")
	batch := flag.Int("batch", 64, "with -throughput: frames per generator call (1..2048)")
	spin := flag.Duration("spin", 50*time.Microsecond, "with -throughput: how long the AF_XDP worker busy-polls an empty ring before it sleeps in poll(2) (0..1s)")
	pin := flag.Bool("pin", true, "with -throughput: pin the generator to the first CPU and the AF_XDP worker to the last")
	threaded := flag.Bool("threaded", false, "with -throughput: threaded NAPI on dut's ingress veth and the sink's, pinned to the worker's CPU, so dut no longer runs on the generator's core")
	rowsFlag := flag.String("rows", strings.Join(rowKeys, ","), "with -throughput: rows to run, comma-separated")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), `Usage: bench-steer [flags]

Measures the steering classifier (bpf/steer.c). Needs root.

Default: per-packet cost with BPF_PROG_TEST_RUN, against a bare XDP_PASS
program measured in the same run (make bench-steer).

-throughput: packets/s through three fresh network namespaces
gen ⇄ dut ⇄ sink joined by veth pairs, with the classifier in native XDP on
dut's ingress. Rows: a counting XDP_DROP program (the floor), the classifier
dropping (default action, and a rule), redirect to the sink veth (counted by
an XDP program there) and xsk:0 to an AF_XDP worker on dut. Each row runs
-duration after -warmup, -rounds times; the best round is shown. Takes about
5 rows x rounds x (duration + warmup + 0.3 s). Everything it creates is
removed on exit, also on error or interrupt (the namespaces are anonymous:
even a killed run leaves none behind). See docs/steering.md, "Cost".

Flags:
`)
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "bench-steer: unexpected arguments %q\n", flag.Args())
		flag.Usage()
		os.Exit(2)
	}
	var err error
	if *throughput {
		o := tpOptions{duration: *duration, warmup: *warmup, rounds: *rounds, gen: *gen, batch: *batch, spin: *spin, pin: *pin, threaded: *threaded}
		if *rowsFlag != "" {
			o.rows = strings.Split(*rowsFlag, ",")
		}
		err = throughputMain(o)
	} else {
		err = run(*repeat, *rounds)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-steer:", err)
		if errors.Is(err, context.Canceled) {
			os.Exit(130)
		}
		os.Exit(1)
	}
}

// throughputMain checks the options and runs -throughput until it ends or
// SIGINT/SIGTERM arrives; either way it cleans up before returning.
func throughputMain(o tpOptions) error {
	switch {
	case o.duration < 100*time.Millisecond || o.duration > time.Minute:
		return fmt.Errorf("-duration %v: want 100ms..1m", o.duration)
	case o.warmup < 0 || o.warmup > 10*time.Second:
		return fmt.Errorf("-warmup %v: want 0..10s", o.warmup)
	case o.rounds < 1 || o.rounds > 20:
		return fmt.Errorf("-rounds %d: want 1..20", o.rounds)
	case o.batch < 1 || o.batch > 2048:
		return fmt.Errorf("-batch %d: want 1..2048", o.batch)
	case o.spin < 0 || o.spin > time.Second:
		return fmt.Errorf("-spin %v: want 0..1s", o.spin)
	case o.gen != genXSK && o.gen != genPacket:
		return fmt.Errorf("-gen %q: want %s or %s", o.gen, genXSK, genPacket)
	}
	for _, k := range o.rows {
		if !slices.Contains(rowKeys, k) {
			return fmt.Errorf("-rows: unknown row %q (want some of %s)", k, strings.Join(rowKeys, ","))
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := runThroughput(ctx, os.Stdout, o)
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("interrupted, testbed removed: %w", err)
	}
	return err
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

	// check runs frame once and fails unless rule's counter counted it.
	check := func(frame []byte, rule uint32) error {
		before, err := s.RuleCounter(rule)
		if err != nil {
			return err
		}
		if _, err := s.XDP.Run(&ebpf.RunOptions{Data: frame}); err != nil {
			return err
		}
		after, err := s.RuleCounter(rule)
		if err != nil {
			return err
		}
		if after.Packets != before.Packets+1 {
			return fmt.Errorf("the frame did not match rule %d", rule)
		}
		return nil
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
			if err := s.Apply(rs); errors.Is(err, bpf.ErrNotDrained) {
				fmt.Fprintf(os.Stderr, "bench-steer: warning: %d rules over %d shapes: %v\n", n, shapes, err)
			} else if err != nil {
				return fmt.Errorf("%d rules over %d shapes: %w", n, shapes, err)
			}
			// The hit matches the last rule of the lowest-priority shape
			// (of the last shape holding a rule, when rules are fewer).
			last := n - 1
			if n >= shapes {
				last = n/shapes*shapes - 1
			}
			hit := frame(dportOf(last), 10, 0, 0, 1)
			miss := frame(65535, 10, 0, 0, 1)
			for _, p := range []struct {
				name  string
				frame []byte
				rule  uint32 // the rule it must match, 0 for none
			}{{"hit", hit, uint32(last + 1)}, {"miss", miss, 0}} {
				if err := check(p.frame, p.rule); err != nil {
					return fmt.Errorf("%d rules over %d shapes, %s: %w", n, shapes, p.name, err)
				}
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
