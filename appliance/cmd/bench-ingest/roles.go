package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime/pprof"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/agent"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/client/clienttest"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/devmem"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/hostagent"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/model"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
)

// runRole runs this process as one role of the bench, until SIGTERM.
func runRole(ctx context.Context, role string) error {
	// BENCH_INGEST_PROFILE=DIR writes each role's CPU profile to
	// DIR/ROLE-PID.pprof, to see where a request's host or DPU CPU goes.
	if dir := os.Getenv("BENCH_INGEST_PROFILE"); dir != "" {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%s-%d.pprof", role, os.Getpid())))
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	switch role {
	case "tcp-server":
		return roleTCPServer(ctx)
	case "udp-host":
		return roleUDPHost(ctx)
	case "dpu-agent":
		return roleDPUAgent(ctx)
	case "host-agent":
		return roleHostAgent(ctx)
	case "busy":
		return roleBusy(ctx)
	case "executor":
		return roleExecutor(ctx)
	}
	return fmt.Errorf("unknown role %q", role)
}

// ready tells the parent that the role serves.
func ready() { fmt.Println("ready") }

// udpOptions are the sockets' options on the testbed's 9000-byte MTU.
func udpOptions(buf int) udp.Options {
	return udp.Options{ReadBuffer: buf, WriteBuffer: buf, MaxPayload: udp.MaxPayloadForMTU(mtu, false)}
}

// TCP frames (path 1): a request is a 4-byte big-endian length and the
// input; a response is a status byte (0 ok, 1 error), a 4-byte length and
// the output or the error's text.
const (
	tcpOK  = 0
	tcpErr = 1
)

// roleTCPServer is path (1): a TCP server on the GPU host that receives
// each input into host memory, copies it into the device buffer, runs the
// model and sends the result back. One goroutine and one buffer pair per
// connection.
func roleTCPServer(ctx context.Context) error {
	m, err := model.Builtin(*modelName)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", tcpAddr)
	if err != nil {
		return err
	}
	dev, err := openDevice()
	if err != nil {
		ln.Close()
		return err
	}
	defer dev.Close()
	ready()
	go func() { <-ctx.Done(); ln.Close() }()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go func() {
			if err := serveTCP(c, dev, m, *size); err != nil && !errors.Is(err, io.EOF) {
				fmt.Fprintln(os.Stderr, "tcp-server:", err)
			}
		}()
	}
}

func serveTCP(c net.Conn, dev devmem.Device, m *model.Model, maxIn int) error {
	defer c.Close()
	in, err := dev.Alloc(maxIn)
	if err != nil {
		return err
	}
	defer in.Free()
	out, err := dev.Alloc(max(m.OutputSize(maxIn), 1))
	if err != nil {
		return err
	}
	defer out.Free()
	buf := make([]byte, maxIn)
	resp := make([]byte, 5+out.Size())
	r := bufio.NewReaderSize(c, 256<<10)
	var hdr [4]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return err
		}
		n := int(binary.BigEndian.Uint32(hdr[:]))
		if n > maxIn {
			return fmt.Errorf("input of %d bytes exceeds -size %d", n, maxIn)
		}
		if _, err := io.ReadFull(r, buf[:n]); err != nil {
			return err
		}
		k, err := runOnDevice(dev, m, in, out, buf[:n], resp[5:])
		if err != nil {
			msg := []byte(err.Error())
			resp[0] = tcpErr
			binary.BigEndian.PutUint32(resp[1:5], uint32(len(msg)))
			k = copy(resp[5:], msg)
		} else {
			resp[0] = tcpOK
			binary.BigEndian.PutUint32(resp[1:5], uint32(k))
		}
		if _, err := c.Write(resp[:5+k]); err != nil {
			return err
		}
	}
}

// runOnDevice is the host path of Conspirator's baselines: copy the input
// from host memory into the device buffer, run, copy the output back.
func runOnDevice(dev devmem.Device, m *model.Model, in, out devmem.Buffer, input, res []byte) (int, error) {
	if len(input) > in.Size() {
		return 0, fmt.Errorf("input of %d bytes exceeds the %d-byte device buffer", len(input), in.Size())
	}
	if err := in.WriteAt(input, 0); err != nil {
		return 0, err
	}
	k, err := dev.Run(m, in, len(input), out)
	if err != nil {
		return 0, err
	}
	if k > len(res) {
		return 0, fmt.Errorf("output of %d bytes exceeds the result buffer", k)
	}
	return k, out.ReadAt(res[:k], 0)
}

