package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	ucli "github.com/urfave/cli/v2"

	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/control/testbed"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
	"github.com/lovelock-dpu/lovelock/dataplane/wire/wirelayer"
)

func captureCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "capture",
		Usage: "capture packets of an interface to a pcap file, or print a pcap file with Lovelock headers decoded",
		Description: "Capture: lovelock capture --iface p0 [--rule NAME] -c 100 -w out.pcap\n" +
			"Read:    lovelock capture -r out.pcap\n\n" +
			"Capturing uses an AF_PACKET socket, so it sees what the kernel sees on the interface: traffic\n" +
			"the steering program passed, and what the kernel stack sends out of it. Frames that XDP\n" +
			"dropped or sent to AF_XDP never reach it, and neither do frames XDP redirected: not where they\n" +
			"arrived, and not on the port they leave by (XDP transmits them past the stack). Capture a\n" +
			"redirect where it arrives; on the testbed the fabric's end of the port:\n" +
			"  lovelock testbed exec fabric -- lovelock capture --iface dpu0-p0 -c 20 -w out.pcap\n" +
			"--rule keeps the frames\n" +
			"that rule matches, judged by the Go reference classifier against lovelockd's live rule set.\n" +
			"The files are ordinary pcap (tcpdump -r reads them).",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "iface", Aliases: []string{"i"}, Usage: "interface to capture on"},
			&ucli.StringFlag{Name: "rule", Usage: "keep only frames this rule (by name) matches"},
			&ucli.IntFlag{Name: "count", Aliases: []string{"c"}, Value: 100, Usage: "stop after this many frames"},
			&ucli.DurationFlag{Name: "timeout", Value: 30 * time.Second, Usage: "stop after this long (0: no limit)"},
			&ucli.StringFlag{Name: "write", Aliases: []string{"w"}, Usage: "pcap file to write"},
			&ucli.StringFlag{Name: "read", Aliases: []string{"r"}, Usage: "pcap file to read and print"},
			&ucli.UintFlag{Name: "port", Value: uint(wire.DefaultPort), Usage: "Lovelock UDP port for decoding"},
		},
		Action: capture,
	}
}

func capture(c *ucli.Context) error {
	port := c.Uint("port")
	if port == 0 || port > 65535 {
		return fmt.Errorf("--port %d: want 1-65535", port)
	}
	// Decode Lovelock headers in what is printed: the only place the
	// binaries register the gopacket layer.
	wirelayer.Register()
	if port != uint(wire.DefaultPort) {
		wirelayer.RegisterPort(uint16(port))
	}
	if r := c.String("read"); r != "" {
		if c.IsSet("iface") || c.IsSet("write") {
			return errors.New("capture: --read prints a file; it takes no --iface or --write")
		}
		return printPcap(c.App.Writer, r)
	}
	iface, out := c.String("iface"), c.String("write")
	if iface == "" || out == "" {
		return errors.New("capture: give --iface and --write to capture, or --read to print a file (see --help)")
	}
	if c.Int("count") <= 0 {
		return fmt.Errorf("--count %d: must be positive", c.Int("count"))
	}
	if d := c.Duration("timeout"); d < 0 {
		return fmt.Errorf("--timeout %s: want 0 (no limit) or a positive duration", d)
	}

	keep := func([]byte) bool { return true }
	if name := c.String("rule"); name != "" {
		var err error
		if keep, err = ruleFilter(c, name, uint16(port), iface); err != nil {
			return err
		}
	}

	if _, err := net.InterfaceByName(iface); err != nil {
		return notHere(iface, err)
	}
	h, err := pcapgo.NewEthernetHandle(iface)
	if err != nil {
		return fmt.Errorf("capture on %s: %w", iface, err)
	}
	ctx := c.Context
	if d := c.Duration("timeout"); d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	go func() { <-ctx.Done(); h.Close() }()
	defer h.Close()

	f, err := os.Create(out)
	if err != nil {
		return fmt.Errorf("capture: %w", err)
	}
	defer f.Close()
	w := pcapgo.NewWriter(f)
	if err := w.WriteFileHeader(65536, layers.LinkTypeEthernet); err != nil {
		return fmt.Errorf("capture: write %s: %w", out, err)
	}
	n := 0
	for n < c.Int("count") {
		data, ci, err := h.ReadPacketData()
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			return fmt.Errorf("capture on %s: %w", iface, err)
		}
		if !keep(data) {
			continue
		}
		if err := w.WritePacket(ci, data); err != nil {
			return fmt.Errorf("capture: write %s: %w", out, err)
		}
		n++
	}
	fmt.Fprintf(c.App.ErrWriter, "captured %d frames on %s into %s\n", n, iface, out)
	return f.Close()
}

