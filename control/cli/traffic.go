package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	ucli "github.com/urfave/cli/v2"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"

	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/control/testbed"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
	"github.com/lovelock-dpu/lovelock/dataplane/wire/wirelayer"
)

// trafficClass is one kind of packet `testbed traffic` sends.
type trafficClass struct {
	name string
	// build returns the L3-and-up layers of one packet; garbage classes
	// return raw bytes to put after the Ethernet header instead.
	build func(src, dst netip.Addr, seq int) ([]gopacket.SerializableLayer, []byte)
}

func lovelockUDP(typ wire.Type, tenant, dstRank uint32) func(src, dst netip.Addr, seq int) ([]gopacket.SerializableLayer, []byte) {
	return func(src, dst netip.Addr, seq int) ([]gopacket.SerializableLayer, []byte) {
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		udp := &layers.UDP{SrcPort: 40000, DstPort: layers.UDPPort(wire.DefaultPort)}
		udp.SetNetworkLayerForChecksum(ip)
		ll := &wirelayer.Lovelock{Header: wire.Header{Version: wire.Version, Type: typ, Tenant: tenant, Src: 1, Dst: dstRank, Seq: uint32(seq)}}
		return []gopacket.SerializableLayer{ip, udp, ll, gopacket.Payload(fmt.Appendf(nil, "demo payload %d", seq))}, nil
	}
}

// trafficMix is the demo's mixed traffic: service packets of several
// tenants and types, plain IP, and garbage.
var trafficMix = []trafficClass{
	{"bundle tenant 7", lovelockUDP(wire.TypeBundle, 7, 3)},
	{"mem-read tenant 3 region 5", lovelockUDP(wire.TypeMemRead, 3, 5)},
	{"mem-read tenant 3 region 40", lovelockUDP(wire.TypeMemRead, 3, 40)},
	{"ping tenant 9", lovelockUDP(wire.TypePing, 9, 0)},
	{"ingest-input tenant 1", lovelockUDP(wire.TypeIngestInput, 1, 0)},
	{"plain udp :5000", func(src, dst netip.Addr, seq int) ([]gopacket.SerializableLayer, []byte) {
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		udp := &layers.UDP{SrcPort: 40001, DstPort: 5000}
		udp.SetNetworkLayerForChecksum(ip)
		return []gopacket.SerializableLayer{ip, udp, gopacket.Payload("plain")}, nil
	}},
	{"tcp syn :23", func(src, dst netip.Addr, seq int) ([]gopacket.SerializableLayer, []byte) {
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		tcp := &layers.TCP{SrcPort: 40002, DstPort: 23, SYN: true, Seq: uint32(seq), Window: 1024}
		tcp.SetNetworkLayerForChecksum(ip)
		return []gopacket.SerializableLayer{ip, tcp}, nil
	}},
	{"garbage: bad lovelock version", func(src, dst netip.Addr, seq int) ([]gopacket.SerializableLayer, []byte) {
		l, _ := lovelockUDP(wire.TypePing, 1, 0)(src, dst, seq)
		l[2] = &wirelayer.Lovelock{Header: wire.Header{Version: 9, Type: wire.TypePing}}
		return l, nil
	}},
	{"garbage: truncated ipv4", func(src, dst netip.Addr, seq int) ([]gopacket.SerializableLayer, []byte) {
		return nil, []byte{0x45, 0x00, 0x00, 0x40, 0x12, 0x34}
	}},
}

func trafficCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "traffic",
		Usage:     "send the demo's mixed traffic from a host node into its DPU, and check where each class went",
		ArgsUsage: "NODE",
		Description: "Sends raw Ethernet frames out of NODE's eth0 (an AF_PACKET socket inside the node) to the\n" +
			"DPU at the other end, addressed to the DPU itself: Lovelock service packets of several\n" +
			"tenants and types, plain UDP and TCP, and malformed frames. Prints what it sent, class by\n" +
			"class.\n\n" +
			"With --check FILE it also checks each class at its destination. FILE (YAML) names, for\n" +
			"every class, the rule that must take it and where it must arrive:\n\n" +
			"   classes:\n" +
			"     - {class: \"tcp syn :23\", rule: block-telnet, to: nowhere}\n\n" +
			"'to' is kernel (the DPU's stack: seen by a packet socket on the DPU's receiving\n" +
			"interface, after XDP), nowhere (dropped, or taken by an AF_XDP socket: seen by no\n" +
			"capture), or one of the DPU's interfaces (redirected out of it: seen at that veth's far\n" +
			"end, e.g. p0 on the fabric's dpuN-p0). 'rule' is a rule name of the live set, or\n" +
			"(default). The check reads the DPU's live rule set and counters from lovelockd\n" +
			"(--socket), captures at every destination while it sends, and prints per class what\n" +
			"was sent, which live rule takes it (the Go reference classifier) and how many packets\n" +
			"that rule counted, where it was expected and how many arrived there (and anywhere\n" +
			"else), and ok or FAIL; then the xsk_miss and malformed counters against the classes\n" +
			"that should move them. It exits non-zero on any mismatch.",
		Flags: []ucli.Flag{
			testbedPrefixFlag(),
			&ucli.IntFlag{Name: "count", Aliases: []string{"c"}, Value: 10, Usage: "packets of each class"},
			&ucli.StringFlag{Name: "check", Usage: "check each class against the expectations in this YAML `FILE` (needs lovelockd's --socket)"},
		},
		Action: traffic,
	}
}

// trafficExpect is the file --check reads: for each class of trafficMix,
// the rule that must take it and where it must arrive.
type trafficExpect struct {
	Classes []classExpect `json:"classes"`
}

type classExpect struct {
	Class string `json:"class"`
	// Rule is a rule name of the live set, or trafficDefaultRule.
	Rule string `json:"rule"`
	// To is trafficKernel, trafficNowhere, or an interface of the DPU
	// the class is redirected out of.
	To string `json:"to"`
}

const (
	trafficDefaultRule = "(default)"
	trafficKernel      = "kernel"
	trafficNowhere     = "nowhere"
)

// readTrafficExpect reads and checks an expectation file: every class of
// trafficMix exactly once, nothing else.
func readTrafficExpect(name string) (map[string]classExpect, error) {
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var f trafficExpect
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	known := map[string]bool{}
	for _, cl := range trafficMix {
		known[cl.name] = true
	}
	out := map[string]classExpect{}
	for i, e := range f.Classes {
		switch {
		case !known[e.Class]:
			return nil, fmt.Errorf("%s: class %d: no class %q (classes: %s)", name, i+1, e.Class, trafficClassNames())
		case out[e.Class].Class != "":
			return nil, fmt.Errorf("%s: class %q listed twice", name, e.Class)
		case e.Rule == "" || e.To == "":
			return nil, fmt.Errorf("%s: class %q: want both rule and to", name, e.Class)
		}
		out[e.Class] = e
	}
	for _, cl := range trafficMix {
		if _, ok := out[cl.name]; !ok {
			return nil, fmt.Errorf("%s: class %q has no expectation", name, cl.name)
		}
	}
	return out, nil
}

func trafficClassNames() string {
	var names []string
	for _, cl := range trafficMix {
		names = append(names, strconv.Quote(cl.name))
	}
	return strings.Join(names, ", ")
}

