package api_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lovelock-dpu/lovelock/control/api"
	"github.com/lovelock-dpu/lovelock/control/attach"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/control/testenv"
	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
)

// fakeService records calls; it stands in for the daemon so that routing,
// encoding and error mapping are tested on their own.
type fakeService struct {
	set      rules.Set
	attached []attach.Attachment
}

func (f *fakeService) Status() (api.Status, error) {
	return api.Status{Version: "test", Rules: len(f.set.Rules), Attachments: f.attached}, nil
}
func (f *fakeService) Attachments() ([]attach.Attachment, error) { return f.attached, nil }
func (f *fakeService) Attach(a attach.Attachment) (api.Attached, error) {
	if a.Iface == "nope0" {
		return api.Attached{}, &api.BadRequestError{Err: errors.New("interface nope0: no such interface")}
	}
	f.attached = append(f.attached, a)
	return api.Attached{}, nil
}
func (f *fakeService) Detach(iface string, hook attach.Hook) error {
	return &api.NotFoundError{Err: errors.New("interface " + iface + " " + string(hook) + ": not attached")}
}
func (f *fakeService) Rules() (rules.Set, error) { return f.set, nil }
func (f *fakeService) ApplyRules(s rules.Set) (api.Applied, error) {
	f.set = s
	return api.Applied{Rules: len(s.Rules)}, nil
}
func (f *fakeService) CheckRules(s rules.Set) (api.Applied, error) {
	return api.Applied{Rules: len(s.Rules)}, nil
}
func (f *fakeService) AddRule(r rules.Rule) (api.Applied, error) {
	f.set.Rules = append(f.set.Rules, r)
	return api.Applied{Rules: len(f.set.Rules)}, nil
}
func (f *fakeService) DeleteRule(name string) (api.Applied, error) {
	return api.Applied{}, &api.NotFoundError{Err: errors.New("rule " + name + ": no such rule")}
}
func (f *fakeService) Stats() (api.Stats, error) {
	return api.Stats{Verdicts: map[string]api.Counter{"rx": {Packets: 3, Bytes: 180}}}, nil
}

func (f *fakeService) MsgStats() (messaging.Stats, error) {
	return messaging.Stats{}, &api.NotFoundError{Err: errors.New("this node runs no messaging agent")}
}

func (f *fakeService) Services() ([]api.ServiceStatus, error) {
	return []api.ServiceStatus{{Name: "messaging", State: api.ServiceDegraded, Degraded: []string{"no XDP on p0"}}}, nil
}

func (f *fakeService) ServiceHandler(name string) http.Handler {
	if name != "echo" {
		return nil
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in map[string]string
		if api.ReadRequest(w, r, &in) {
			api.Reply(w, map[string]string{"path": r.URL.Path, "got": in["say"]}, nil)
		}
	})
}

func (f *fakeService) ServiceStats(name string) (any, error) {
	if name != "messaging" {
		return nil, &api.NotFoundError{Err: errors.New("this node runs no " + name + " service")}
	}
	return messaging.Stats{Role: "agent", Node: "node0"}, nil
}

func serve(t *testing.T, svc api.Service) *api.Client {
	t.Helper()
	// SO_PEERCRED must say root for the server to answer.
	testenv.RequirePriv(t)
	sock := filepath.Join(t.TempDir(), "run", "api.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- api.Serve(ctx, sock, api.Handler(svc)) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	for i := 0; i < 100; i++ {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	st, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want 0600", st.Mode().Perm())
	}
	return api.NewClient(sock)
}

