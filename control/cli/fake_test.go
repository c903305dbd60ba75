package cli

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/attach"
	llnetns "github.com/lovelock-dpu/lovelock/control/netns"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/control/testenv"
	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
)

// fakeService is an api.Service that keeps a rule set and answers the rest
// with zero values, for CLI tests that need a daemon to talk to.
type fakeService struct {
	attached   []attach.Attachment
	set        rules.Set
	applied    int // ApplyRules calls
	statsCalls int
	services   []api.ServiceStatus
	status     api.Status
	msg        *messaging.Stats // nil: no messaging agent
	svcStats   map[string]any   // ServiceStats by service name; none: not found
	ns         *netns.NsHandle  // where CheckRules runs; nil: the test's
}

func (f *fakeService) Status() (api.Status, error)               { return f.status, nil }
func (f *fakeService) Attachments() ([]attach.Attachment, error) { return nil, nil }
func (f *fakeService) Attach(a attach.Attachment) (api.Attached, error) {
	f.attached = append(f.attached, a)
	return api.Attached{}, nil
}
func (f *fakeService) Detach(string, attach.Hook) error { return nil }
func (f *fakeService) Rules() (rules.Set, error)        { return f.set, nil }
func (f *fakeService) ApplyRules(s rules.Set) (api.Applied, error) {
	f.set = s
	f.applied++
	return api.Applied{Rules: len(s.Rules)}, nil
}
func (f *fakeService) AddRule(r rules.Rule) (api.Applied, error) {
	f.set.Rules = append(f.set.Rules, r)
	return api.Applied{Rules: len(f.set.Rules)}, nil
}
func (f *fakeService) DeleteRule(string) (api.Applied, error) { return api.Applied{}, nil }

// CheckRules validates s against the interfaces of the test's namespace
// and the status's port, and checks its redirects from the native XDP
// hooks among the status's links, as lovelockd's check does on its node.
// With ns set, in that network namespace, as lovelockd runs in its node's.
func (f *fakeService) CheckRules(s rules.Set) (res api.Applied, err error) {
	check := func() error {
		if err := rules.Validate(&s, rules.LinkResolver, f.status.Port); err != nil {
			return &api.BadRequestError{Err: err}
		}
		var hooks rules.XDPHooks
		for _, l := range f.status.Links {
			if l.NativeXDP() {
				hooks.Ifaces = append(hooks.Ifaces, l.Iface)
			}
		}
		warnings, err := rules.CheckXDPRedirects(&s, rules.LinkResolver, hooks)
		if err != nil {
			return &api.BadRequestError{Err: err}
		}
		res = api.Applied{Rules: len(s.Rules), Warnings: warnings}
		return nil
	}
	if f.ns != nil {
		return res, llnetns.Do(*f.ns, check)
	}
	return res, check()
}

// Stats counts 100 packets of 10 bytes a second on rx and rule "web",
// one simulated second per call: 70 of them arrive on p0 and pass, 30 on
// pf0hpf and are dropped.
func (f *fakeService) Stats() (api.Stats, error) {
	f.statsCalls++
	n := uint64(f.statsCalls)
	c := api.Counter{Packets: 100 * n, Bytes: 1000 * n}
	p0 := api.Counter{Packets: 70 * n, Bytes: 700 * n}
	pf := api.Counter{Packets: 30 * n, Bytes: 300 * n}
	return api.Stats{
		Time:     time.Unix(1e9+int64(n), 0),
		Verdicts: map[string]api.Counter{"rx": c},
		Rules:    []api.RuleStat{{Name: "web", ID: 1, Counter: c}},
		// As lovelockd's: the status's pending set is the stats' too.
		RulesPending: f.status.RulesPending,
		Interfaces: map[string]map[string]api.Counter{
			"pf0hpf": {"rx": pf, "drop": pf},
			"p0":     {"rx": p0, "pass": p0},
		},
	}, nil
}
func (f *fakeService) MsgStats() (messaging.Stats, error) {
	if f.msg != nil {
		return *f.msg, nil
	}
	return messaging.Stats{}, &api.NotFoundError{Err: errors.New("no agent")}
}

func (f *fakeService) Services() ([]api.ServiceStatus, error) { return f.services, nil }
func (f *fakeService) ServiceHandler(string) http.Handler     { return nil }

func (f *fakeService) ServiceStats(name string) (any, error) {
	if v, ok := f.svcStats[name]; ok {
		return v, nil
	}
	return nil, &api.NotFoundError{Err: errors.New("this node runs no " + name + " service")}
}

// serveFake serves svc on a socket in a temporary directory until the test
// ends and returns the socket's path. The API answers root only.
func serveFake(t *testing.T, svc api.Service) string {
	t.Helper()
	testenv.RequirePriv(t)
	sock := filepath.Join(t.TempDir(), "api.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- api.Serve(ctx, sock, api.Handler(svc)) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	c := api.NewClient(sock)
	for deadline := time.Now().Add(5 * time.Second); ; {
		if _, err := c.Status(context.Background()); err == nil {
			return sock
		} else if time.Now().After(deadline) {
			t.Fatalf("fake daemon does not answer: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// runFake runs the CLI against svc, served as serveFake does, and returns
// its stdout; an error fails the test.
func runFake(t *testing.T, svc api.Service, args ...string) string {
	t.Helper()
	out, _, err := runCLI(serveFake(t, svc), args...)
	if err != nil {
		t.Fatalf("lovelock %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// matchOutput checks that out matches each of the regexps want and none of
// notWant.
func matchOutput(t *testing.T, out string, want, notWant []string) {
	t.Helper()
	for _, re := range want {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("output does not match %q:\n%s", re, out)
		}
	}
	for _, re := range notWant {
		if regexp.MustCompile(re).MatchString(out) {
			t.Errorf("output matches %q:\n%s", re, out)
		}
	}
}

// runCLI runs the CLI in-process against sock and returns stdout, stderr
// and the error.
func runCLI(sock string, args ...string) (string, string, error) {
	var out, errOut bytes.Buffer
	err := App(&out, &errOut).Run(append([]string{"lovelock", "--socket", sock}, args...))
	return out.String(), errOut.String(), err
}