func traffic(c *ucli.Context) error {
	if c.NArg() == 0 {
		return errors.New("testbed traffic: want the sending node, e.g. host0")
	}
	if err := checkArgs(c, 1); err != nil {
		return err
	}
	spec := testbedSpec(c)
	from := c.Args().First()
	if _, err := spec.Node(from); err != nil {
		return err
	}
	var me, peer testbed.Endpoint
	for _, l := range spec.Links {
		switch {
		case l.A.Node == from && l.A.Iface == "eth0":
			me, peer = l.A, l.B
		case l.B.Node == from && l.B.Iface == "eth0":
			me, peer = l.B, l.A
		}
	}
	if me.Node == "" || len(me.Addrs) == 0 || len(peer.Addrs) == 0 {
		return fmt.Errorf("testbed traffic: %s has no eth0 facing a DPU", from)
	}
	count := c.Int("count")
	if count <= 0 {
		return fmt.Errorf("--count %d: must be positive", count)
	}
	frames, err := trafficFrames(me, peer, count)
	if err != nil {
		return fmt.Errorf("testbed traffic: %w", err)
	}
	if file := c.String("check"); file != "" {
		exp, err := readTrafficExpect(file)
		if err != nil {
			return fmt.Errorf("testbed traffic --check: %w", err)
		}
		return trafficCheck(c, spec, me, peer, frames, exp)
	}
	if err := trafficSend(spec, me, peer, frames); err != nil {
		return err
	}
	tw := newTable(c.App.Writer)
	fmt.Fprintf(tw, "CLASS\tSENT\t(%s %s -> %s %s)\n", me, me.Addrs[0].Addr(), peer, peer.Addrs[0].Addr())
	for i, class := range trafficMix {
		fmt.Fprintf(tw, "%s\t%d\t\n", class.name, len(frames[i]))
	}
	return tw.Flush()
}

// trafficFrames builds count Ethernet frames of every class of trafficMix
// from me to peer, addressed to peer's first address.
func trafficFrames(me, peer testbed.Endpoint, count int) ([][][]byte, error) {
	src, dst := me.Addrs[0].Addr(), peer.Addrs[0].Addr()
	eth := &layers.Ethernet{SrcMAC: testbed.MAC(me.Node, me.Iface), DstMAC: testbed.MAC(peer.Node, peer.Iface), EthernetType: layers.EthernetTypeIPv4}
	opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
	out := make([][][]byte, len(trafficMix))
	for ci, class := range trafficMix {
		for i := 0; i < count; i++ {
			ls, raw := class.build(src, dst, i)
			var frame []byte
			if raw != nil {
				// gopacket pads frames to Ethernet's minimum, which
				// would repair the garbage: write it by hand.
				frame = append(append(append([]byte{}, eth.DstMAC...), eth.SrcMAC...), 0x08, 0x00)
				frame = append(frame, raw...)
			} else {
				buf := gopacket.NewSerializeBuffer()
				if err := gopacket.SerializeLayers(buf, opts, append([]gopacket.SerializableLayer{eth}, ls...)...); err != nil {
					return nil, fmt.Errorf("%s: build: %w", class.name, err)
				}
				frame = buf.Bytes()
			}
			out[ci] = append(out[ci], frame)
		}
	}
	return out, nil
}

