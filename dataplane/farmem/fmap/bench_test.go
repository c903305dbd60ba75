package fmap

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

const benchSize = 64 << 20

// BenchmarkFaultIn compares first-touch reads through a mapping (a program
// process reads one byte per page of a region whose chunks all fit the
// buffer, so every chunk faults in once and nothing is evicted) with the
// explicit baseline: ReadAt of the same backend in chunk-sized pieces. Both
// report MB/s of region data; the ratio is what to read.
func BenchmarkFaultIn(b *testing.B) {
	for _, chunk := range []int{4 << 10, 64 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("chunk=%dKiB/mapping", chunk>>10), func(b *testing.B) {
			a := startAgent(b)
			a.add(1, benchBackend())
			var total time.Duration
			for b.Loop() {
				out := runHelper(b, context.Background(), "touch", "FMAP_SOCK="+a.sock,
					"FMAP_CHUNK="+strconv.Itoa(chunk))
				total += parseTouch(b, out)
			}
			b.ReportMetric(float64(benchSize)*float64(b.N)/total.Seconds()/1e6, "MB/s")
			b.ReportMetric(0, "ns/op") // process start-up dominates ns/op; MB/s is the number
		})
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
	start := time.Now()
	for off := 0; off < len(buf); off += page {
		if buf[off] != byte(off/page) {
			return fmt.Errorf("page %d holds %d, want %d", off/page, buf[off], byte(off/page))
		}
	}
	elapsed := time.Since(start)
	fmt.Printf("TOUCH ns=%d\n", elapsed.Nanoseconds())
	return m.Close()
}
