package memservice

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
)

var (
	srvRegions  = prometheus.NewDesc("lovelock_mem_server_regions", "Regions the memory server holds.", nil, nil)
	srvTenants  = prometheus.NewDesc("lovelock_mem_server_tenants", "Tenants that own regions on the memory server.", nil, nil)
	srvWriters  = prometheus.NewDesc("lovelock_mem_server_writers", "Regions whose writer lease is held.", nil, nil)
	srvUsed     = prometheus.NewDesc("lovelock_mem_server_used_bytes", "Bytes of regions the memory server holds.", nil, nil)
	srvCapacity = prometheus.NewDesc("lovelock_mem_server_capacity_bytes", "Bytes of regions the memory server may hold.", nil, nil)
	srvMaxRegs  = prometheus.NewDesc("lovelock_mem_server_max_regions", "Regions the memory server may hold (max_regions, or less to fit its open-files limit).", nil, nil)
	srvData     = prometheus.NewDesc("lovelock_mem_server_data_bytes_total", "Page data the memory server read or wrote, by direction (read: to requesters).", []string{"dir"}, nil)
	srvReqs     = prometheus.NewDesc("lovelock_mem_server_requests_total", "Requests the memory server executed.", nil, nil)
	srvDups     = prometheus.NewDesc("lovelock_mem_server_duplicates_total", "Requests that arrived again and were answered from the reply cache or ignored.", nil, nil)
	srvEvicted  = prometheus.NewDesc("lovelock_mem_server_replies_evicted_total", "Cached replies dropped for room (reply_cache, reply_cache_bytes) before their requester was done with them: a late duplicate of one is executed again.", nil, nil)
	srvErrors   = prometheus.NewDesc("lovelock_mem_server_errors_total", "Requests the memory server refused or failed, by kind.", []string{"kind"}, nil)
	srvNotices  = prometheus.NewDesc("lovelock_mem_server_freed_notices_total", "Notices that a region was freed sent to the agents that cache it (repeats not counted).", nil, nil)

	agentReqs    = prometheus.NewDesc("lovelock_mem_agent_host_requests_total", "Requests the far-memory agent took from host processes.", nil, nil)
	agentFwd     = prometheus.NewDesc("lovelock_mem_agent_forwarded_total", "Host requests the far-memory agent forwarded to memory nodes, each once (fan-out apart).", nil, nil)
	agentBatches = prometheus.NewDesc("lovelock_mem_agent_batches_total", "Task batches that carried the forwarded requests.", nil, nil)
	agentOwn     = prometheus.NewDesc("lovelock_mem_agent_own_requests_total", "The agent's own requests to memory nodes: cache fills, static loads, region lists.", nil, nil)
	agentFanOut  = prometheus.NewDesc("lovelock_mem_agent_fan_out_total", "Requests to further memory nodes that forwarded host requests made (a list's other nodes, a create's next node after a full one).", nil, nil)
	agentData    = prometheus.NewDesc("lovelock_mem_agent_data_bytes_total", "Page data through the far-memory agent, by direction (read: server to host).", []string{"dir"}, nil)
	agentRetx    = prometheus.NewDesc("lovelock_mem_agent_retransmits_total", "Requests the agent sent to memory nodes again after a timeout.", nil, nil)
	agentTimeout = prometheus.NewDesc("lovelock_mem_agent_timeouts_total", "Requests that failed after every try (no answer from the memory node).", nil, nil)
	agentEvicted = prometheus.NewDesc("lovelock_mem_agent_host_replies_evicted_total", "Cached replies to hosts dropped for room (reply_cache, reply_cache_bytes) before their host was done with them: a late duplicate of one is executed again.", nil, nil)
	agentErrors  = prometheus.NewDesc("lovelock_mem_agent_errors_total", "Replies to hosts by failure kind.", []string{"kind"}, nil)
	agentNotices = prometheus.NewDesc("lovelock_mem_agent_freed_notices_total", "Memory nodes' notices that a region was freed, by outcome (received, dropped: regions dropped from the caches, refused: not from the region's memory node).", []string{"outcome"}, nil)
	agentTurned  = prometheus.NewDesc("lovelock_mem_agent_turned_away_total", "Host requests the agent answered unavailable at its bounds, by what was full (unresolved: waiting for their region's memory node; static: static loads queued).", []string{"bound"}, nil)
	agentRefused = prometheus.NewDesc("lovelock_mem_agent_refused_total", "Hosts' hints refused and static loads that failed, by kind (hint, static).", []string{"kind"}, nil)
	hostMaps     = prometheus.NewDesc("lovelock_mem_host_mappings", "Far-memory mappings the host agent serves.", nil, nil)
	hostReqs     = prometheus.NewDesc("lovelock_mem_host_requests_total", "Requests the host agent sent for its mappings' faults and write-backs.", nil, nil)
	hostRetx     = prometheus.NewDesc("lovelock_mem_host_retransmits_total", "Requests the host agent sent again after a timeout.", nil, nil)
	hostTimeouts = prometheus.NewDesc("lovelock_mem_host_timeouts_total", "Requests that failed after every try.", nil, nil)
	hostLatency  = prometheus.NewDesc("lovelock_mem_host_latency_seconds", "Round trip of the host agent's requests, by quantile (absent until one is answered).", []string{"quantile"}, nil)
	cacheOn      = prometheus.NewDesc("lovelock_mem_agent_cache_on", "1 while the adaptive switch has the dynamic cache on (SODA eq. 3).", nil, nil)
	cacheRate    = prometheus.NewDesc("lovelock_mem_agent_cache_window_hit_rate", "Dynamic-cache hit rate of the last complete window (absent until a window completes).", nil, nil)
	cacheThresh  = prometheus.NewDesc("lovelock_mem_agent_cache_threshold", "B_net/B_intra: the hit rate below which the dynamic cache is switched off (absent until both are known).", nil, nil)
	cacheSwitch  = prometheus.NewDesc("lovelock_mem_agent_cache_switches_total", "Turns of the adaptive switch (off, probe, on).", nil, nil)
	cacheEntries = prometheus.NewDesc("lovelock_mem_agent_cache_entries", "Dynamic-cache entries by state.", []string{"state"}, nil)
	cacheStatic  = prometheus.NewDesc("lovelock_mem_agent_cache_static_bytes", "Bytes held by the static cache.", nil, nil)
	cacheReads   = prometheus.NewDesc("lovelock_mem_agent_cache_reads_total", "Reads looked up in the caches, per region and outcome (static_hit, hit, miss, bypassed, outside_dynamic: outside the ranges the dynamic cache holds).", []string{"region", "outcome"}, nil)
	cacheWaited  = prometheus.NewDesc("lovelock_mem_agent_cache_waited_total", "Reads that found their dynamic-cache entry filling and waited for the fill (each also counted as a hit, or a miss if the fill failed), per region.", []string{"region"}, nil)
	cachePrefet  = prometheus.NewDesc("lovelock_mem_agent_cache_prefetches_total", "Entry fills per region: issued, used, evicted_unused, invalidated.", []string{"region", "prefetcher", "kind"}, nil)
	agentLatency = prometheus.NewDesc("lovelock_mem_agent_latency_seconds", "Round trip from forwarding a host request to the memory node's reply, by quantile (absent until one is answered).", []string{"quantile"}, nil)
	agentOwnLat  = prometheus.NewDesc("lovelock_mem_agent_own_latency_seconds", "Round trip of the agent's own requests (cache fills, static loads, lists), by quantile (absent until one is answered).", []string{"quantile"}, nil)
)

