package daemon

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/appliance/service"
	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/attach"
	"github.com/lovelock-dpu/lovelock/control/rules"
)

// What lovelockd reports must be true (DESIGN §7): it checks its
// attachments against the live kernel whenever it reports them, re-attaches
// when an interface it was asked for comes back, and says "ready" only
// while everything asked for runs. Otherwise it runs degraded and says
// what fails and why (Status, 'lovelock status', lovelock_healthy).

// failure is a recorded failure to do something asked for.
type failure struct {
	err   error
	since time.Time
}

func attKey(a attach.Attachment) string { return "attachment " + a.Iface + " " + string(a.Hook) }

// setFailure records (err non-nil) or clears a failure. Callers hold d.mu.
func (d *Daemon) setFailure(what string, err error) {
	if err == nil {
		delete(d.failures, what)
		return
	}
	if f, ok := d.failures[what]; ok {
		f.err = err
		d.failures[what] = f
		return
	}
	d.failures[what] = failure{err: err, since: time.Now()}
}

// attachAll brings every desired attachment whose interface is in ifaces
// (all when ifaces is nil) to the live kernel, logging what it changes and
// recording what fails. Callers hold d.mu.
func (d *Daemon) attachAll(ifaces []string) {
	for _, a := range d.state.Attachments {
		if ifaces != nil && !slices.Contains(ifaces, a.Iface) {
			continue
		}
		out, err := d.node.Reattach(a)
		prev, failed := d.failures[attKey(a)]
		d.setFailure(attKey(a), err)
		switch {
		case err != nil && failed && prev.err.Error() == err.Error():
			// Logged when it first failed so.
		case err != nil:
			d.log.Error("attachment", "iface", a.Iface, "hook", a.Hook, "err", err)
		case out == attach.Replaced:
			d.log.Warn("attachment re-attached: the pinned link ran on no live interface (deleted or re-created)", "iface", a.Iface, "hook", a.Hook)
		default:
			d.log.Info("attachment", "iface", a.Iface, "hook", a.Hook, "adopted", out == attach.Adopted)
		}
	}
}

// retryRules installs the recorded rule set again after it failed (an
// interface a rule redirects to may have appeared), or when an interface it
// names is gone or has another ifindex than the set was compiled for (it
// was re-created). Callers hold d.mu.
func (d *Daemon) retryRules() {
	_, failed := d.failures["rules"]
	for name, idx := range d.ruleIfaces {
		if now, err := resolveIface(name); err != nil || now != idx {
			failed = true
		}
	}
	if !failed {
		return
	}
	warnings, err := d.reinstall(d.owned)
	for _, w := range warnings {
		d.log.Warn("rules", "warning", w)
	}
	if err != nil {
		d.setFailure("rules", rulesFailure(err, d.node.Loaded))
		return
	}
	d.setFailure("rules", nil)
	d.log.Info("rules applied", "rules", len(d.state.Rules.Rules), "default", d.state.Rules.Default)
}

func rulesFailure(err error, fresh bool) error {
	if fresh {
		return fmt.Errorf("%w; the data plane runs with no rule set (every packet passes) until they apply", err)
	}
	return fmt.Errorf("%w; the data plane keeps the rule set it had", err)
}