// trafficSend writes every frame out of me, class by class.
func trafficSend(spec testbed.Spec, me, peer testbed.Endpoint, frames [][][]byte) error {
	err := sendOut(spec, me.Node, me.Iface, testbed.MAC(peer.Node, peer.Iface), func(send func([]byte) error) error {
		for ci, class := range trafficMix {
			for _, frame := range frames[ci] {
				if err := send(frame); err != nil {
					return fmt.Errorf("%s: send: %w", class.name, err)
				}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("testbed traffic from %s: %w", me.Node, err)
	}
	return nil
}

// sendOut opens a packet socket on node's iface and calls write, whose send
// writes one frame out of it to the MAC dst.
func sendOut(spec testbed.Spec, node, iface string, dst []byte, write func(send func([]byte) error) error) error {
	return spec.Run(node, func() error {
		l, err := netlink.LinkByName(iface)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		defer unix.Close(fd)
		to := &unix.SockaddrLinklayer{Ifindex: l.Attrs().Index, Halen: 6}
		copy(to.Addr[:], dst)
		return write(func(frame []byte) error { return unix.Sendto(fd, frame, 0, to) })
	})
}

// trafficPoint is a place --check watches: the DPU's stack (a packet socket
// on its receiving interface sees what XDP passed) or the far end of one of
// the DPU's ports (what left the DPU through it).
type trafficPoint struct {
	name string // trafficKernel, or the DPU's interface
	at   testbed.Endpoint
	fd   int
	// seen counts arrivals per class; other counts frames of no class.
	seen  []int
	other int
	// drops are frames the kernel dropped for the socket (its buffer
	// full); err is why it stopped before stop, or that its end marker
	// never came. Either way the capture cannot tell a frame that went
	// nowhere from one it missed.
	drops int
	err   error
	done  chan struct{}
	// marker, for the far end of a DPU port, is the frame the check sends
	// out of that port after the DPU counted the whole mix: it shares the
	// veth's receive ring with every frame redirected into it, so once it
	// arrives (marked closes) they all have. Not counted as other.
	marker []byte
	marked chan struct{}
}

// trafficPoints lists the kernel of the DPU behind peer and the far end of
// every port of that DPU.
func trafficPoints(spec testbed.Spec, peer testbed.Endpoint) []*trafficPoint {
	pts := []*trafficPoint{{name: trafficKernel, at: peer}}
	for _, l := range spec.Links {
		switch peer.Node {
		case l.A.Node:
			pts = append(pts, &trafficPoint{name: l.A.Iface, at: l.B})
		case l.B.Node:
			pts = append(pts, &trafficPoint{name: l.B.Iface, at: l.A})
		}
	}
	return pts
}

// open binds a packet socket to the point's interface inside its node.
func (p *trafficPoint) open(spec testbed.Spec) error {
	return spec.Run(p.at.Node, func() error {
		l, err := netlink.LinkByName(p.at.Iface)
		if err != nil {
			return err
		}
		proto := int(htons(unix.ETH_P_ALL))
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		// The whole mix must fit while nobody reads.
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20)
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: uint16(proto), Ifindex: l.Attrs().Index}); err != nil {
			unix.Close(fd)
			return fmt.Errorf("bind packet socket to %s: %w", p.at.Iface, err)
		}
		p.fd = fd
		return nil
	})
}

// read counts the frames that arrive, by class (classOf keys on the whole
// frame), until stop is closed; it then counts what is still queued, closes
// the socket and closes done. The reader waits in poll on the socket and an
// eventfd that stop's closing writes, so it stops the moment it is told.
func (p *trafficPoint) read(classOf map[string]int, stop <-chan struct{}) {
	p.seen = make([]int, len(trafficMix))
	p.done = make(chan struct{})
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		p.err = fmt.Errorf("eventfd: %w", err)
		unix.Close(p.fd)
		close(p.done)
		return
	}
	exited := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		select {
		case <-stop:
			one := [8]byte{1}
			unix.Write(wake, one[:])
		case <-exited:
		}
	}()
	go func() {
		defer wg.Done()
		defer close(exited)
		p.loop(classOf, wake)
	}()
	// wake is closed only once neither goroutine can touch it.
	go func() {
		wg.Wait()
		unix.Close(wake)
		close(p.done)
	}()
}

func (p *trafficPoint) loop(classOf map[string]int, wake int) {
	defer unix.Close(p.fd)
	// Read last: the kernel counts drops until the socket closes.
	defer func() {
		st, err := unix.GetsockoptTpacketStats(p.fd, unix.SOL_PACKET, unix.PACKET_STATISTICS)
		if err != nil {
			p.err = errors.Join(p.err, fmt.Errorf("read its drop counter: %w", err))
			return
		}
		p.drops += int(st.Drops)
	}()
	buf := make([]byte, 1<<16)
	fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}, {Fd: int32(wake), Events: unix.POLLIN}}
	for {
		if _, err := unix.Poll(fds, -1); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			p.err = fmt.Errorf("poll: %w", err)
			return
		}
		// Also after the stop: what arrived before it counts.
		if err := p.drain(buf, classOf); err != nil {
			p.err = fmt.Errorf("receive: %w", err)
			return
		}
		if fds[1].Revents != 0 {
			return
		}
	}
}

