package cli

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
)

// The far-memory services' names in lovelockd (appliance/service/memservice).
const (
	memServer = "memserver"
	memAgent  = "farmem"
	memHost   = "memhost"
)

func memCommand() *ucli.Command {
	tenant := &ucli.UintFlag{Name: "tenant", Usage: "the tenant the region belongs to (0: infrastructure, which sees every tenant's)"}
	return &ucli.Command{
		Name:  "mem",
		Usage: "far memory (SODA): regions on a memory node, the DPU's agent, the host's mappings",
		Description: "lovelockd runs the memory server on a memory node (config section memory_server), the\n" +
			"far-memory agent on a DPU (far_memory) and the host agent that serves programs' mappings on a\n" +
			"host (far_memory_host); docs/farmem.md describes them. regions, create and free talk to the\n" +
			"memory server of the node whose lovelockd --socket names.",
		Subcommands: []*ucli.Command{
			{
				Name:  "regions",
				Usage: "list the memory server's regions: ID, tenant, size, writable, writer lease held, source",
				Flags: []ucli.Flag{outputFlag(), tenant},
				Action: func(c *ucli.Context) error {
					asJSON, err := wantJSON(c)
					if err != nil {
						return err
					}
					tenant, err := uint32Flag(c, "tenant")
					if err != nil {
						return fmt.Errorf("mem regions: %w", err)
					}
					var regions []farmem.RegionInfo
					if err := client(c).ServiceCall(c.Context, http.MethodGet, memServer, "regions?tenant="+strconv.FormatUint(uint64(tenant), 10), nil, &regions); err != nil {
						return noMemServer(err)
					}
					if asJSON {
						return writeJSON(c.App.Writer, regions)
					}
					tw := newTable(c.App.Writer)
					fmt.Fprintln(tw, "ID\tTENANT\tSIZE\tWRITABLE\tWRITER\tSOURCE")
					for _, r := range regions {
						fmt.Fprintf(tw, "%d\t%d\t%s\t%t\t%t\t%s\n", r.ID, r.Tenant, farmem.Size(r.Size), r.Writable, r.Writer, dash(r.Source))
					}
					return tw.Flush()
				},
			},
			{
				Name:      "create",
				Usage:     "create a region: --size zero-filled bytes, or a copy of --preload (a file on the memory node)",
				ArgsUsage: " ",
				Flags: []ucli.Flag{
					tenant,
					&ucli.StringFlag{Name: "size", Usage: "bytes, or with a unit: 64MiB, 2GiB (with --preload: 0 or the file's size)"},
					&ucli.BoolFlag{Name: "writable", Usage: "allow a writer (one at a time; readers are many)"},
					&ucli.StringFlag{Name: "preload", Usage: "copy this file, on the memory node, into the region"},
					outputFlag(),
				},
				Action: func(c *ucli.Context) error {
					asJSON, err := wantJSON(c)
					if err != nil {
						return err
					}
					tenant, err := uint32Flag(c, "tenant")
					if err != nil {
						return fmt.Errorf("mem create: %w", err)
					}
					req := api.MemCreate{Tenant: tenant, Writable: c.Bool("writable"), Preload: c.String("preload")}
					if v := c.String("size"); v != "" {
						size, err := farmem.ParseSize(v)
						if err != nil {
							return fmt.Errorf("--size: %w", err)
						}
						req.Size = uint64(size)
					}
					if req.Size == 0 && req.Preload == "" {
						return errors.New("mem create: give --size, or --preload FILE (see 'lovelock mem create --help')")
					}
					var info farmem.RegionInfo
					if err := client(c).ServiceCall(c.Context, http.MethodPost, memServer, "regions", req, &info); err != nil {
						return noMemServer(err)
					}
					if asJSON {
						return writeJSON(c.App.Writer, info)
					}
					fmt.Fprintf(c.App.Writer, "region %d: %s, tenant %d, writable %t\n", info.ID, farmem.Size(info.Size), info.Tenant, info.Writable)
					return nil
				},
			},
			{
				Name:      "free",
				Usage:     "free a region and its backing file (its data is gone)",
				ArgsUsage: "ID",
				Flags:     []ucli.Flag{tenant},
				Action: func(c *ucli.Context) error {
					if c.NArg() == 0 {
						return errors.New("mem free: want one region ID (see 'lovelock mem regions')")
					}
					if err := checkArgs(c, 1); err != nil {
						return err
					}
					id, err := strconv.ParseUint(c.Args().First(), 10, 32)
					if err != nil {
						return fmt.Errorf("mem free: region %q: want a number (see 'lovelock mem regions')", c.Args().First())
					}
					tenant, err := uint32Flag(c, "tenant")
					if err != nil {
						return fmt.Errorf("mem free: %w", err)
					}
					path := fmt.Sprintf("regions/%d?tenant=%d", id, tenant)
					if err := client(c).ServiceCall(c.Context, http.MethodDelete, memServer, path, nil, nil); err != nil {
						return noMemServer(err)
					}
					fmt.Fprintf(c.App.Writer, "region %d freed\n", id)
					return nil
				},
			},
			{
				Name:  "stats",
				Usage: "the node's far-memory services: a memory server's regions, bytes, tenants and writers; an agent's requests, batches, bytes and latency; a host agent's mappings",
				Flags: []ucli.Flag{outputFlag()},
				Action: func(c *ucli.Context) error {
					return memStats(c)
				},
			},
		},
	}
}

