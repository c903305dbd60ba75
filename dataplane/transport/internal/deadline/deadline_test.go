package deadline

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

func TestWaker(t *testing.T) {
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var w Waker
	buf := make([]byte, 16)
	read := func(ctx context.Context, at time.Time) error {
		disarm := w.Arm(ctx, c, at)
		defer disarm()
		_, err := c.Read(buf)
		return err
	}

	tests := []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		at   time.Time
	}{
		{"cancel", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(20*time.Millisecond, cancel)
			return ctx, cancel
		}, time.Time{}},
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithCancel(context.Background())
		}, time.Now().Add(20 * time.Millisecond)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := tt.ctx()
			defer cancel()
			if err := read(ctx, tt.at); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read = %v, want a deadline error", err)
			}
		})
	}

	// Disarmed: ending the earlier context no longer touches the deadline,
	// and a read with none waits for its datagram.
	ctx, cancel := context.WithCancel(context.Background())
	disarm := w.Arm(ctx, c, time.Time{})
	disarm()
	cancel()
	go func() {
		time.Sleep(50 * time.Millisecond)
		s, err := net.DialUDP("udp", nil, c.LocalAddr().(*net.UDPAddr))
		if err == nil {
			s.Write([]byte("x"))
			s.Close()
		}
	}()
	if err := read(context.Background(), time.Time{}); err != nil {
		t.Fatalf("read after a disarmed context ended: %v", err)
	}
}