// Describe implements prometheus.Collector.
func (s *ServerService) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{srvRegions, srvTenants, srvWriters, srvUsed, srvCapacity, srvMaxRegs, srvData, srvReqs, srvDups, srvEvicted, srvErrors, srvNotices} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (s *ServerService) Collect(ch chan<- prometheus.Metric) {
	srv := s.server.Load()
	if srv == nil {
		return
	}
	st := srv.Stats()
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	counter := func(d *prometheus.Desc, v uint64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), l...)
	}
	gauge(srvRegions, float64(st.Regions))
	gauge(srvTenants, float64(st.Tenants))
	gauge(srvWriters, float64(st.Writers))
	gauge(srvUsed, float64(st.Used))
	gauge(srvCapacity, float64(st.Capacity))
	gauge(srvMaxRegs, float64(st.MaxRegions))
	counter(srvData, st.ReadBytes, "read")
	counter(srvData, st.WriteBytes, "write")
	counter(srvReqs, st.Link.Requests)
	counter(srvDups, st.Link.Duplicates)
	counter(srvEvicted, st.Link.RepliesEvicted)
	counter(srvNotices, st.FreedNotices)
	for kind, v := range errorKinds(st.Errors) {
		counter(srvErrors, v, kind)
	}
}

// Describe implements prometheus.Collector.
func (s *AgentService) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{agentReqs, agentFwd, agentBatches, agentOwn, agentFanOut, agentData, agentRetx, agentTimeout, agentEvicted, agentErrors, agentNotices, agentTurned, agentRefused, agentLatency, agentOwnLat,
		cacheOn, cacheRate, cacheThresh, cacheSwitch, cacheEntries, cacheStatic, cacheReads, cacheWaited, cachePrefet} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (s *AgentService) Collect(ch chan<- prometheus.Metric) {
	a := s.agent.Load()
	if a == nil {
		return
	}
	collectAgent(ch, a.Stats())
}

