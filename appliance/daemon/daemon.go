// Package daemon is lovelockd: it opens (or adopts) the node's pinned
// steering data plane, reconciles it with the desired state recorded in its
// state file, and serves the local API and Prometheus metrics. The data
// plane does not depend on the daemon: stopping or killing it leaves every
// program, link and rule set in place, and a restart adopts them.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/vishvananda/netlink"

	"github.com/lovelock-dpu/lovelock/appliance/config"
	"github.com/lovelock-dpu/lovelock/appliance/service"
	"github.com/lovelock-dpu/lovelock/bpf"
	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/attach"
	"github.com/lovelock-dpu/lovelock/control/buildinfo"
	"github.com/lovelock-dpu/lovelock/control/rules"
)

// Daemon is a running lovelockd. Its methods implement api.Service.
type Daemon struct {
	cfg     config.Config
	log     *slog.Logger
	started time.Time

	mu    sync.Mutex // serialises changes to the data plane and the state
	node  *attach.Node
	state State
	// live is the rule set the data plane holds, with IDs: the operator's
	// (state.Rules) followed by owned, lovelockd's own rules; while
	// counted is not nil, the set to install.
	live  rules.Set
	owned []rules.Rule
	// counted, when not nil, is the set whose rules the rule counters
	// count where that is not live: after a reconcile that failed, the
	// data plane still runs the previous start's rules (as far as the
	// state file records them), or none on a fresh data plane (counted
	// is empty), while live lists the set to install. The next install
	// zeroes by it and clears it.
	counted *rules.Set
	// reserved are the services' own rules by service; owned is their
	// merge (service.Merge) as last installed.
	reserved map[string][]rules.Rule

	supervisors []*service.Supervisor // one per configured service

	// failures are what lovelockd was asked to do and could not, by what
	// ("attachment IFACE HOOK", "rules"); see health.go.
	failures map[string]failure
	// ruleIfaces are the interfaces the live rule set names, with the
	// ifindexes it was compiled for: rules match and redirect by ifindex,
	// so a re-created interface needs the set compiled again.
	ruleIfaces map[string]int

	// onDisk is the state file as read at start while the operator's rules
	// are the config's rule file's, which the state file does not hold
	// (HasRules false): the IDs they go live under are recorded in it
	// (RuleFileIDs) without making the file's rules, or the config's
	// attachments, the state file's. nil once a change made its state
	// lovelockd's (save), whether or not the file could be written.
	onDisk *State

	// swap swaps a compiled rule set in; nil is node.Steer.Apply. Tests
	// set it to make the wait after the flip fail (bpf.ErrNotDrained).
	swap func(*bpf.Ruleset) error
}

// Listeners are the sockets a Daemon serves on.
type Listeners struct {
	// API is the local API's unix socket.
	API *api.Listener
	// Metrics is the Prometheus endpoint's; nil when the config turns it
	// off.
	Metrics net.Listener
}

// Listen opens cfg's API socket and metrics address. lovelockd calls it
// before New, so that what it cannot serve on, a socket another lovelockd
// answers on (api.ErrSocketInUse) or a metrics address in use or not on
// this node, fails the start before the data plane is opened, upgraded,
// attached or given rules.
func Listen(cfg config.Config) (*Listeners, error) {
	ln, err := api.Listen(cfg.Socket)
	if err != nil {
		return nil, err
	}
	l := &Listeners{API: ln}
	if cfg.Metrics != "" {
		if l.Metrics, err = net.Listen("tcp", cfg.Metrics); err != nil {
			ln.Close()
			return nil, metricsListenError(err)
		}
	}
	return l, nil
}