func TestRoundTrip(t *testing.T) {
	svc := &fakeService{}
	cl := serve(t, svc)
	ctx := context.Background()

	set, err := rules.Parse([]byte(`
default: drop
rules:
  - {name: a, priority: 5, match: {iface: p0, proto: udp, dport: 7000, rank: 4-7}, action: "xsk:2"}
`))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := cl.ApplyRules(ctx, *set); err != nil || res.Rules != 1 {
		t.Fatalf("apply: %+v, %v", res, err)
	}
	got, err := cl.Rules(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a, b := mustFormat(t, set), mustFormat(t, &got)
	if a != b {
		t.Errorf("rule set changed on the way:\n%s\nvs\n%s", a, b)
	}
	if _, err := cl.Attach(ctx, attach.Attachment{Iface: "p0", Hook: attach.HookXDP}); err != nil {
		t.Fatal(err)
	}
	st, err := cl.Status(ctx)
	if err != nil || st.Version != "test" || len(st.Attachments) != 1 {
		t.Errorf("status: %+v, %v", st, err)
	}
	stats, err := cl.Stats(ctx)
	if err != nil || stats.Verdicts["rx"].Packets != 3 {
		t.Errorf("stats: %+v, %v", stats, err)
	}
	svcs, err := cl.Services(ctx)
	if err != nil || len(svcs) != 1 || svcs[0].State != api.ServiceDegraded || svcs[0].Degraded[0] != "no XDP on p0" {
		t.Errorf("services: %+v, %v", svcs, err)
	}
	var ms messaging.Stats
	if err := cl.ServiceStats(ctx, "messaging", &ms); err != nil || ms.Role != "agent" || ms.Node != "node0" {
		t.Errorf("service stats: %+v, %v", ms, err)
	}
	var echo map[string]string
	if err := cl.ServiceCall(ctx, "POST", "echo", "/things/1", map[string]string{"say": "hi"}, &echo); err != nil ||
		echo["path"] != "/things/1" || echo["got"] != "hi" {
		t.Errorf("service call: %v, %v", echo, err)
	}
}

func mustFormat(t *testing.T, s *rules.Set) string {
	t.Helper()
	b, err := rules.Format(s)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestErrors(t *testing.T) {
	cl := serve(t, &fakeService{})
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		call func() error
		want string
	}{
		{"bad request", func() error {
			_, err := cl.Attach(ctx, attach.Attachment{Iface: "nope0", Hook: attach.HookXDP})
			return err
		}, "interface nope0"},
		{"not found", func() error { return cl.Detach(ctx, "p0", attach.HookXDP) }, "not attached"},
		{"unknown rule", func() error { _, err := cl.DeleteRule(ctx, "x"); return err }, "rule x: no such rule"},
		{"no agent", func() error { _, err := cl.MsgStats(ctx); return err }, "no messaging agent"},
		{"no service", func() error { var v any; return cl.ServiceStats(ctx, "farmem", &v) }, "runs no farmem service"},
		{"no service call", func() error { return cl.ServiceCall(ctx, "GET", "farmem", "regions", nil, nil) }, "runs no farmem service with such a call"},
		// Before: 400 "request body: unexpected EOF", which did not say why.
		{"body too large", func() error {
			_, err := cl.ApplyRules(ctx, rules.Set{Rules: []rules.Rule{{Name: strings.Repeat("x", 65<<20), Action: rules.Pass()}}})
			return err
		}, "larger than the API accepts (64 MiB)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
	// The client keeps the kind of error the server answered with.
	var bad *api.BadRequestError
	if _, err := cl.Attach(ctx, attach.Attachment{Iface: "nope0", Hook: attach.HookXDP}); !errors.As(err, &bad) {
		t.Errorf("bad request: %T %v, want *api.BadRequestError", err, err)
	}
	var nf *api.NotFoundError
	if _, err := cl.DeleteRule(ctx, "x"); !errors.As(err, &nf) {
		t.Errorf("not found: %T %v, want *api.NotFoundError", err, err)
	}
}

func TestNoDaemon(t *testing.T) {
	cl := api.NewClient(filepath.Join(t.TempDir(), "missing.sock"))
	if _, err := cl.Status(context.Background()); !errors.Is(err, api.ErrNoDaemon) {
		t.Errorf("err = %v, want ErrNoDaemon", err)
	}
}