// ruleFilter returns a predicate that holds for frames the named rule of the
// live rule set matches on iface.
func ruleFilter(c *ucli.Context, name string, port uint16, iface string) (func([]byte) bool, error) {
	set, err := client(c).Rules(c.Context)
	if err != nil {
		return nil, err
	}
	var id uint32
	for _, r := range set.Rules {
		if r.Name == name {
			id = r.ID
		}
	}
	if id == 0 {
		return nil, fmt.Errorf("capture --rule %q: no such rule (see 'lovelock rule list')", name)
	}
	ifc, err := net.InterfaceByName(iface)
	if err != nil {
		return nil, notHere(iface, err)
	}
	cl, err := rules.NewClassifier(&set, resolveLocal, port)
	if err != nil {
		return nil, err
	}
	return func(frame []byte) bool {
		return cl.Classify(frame, uint32(ifc.Index)).RuleID == id
	}, nil
}

func resolveLocal(name string) (int, error) {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return 0, fmt.Errorf("interface %s: %w", name, err)
	}
	return ifc.Index, nil
}

// printPcap prints one line per frame, with the Lovelock header decoded.
func printPcap(w io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("capture: %w", err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		return fmt.Errorf("capture: read %s: %w", path, err)
	}
	for i := 1; ; i++ {
		data, ci, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("capture: read %s: frame %d: %w", path, i, err)
		}
		pkt := gopacket.NewPacket(data, r.LinkType(), gopacket.Default)
		line := summarize(pkt)
		if ci.CaptureLength < ci.Length {
			line += fmt.Sprintf("  (captured %d of %d bytes)", ci.CaptureLength, ci.Length)
		}
		fmt.Fprintf(w, "%d %s %s\n", i, ci.Timestamp.Format("15:04:05.000000"), line)
	}
}

func summarize(pkt gopacket.Packet) string {
	var parts []string
	// A layer gopacket could not decode (a truncated frame) has an empty
	// flow, which prints as "<nil>-><nil>": name the layer instead, and
	// the error layer below says what is wrong with it.
	flow := func(f gopacket.Flow) string {
		if len(f.Src().Raw()) == 0 && len(f.Dst().Raw()) == 0 {
			return ""
		}
		return f.String()
	}
	if nl := pkt.NetworkLayer(); nl != nil {
		if f := flow(nl.NetworkFlow()); f != "" {
			parts = append(parts, f)
		} else {
			parts = append(parts, nl.LayerType().String())
		}
	}
	if tl := pkt.TransportLayer(); tl != nil {
		if f := flow(tl.TransportFlow()); f != "" {
			parts = append(parts, tl.LayerType().String()+" "+f)
		} else {
			parts = append(parts, tl.LayerType().String())
		}
	}
	if l, ok := pkt.Layer(wirelayer.LayerType).(*wirelayer.Lovelock); ok {
		parts = append(parts, fmt.Sprintf("Lovelock v%d %s flags=%s tenant=%d src=%d dst=%d seq=%d len=%d",
			l.Version, l.Type, l.Flags, l.Tenant, l.Src, l.Dst, l.Seq, l.Length))
	}
	if el := pkt.ErrorLayer(); el != nil {
		parts = append(parts, "error: "+el.Error().Error())
	}
	if len(parts) == 0 {
		parts = append(parts, pkt.LinkLayer().LayerType().String())
	}
	return strings.Join(parts, "  ")
}

// netnsDir is where `ip netns` (and the testbed) name network namespaces.
var netnsDir = "/run/netns"

// notHere explains an interface missing from this network namespace: a
// node's interfaces live in its namespace on the testbed, so capture there.
func notHere(iface string, err error) error {
	hint := "capture in the namespace that has it"
	if ents, rerr := os.ReadDir(netnsDir); rerr == nil {
		// Only the default testbed's nodes: ll-x-host0 is another
		// testbed's, not a node called x-host0.
		known := testbed.DefaultSpec().NodeNames()
		var nodes []string
		for _, e := range ents {
			if n, ok := strings.CutPrefix(e.Name(), testbed.DefaultPrefix); ok && slices.Contains(known, n) {
				nodes = append(nodes, n)
			}
		}
		if len(nodes) > 0 {
			hint = fmt.Sprintf("the testbed's nodes (%s) have their own namespaces: run it in the node's, "+
				"e.g. 'lovelock testbed exec %s -- lovelock capture --iface %s …'", strings.Join(nodes, ", "), nodes[0], iface)
		} else {
			hint += ", e.g. on the testbed 'lovelock testbed exec NODE -- lovelock capture --iface " + iface + " …'"
		}
	}
	return fmt.Errorf("capture: interface %s is not in this network namespace (%v); %s", iface, err, hint)
}