// Close closes the listeners, removing the API socket (api.Listener.Close).
// Run closes them itself: Close is for a start that fails before Run.
func (l *Listeners) Close() error {
	var errs []error
	if l.Metrics != nil {
		if err := l.Metrics.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(append(errs, l.API.Close())...)
}

// New opens the data plane and reconciles it with the state file. Pins of
// another build or port are upgraded in place under traffic, with the state
// file's rules (attach.Options.Upgrade). It fails when the data plane
// cannot be opened or upgraded (the state file's rules do not compile for
// the new programs: the old ones keep running) or the config's rule file
// does not parse; attachments or rules that cannot
// be restored (an interface that is not there, an attach the kernel
// refuses) are logged and reported as failures (Status), the node runs
// degraded, and they are retried when interfaces appear.
func New(cfg config.Config, log *slog.Logger) (*Daemon, error) {
	state, err := LoadState(cfg.State)
	if err != nil {
		return nil, err
	}
	// The data plane's rule counters are kept by ID. prev is the operator's
	// set as the data plane counts it, as far as the state file records:
	// reconcile zeroes the counters of an ID prev does not give the same
	// rule.
	var prev rules.Set
	var onDisk *State
	if !state.HasRules && cfg.Rules != "" {
		set, err := readRules(cfg.Rules)
		if err != nil {
			return nil, err
		}
		// The file gives no IDs (or every rule one, kept as written):
		// each rule gets the one its name went live under last time, so
		// an edited file moves no counters between rules.
		prev = state.ruleFileSet()
		if slices.ContainsFunc(set.Rules, func(r rules.Rule) bool { return r.ID == 0 }) {
			assignIDs(set, prev)
		}
		loaded := state
		onDisk = &loaded
		state.Rules, state.HasRules, state.RuleFileIDs = *set, true, nil
	} else {
		// A state file written before IDs were recorded gives none:
		// 1..n in order, as that version assigned them.
		withIDs(&state.Rules)
		prev = state.Rules
	}
	// Pins of another build or port are upgraded under traffic
	// (docs/steering.md, "Upgrades"): the new maps get the operator's
	// rule set before any link runs the new programs.
	node, err := attach.Open(attach.Options{Dir: cfg.PinDir, Port: cfg.Port, Upgrade: true, Fill: func(s *bpf.Steer) error {
		return fillUpgrade(s, state.Rules, cfg.Port)
	}})
	if err != nil {
		return nil, err
	}
	if rep := node.Upgraded; rep != nil {
		logUpgrade(log, cfg.PinDir, rep)
	}
	d := &Daemon{cfg: cfg, log: log, started: time.Now(), node: node, failures: map[string]failure{}, state: state, onDisk: onDisk}
	for _, svc := range services(d) {
		d.supervisors = append(d.supervisors, service.NewSupervisor(svc, steering{d}, log, 0))
	}
	want := slices.Clone(cfg.Interfaces)
	for _, s := range d.supervisors {
		// A service's AF_XDP sockets get nothing without the steering
		// program in XDP on their interfaces.
		for _, i := range s.Service().Interfaces() {
			if !slices.ContainsFunc(want, func(b attach.Attachment) bool { return b.Iface == i && b.Hook == attach.HookXDP }) {
				want = append(want, attach.Attachment{Iface: i, Hook: attach.HookXDP, Mode: attach.ModeNative})
			}
		}
	}
	for _, a := range want {
		if !slices.ContainsFunc(state.Attachments, func(b attach.Attachment) bool { return b.Iface == a.Iface && b.Hook == a.Hook }) {
			state.Attachments = append(state.Attachments, a)
		}
	}
	d.state = state
	log.Info("data plane opened", "pins", cfg.PinDir, "loaded", node.Loaded, "version", buildinfo.Version)
	d.reconcile(prev)
	return d, nil
}

// readRules reads and parses the config's rule file.
func readRules(path string) (*rules.Set, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("rules file: %w", err)
	}
	set, err := rules.ParseFile(path, data)
	if err != nil {
		return nil, fmt.Errorf("rules file %s: %w", path, err)
	}
	return set, nil
}

