package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem/fmap"
)

// runDemo maps a region of the memory node (-mem-socket's lovelockd)
// through a DPU's agent (-dpu-socket) and this host's host agent
// (-host-socket) on a running testbed, writes a pattern through the mapping with a buffer of an
// eighth of the region, maps it again and checks every byte, and prints
// throughput and what dpu0's agent moved.
func runDemo(ctx context.Context) error {
	if *memSock == "" || *dpuSock == "" || *hostSock == "" {
		return errors.New("-demo needs -mem-socket, -dpu-socket and -host-socket (see appliance/examples/demo.sh)")
	}
	size, err := farmem.ParseSize(*demoSize)
	if err != nil {
		return fmt.Errorf("-demo-size: %w", err)
	}
	mem, dpu := api.NewClient(*memSock), api.NewClient(*dpuSock)
	var info farmem.RegionInfo
	if err := mem.ServiceCall(ctx, http.MethodPost, "memserver", "regions", api.MemCreate{Size: uint64(size), Writable: true}, &info); err != nil {
		return fmt.Errorf("create a region on mem0: %w", err)
	}
	defer mem.ServiceCall(context.Background(), http.MethodDelete, "memserver", fmt.Sprintf("regions/%d", info.ID), nil, nil)
	var before farmem.AgentStats
	if err := dpu.ServiceStats(ctx, "farmem", &before); err != nil {
		return fmt.Errorf("dpu0's far-memory agent: %w", err)
	}

	buffer := int64(size) / 8
	ref := fmap.RegionRef{ID: uint64(info.ID), Name: "demo"}
	start := time.Now()
	m, err := fmap.Map(ctx, *hostSock, ref, fmap.Options{BufferBytes: buffer})
	if err != nil {
		return err
	}
	data := m.Bytes()
	for i := range data {
		data[i] = pattern(i)
	}
	st, err := m.Stats(ctx)
	if err != nil {
		return err
	}
	if err := m.Close(); err != nil {
		return fmt.Errorf("close (writes back every dirty chunk): %w", err)
	}
	wrote := time.Since(start)

	start = time.Now()
	ref.ReadOnly = true
	m, err = fmap.Map(ctx, *hostSock, ref, fmap.Options{BufferBytes: buffer})
	if err != nil {
		return err
	}
	want := make([]byte, len(m.Bytes()))
	for i := range want {
		want[i] = pattern(i)
	}
	same := bytes.Equal(m.Bytes(), want)
	read := time.Since(start)
	if err := m.Close(); err != nil {
		return err
	}
	if !same {
		return fmt.Errorf("region %d read back through a new mapping differs from what was written", info.ID)
	}
	var after farmem.AgentStats
	if err := dpu.ServiceStats(ctx, "farmem", &after); err != nil {
		return err
	}
	mb := float64(size) / 1e6
	fmt.Printf("far memory: region %d (%s) on the memory node, mapped here with a buffer of %s (an eighth), through the DPU's agent\n",
		info.ID, farmem.Size(size), farmem.Size(buffer))
	fmt.Printf("  wrote the pattern through the mapping and closed it: %.0f MB/s (%d faults, %d chunks evicted, %d written back)\n",
		mb/wrote.Seconds(), st.Faults, st.Evictions, st.Writebacks)
	fmt.Printf("  mapped it again and checked every byte: %.0f MB/s; every byte equal\n", mb/read.Seconds())
	fmt.Printf("  the DPU's agent: %d host requests in %d task batches; page data host→mem0 %d B, mem0→host %d B; fabric %d datagrams out, %d in, %d retransmits\n",
		after.HostRequests-before.HostRequests, after.Batches-before.Batches, after.WriteBytes-before.WriteBytes,
		after.ReadBytes-before.ReadBytes, after.Fabric.TXDatagrams-before.Fabric.TXDatagrams,
		after.Fabric.RXDatagrams-before.Fabric.RXDatagrams, after.Fabric.Retransmits-before.Fabric.Retransmits)
	return nil
}

// pattern is the byte the demo writes at offset i: a page-varying pattern,
// so misplaced chunks show.
func pattern(i int) byte { return byte(i) ^ byte(i>>12) ^ byte(i>>20) }
