package cli

import (
	"errors"
	"strings"
	"testing"

	"github.com/lovelock-dpu/lovelock/control/attach"
)

// detachFake lists its attachments and refuses to detach those in fail.
type detachFake struct {
	fakeService
	list     []attach.Attachment
	fail     map[string]bool
	detached []string
}

func (f *detachFake) Attachments() ([]attach.Attachment, error) { return f.list, nil }
func (f *detachFake) Detach(iface string, hook attach.Hook) error {
	if f.fail[iface] {
		return errors.New("interface " + iface + ": cannot detach")
	}
	f.detached = append(f.detached, iface+" "+string(hook))
	return nil
}

// TestDetachAllGoesOn: iface detach --all detaches every attachment it can
// and reports, at the end, each one it could not.
func TestDetachAllGoesOn(t *testing.T) {
	svc := &detachFake{
		list: []attach.Attachment{
			{Iface: "a", Hook: attach.HookXDP},
			{Iface: "gone", Hook: attach.HookTCIngress},
			{Iface: "p0", Hook: attach.HookXDP},
			{Iface: "p1", Hook: attach.HookTCEgress},
		},
		fail: map[string]bool{"gone": true, "p1": true},
	}
	sock := serveFake(t, svc)
	out, _, err := runCLI(sock, "iface", "detach", "--all")
	if err == nil || !strings.Contains(err.Error(), "2 of 4 attachments not detached") ||
		!strings.Contains(err.Error(), "gone tc-ingress: ") || !strings.Contains(err.Error(), "p1 tc-egress: ") {
		t.Errorf("err = %v; want both failures reported", err)
	}
	if len(svc.detached) != 2 || !strings.Contains(out, "a xdp: detached") || !strings.Contains(out, "p0 xdp: detached") {
		t.Errorf("detached %v, output:\n%s\nwant a and p0 detached past the failure", svc.detached, out)
	}
}