// Check checks what New reads before it opens the data plane, changing
// nothing: the state file, and the config's rule file, parsed and compiled
// as New would, its redirects from native XDP hooks checked as New would
// (rules.CheckXDPRedirects). Interfaces are looked up by name in the
// calling thread's network namespace; one that is not there is no error
// (lovelockd would start degraded, the rules not applied until it appears)
// but a note, as is a rule file the state file's rules take the place of.
func Check(cfg config.Config) (notes []string, err error) {
	state, err := LoadState(cfg.State)
	if err != nil {
		return nil, err
	}
	if cfg.Rules == "" {
		return nil, nil
	}
	set, err := readRules(cfg.Rules)
	if err != nil {
		return nil, err
	}
	if state.HasRules {
		notes = append(notes, fmt.Sprintf("the state file %s holds rules: lovelockd restores them, not the rule file's", cfg.State))
	}
	var missing []string
	resolve := func(name string) (int, error) {
		if idx, err := resolveIface(name); err == nil {
			return idx, nil
		}
		// A stand-in, one per name (Compile asks once per name) and far
		// above the ifindexes a node has, so the check goes on.
		missing = append(missing, name)
		return 1<<30 + len(missing), nil
	}
	if _, err := rules.Compile(set, resolve, cfg.Port); err != nil {
		return notes, fmt.Errorf("rules file %s: %w", cfg.Rules, err)
	}
	// Redirects from the native XDP hooks of the config and the state
	// file, as New would attach them, to the interfaces that are here
	// (one that is not is checked when it appears).
	warnings, err := rules.CheckXDPRedirects(set, resolveIface, xdpHooks(append(slices.Clone(cfg.Interfaces), state.Attachments...)))
	if err != nil {
		return notes, fmt.Errorf("rules file %s: %w", cfg.Rules, err)
	}
	for _, w := range warnings {
		notes = append(notes, fmt.Sprintf("rules file %s: %s", cfg.Rules, w))
	}
	for _, name := range missing {
		notes = append(notes, fmt.Sprintf("rules file %s: interface %s is not in this network namespace: "+
			"lovelockd would start degraded and apply the rules once it appears", cfg.Rules, name))
	}
	return notes, nil
}

// fillUpgrade installs the operator's rule set op, under the IDs the state
// file gives it, in the maps of an upgrade's new programs. lovelockd's own
// rules come back as its services bind.
func fillUpgrade(s *bpf.Steer, op rules.Set, port uint16) error {
	set := cloneSet(op)
	withIDs(&set)
	compiled, err := rules.Compile(&set, resolveIface, port)
	if err != nil {
		return fmt.Errorf("the state file's rules: %w (the old data plane keeps running)", err)
	}
	// The new programs run nowhere yet: no reader to wait out.
	if err := s.Apply(compiled); err != nil && !errors.Is(err, bpf.ErrNotDrained) {
		return err
	}
	return nil
}

// withIDs gives set's rules IDs when any lacks one: 1..n in rule order,
// which depends on the set alone (assignIDs against no live set).
func withIDs(set *rules.Set) {
	if slices.ContainsFunc(set.Rules, func(r rules.Rule) bool { return r.ID == 0 }) {
		assignIDs(set, rules.Set{})
	}
}

// logUpgrade says what Open swapped.
func logUpgrade(log *slog.Logger, dir string, rep *attach.UpgradeReport) {
	swapped := make([]string, 0, len(rep.Swapped))
	for _, a := range rep.Swapped {
		swapped = append(swapped, string(a.Hook)+"@"+a.Iface)
	}
	if rep.To.Tag == "" {
		log.Warn("links swapped to the pinned programs: an upgrade was interrupted", "pins", dir, "swapped", swapped)
	} else {
		log.Warn("data plane upgraded", "pins", dir, "why", rep.Reason, "from", rep.From.String(), "to", rep.To.String(),
			"swapped", swapped, "counters_carried", rep.CountersCarried, "iface_counters_carried", rep.IfaceCountersCarried)
		if !rep.CountersCarried {
			log.Warn("upgrade: the counters' layout changed; verdict and rule counters start from zero")
		}
	}
	for _, f := range rep.Failed {
		log.Error("upgrade: not swapped, still on the old programs until the next start", "err", f)
	}
}

// reconcile brings the data plane to d.state, logging what it cannot do.
// The rules go live before the classifier is attached anywhere, so that a
// fresh data plane never runs on an interface without them (with no set,
// every packet passes).
func (d *Daemon) reconcile(prev rules.Set) {
	d.mu.Lock()
	defer d.mu.Unlock()
	defer d.attachAll(nil)
	// The set goes live under the IDs New gave it, which an upgrade's fill
	// used too; prev, the data plane's rules as far as the state file
	// records, says which counters are another rule's history and are
	// zeroed. lovelockd's own rules from an earlier run, if any are left,
	// go with this swap.
	op := cloneSet(d.state.Rules)
	warnings, err := d.apply(op, prev)
	for _, w := range warnings {
		d.log.Warn("restore rules", "warning", w)
	}
	if err != nil {
		err = rulesFailure(err, d.node.Loaded)
		// A retry installs the set under the same IDs, which the state
		// file records (assignIDs keeps live's), zeroing by what the data
		// plane counts: prev, or on a fresh data plane nothing. IDs
		// assigned afresh would not be written, and the next start would
		// give each rule's ID another rule's counters.
		counted := prev
		if d.node.Loaded {
			counted = rules.Set{}
		}
		d.live, d.counted = op, &counted
		d.setFailure("rules", err)
		d.log.Error("restore rules", "err", err)
		return
	}
	d.live, d.owned = op, nil
	if err := d.recordRuleFileIDs(); err != nil {
		d.log.Warn("restore rules", "warning", err)
	}
	d.log.Info("rules applied", "rules", len(d.state.Rules.Rules), "default", d.state.Rules.Default)
}