// drain counts every frame queued on the socket, without waiting.
func (p *trafficPoint) drain(buf []byte, classOf map[string]int) error {
	for {
		n, from, err := unix.Recvfrom(p.fd, buf, unix.MSG_DONTWAIT)
		switch {
		case errors.Is(err, unix.EAGAIN):
			return nil
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return err
		}
		// Frames the interface sends (the bridge flooding, the
		// DPU's replies) are not arrivals.
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		frame := buf[:n]
		if p.marker != nil && bytes.Equal(frame, p.marker) {
			select {
			case <-p.marked:
			default:
				close(p.marked)
			}
			continue
		}
		if ci, ok := classOf[string(frame)]; ok {
			p.seen[ci]++
		} else {
			p.other++
		}
	}
}

// setMarker gives the far end p of the DPU port p.name its end marker: a
// frame of the IEEE local experimental EtherType from that port to the far
// end's MAC (the fabric's bridge delivers it to itself, floods nothing).
func (p *trafficPoint) setMarker(dpu string) {
	eth := append(append(slices.Clone(testbed.MAC(p.at.Node, p.at.Iface)), testbed.MAC(dpu, p.name)...), 0x88, 0xb5)
	p.marker = fmt.Appendf(eth, "lovelock testbed traffic --check: end of %s %s, pid %d, %d", dpu, p.name, os.Getpid(), time.Now().UnixNano())
	p.marked = make(chan struct{})
}