// noMemServer points to the config when the node has no memory server.
func noMemServer(err error) error {
	if serviceMissing(err) {
		return fmt.Errorf("%w (the node's lovelockd runs no memory server: see memory_server in its config)", err)
	}
	return err
}

// serviceMissing reports whether err is lovelockd's answer that the node
// runs no such service, or no such call of it; not a 404 about a thing the
// service looked for (an unknown region, a model), which the service's
// own message explains.
func serviceMissing(err error) bool {
	var nf *api.NotFoundError
	return errors.As(err, &nf) && strings.Contains(nf.Error(), "runs no ")
}

// memStatsReport is what mem stats prints, per service the node runs.
type memStatsReport struct {
	Server *farmem.ServerStats `json:"memserver,omitempty"`
	Agent  *farmem.AgentStats  `json:"farmem,omitempty"`
	Host   *api.MemHostStats   `json:"memhost,omitempty"`
}

func memStats(c *ucli.Context) error {
	asJSON, err := wantJSON(c)
	if err != nil {
		return err
	}
	rep := memStatsReport{Server: &farmem.ServerStats{}, Agent: &farmem.AgentStats{}, Host: &api.MemHostStats{}}
	found, err := fetchStats(c, map[string]any{memServer: rep.Server, memAgent: rep.Agent, memHost: rep.Host})
	if err != nil {
		return err
	}
	if len(found) == 0 {
		return errors.New("the node's lovelockd runs no far-memory service (memory_server, far_memory or far_memory_host in its config)")
	}
	// What the node does not run stays out of the report.
	if !found[memServer] {
		rep.Server = nil
	}
	if !found[memAgent] {
		rep.Agent = nil
	}
	if !found[memHost] {
		rep.Host = nil
	}
	if asJSON {
		return writeJSON(c.App.Writer, rep)
	}
	w := c.App.Writer
	if s := rep.Server; s != nil {
		most := ""
		if s.MaxRegions > 0 { // 0: a lovelockd that predates max_regions
			most = fmt.Sprintf(" (at most %d)", s.MaxRegions)
		}
		fmt.Fprintf(w, "memory server: %d regions%s of %d tenants, %d with a writer; %s of %s used\n", s.Regions, most, s.Tenants, s.Writers,
			farmem.Size(s.Used), farmem.Size(s.Capacity))
		fmt.Fprintf(w, "  requests %d, read %d B, written %d B, duplicates %d, malformed %d; freed notices sent %d (to agents that cache a freed region)\n",
			s.Link.Requests, s.ReadBytes, s.WriteBytes, s.Link.Duplicates, s.Link.Malformed, s.FreedNotices)
		fmt.Fprintf(w, "  reply cache: %d replies evicted early (a late duplicate of one runs again; raise reply_cache_bytes if it grows)\n",
			s.Link.RepliesEvicted)
		printMemErrors(w, s.Errors)
	}
	if a := rep.Agent; a != nil {
		fmt.Fprintf(w, "far-memory agent: %d memory nodes, %d regions known\n", a.Servers, a.Regions)
		fmt.Fprintf(w, "  host requests %d, forwarded %d in %d batches (%.1f host requests per batch; %d more to further nodes: lists, creates a full node refused); own requests %d (cache fills, static loads, region lists)\n",
			a.HostRequests, a.Forwarded, a.Batches, a.AvgBatch, a.FanOut, a.OwnRequests)
		fmt.Fprintf(w, "  reply cache: %d replies to hosts evicted early (a late duplicate of one runs again; raise reply_cache_bytes if it grows)\n",
			a.Host.RepliesEvicted)
		fmt.Fprintf(w, "  bytes: server→host %d, host→server %d; fabric datagrams tx %d rx %d, retransmits %d, timeouts %d\n",
			a.ReadBytes, a.WriteBytes, a.Fabric.TXDatagrams, a.Fabric.RXDatagrams, a.Fabric.Retransmits, a.Fabric.Timeouts)
		fmt.Fprintf(w, "  latency to the memory node: %s\n", memLatency(a.Latency))
		fmt.Fprintf(w, "  latency of the agent's own requests (cache fills, static loads, region lists): %s\n", memLatency(a.OwnLatency))
		fmt.Fprintf(w, "  freed notices from memory nodes: %d received, %d regions dropped from the caches, %d refused (not from the region's memory node)\n",
			a.FreedNotices.Received, a.FreedNotices.Dropped, a.FreedNotices.Refused)
		o := a.Overload
		fmt.Fprintf(w, "  turned away (answered unavailable): %d reads or writes waiting for their region's node (now %d of %d), %d static loads (now %d of %d queued or loading)\n",
			o.UnresolvedRefused, o.Unresolved, o.UnresolvedLimit, o.StaticRefused, o.StaticQueued, o.StaticLimit)
		fmt.Fprintf(w, "  refused: %d hints, %d static loads failed\n", a.Refused.Hints, a.Refused.StaticLoads)
		printMemErrors(w, a.Errors)
		printMemCache(w, &a.Cache)
	}
	if h := rep.Host; h != nil {
		fmt.Fprintf(w, "host agent: %d mappings on %s, agent %s\n", h.Mappings, h.Socket, h.Agent)
		fmt.Fprintf(w, "  requests %d, retransmits %d, timeouts %d; latency: %s\n", h.Client.Link.Requests,
			h.Client.Link.Retransmits, h.Client.Link.Timeouts, memLatency(h.Client.Latency))
	}
	return nil
}