// watchLinks re-attaches when an interface the daemon attaches to appears
// or is re-created, until ctx ends. It returns once it subscribed.
func (d *Daemon) watchLinks(ctx context.Context, kick func()) (wait func(), err error) {
	ch := make(chan netlink.LinkUpdate, 64)
	done := make(chan struct{})
	errc := make(chan error, 1)
	err = netlink.LinkSubscribeWithOptions(ch, done, netlink.LinkSubscribeOptions{
		ErrorCallback: func(err error) {
			select {
			case errc <- err:
			default:
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("watch interfaces: %w", err)
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		defer func() {
			close(done)
			for range ch {
			}
		}()
		// Interfaces that appeared between reconcile and the subscription.
		d.relink(nil)
		kick()
		for {
			select {
			case <-ctx.Done():
				return
			case err := <-errc:
				d.log.Error("watch interfaces: netlink subscription failed; re-attachment on interface changes stops", "err", err)
				d.mu.Lock()
				d.setFailure("interface watch", err)
				d.mu.Unlock()
				kick()
				return
			case u, ok := <-ch:
				if !ok {
					return
				}
				name := u.Attrs().Name
				if u.Header.Type == unix.RTM_DELLINK {
					if d.wants(name) {
						d.log.Warn("interface gone; the classifier runs on it again when it is back", "iface", name)
					}
					// Rules naming it no longer compile: say so.
					d.mu.Lock()
					d.retryRules()
					d.mu.Unlock()
					kick()
					continue
				}
				d.relink([]string{name})
				kick()
			}
		}
	}()
	return func() { <-stopped }, nil
}

// wants reports whether an attachment is asked for on iface.
func (d *Daemon) wants(iface string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.ContainsFunc(d.state.Attachments, func(a attach.Attachment) bool { return a.Iface == iface })
}

// relink retries a failed rule set, and re-attaches on ifaces (nil: all)
// where a pinned attachment does not run. The rules go first: on an
// interface re-created with a new ifindex, a classifier attached before
// the rules were compiled for that ifindex would let its first packets
// miss their iface rules.
func (d *Daemon) relink(ifaces []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.retryRules()
	for _, a := range d.state.Attachments {
		if ifaces != nil && !slices.Contains(ifaces, a.Iface) {
			continue
		}
		if _, err := d.node.Check(a); err == nil {
			d.setFailure(attKey(a), nil)
			continue
		}
		d.attachAll([]string{a.Iface})
	}
}

// health reports the attachments as the kernel runs them and every
// failure, the live rules' redirects checked again (recheckRedirects).
// Callers hold d.mu.
func (d *Daemon) health() (api.Health, []attach.LinkStatus, []api.Failure) {
	d.recheckRedirects()
	links, err := d.node.Status()
	var fails []api.Failure
	if err != nil {
		fails = append(fails, api.Failure{What: "attachments", Cause: err.Error()})
	}
	for _, a := range d.state.Attachments {
		if !slices.ContainsFunc(links, func(l attach.LinkStatus) bool { return l.Iface == a.Iface && l.Hook == a.Hook }) {
			ls := attach.LinkStatus{Attachment: a, Problem: "not attached"}
			if f, ok := d.failures[attKey(a)]; ok {
				ls.Problem = f.err.Error()
			}
			links = append(links, ls)
		}
	}
	for _, l := range links {
		if l.Live {
			continue
		}
		f := api.Failure{What: attKey(l.Attachment), Cause: l.Problem}
		if rec, ok := d.failures[f.What]; ok {
			f.Since = rec.since
			if !strings.Contains(l.Problem, rec.err.Error()) {
				f.Cause = l.Problem + "; last attempt: " + rec.err.Error()
			}
		}
		fails = append(fails, f)
	}
	for what, f := range d.failures {
		if strings.HasPrefix(what, "attachment ") {
			continue
		}
		fails = append(fails, api.Failure{What: what, Cause: f.err.Error(), Since: f.since})
	}
	svcFails, starting := servicesHealth(d.supervisors)
	fails = append(fails, svcFails...)
	slices.SortFunc(fails, func(a, b api.Failure) int { return strings.Compare(a.What, b.What) })
	switch {
	case len(fails) > 0:
		return api.HealthDegraded, links, fails
	case starting:
		return api.HealthStarting, links, nil
	}
	return api.HealthOK, links, nil
}

// servicesHealth returns a failure for each service that does not run as
// asked, and whether one is still starting: the node is not ready until
// every service has said it serves (service.Binding.Ready).
func servicesHealth(sups []*service.Supervisor) (fails []api.Failure, starting bool) {
	for _, s := range sups {
		st := s.Status()
		switch st.State {
		case api.ServiceRunning:
		case api.ServiceStarting:
			starting = true
		default:
			cause := string(st.State)
			if len(st.Degraded) > 0 {
				cause += ": " + strings.Join(st.Degraded, "; ")
			}
			if st.Error != "" {
				cause += ": " + st.Error
			}
			fails = append(fails, api.Failure{What: "service " + st.Name, Cause: cause, Since: st.Since})
		}
	}
	return fails, starting
}

// announce logs "ready" each time the node comes to run as asked, and
// "degraded" with every failure each time it stops doing so (or what fails
// changes), until ctx ends. The image's init takes the ready line as the
// DPU's readiness and checks Status.Health (images/cmd/lovelock-init).
func (d *Daemon) announce(ctx context.Context, kicks <-chan struct{}) {
	last := ""
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		// A service degraded by a missing XDP attachment runs as asked
		// once an operator attaches (lovelock iface attach), and is
		// degraded again after a detach; reserved rules that did not
		// compile are retried. Recheck takes d.mu itself (through
		// steering): it must not be held here.
		for _, s := range d.supervisors {
			s.Recheck()
		}
		d.mu.Lock()
		h, _, fails := d.health()
		d.mu.Unlock()
		var b strings.Builder
		b.WriteString(string(h))
		for _, f := range fails {
			b.WriteString("|" + f.What)
		}
		if now := b.String(); now != last {
			last = now
			switch h {
			case api.HealthOK:
				d.log.Info("ready", "socket", d.cfg.Socket)
			case api.HealthDegraded:
				for _, f := range fails {
					d.log.Error("not running as asked", "what", f.What, "cause", f.Cause)
				}
				d.log.Warn("degraded: serving, but not everything asked for runs (see 'lovelock status')", "failures", len(fails), "socket", d.cfg.Socket)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-kicks:
		}
	}
}

// recheckRedirects checks the live rule set's redirects from native XDP
// hooks again, as every install does (rules.CheckXDPRedirects), and records
// what fails as the "redirects" failure, which clears once they pass. A
// veth takes XDP frames only while its peer runs an XDP program, which can
// go after the set was installed (the peer is often in another network
// namespace, where lovelockd sees no link event); the kernel then drops
// what those rules redirect after the data plane counted it. The set stays
// live. A set that did not go live is the "rules" failure's. Callers hold
// d.mu.
func (d *Daemon) recheckRedirects() {
	if d.counted != nil {
		d.setFailure("redirects", nil)
		return
	}
	_, err := rules.CheckXDPRedirects(&d.live, resolveIface, xdpHooks(d.state.Attachments))
	if err != nil {
		err = fmt.Errorf("the live rule set: %w (the set stays live; this clears once the target can transmit XDP frames)", err)
	}
	d.setFailure("redirects", err)
}