// roleUDPHost is path (3): the GPU host receives the Lovelock ingest
// protocol over kernel UDP, reassembles each input in host memory (the
// protocol's stand-in receiver, clienttest, rather than a second copy of
// it), copies it to the device, runs the model and answers.
func roleUDPHost(ctx context.Context) error {
	m, err := model.Builtin(*modelName)
	if err != nil {
		return err
	}
	tr, err := udp.Listen(netip.MustParseAddrPort(udpHostAddr), udpOptions(8<<20))
	if err != nil {
		return err
	}
	defer tr.Close()
	dev, err := openDevice()
	if err != nil {
		return err
	}
	defer dev.Close()
	in, err := dev.Alloc(*size)
	if err != nil {
		return err
	}
	out, err := dev.Alloc(max(m.OutputSize(*size), 1))
	if err != nil {
		return err
	}
	res := make([]byte, out.Size())
	// clienttest calls Handle from its one receive goroutine, so one
	// buffer pair serves every request.
	d := clienttest.Start(tr, clienttest.Options{Handle: func(r *clienttest.Request) clienttest.Answer {
		if r.Model != m.Name {
			return clienttest.Answer{Status: ingest.StatusUnknownModel, Text: "no model " + r.Model}
		}
		k, err := runOnDevice(dev, m, in, out, r.Input, res)
		if err != nil {
			return clienttest.Answer{Status: ingest.StatusBadRequest, Text: err.Error()}
		}
		return clienttest.Answer{Status: ingest.StatusOK, Text: "shm@0", Output: append([]byte(nil), res[:k]...)}
	}})
	ready()
	<-ctx.Done()
	d.Close()
	return nil
}

// roleDPUAgent is path (4)'s DPU side: the real ingest agent in dpu2,
// clients on its uplink, the host agent on pf0hpf.
func roleDPUAgent(ctx context.Context) error {
	clients, err := udp.Listen(netip.MustParseAddrPort(dpuClientAddr), udpOptions(8<<20))
	if err != nil {
		return err
	}
	defer clients.Close()
	host, err := udp.Listen(netip.MustParseAddrPort(dpuHostAddr), udpOptions(0))
	if err != nil {
		return err
	}
	defer host.Close()
	imp, err := openImporter()
	if err != nil {
		return err
	}
	defer imp.Close()
	hostAgent := netip.MustParseAddrPort(hostAgentAddr).Addr()
	a, err := agent.New(agent.Config{Clients: clients, Host: host, Importer: imp,
		HostPeer: netip.PrefixFrom(hostAgent, hostAgent.BitLen()), HostSocket: *handleSocket,
		Models: []agent.ModelConfig{{Name: *modelName}}, Logger: stderrLogger()})
	if err != nil {
		return err
	}
	ready()
	return a.Run(ctx)
}

// roleHostAgent is path (4)'s host side: the real host agent in gpu0 with
// one device (a shared-memory one standing in for an H100, or GPU 0),
// registered with the DPU agent; ready once the DPU has mapped its buffers.
func roleHostAgent(ctx context.Context) error {
	m, err := model.Builtin(*modelName)
	if err != nil {
		return err
	}
	tr, err := udp.Listen(netip.MustParseAddrPort(hostAgentAddr), udpOptions(0))
	if err != nil {
		return err
	}
	defer tr.Close()
	dev, err := openDevice()
	if err != nil {
		return err
	}
	defer dev.Close()
	card, err := hostCard(dev)
	if err != nil {
		return err
	}
	h, err := hostagent.New(hostagent.Config{Transport: tr, DPU: netip.MustParseAddrPort(dpuHostAddr),
		Devices: []devmem.Device{dev}, Cards: []string{card},
		HandleSocket: *handleSocket, Models: []*model.Model{m}, Logger: stderrLogger()})
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	deadline := time.After(15 * time.Second)
	for !h.Registered() {
		select {
		case err := <-done:
			return fmt.Errorf("host agent stopped before registering: %v", err)
		case <-deadline:
			return errors.New("host agent: the DPU agent did not register it within 15s")
		case <-time.After(10 * time.Millisecond):
		}
	}
	ready()
	err = <-done
	if dir := os.Getenv("BENCH_INGEST_PROFILE"); dir != "" {
		// With the profile, the agent's counters: how many doorbells
		// shared a wake-up.
		if b, jerr := json.MarshalIndent(h.Stats(), "", "  "); jerr == nil {
			os.WriteFile(filepath.Join(dir, fmt.Sprintf("host-agent-%d.json", os.Getpid())), b, 0o644)
		}
	}
	return err
}

// roleBusy is the background load on the host's CPU: busy for busyOn, then
// asleep for busyOff, so that alone it takes busyOn/(busyOn+busyOff) of
// the CPU.
func roleBusy(ctx context.Context) error {
	ready()
	for ctx.Err() == nil {
		start := time.Now()
		for time.Since(start) < busyOn {
		}
		time.Sleep(busyOff)
	}
	return nil
}

// The background load's duty cycle: 80 % of one CPU.
const (
	busyOn  = 8 * time.Millisecond
	busyOff = 2 * time.Millisecond
)

func stderrLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// roleExecutor runs the models for the host side's shared-memory devices,
// as a GPU's engines would: its CPU time is the device's, not the host's.
// With -device cuda the GPU runs them and there is no executor.
func roleExecutor(ctx context.Context) error {
	os.Remove(*executor)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: *executor, Net: "unix"})
	if err != nil {
		return err
	}
	var models []*model.Model
	for _, name := range model.BuiltinNames() {
		m, _ := model.Builtin(name)
		models = append(models, m)
	}
	ready()
	return devmem.ServeExecutor(ctx, ln, models)
}