// Close releases the data plane without changing it.
func (d *Daemon) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.node.Close()
}

// Run serves the API and metrics on ln (Listen's, opened before New) until
// ctx ends, and supervises the services; it returns once every goroutine
// it started has stopped, with ln closed.
func (d *Daemon) Run(ctx context.Context, ln *Listeners) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	errc := make(chan error, 2)
	wg.Go(func() {
		if err := ln.API.Serve(ctx, api.Handler(d)); err != nil {
			errc <- err
		}
	})
	reg := prometheus.NewRegistry()
	reg.MustRegister(&collector{d: d})
	for _, s := range d.supervisors {
		reg.MustRegister(s.Service())
	}
	if mln := ln.Metrics; mln != nil {
		srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})}
		wg.Go(func() { <-ctx.Done(); srv.Close() })
		wg.Go(func() {
			if err := srv.Serve(mln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("metrics: %w", err)
			}
		})
		d.log.Info("metrics", "addr", mln.Addr().String())
	}
	kicks := make(chan struct{}, 1)
	kick := func() {
		select {
		case kicks <- struct{}{}:
		default:
		}
	}
	waitLinks, err := d.watchLinks(ctx, kick)
	if err != nil {
		return err
	}
	// The watcher stops only with ctx: cancel first, or a server's error
	// waits forever.
	defer func() { cancel(); waitLinks() }()
	for _, s := range d.supervisors {
		wg.Go(func() { s.Run(ctx) })
	}
	// "ready" is logged once everything asked for runs, "degraded" with
	// what does not otherwise.
	wg.Go(func() { d.announce(ctx, kicks) })
	select {
	case <-ctx.Done():
		d.log.Info("stopping; the data plane stays attached")
		return nil
	case err := <-errc:
		return err
	}
}

// Status implements api.Service.
func (d *Daemon) Status() (api.Status, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	att, err := d.node.Attachments()
	if err != nil {
		return api.Status{}, err
	}
	health, links, fails := d.health()
	svcs := []api.ServiceStatus{}
	for _, s := range d.supervisors {
		svcs = append(svcs, s.Status())
	}
	return api.Status{
		Version: buildinfo.Version, PinDir: d.node.Dir(), Port: d.cfg.Port, Loaded: d.node.Loaded,
		Started: d.started, Attachments: att, Rules: len(d.live.Rules), RulesPending: d.counted != nil,
		Health: health, Links: links, Failures: fails, Services: svcs,
	}, nil
}

// Attachments implements api.Service.
func (d *Daemon) Attachments() ([]attach.Attachment, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.node.Attachments()
}