// sendMarker sends p's marker out of the DPU port p.name, inside dpu.
func (p *trafficPoint) sendMarker(spec testbed.Spec, dpu string) error {
	return sendOut(spec, dpu, p.name, p.marker[:6], func(send func([]byte) error) error { return send(p.marker) })
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// trafficCheck sends the mix while capturing at every destination and
// prints, per class, what was sent, counted and where it arrived.
func trafficCheck(c *ucli.Context, spec testbed.Spec, me, peer testbed.Endpoint, frames [][][]byte, exp map[string]classExpect) error {
	ctx := c.Context
	cl := client(c)
	set, err := cl.Rules(ctx)
	if err != nil {
		return fmt.Errorf("testbed traffic --check: the live rule set of %s: %w", peer.Node, err)
	}
	status, err := cl.Status(ctx)
	if err != nil {
		return fmt.Errorf("testbed traffic --check: %w", err)
	}
	// Interface names in rules and verdicts are the DPU's: resolve them
	// inside its namespace.
	var classifier *rules.Classifier
	var ifindex int
	ifname := map[int]string{}
	err = spec.Run(peer.Node, func() error {
		var err error
		if classifier, err = rules.NewClassifier(&set, rules.LinkResolver, status.Port); err != nil {
			return err
		}
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			ifname[l.Attrs().Index] = l.Attrs().Name
			if l.Attrs().Name == peer.Iface {
				ifindex = l.Attrs().Index
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("testbed traffic --check: the live rule set of %s: %w", peer.Node, err)
	}
	ruleName := map[uint32]string{0: trafficDefaultRule}
	for _, r := range set.Rules {
		ruleName[r.ID] = r.Name
	}

	pts := trafficPoints(spec, peer)
	pointNames := []string{trafficKernel, trafficNowhere}
	for _, p := range pts[1:] {
		pointNames = append(pointNames, p.name)
	}
	for _, class := range trafficMix {
		if e := exp[class.name]; !slices.Contains(pointNames, e.To) {
			return fmt.Errorf("testbed traffic --check: class %q: to %q: want one of %s", class.name, e.To, strings.Join(pointNames, ", "))
		}
	}
	classOf := map[string]int{}
	for ci := range frames {
		for _, f := range frames[ci] {
			classOf[string(f)] = ci
		}
	}
	classify := func(frame []byte) (string, string, bool) {
		v := classifier.Classify(frame, uint32(ifindex))
		action := v.Action.String()
		switch v.Action {
		case bpf.ActionRedirect:
			action += ":" + ifname[int(v.Arg)]
		case bpf.ActionXSK:
			action += ":" + strconv.Itoa(int(v.Arg))
		}
		return ruleName[v.RuleID], action, v.Status.Malformed()
	}
	// What each rule must count of the mix: the check waits for it.
	wantRule := map[string]uint64{}
	for ci := range frames {
		rule, _, _ := classify(frames[ci][0])
		wantRule[rule] += uint64(len(frames[ci]))
	}
	for _, p := range pts[1:] {
		p.setMarker(peer.Node)
	}
	stop := make(chan struct{})
	for i, p := range pts {
		if err := p.open(spec); err != nil {
			close(stop)
			for _, q := range pts[:i] {
				<-q.done
			}
			return fmt.Errorf("testbed traffic --check: capture at %s %s: %w", p.at.Node, p.at.Iface, err)
		}
		p.read(classOf, stop)
	}
	stopped := false
	halt := func() {
		if !stopped {
			stopped = true
			close(stop)
			for _, p := range pts {
				<-p.done
			}
		}
	}
	defer halt()

	before, err := cl.Stats(ctx)
	if err != nil {
		return fmt.Errorf("testbed traffic --check: counters: %w", err)
	}
	if err := trafficSend(spec, me, peer, frames); err != nil {
		return err
	}
	// No fixed settle time: wait until the DPU's XDP has counted every
	// frame of the mix (a frame it passed reaches the kernel's capture in
	// that same softirq), read the counters, then send each far end its
	// marker, which arrives after everything redirected there before it.
	// The markers go after the counters were read, so a TC egress hook on
	// the port that counts them changes nothing.
	wctx, cancel := context.WithTimeout(ctx, trafficWait)
	defer cancel()
	after, err := trafficAwaitCounted(ctx, wctx, cl, set, before, wantRule)
	if err != nil {
		return fmt.Errorf("testbed traffic --check: counters: %w", err)
	}
	for _, p := range pts[1:] {
		if err := p.sendMarker(spec, peer.Node); err != nil {
			return fmt.Errorf("testbed traffic --check: end marker out of %s %s: %w", peer.Node, p.name, err)
		}
	}
	for _, p := range pts[1:] {
		select {
		case <-p.marked:
		case <-wctx.Done():
		}
	}
	halt()
	for _, p := range pts[1:] {
		select {
		case <-p.marked:
		default:
			p.err = errors.Join(p.err, fmt.Errorf("its end marker, sent out of %s %s after the DPU counted the mix, did not arrive within %v, so frames may still have been on their way (a TC egress hook on %s that drops it?)",
				peer.Node, p.name, trafficWait, p.name))
		}
	}
	d, err := trafficDeltas(set, before, after)
	if err != nil {
		return fmt.Errorf("testbed traffic --check: %s: %w", peer.Node, err)
	}
	return trafficReport(c.App.Writer, me, peer, frames, exp, pts, d, classify)
}

// trafficWait bounds how long --check waits, after sending, for the DPU to
// count the mix and for the captures' end markers; only a failing check
// waits that long.
const trafficWait = 5 * time.Second

// trafficAwaitCounted reads the counters until every rule counted at least
// its share of the mix (want), so XDP has seen every frame, and returns the
// last reading. When wait ends first, or the counters are not comparable
// with before (trafficDeltas says why later), it returns the last reading
// as is. Readings use ctx, so that the last one does not fail for wait.
func trafficAwaitCounted(ctx, wait context.Context, cl *api.Client, set rules.Set, before api.Stats, want map[string]uint64) (api.Stats, error) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		now, err := cl.Stats(ctx)
		if err != nil {
			return api.Stats{}, err
		}
		d, err := trafficDeltas(set, before, now)
		if err != nil {
			return now, nil
		}
		done := true
		for rule, n := range want {
			if d.rules[rule] < n {
				done = false
			}
		}
		if done {
			return now, nil
		}
		select {
		case <-wait.Done():
			return now, nil
		case <-tick.C:
		}
	}
}

// counterDeltas are the counters' increase over the check, rules by name
// (the default under trafficDefaultRule).
type counterDeltas struct {
	rules    map[string]uint64
	verdicts map[string]uint64
}

// trafficDeltas is the counters' increase from before to after. Both must
// count set, the rule set the classifier was built from, installed (rule
// names and IDs alike), and no counter may go back: else the set changed
// or lovelockd restarted during the check, and a difference would compare
// another set's counts with the classifier's, or wrap round.
func trafficDeltas(set rules.Set, before, after api.Stats) (counterDeltas, error) {
	const again = "run the check again once nothing changes the rules"
	if before.RulesPending || after.RulesPending {
		return counterDeltas{}, fmt.Errorf("the live rule set is not installed (see 'lovelock status'): its rules count nothing; %s", again)
	}
	ids := func(rs []api.RuleStat) []string {
		var out []string
		for _, r := range rs {
			out = append(out, fmt.Sprintf("%s (id %d)", r.Name, r.ID))
		}
		return out
	}
	var want []string
	for _, r := range set.Rules {
		want = append(want, fmt.Sprintf("%s (id %d)", r.Name, r.ID))
	}
	if b := ids(before.Rules); !slices.Equal(b, want) {
		return counterDeltas{}, fmt.Errorf("the counters are of rules %s, not the set read first (%s); %s", strings.Join(b, ", "), strings.Join(want, ", "), again)
	}
	if a := ids(after.Rules); !slices.Equal(a, want) {
		return counterDeltas{}, fmt.Errorf("the rule set changed during the check: %s, then %s; %s", strings.Join(want, ", "), strings.Join(a, ", "), again)
	}
	back := func(what string, b, a uint64) error {
		if a < b {
			return fmt.Errorf("counter %s went back during the check, from %d to %d (lovelockd restarted, or the rule's ID was given again); %s", what, b, a, again)
		}
		return nil
	}
	d := counterDeltas{rules: map[string]uint64{}, verdicts: map[string]uint64{}}
	if err := back(trafficDefaultRule, before.Default.Packets, after.Default.Packets); err != nil {
		return counterDeltas{}, err
	}
	d.rules[trafficDefaultRule] = after.Default.Packets - before.Default.Packets
	for i, r := range after.Rules {
		if err := back("of rule "+r.Name, before.Rules[i].Counter.Packets, r.Counter.Packets); err != nil {
			return counterDeltas{}, err
		}
		d.rules[r.Name] = r.Counter.Packets - before.Rules[i].Counter.Packets
	}
	for name, v := range after.Verdicts {
		if err := back(name, before.Verdicts[name].Packets, v.Packets); err != nil {
			return counterDeltas{}, err
		}
		d.verdicts[name] = v.Packets - before.Verdicts[name].Packets
	}
	return d, nil
}

// trafficReport prints the check's table and returns an error naming what
// failed. classify says which live rule takes a frame, its action, and
// whether the frame is malformed.
func trafficReport(w io.Writer, me, peer testbed.Endpoint, frames [][][]byte, exp map[string]classExpect, pts []*trafficPoint,
	d counterDeltas, classify func([]byte) (rule, action string, malformed bool)) error {
	type row struct {
		rule, action string
		malformed    bool
	}
	rows := make([]row, len(trafficMix))
	wantRule := map[string]uint64{}
	var wantMiss, wantMalformed uint64
	for ci, class := range trafficMix {
		r := &rows[ci]
		r.rule, r.action, r.malformed = classify(frames[ci][0])
		n := uint64(len(frames[ci]))
		wantRule[r.rule] += n
		if r.malformed {
			wantMalformed += n
		}
		// An xsk verdict that the kernel received had no socket.
		if strings.HasPrefix(r.action, "xsk") && exp[class.name].To == trafficKernel {
			wantMiss += n
		}
	}

	var failed []string
	tw := newTable(w)
	fmt.Fprintf(tw, "CLASS\tSENT\tRULE\tACTION\tCOUNTED\tEXPECTED AT\tARRIVED\tRESULT\t(%s -> %s %s)\n", me, peer, peer.Addrs[0].Addr())
	for ci, class := range trafficMix {
		e, r := exp[class.name], rows[ci]
		sent := len(frames[ci])
		ok := true
		rule := r.rule
		if r.rule != e.Rule {
			rule += " (want " + e.Rule + ")"
			ok = false
		}
		counted := strconv.Itoa(sent)
		switch got, want := d.rules[r.rule], wantRule[r.rule]; {
		case got == want:
		case r.rule == trafficDefaultRule && got > want:
			// The default takes whatever no rule matches on any of the
			// node's interfaces, the kernel's own chatter on p0 too
			// (neighbour and multicast-listener reports of freshly up
			// interfaces); the captures say where this class went.
			counted = fmt.Sprintf("%d (+%d not from the mix)", sent, got-want)
		default:
			counted = fmt.Sprintf("%d by the rule, want %d", got, want)
			ok = false
		}
		where, arrived := trafficWhere(e.To, pts, peer), 0
		var elsewhere []string
		for _, p := range pts {
			n := p.seen[ci]
			if p.name == e.To {
				arrived = n
			} else if n > 0 {
				elsewhere = append(elsewhere, fmt.Sprintf("%d at %s", n, trafficWhere(p.name, pts, peer)))
			}
		}
		arr := strconv.Itoa(arrived)
		if len(elsewhere) > 0 {
			arr += ", " + strings.Join(elsewhere, ", ")
			ok = false
		}
		if e.To != trafficNowhere && arrived != sent {
			ok = false
		}
		verdict := "ok"
		if !ok {
			verdict = "FAIL"
			failed = append(failed, class.name)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n", class.name, sent, rule, r.action, counted, where, arr, verdict)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, p := range pts {
		var lost string
		switch {
		case p.err != nil:
			lost = fmt.Sprintf("stopped early (%v)", p.err)
		case p.drops > 0:
			lost = fmt.Sprintf("dropped %d frames, its buffer full (try a smaller --count)", p.drops)
		default:
			continue
		}
		// What it missed may be frames of a class expected elsewhere
		// or nowhere: no class's result there can be trusted.
		fmt.Fprintf(w, "capture at %s %s (%s): %s: FAIL\n", p.at.Node, p.at.Iface, trafficWhere(p.name, pts, peer), lost)
		failed = append(failed, fmt.Sprintf("capture at %s %s", p.at.Node, p.at.Iface))
	}
	for _, v := range []struct {
		name string
		want uint64
		why  string
	}{
		{"xsk_miss", wantMiss, "the classes steered to an AF_XDP queue that arrived in the kernel"},
		{"malformed", wantMalformed, "the malformed classes"},
	} {
		verdict := "ok"
		if got := d.verdicts[v.name]; got != v.want {
			verdict = "FAIL"
			failed = append(failed, "counter "+v.name)
		}
		fmt.Fprintf(w, "counter %s: %d, want %d (%s): %s\n", v.name, d.verdicts[v.name], v.want, v.why, verdict)
	}
	if len(failed) > 0 {
		return fmt.Errorf("testbed traffic --check: %d FAIL: %s", len(failed), strings.Join(failed, "; "))
	}
	fmt.Fprintf(w, "every class went where its rule says, and arrived there\n")
	return nil
}

// trafficWhere names a destination for the table.
func trafficWhere(to string, pts []*trafficPoint, peer testbed.Endpoint) string {
	switch to {
	case trafficNowhere:
		return trafficNowhere
	case trafficKernel:
		return fmt.Sprintf("%s's kernel (%s)", peer.Node, peer.Iface)
	}
	for _, p := range pts {
		if p.name == to {
			return fmt.Sprintf("out of %s (%s %s)", to, p.at.Node, p.at.Iface)
		}
	}
	return to
}
