package farmem

import (
	"errors"
	"fmt"
	"time"
)

// Duration is a time.Duration that reads and writes as text ("5ms") in
// config files.
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with time.ParseDuration.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Config holds the protocol knobs every far-memory party shares: the
// server, the agent and the client. lovelockd embeds it in its service
// section; the zero value of a field means its default (WithDefaults).
type Config struct {
	// ChunkSize is the largest read or write one request carries: the
	// page size of SODA (64 KiB). Region handles split larger accesses.
	// A multiple of FragUnit, at most MaxChunk.
	ChunkSize int `json:"chunk_size,omitempty"`
	// MaxDatagram is the largest datagram (UDP payload) any party sends:
	// the path's MTU less IP and UDP headers, 8972 on the testbed's jumbo
	// frames. Each party lowers it to its transport's MaxPayload, and
	// receives into buffers of the transport's MaxPayload.
	MaxDatagram int `json:"max_datagram,omitempty"`
	// RetransmitTimeout is how long a requester waits for a reply before
	// it sends the request again; it doubles per try up to
	// MaxRetransmitTimeout.
	RetransmitTimeout    Duration `json:"retransmit_timeout,omitempty"`
	MaxRetransmitTimeout Duration `json:"max_retransmit_timeout,omitempty"`
	// Tries bounds the transmissions of one request; after the last one
	// times out the request fails with ErrUnavailable.
	Tries int `json:"tries,omitempty"`
	// Window bounds the requests a client, or an agent towards its
	// memory nodes, has outstanding at once; further requests wait.
	Window int `json:"window,omitempty"`
	// Reassembly bounds the write requests (and an agent's forwarded
	// reads) a responder assembles at once: at most Reassembly*ChunkSize
	// bytes. The oldest is dropped when a new one needs room (its sender
	// retransmits).
	Reassembly int `json:"reassembly,omitempty"`
	// LeaseTTL is how long a writer lease lives without renewal; clients
	// renew at a third of it. A writer that vanishes frees the region
	// after at most this long.
	LeaseTTL Duration `json:"lease_ttl,omitempty"`
	// ReplyCache bounds the replies a responder keeps per requester to
	// answer duplicates of non-idempotent requests.
	ReplyCache int `json:"reply_cache,omitempty"`
	// ReplyCacheBytes bounds those replies across all requesters of one
	// responder (a memory node's; each of a DPU agent's host workers'),
	// each counted as its data plus 160 bytes: a write's reply carries no
	// data, a control operation's a few bytes to one datagram. The
	// oldest reply of any requester is dropped for a new one, and counted
	// (replies_evicted).
	ReplyCacheBytes Size `json:"reply_cache_bytes,omitempty"`
}

// Defaults of the knobs.
const (
	// DefaultChunkSize: SODA's 64 KiB data chunk (its RDMA and DMA
	// bandwidth plateau there).
	DefaultChunkSize = 64 << 10
	// DefaultMaxDatagram fits one IPv4 packet on a 9000-byte MTU.
	DefaultMaxDatagram = 9000 - 28
	// DefaultRetransmitTimeout is well above a rack's RTT plus a 64 KiB
	// chunk's serialisation and a backing-file write.
	DefaultRetransmitTimeout    = Duration(20 * time.Millisecond)
	DefaultMaxRetransmitTimeout = Duration(500 * time.Millisecond)
	// DefaultTries: with backoff, about 5 s before a request fails,
	// enough for a lovelockd restart on the DPU.
	DefaultTries      = 14
	DefaultWindow     = 256
	DefaultReassembly = 256
	DefaultLeaseTTL   = Duration(15 * time.Second)
	DefaultReplyCache = 4096
	// DefaultReplyCacheBytes holds about 200,000 write replies: 50
	// requesters with full reply caches, far more with a window's worth
	// each.
	DefaultReplyCacheBytes = Size(32 << 20)
	// MinReplyCacheBytes and MaxReplyCacheBytes bound ReplyCacheBytes:
	// room for a few full windows, and well below a DPU's memory.
	MinReplyCacheBytes = Size(1 << 20)
	MaxReplyCacheBytes = Size(16 << 30)
)

// Defaults returns the configuration with every knob at its default.
func Defaults() Config { return Config{}.WithDefaults() }

// WithDefaults returns c with every zero knob at its default.
func (c Config) WithDefaults() Config {
	set := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	setD := func(v *Duration, d Duration) {
		if *v == 0 {
			*v = d
		}
	}
	set(&c.ChunkSize, DefaultChunkSize)
	set(&c.MaxDatagram, DefaultMaxDatagram)
	set(&c.Tries, DefaultTries)
	set(&c.Window, DefaultWindow)
	set(&c.Reassembly, DefaultReassembly)
	set(&c.ReplyCache, DefaultReplyCache)
	if c.ReplyCacheBytes == 0 {
		c.ReplyCacheBytes = DefaultReplyCacheBytes
	}
	setD(&c.RetransmitTimeout, DefaultRetransmitTimeout)
	setD(&c.MaxRetransmitTimeout, DefaultMaxRetransmitTimeout)
	setD(&c.LeaseTTL, DefaultLeaseTTL)
	return c
}

// Validate checks every knob of c after defaults, and names each one that
// is out of range.
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("farmem: config: "+format, a...)) }
	if c.ChunkSize < FragUnit || c.ChunkSize > MaxChunk || c.ChunkSize%FragUnit != 0 {
		bad("chunk_size %d: want a multiple of %d between %d and %d", c.ChunkSize, FragUnit, FragUnit, MaxChunk)
	}
	if c.MaxDatagram < MinDatagram || c.MaxDatagram > 65507 {
		bad("max_datagram %d: want %d to 65507", c.MaxDatagram, MinDatagram)
	}
	if c.RetransmitTimeout <= 0 || c.MaxRetransmitTimeout < c.RetransmitTimeout {
		bad("retransmit_timeout %v, max_retransmit_timeout %v: want 0 < retransmit <= max", c.RetransmitTimeout.D(), c.MaxRetransmitTimeout.D())
	}
	if c.Tries < 1 || c.Tries > 64 {
		bad("tries %d: want 1 to 64", c.Tries)
	}
	if c.Window < 1 || c.Window > 1<<16 {
		bad("window %d: want 1 to 65536", c.Window)
	}
	if c.Reassembly < 1 || c.Reassembly > 1<<16 {
		bad("reassembly %d: want 1 to 65536", c.Reassembly)
	}
	if c.LeaseTTL < Duration(10*time.Millisecond) {
		bad("lease_ttl %v: want at least 10ms", c.LeaseTTL.D())
	}
	if c.ReplyCache < 16 {
		bad("reply_cache %d: want at least 16", c.ReplyCache)
	}
	if c.ReplyCacheBytes < MinReplyCacheBytes || c.ReplyCacheBytes > MaxReplyCacheBytes {
		bad("reply_cache_bytes %v: want %v to %v", c.ReplyCacheBytes, MinReplyCacheBytes, MaxReplyCacheBytes)
	}
	return errors.Join(errs...)
}
