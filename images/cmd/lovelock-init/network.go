package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/images/appconfig"
)

// linkWait is how long /init waits for a required interface to appear:
// drivers probe asynchronously after their module loads.
const linkWait = 20 * time.Second

// setupNetwork brings up loopback and every configured interface with its
// MTU, addresses and default route. A missing optional interface is
// skipped; a missing required one is an error (the others still come up).
func setupNetwork(ctx context.Context, log *slog.Logger, cfg *appconfig.Config) error {
	var errs []error
	if lo, err := netlink.LinkByName("lo"); err == nil {
		if err := netlink.LinkSetUp(lo); err != nil {
			errs = append(errs, fmt.Errorf("lo: %w", err))
		}
	}
	for _, ifc := range cfg.Interfaces {
		wait := linkWait
		if ifc.Optional {
			wait = 0
		}
		l, err := findLink(ctx, ifc.Name, wait)
		if err != nil {
			if ifc.Optional {
				log.Info("optional interface absent", "iface", ifc.Name)
				continue
			}
			errs = append(errs, err)
			continue
		}
		if err := configure(l, ifc); err != nil {
			errs = append(errs, err)
			continue
		}
		log.Info("interface up", "iface", ifc.Name, "addresses", strings.Join(ifc.Addresses, ","), "xdp", ifc.XDP)
	}
	return errors.Join(errs...)
}

// findLink waits up to wait for the interface called name, renaming the
// one whose phys_port_name is name when no interface has that name yet.
func findLink(ctx context.Context, name string, wait time.Duration) (netlink.Link, error) {
	deadline := time.Now().Add(wait)
	for {
		if l, err := netlink.LinkByName(name); err == nil {
			return l, nil
		}
		if l, err := renameByPortName(name); err == nil && l != nil {
			return l, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("interface %s: not found after %v", name, wait)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// renameByPortName gives the interface whose phys_port_name is name that
// name, as NVIDIA's udev rule does for mlx5 ports and representors (p0,
// pf0hpf, pf0vf0). It returns nil when no interface reports that port name.
func renameByPortName(name string) (netlink.Link, error) {
	dirs, err := os.ReadDir("/sys/class/net")
	if err != nil {
		return nil, err
	}
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join("/sys/class/net", d.Name(), "phys_port_name"))
		if err != nil || strings.TrimSpace(string(b)) != name {
			continue
		}
		l, err := netlink.LinkByName(d.Name())
		if err != nil {
			return nil, err
		}
		_ = netlink.LinkSetDown(l)
		if err := netlink.LinkSetName(l, name); err != nil {
			return nil, fmt.Errorf("interface %s: rename to %s: %w", d.Name(), name, err)
		}
		return netlink.LinkByName(name)
	}
	return nil, nil
}

func configure(l netlink.Link, ifc appconfig.Interface) error {
	if ifc.MTU != 0 {
		if err := netlink.LinkSetMTU(l, ifc.MTU); err != nil {
			return fmt.Errorf("interface %s: mtu %d: %w", ifc.Name, ifc.MTU, err)
		}
	}
	// IPv6 duplicate address detection would delay the addresses for
	// seconds on a point-to-point appliance link; skip it.
	_ = os.WriteFile(filepath.Join("/proc/sys/net/ipv6/conf", ifc.Name, "accept_dad"), []byte("0"), 0)
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("interface %s: up: %w", ifc.Name, err)
	}
	for _, a := range ifc.Addresses {
		addr, err := netlink.ParseAddr(a)
		if err != nil {
			return fmt.Errorf("interface %s: address %s: %w", ifc.Name, a, err)
		}
		if err := netlink.AddrAdd(l, addr); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("interface %s: address %s: %w", ifc.Name, a, err)
		}
	}
	if ifc.Gateway != "" {
		gw := net.ParseIP(ifc.Gateway)
		route := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw}
		if err := netlink.RouteAdd(route); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("interface %s: default route via %s: %w", ifc.Name, gw, err)
		}
	}
	return nil
}