// memLatency prints a latency summary, or that there is none: its
// percentiles are 0 until a request is answered.
func memLatency(l farmem.Latency) string {
	if l.Count == 0 {
		return "none measured (no request answered)"
	}
	return fmt.Sprintf("p50 %.0f µs, p99 %.0f µs (%d requests)", l.P50us, l.P99us, l.Count)
}

func printMemErrors(w io.Writer, e farmem.ErrorCounts) {
	fmt.Fprintf(w, "  errors: unknown region %d, out of range %d, wrong tenant %d, writer busy %d, not writer %d, read-only %d, "+
		"no space %d, bad request %d, i/o %d, unavailable %d, no server %d\n", e.UnknownRegion, e.OutOfRange, e.WrongTenant,
		e.WriterBusy, e.NotWriter, e.ReadOnly, e.NoSpace, e.BadRequest, e.IO, e.Unavailable, e.NoServer)
}

func printMemCache(w io.Writer, c *farmem.CacheStats) {
	state := "no dynamic cache"
	if c.Dynamic {
		state = "off (adaptive switch)"
		if c.On {
			state = "on"
		}
	}
	measured := func(m bool) string {
		if m {
			return "measured"
		}
		return "configured"
	}
	fmt.Fprintf(w, "  cache: dynamic %s, %d of %d entries of %s valid (%d filling, %d in use); static %s of %s\n", state,
		c.Valid, c.Entries, farmem.Size(c.EntrySize), c.Filling, c.InUse, farmem.Size(c.StaticBytes), farmem.Size(c.StaticLimit))
	if !c.Dynamic {
		fmt.Fprintf(w, "  switch: none (no dynamic cache)\n")
	} else {
		bnet := fmt.Sprintf("B_net %.3g B/s (%s)", c.BNet, measured(c.BNetMeasured))
		if c.BNetMeasured && c.BNet == 0 {
			bnet = "B_net not measured yet (no entry fill yet: the switch stays on)"
		}
		threshold := "threshold none yet"
		if c.Threshold > 0 {
			threshold = fmt.Sprintf("threshold %.3f", c.Threshold)
		}
		last := fmt.Sprintf("last window of %d reads: none yet", c.Window)
		if c.Windows > 0 {
			last = fmt.Sprintf("last window of %d reads (%d so far): hit rate %.3f", c.Window, c.Windows, c.WindowHitRate)
		}
		fmt.Fprintf(w, "  switch: %s, B_intra %.3g B/s (%s), %s; %s; %d switches\n",
			bnet, c.BIntra, measured(c.BIntraMeasured), threshold, last, c.Switches)
	}
	for _, e := range c.Events {
		onoff := "off"
		if e.On {
			onoff = "on"
		}
		fmt.Fprintf(w, "    %s  %-3s  %s\n", e.Time.Format(time.RFC3339), onoff, e.Reason)
	}
	for _, r := range c.Regions {
		scope := "all of the region"
		if r.DynamicRanges > 0 {
			scope = fmt.Sprintf("%d ranges, %d reads outside them", r.DynamicRanges, r.OutsideDynamic)
		}
		fmt.Fprintf(w, "  region %d (%s): static %d ranges %s, %d hits; dynamic (%s) hits %d, misses %d (%d of these reads waited for a fill), bypassed %d; "+
			"prefetch issued %d, used %d, evicted unused %d, invalidated %d; accuracy %.2f, coverage %.2f\n",
			r.Region, r.Prefetcher, r.StaticRanges, farmem.Size(r.StaticBytes), r.StaticHits, scope, r.Hits, r.Misses, r.Waited, r.Bypassed,
			r.PrefetchIssued, r.PrefetchUsed, r.EvictedUnused, r.Invalidated, r.Accuracy, r.Coverage)
	}
}
