package farmem

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// newLimitedServer opens a server on dir holding at most maxRegions
// regions, not running: the tests call its Go API, or run it themselves.
func newLimitedServer(t *testing.T, dir string, maxRegions int) *Server {
	t.Helper()
	s, err := NewServer(ServerOptions{Config: testConfig(), StateDir: dir, Capacity: 64 << 20, MaxRegions: maxRegions,
		Transport: listen(t, loopback)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestRegionLimit: a memory node holds at most max_regions regions (each
// keeps a file open), however small: a create beyond it is refused with
// ErrNoSpace saying regions are the limit, a repeat of a create it made is
// still answered, and once a region is freed a create succeeds again.
func TestRegionLimit(t *testing.T) {
	for _, tc := range []struct {
		name string
		max  int
		wire bool // through a client, as a host's create arrives
	}{
		{"one region", 1, false},
		{"several regions", 5, false},
		{"over the wire", 3, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newLimitedServer(t, t.TempDir(), tc.max)
			create := func() (RegionInfo, error) { return srv.Create(7, 4096, true, "") }
			free := func(id uint32) error { return srv.Free(7, id) }
			if tc.wire {
				run(t, srv.Run)
				c := newClient(t, srv.Addr(), 7)
				ctx := context.Background()
				create = func() (RegionInfo, error) { return c.Create(ctx, 4096, CreateOptions{Writable: true}) }
				free = func(id uint32) error { return c.Free(ctx, id) }
			} else {
				t.Cleanup(func() { srv.Close(); srv.st.close() })
			}
			var ids []uint32
			for i := range tc.max {
				ri, err := create()
				if err != nil {
					t.Fatalf("create %d of %d: %v", i+1, tc.max, err)
				}
				ids = append(ids, ri.ID)
			}
			_, err := create()
			if !errors.Is(err, ErrNoSpace) {
				t.Fatalf("create %d with max_regions %d: %v, want ErrNoSpace", tc.max+1, tc.max, err)
			}
			if !tc.wire && (!errors.Is(err, errRegionLimit) || !strings.Contains(err.Error(), "max_regions")) {
				t.Errorf("the refusal does not say regions are the limit, and what to do: %v", err)
			}
			// The wire carries only the status: the host is told both
			// bounds, and the create is named by its size, not by its
			// Region field, which holds half of its nonce.
			if msg := err.Error(); tc.wire && (regionNumber.MatchString(msg) || !strings.Contains(msg, "create of 4096 bytes") ||
				!strings.Contains(msg, "max_regions") || !strings.Contains(msg, "capacity")) {
				t.Errorf("the refusal over the wire names a region, or not the size, max_regions and capacity: %v", err)
			}
			if got := srv.Stats(); got.Regions != tc.max || got.MaxRegions != tc.max || got.Errors.NoSpace != b2u(tc.wire) {
				t.Errorf("stats: %d regions of at most %d, %d no-space answers on the wire; want %d of %d, %d",
					got.Regions, got.MaxRegions, got.Errors.NoSpace, tc.max, tc.max, b2u(tc.wire))
			}
			// A create the memory node made, repeated (a restarted agent
			// forwards it again), is answered, not refused.
			if !tc.wire {
				srv.st.mu.Lock()
				srv.st.regions[ids[0]].createNonce = 0xfeed
				srv.st.byNonce[createKey{7, 0xfeed}] = ids[0]
				srv.st.mu.Unlock()
				if ri, err := srv.st.create(7, 4096, true, "", 0xfeed); err != nil || ri.ID != ids[0] {
					t.Errorf("a repeated create at the limit: %+v, %v; want region %d", ri, err, ids[0])
				}
			}
			if err := free(ids[len(ids)-1]); err != nil {
				t.Fatal(err)
			}
			if _, err := create(); err != nil {
				t.Fatalf("create after a free: %v", err)
			}
			if _, err := create(); !errors.Is(err, ErrNoSpace) {
				t.Fatalf("create past the limit again: %v, want ErrNoSpace", err)
			}
		})
	}
}

// regionNumber matches an error naming a region by number.
var regionNumber = regexp.MustCompile(`region \d`)

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// TestRegionLimitRestart: a memory node restarted with max_regions below
// the regions it holds loads and serves every one of them (their bytes
// were acknowledged), and refuses creates until enough are freed.
func TestRegionLimitRestart(t *testing.T) {
	for _, tc := range []struct {
		name        string
		held, lower int
	}{
		{"lowered below", 6, 2},
		{"lowered to", 3, 3},
		{"lowered to one", 4, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			srv := newLimitedServer(t, dir, tc.held)
			want := map[uint32]string{}
			for i := range tc.held {
				ri, err := srv.Create(1, 4096, true, "")
				if err != nil {
					t.Fatal(err)
				}
				r, _ := srv.st.get(0, ri.ID)
				want[ri.ID] = fmt.Sprintf("region %d of %d", i, tc.held)
				if err := r.writeAt([]byte(want[ri.ID]), 100); err != nil {
					t.Fatal(err)
				}
			}
			srv.Close()
			srv.st.close()

			srv = newLimitedServer(t, dir, tc.lower)
			t.Cleanup(func() { srv.Close(); srv.st.close() })
			list := srv.List(0)
			if len(list) != tc.held {
				t.Fatalf("after a restart with max_regions %d the server lists %d regions, want all %d", tc.lower, len(list), tc.held)
			}
			for _, ri := range list {
				r, err := srv.st.get(0, ri.ID)
				if err != nil {
					t.Fatal(err)
				}
				got := make([]byte, len(want[ri.ID]))
				if err := r.readAt(got, 100); err != nil || string(got) != want[ri.ID] {
					t.Fatalf("region %d after the restart: %q, %v; want %q", ri.ID, got, err, want[ri.ID])
				}
			}
			// Refused while at or over the limit, one freed each time.
			for i := 0; tc.held-i >= tc.lower; i++ {
				if _, err := srv.Create(1, 4096, true, ""); !errors.Is(err, ErrNoSpace) || !errors.Is(err, errRegionLimit) {
					t.Fatalf("create with %d regions held, at most %d: %v, want ErrNoSpace for the region count", tc.held-i, tc.lower, err)
				}
				if err := srv.Free(1, list[i].ID); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := srv.Create(1, 4096, true, ""); err != nil {
				t.Fatalf("create once under max_regions %d: %v", tc.lower, err)
			}
		})
	}
}

// TestRegionLimitConfig: max_regions is checked, and lowered to leave
// descriptors of the open-files limit to the rest of the process.
func TestRegionLimitConfig(t *testing.T) {
	for _, tc := range []struct {
		n  int
		ok bool
	}{{-1, false}, {0, true}, {1, true}, {MaxRegionsLimit, true}, {MaxRegionsLimit + 1, false}} {
		if err := CheckMaxRegions(tc.n); (err == nil) != tc.ok || err != nil && !strings.Contains(err.Error(), "max_regions") {
			t.Errorf("CheckMaxRegions(%d) = %v, want ok %v", tc.n, err, tc.ok)
		}
	}
	if _, err := NewServer(ServerOptions{StateDir: t.TempDir(), Capacity: 1 << 20, MaxRegions: -1}); err == nil || !strings.Contains(err.Error(), "max_regions") {
		t.Errorf("NewServer with max_regions -1: %v", err)
	}
	for _, tc := range []struct {
		want    int
		nofile  uint64
		n       int
		lowered bool
	}{
		{1024, 4096, 1024, false},
		{3840, 4096, 3840, false},
		{3841, 4096, 3840, true},
		{1024, 1024, 768, true},
		{1024, 100, 50, true},
		{1024, 1, 1, true},
		{1024, 0, 1, true},
		{MaxRegionsLimit, unix.RLIM_INFINITY, MaxRegionsLimit, false},
	} {
		if n, lowered := regionLimit(tc.want, tc.nofile); n != tc.n || lowered != tc.lowered {
			t.Errorf("regionLimit(%d, %d) = %d, %v; want %d, %v", tc.want, tc.nofile, n, lowered, tc.n, tc.lowered)
		}
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil || lim.Cur >= MaxRegionsLimit+fdReserve {
		return // nothing to lower on this machine
	}
	srv := newLimitedServer(t, t.TempDir(), MaxRegionsLimit)
	t.Cleanup(func() { srv.Close(); srv.st.close() })
	if got := srv.Stats().MaxRegions; uint64(got)+fdReserve > lim.Cur {
		t.Errorf("max_regions %d with an open-files limit of %d: holds up to %d, leaving less than %d descriptors", MaxRegionsLimit, lim.Cur, got, fdReserve)
	}
}
