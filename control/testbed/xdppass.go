package testbed

import (
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"

	"github.com/lovelock-dpu/lovelock/bpf"
)

// veth delivers a frame that XDP redirected into it (bpf_redirect to a DPU
// port, XDP_REDIRECT) only when the receiving end, the veth's peer, runs an
// XDP program: otherwise the frame is dropped and counted nowhere. A real
// DPU port's far end is a wire, which has no such rule, so the testbed
// makes its DPU ports behave like one: Up attaches the steering object's
// xdp_pass program to the far end of every veth whose other end is a DPU's.
// It attaches through netlink, not a BPF link, so the program stays with
// the interface after Up returns and goes with it (Down, or the interface
// deleted); a far end that runs an XDP program already is left as it is.

// dpuPortPeers returns the far ends of the DPUs' ports: the veth ends whose
// other end is a DPU's, in the Spec's link order, each with that DPU port.
func dpuPortPeers(spec Spec) (peers, ports []Endpoint) {
	roles := map[string]Role{}
	for _, n := range spec.Nodes {
		roles[n.Name] = n.Role
	}
	for _, l := range spec.Links {
		switch {
		case roles[l.A.Node] == RoleDPU && roles[l.B.Node] != RoleDPU:
			peers, ports = append(peers, l.B), append(ports, l.A)
		case roles[l.B.Node] == RoleDPU && roles[l.A.Node] != RoleDPU:
			peers, ports = append(peers, l.A), append(ports, l.B)
		}
	}
	return peers, ports
}

// ensurePeerPass attaches xdp_pass to the far ends of the DPUs' ports.
func ensurePeerPass(spec Spec) error {
	peers, _ := dpuPortPeers(spec)
	if len(peers) == 0 {
		return nil
	}
	s, err := bpf.Load(bpf.Options{})
	if err != nil {
		return fmt.Errorf("testbed: load xdp_pass for the DPU ports' peers: %w", err)
	}
	defer s.Close()
	for _, p := range peers {
		err := spec.Run(p.Node, func() error {
			l, err := netlink.LinkByName(p.Iface)
			if err != nil {
				return err
			}
			if xdpAttached(l) {
				return nil
			}
			return netlink.LinkSetXdpFdWithFlags(l, s.XDPPass.FD(), nl.XDP_FLAGS_DRV_MODE)
		})
		if err != nil {
			return fmt.Errorf("testbed: %s (peer of a DPU port): attach xdp_pass: %w", p, err)
		}
	}
	return nil
}
