package fmap

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"
)

// The race program: raceWriters goroutines keep rewriting counters spread
// over the region (each writer owns every raceWriters-th page) while the main
// goroutine calls Sync in a loop, and the buffer of a quarter of the region
// keeps evicting. Writes that land while a chunk is being written back must
// not be lost.
const (
	raceWriters = 4
	raceRounds  = 40
	raceSize    = 4 << 20
)

// raceWant is the counter every writer leaves in its pages.
func raceWant(page int) uint64 { return uint64(page)<<32 | raceRounds }

// TestWritesRacingWriteback checks that writes concurrent with Sync and with
// evictions survive, and that Sync alone (before Close) leaves every byte in
// the backend.
func TestWritesRacingWriteback(t *testing.T) {
	a := startAgent(t)
	be := a.add(1, NewMemBackend(raceSize))
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()

	cmd := exec.CommandContext(ctx, os.Args[0], "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=race", "FMAP_SOCK="+a.sock)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	synced := false
	for sc.Scan() {
		t.Log(sc.Text())
		if sc.Text() == "SYNCED" {
			synced = true
			break
		}
	}
	if !synced {
		cmd.Wait()
		t.Fatalf("race program ended before its final Sync")
	}
	// The program is parked with its mapping open: Sync alone must have put
	// every write in the backend.
	checkRace(t, be, "after Sync")
	stdin.Close() // lets the program Close and exit
	for sc.Scan() {
		t.Log(sc.Text())
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("race program: %v", err)
	}
	checkRace(t, be, "after Close")
}

func checkRace(t *testing.T, be Backend, when string) {
	t.Helper()
	page := os.Getpagesize()
	got := make([]byte, raceSize)
	be.ReadAt(got, 0)
	for p := range raceSize / page {
		if v := binary.NativeEndian.Uint64(got[p*page:]); v != raceWant(p) {
			t.Fatalf("%s: page %d holds %#x, want %#x", when, p, v, raceWant(p))
		}
	}
}

func helperRace() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m, err := Map(ctx, os.Getenv("FMAP_SOCK"), RegionRef{ID: 1, Name: "race"},
		Options{ChunkSize: 16 << 10, BufferBytes: raceSize / 4})
	if err != nil {
		return err
	}
	b := m.Bytes()
	page := os.Getpagesize()
	pages := len(b) / page
	var writers sync.WaitGroup
	for w := range raceWriters {
		writers.Go(func() {
			for r := uint64(1); r <= raceRounds; r++ {
				for p := w; p < pages; p += raceWriters {
					binary.NativeEndian.PutUint64(b[p*page:], uint64(p)<<32|r)
				}
			}
		})
	}
	stop := make(chan struct{})
	syncDone := make(chan error, 1)
	syncs := 0
	go func() {
		for {
			select {
			case <-stop:
				syncDone <- nil
				return
			default:
			}
			if err := m.Sync(ctx); err != nil {
				syncDone <- err
				return
			}
			syncs++
		}
	}()
	writers.Wait()
	close(stop)
	if err := <-syncDone; err != nil {
		return err
	}
	if err := m.Sync(ctx); err != nil {
		return err
	}
	st, err := m.Stats(ctx)
	if err != nil {
		return err
	}
	// Writes to chunks that Sync had cleaned must have come back as
	// write-protect faults; without them nothing would be written twice.
	if st.WPFaults == 0 || st.Evictions == 0 {
		return fmt.Errorf("stats %+v: want write-protect faults and evictions", st)
	}
	fmt.Printf("race: %d Syncs ran during the writes\nSTATS %+v\nSYNCED\n", syncs, st)
	// Wait for the test to check the backend; stdin closes then.
	bufio.NewReader(os.Stdin).ReadString('\n')
	return m.Close()
}
