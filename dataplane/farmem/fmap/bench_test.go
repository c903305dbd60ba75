package fmap

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const benchSize = 64 << 20

// BenchmarkFaultIn compares first-touch reads through a mapping (a program
// process reads one byte per page of a region whose chunks all fit the
// buffer, so every chunk faults in once and nothing is evicted) with the
// explicit baseline: ReadAt of the same backend in chunk-sized pieces. Both
// report MB/s of region data; the ratio is what to read.
func BenchmarkFaultIn(b *testing.B) {
	for _, chunk := range []int{4 << 10, 64 << 10, 1 << 20} {
		// read: first touch is a read (one MISSING fault per chunk).
		// rw: read, then write the same page (a MISSING and a WP fault per
		// chunk): the cost of synchronous dirty tracking.
		for _, mode := range []string{"read", "rw"} {
			b.Run(fmt.Sprintf("chunk=%dKiB/mapping-%s", chunk>>10, mode), func(b *testing.B) {
				a := startAgent(b)
				a.add(1, benchBackend())
				var total time.Duration
				for b.Loop() {
					out := runHelper(b, context.Background(), "touch", "FMAP_SOCK="+a.sock,
						"FMAP_CHUNK="+strconv.Itoa(chunk), "FMAP_TOUCH="+mode)
					total += parseTouch(b, out)
					for _, l := range strings.Split(out, "\n") {
						if strings.HasPrefix(l, "FAULTS") {
							b.Log(l)
						}
					}
				}
				b.ReportMetric(float64(benchSize)*float64(b.N)/total.Seconds()/1e6, "MB/s")
				b.ReportMetric(0, "ns/op") // process start-up dominates ns/op; MB/s is the number
			})
		}
		b.Run(fmt.Sprintf("chunk=%dKiB/readat", chunk>>10), func(b *testing.B) {
			be := benchBackend()
			buf := make([]byte, chunk)
			b.SetBytes(benchSize)
			start := time.Now()
			for b.Loop() {
				for off := int64(0); off < benchSize; off += int64(chunk) {
					be.ReadAt(buf, off)
				}
			}
			b.ReportMetric(float64(benchSize)*float64(b.N)/time.Since(start).Seconds()/1e6, "MB/s")
		})
	}
}

// benchBackend returns a backend whose memory is touched (a pattern of
// page-sized runs), so that neither side pays for the agent's own first
// touches of fresh anonymous memory.
func benchBackend() *MemBackend {
	be := NewMemBackend(benchSize)
	page := os.Getpagesize()
	for off := 0; off < benchSize; off += page {
		be.data[off] = byte(off / page)
	}
	return be
}

func parseTouch(b *testing.B, out string) time.Duration {
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(l, "TOUCH ns="); ok {
			ns, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return time.Duration(ns)
		}
	}
	b.Fatalf("touch program printed no time:\n%s", out)
	return 0
}

func helperTouch() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m, err := Map(ctx, os.Getenv("FMAP_SOCK"), RegionRef{ID: 1, Name: "touch"},
		Options{ChunkSize: int(envInt("FMAP_CHUNK")), BufferBytes: benchSize})
	if err != nil {
		return err
	}
	buf := m.Bytes()
	page := os.Getpagesize()
	write := os.Getenv("FMAP_TOUCH") == "rw"
	var ru0, ru1 unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru0)
	start := time.Now()
	for off := 0; off < len(buf); off += page {
		if buf[off] != byte(off/page) {
			return fmt.Errorf("page %d holds %d, want %d", off/page, buf[off], byte(off/page))
		}
		if write {
			buf[off+1] = 1
		}
	}
	elapsed := time.Since(start)
	unix.Getrusage(unix.RUSAGE_SELF, &ru1)
	fmt.Printf("TOUCH ns=%d\n", elapsed.Nanoseconds())
	st, err := m.Stats(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("FAULTS minor=%d major=%d pages=%d agent=%+v\n", ru1.Minflt-ru0.Minflt, ru1.Majflt-ru0.Majflt, len(buf)/page, st)
	return m.Close()
}