// Attach implements api.Service.
func (d *Daemon) Attach(a attach.Attachment) (api.Attached, error) {
	if err := a.Validate(); err != nil {
		return api.Attached{}, &api.BadRequestError{Err: err}
	}
	if _, err := netlink.LinkByName(a.Iface); err != nil {
		return api.Attached{}, &api.BadRequestError{Err: fmt.Errorf("interface %s: %w (see 'ip link')", a.Iface, err)}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	// In native XDP the rules' redirects from a must reach devices that
	// can transmit XDP frames, as for a rule set applied.
	if hooks := xdpHooks([]attach.Attachment{a}); len(hooks.Ifaces) > 0 {
		hooks.Ifaces = append(hooks.Ifaces, xdpHooks(d.state.Attachments).Ifaces...)
		if _, err := rules.CheckXDPRedirects(&d.live, resolveIface, hooks); err != nil {
			return api.Attached{}, &api.BadRequestError{Err: fmt.Errorf("interface %s %s in native mode: %w "+
				"(change those rules first, or attach in generic mode or a TC hook)", a.Iface, a.Hook, err)}
		}
	}
	out, err := d.node.Reattach(a)
	if err != nil {
		return api.Attached{}, err
	}
	d.setFailure(attKey(a), nil)
	if out == attach.Replaced {
		d.log.Warn("attachment re-attached: the pinned link ran on no live interface (deleted or re-created)", "iface", a.Iface, "hook", a.Hook)
	}
	adopted := out == attach.Adopted
	next := d.state
	next.Attachments = append(slices.DeleteFunc(slices.Clone(next.Attachments), func(b attach.Attachment) bool {
		return b.Iface == a.Iface && b.Hook == a.Hook
	}), a)
	return api.Attached{Adopted: adopted}, d.save(next)
}

// Detach implements api.Service.
func (d *Daemon) Detach(iface string, hook attach.Hook) error {
	if _, err := attach.ParseHook(string(hook)); err != nil {
		return &api.BadRequestError{Err: err}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.node.Detach(iface, hook); err != nil {
		if errors.Is(err, attach.ErrNotAttached) {
			return &api.NotFoundError{Err: err}
		}
		return err
	}
	d.setFailure(attKey(attach.Attachment{Iface: iface, Hook: hook}), nil)
	next := d.state
	next.Attachments = slices.DeleteFunc(slices.Clone(next.Attachments), func(b attach.Attachment) bool {
		return b.Iface == iface && b.Hook == hook
	})
	return d.save(next)
}

// Rules implements api.Service: the live set, the operator's rules
// followed by lovelockd's own; while the set did not go live
// (Status.RulesPending), the set to install.
func (d *Daemon) Rules() (rules.Set, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return cloneSet(d.live), nil
}

// ApplyRules implements api.Service: the whole set replaces the live one
// atomically, or nothing changes.
func (d *Daemon) ApplyRules(set rules.Set) (api.Applied, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.replace(set)
}

// AddRule implements api.Service.
func (d *Daemon) AddRule(r rules.Rule) (api.Applied, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	set := cloneSet(d.state.Rules)
	r.ID = 0
	set.Rules = append(set.Rules, r)
	return d.replace(set)
}

// DeleteRule implements api.Service.
func (d *Daemon) DeleteRule(name string) (api.Applied, error) {
	if api.IsOwned(name) {
		return api.Applied{}, &api.BadRequestError{Err: fmt.Errorf("rule %q belongs to lovelockd: it steers one of its services' traffic to the service's AF_XDP sockets, "+
			"and goes when the service stops or runs on kernel sockets (see 'lovelock services' and docs/services.md)", name)}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	set := cloneSet(d.state.Rules)
	n := len(set.Rules)
	set.Rules = slices.DeleteFunc(set.Rules, func(r rules.Rule) bool { return r.Name == name })
	if len(set.Rules) == n {
		return api.Applied{}, &api.NotFoundError{Err: fmt.Errorf("rule %q: no such rule (see 'lovelock rule list')", name)}
	}
	return d.replace(set)
}

// CheckRules implements api.Service: everything ApplyRules checks, on the
// same merge with lovelockd's own rules and against this node's interfaces
// and port, without changing anything. The answer counts the rules that
// would be live and carries the warnings the apply would give.
func (d *Daemon) CheckRules(set rules.Set) (api.Applied, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	op, err := operatorSet(set, d.owned)
	if err != nil {
		return api.Applied{}, err
	}
	merged, err := d.merge(op, d.owned)
	if err != nil {
		return api.Applied{}, err
	}
	_, _, warnings, err := d.compile(merged)
	if err != nil {
		return api.Applied{}, err
	}
	return api.Applied{Rules: len(merged.Rules), Owned: len(d.owned), Warnings: append(warnings, shadowed(op, d.owned, d.cfg.Port)...)}, nil
}

// replace makes set the operator's rule set: it checks it, installs it
// with lovelockd's own rules and records it. Callers hold d.mu.
func (d *Daemon) replace(set rules.Set) (api.Applied, error) {
	set, err := operatorSet(set, d.owned)
	if err != nil {
		return api.Applied{}, err
	}
	op, warnings, err := d.install(set, d.owned)
	if err != nil {
		return api.Applied{}, err
	}
	d.setFailure("rules", nil)
	next := d.state
	next.Rules, next.HasRules = op, true
	res := api.Applied{Rules: len(d.live.Rules), Owned: len(d.owned), Warnings: append(warnings, shadowed(op, d.owned, d.cfg.Port)...)}
	for _, w := range res.Warnings {
		d.log.Warn("rules", "warning", w)
	}
	return res, d.save(next)
}

// install swaps in the operator's set op followed by owned, IDs assigned
// against the live set (a rule keeps its ID by name), and returns op with
// its IDs and apply's warnings. Callers hold d.mu.
func (d *Daemon) install(op rules.Set, owned []rules.Rule) (rules.Set, []string, error) {
	merged, err := d.merge(op, owned)
	if err != nil {
		return rules.Set{}, nil, err
	}
	counted := d.live
	if d.counted != nil {
		counted = *d.counted
	}
	warnings, err := d.apply(merged, counted)
	if err != nil {
		return rules.Set{}, nil, err
	}
	d.live, d.owned, d.counted = merged, owned, nil
	op.Rules = merged.Rules[:len(op.Rules):len(op.Rules)]
	return op, warnings, nil
}

// merge returns the operator's set op followed by owned, IDs assigned
// against the live set (a rule keeps its ID by name), or why the data plane
// cannot count that many rules. Callers hold d.mu.
func (d *Daemon) merge(op rules.Set, owned []rules.Rule) (rules.Set, error) {
	if n := len(op.Rules) + len(owned); n > rules.MaxID {
		whose := ""
		if len(owned) > 0 {
			whose = fmt.Sprintf(" (%d of yours, %d of lovelockd's own for its services)", len(op.Rules), len(owned))
		}
		return rules.Set{}, &api.BadRequestError{Err: fmt.Errorf("rules: %d rules%s, the data plane counts at most %d: remove %d",
			n, whose, rules.MaxID, n-rules.MaxID)}
	}
	merged := cloneSet(op)
	merged.Rules = append(merged.Rules, owned...)
	assignIDs(&merged, d.live)
	return merged, nil
}

// reinstall swaps in the operator's recorded set again with owned
// (install) and keeps the IDs it went live under: in d.state, and for the
// rule file's rules in the state file (recordRuleFileIDs). Callers hold
// d.mu.
func (d *Daemon) reinstall(owned []rules.Rule) ([]string, error) {
	op, warnings, err := d.install(d.state.Rules, owned)
	if err != nil {
		return nil, err
	}
	d.state.Rules = op
	if err := d.recordRuleFileIDs(); err != nil {
		warnings = append(warnings, err.Error())
	}
	return warnings, nil
}

// recordRuleFileIDs records in the state file the IDs the rule file's rules
// went live under, by name, while the rule file is the operator's set
// (d.onDisk): the next start gives each rule the ID its name had, and with
// it its counters, however the file was edited meanwhile. Callers hold
// d.mu.
func (d *Daemon) recordRuleFileIDs() error {
	if d.onDisk == nil {
		return nil
	}
	ids := make(map[string]uint32, len(d.state.Rules.Rules))
	for _, r := range d.state.Rules.Rules {
		ids[r.Name] = r.ID
	}
	if maps.Equal(ids, d.onDisk.RuleFileIDs) {
		return nil
	}
	next := *d.onDisk
	next.RuleFileIDs = ids
	if err := next.Save(d.cfg.State); err != nil {
		return fmt.Errorf("the rule file's rule IDs were not recorded in the state file: %w "+
			"(the next start counts from zero the rules whose IDs it does not find there)", err)
	}
	d.onDisk = &next
	return nil
}

// xdpHooks lists the interfaces of atts where the classifier runs in native
// XDP (attach.Attachment.NativeXDP): a redirect from there needs a target
// that can transmit XDP frames (rules.CheckXDPRedirects).
func xdpHooks(atts []attach.Attachment) rules.XDPHooks {
	var h rules.XDPHooks
	for _, a := range atts {
		if a.NativeXDP() {
			h.Ifaces = append(h.Ifaces, a.Iface)
		}
	}
	return h
}

// apply compiles set and swaps it in. Rule counters are kept by ID, and
// counted is the set whose rules they count: a rule whose ID counted gives
// no rule has it zeroed before the swap, so it starts from zero; one whose
// ID is a removed rule's of counted (assignIDs reuses those only when
// 1..MaxID runs out) has it zeroed once the swap returned, when the old set
// no longer counts there. A set that redirects from a native XDP hook to
// a device that cannot transmit XDP frames is refused
// (rules.CheckXDPRedirects); one whose targets could not be checked (a
// kernel before 6.3) is applied with a warning. A swap whose set went live
// but whose wait for the old set's readers failed (bpf.ErrNotDrained) is
// applied: apply returns no error but a warning for the caller to log or
// pass on.
func (d *Daemon) apply(set, counted rules.Set) (warnings []string, err error) {
	compiled, used, warnings, err := d.compile(set)
	if err != nil {
		return nil, err
	}
	owner := make(map[uint32]string, len(counted.Rules))
	for _, r := range counted.Rules {
		owner[r.ID] = r.Name
	}
	var reused []uint32
	for _, r := range set.Rules {
		name, ok := owner[r.ID]
		switch {
		case !ok:
			if err := d.node.Steer.ResetRuleCounter(r.ID); err != nil {
				return nil, fmt.Errorf("rule %q: zero its counters: %w (the rule set was not changed)", r.Name, err)
			}
		case name != r.Name:
			reused = append(reused, r.ID)
		}
	}
	swap := d.swap
	if swap == nil {
		swap = d.node.Steer.Apply
	}
	if err := swap(compiled); err != nil {
		if !errors.Is(err, bpf.ErrNotDrained) {
			return nil, err
		}
		warnings = append(warnings, fmt.Sprintf("rules applied, but: %v", err))
		if len(reused) > 0 {
			// The old set's packets still in flight may count on the
			// reused IDs after they are zeroed: say so, not fail, as the
			// new set is live.
			warnings = append(warnings, fmt.Sprintf("%d rules took the IDs of removed rules: their counters may include a few packets of those rules", len(reused)))
		}
	}
	d.ruleIfaces = used
	for _, id := range reused {
		if err := d.node.Steer.ResetRuleCounter(id); err != nil {
			warnings = append(warnings, fmt.Sprintf("rules applied, but the counters of rule ID %d, a removed rule's, were not zeroed: %v; they still hold that rule's packets", id, err))
			break
		}
	}
	return warnings, nil
}

// compile compiles set for this node's interfaces and port, checks its
// redirects from native XDP hooks (rules.CheckXDPRedirects: a target that
// cannot transmit XDP frames is refused, one the kernel cannot say about
// is a warning), and returns the interfaces it resolved, by name. The
// check is made here, where the names are resolved, so that a redirect
// target that appears later is checked when the set is retried.
func (d *Daemon) compile(set rules.Set) (*bpf.Ruleset, map[string]int, []string, error) {
	used := map[string]int{}
	compiled, err := rules.Compile(&set, func(name string) (int, error) {
		idx, err := resolveIface(name)
		if err == nil {
			used[name] = idx
		}
		return idx, err
	}, d.cfg.Port)
	if err != nil {
		return nil, nil, nil, &api.BadRequestError{Err: err}
	}
	warnings, err := rules.CheckXDPRedirects(&set, func(name string) (int, error) {
		if idx, ok := used[name]; ok {
			return idx, nil
		}
		return resolveIface(name)
	}, xdpHooks(d.state.Attachments))
	if err != nil {
		return nil, nil, nil, &api.BadRequestError{Err: err}
	}
	return compiled, used, warnings, nil
}

// save makes next, which the data plane runs now, lovelockd's state and
// writes it to the state file. The state is next also when the write
// fails: every later swap (a service's rules, a retry, the operator's next
// change) starts from it, and a link event attaches what it lists, so
// that nothing goes back to the set or the attachments before. The state
// file stays behind until a change writes it. Callers hold d.mu.
func (d *Daemon) save(next State) error {
	// The operator's rules with their IDs are the state's from now on,
	// not the rule file's: a write of the rule file's IDs over a state
	// file this change could not write would make its next start give
	// the rule file's rules the IDs of rules that are not its own.
	d.state, d.onDisk = next, nil
	if err := next.Save(d.cfg.State); err != nil {
		return fmt.Errorf("the data plane changed but the state file was not written: %w "+
			"(lovelockd runs the change, but a restart would go back to the state file's: free space on %s's file system or make it writable; "+
			"the next change writes the state file again)", err, filepath.Dir(d.cfg.State))
	}
	return nil
}

// Stats implements api.Service.
func (d *Daemon) Stats() (api.Stats, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	verdicts, err := d.node.Steer.Stats()
	if err != nil {
		return api.Stats{}, err
	}
	st := api.Stats{Time: time.Now(), Verdicts: map[string]api.Counter{}, RulesPending: d.counted != nil}
	for i, c := range verdicts {
		st.Verdicts[bpf.Stat(i).String()] = c
	}
	if st.Default, err = d.node.Steer.RuleCounter(0); err != nil {
		return api.Stats{}, err
	}
	// A set that did not go live (counted not nil) counts nothing: its
	// rules are reported at zero, but for one whose ID the running set
	// gives a rule of the same name, which counts there. What an ID of
	// it counts otherwise is another rule's (a removed one's, or a rule
	// of lovelockd's from an earlier run), zeroed when the set goes live.
	var counted map[uint32]string
	if d.counted != nil {
		counted = make(map[uint32]string, len(d.counted.Rules))
		for _, r := range d.counted.Rules {
			counted[r.ID] = r.Name
		}
	}
	for _, r := range d.live.Rules {
		var c api.Counter
		if name, ok := counted[r.ID]; counted == nil || ok && name == r.Name {
			if c, err = d.node.Steer.RuleCounter(r.ID); err != nil {
				return api.Stats{}, err
			}
		}
		st.Rules = append(st.Rules, api.RuleStat{Name: r.Name, ID: r.ID, Priority: r.Priority, Action: r.Action.String(), Counter: c})
	}
	ifs, err := d.node.Steer.IfaceStats()
	if err != nil {
		return api.Stats{}, err
	}
	if len(ifs) > 0 {
		st.Interfaces = make(map[string]map[string]api.Counter, len(ifs))
		names := ifaceNames()
		for slot, cs := range ifs {
			name, ok := names[slot]
			switch {
			case slot == bpf.IfaceOther:
				name = api.IfaceOther
			case !ok:
				name = api.IfaceUnknown(slot)
			}
			m := make(map[string]api.Counter, len(cs))
			for i, c := range cs {
				m[bpf.Stat(i).String()] = c
			}
			st.Interfaces[name] = m
		}
	}
	return st, nil
}

// ifaceNames maps the ifindexes of lovelockd's network namespace to their
// interfaces' names (the counters are kept by ifindex); empty when the
// kernel cannot list them.
func ifaceNames() map[uint32]string {
	out := map[uint32]string{}
	ifs, err := net.Interfaces()
	if err != nil {
		return out
	}
	for _, i := range ifs {
		out[uint32(i.Index)] = i.Name
	}
	return out
}

// assignIDs gives every rule of set an ID: the one the rule of the same name
// has in prev, else the lowest ID free in both sets, else, when 1..MaxID has
// none left, the lowest ID of prev's that set does not use (a removed
// rule's: the caller zeroes its counters once prev no longer runs, see
// apply). IDs index per-rule counters, so a rule keeps its counters across
// rule set changes. A set of more than MaxID rules gets IDs above it, which
// Compile refuses.
func assignIDs(set *rules.Set, prev rules.Set) {
	byName := map[string]uint32{}
	taken := map[uint32]bool{}
	for _, r := range prev.Rules {
		byName[r.Name] = r.ID
		taken[r.ID] = true
	}
	used := map[uint32]bool{}
	for i, r := range set.Rules {
		set.Rules[i].ID = 0
		if id, ok := byName[r.Name]; ok && !used[id] {
			set.Rules[i].ID = id
			used[id] = true
		}
	}
	next, spare := uint32(1), uint32(1)
	for i := range set.Rules {
		if set.Rules[i].ID != 0 {
			continue
		}
		for used[next] || (taken[next] && next <= rules.MaxID) {
			next++
		}
		id := next
		if next > rules.MaxID {
			// Only IDs prev has and set does not use are left.
			for spare <= rules.MaxID && used[spare] {
				spare++
			}
			if spare <= rules.MaxID {
				id = spare
			}
		}
		set.Rules[i].ID = id
		used[id] = true
	}
}

// cloneSet copies s deeply enough to edit its rule list.
func cloneSet(s rules.Set) rules.Set {
	s.Rules = slices.Clone(s.Rules)
	return s
}

func resolveIface(name string) (int, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return 0, fmt.Errorf("interface %s: %w", name, err)
	}
	return l.Attrs().Index, nil
}