// latency sends l's quantiles as d, none until a request was answered: a
// 0 would read as measured.
func latency(ch chan<- prometheus.Metric, d *prometheus.Desc, l farmem.Latency) {
	if l.Count == 0 {
		return
	}
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, l.P50us/1e6, "0.5")
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, l.P99us/1e6, "0.99")
}

// collectAgent sends the agent's metrics from st.
func collectAgent(ch chan<- prometheus.Metric, st farmem.AgentStats) {
	counter := func(d *prometheus.Desc, v uint64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), l...)
	}
	counter(agentReqs, st.HostRequests)
	counter(agentFwd, st.Forwarded)
	counter(agentBatches, st.Batches)
	counter(agentOwn, st.OwnRequests)
	counter(agentFanOut, st.FanOut)
	counter(agentData, st.ReadBytes, "read")
	counter(agentData, st.WriteBytes, "write")
	counter(agentRetx, st.Fabric.Retransmits)
	counter(agentTimeout, st.Fabric.Timeouts)
	counter(agentEvicted, st.Host.RepliesEvicted)
	counter(agentNotices, st.FreedNotices.Received, "received")
	counter(agentNotices, st.FreedNotices.Dropped, "dropped")
	counter(agentNotices, st.FreedNotices.Refused, "refused")
	counter(agentTurned, st.Overload.UnresolvedRefused, "unresolved")
	counter(agentTurned, st.Overload.StaticRefused, "static")
	counter(agentRefused, st.Refused.Hints, "hint")
	counter(agentRefused, st.Refused.StaticLoads, "static")
	for kind, v := range errorKinds(st.Errors) {
		counter(agentErrors, v, kind)
	}
	latency(ch, agentLatency, st.Latency)
	latency(ch, agentOwnLat, st.OwnLatency)
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	cs := st.Cache
	on := 0.0
	if cs.On {
		on = 1
	}
	gauge(cacheOn, on)
	if cs.Windows > 0 {
		gauge(cacheRate, cs.WindowHitRate)
	}
	if cs.Threshold > 0 {
		gauge(cacheThresh, cs.Threshold)
	}
	counter(cacheSwitch, cs.Switches)
	gauge(cacheEntries, float64(cs.Valid), "valid")
	gauge(cacheEntries, float64(cs.Filling), "filling")
	gauge(cacheEntries, float64(cs.Entries-cs.Valid-cs.Filling), "free")
	gauge(cacheStatic, float64(cs.StaticBytes))
	for _, r := range cs.Regions {
		id := strconv.FormatUint(uint64(r.Region), 10)
		counter(cacheReads, r.StaticHits, id, "static_hit")
		counter(cacheReads, r.Hits, id, "hit")
		counter(cacheReads, r.Misses, id, "miss")
		counter(cacheReads, r.Bypassed, id, "bypassed")
		counter(cacheReads, r.OutsideDynamic, id, "outside_dynamic")
		counter(cacheWaited, r.Waited, id)
		counter(cachePrefet, r.PrefetchIssued, id, r.Prefetcher, "issued")
		counter(cachePrefet, r.PrefetchUsed, id, r.Prefetcher, "used")
		counter(cachePrefet, r.EvictedUnused, id, r.Prefetcher, "evicted_unused")
		counter(cachePrefet, r.Invalidated, id, r.Prefetcher, "invalidated")
	}
}

func errorKinds(e farmem.ErrorCounts) map[string]uint64 {
	return map[string]uint64{
		"unknown_region": e.UnknownRegion, "out_of_range": e.OutOfRange, "wrong_tenant": e.WrongTenant,
		"writer_busy": e.WriterBusy, "not_writer": e.NotWriter, "read_only": e.ReadOnly, "no_space": e.NoSpace,
		"bad_request": e.BadRequest, "io": e.IO, "unavailable": e.Unavailable, "no_server": e.NoServer,
	}
}

// Describe implements prometheus.Collector.
func (s *HostService) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{hostMaps, hostReqs, hostRetx, hostTimeouts, hostLatency} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (s *HostService) Collect(ch chan<- prometheus.Metric) {
	st, ok := s.stats()
	if !ok {
		return
	}
	ch <- prometheus.MustNewConstMetric(hostMaps, prometheus.GaugeValue, float64(st.Mappings))
	ch <- prometheus.MustNewConstMetric(hostReqs, prometheus.CounterValue, float64(st.Client.Link.Requests))
	ch <- prometheus.MustNewConstMetric(hostRetx, prometheus.CounterValue, float64(st.Client.Link.Retransmits))
	ch <- prometheus.MustNewConstMetric(hostTimeouts, prometheus.CounterValue, float64(st.Client.Link.Timeouts))
	latency(ch, hostLatency, st.Client.Latency)
}
