package xsk

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"
)

// RecvBatch moves up to len(descs) received descriptors off the RX ring
// into descs and returns how many. The frames now belong to the caller:
// read them with Frame, then give them back with Recycle or send them with
// TransmitDescs. It never blocks; 0 means the ring is empty (see Poll).
//
// On a MultiBuffer socket a packet may take several descriptors, each but
// the last with Options&unix.XDP_PKT_CONTD. RecvBatch returns whole
// packets only: a packet that does not fit what is left of descs stays on
// the ring for the next call. When descs cannot hold even the first
// packet's descriptors it takes nothing and returns an error wrapping
// ErrShortBatch that says how many that packet takes; a slice of
// ceil(longest frame / (FrameSize-Headroom-PacketHeadroom)) descriptors
// always holds one.
func (s *Socket) RecvBatch(descs []Desc) (int, error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.exit()
	if s.rx == nil {
		return 0, s.errNoRX
	}
	s.rxMu.Lock()
	defer s.rxMu.Unlock()
	n, need := s.recvLocked(descs, len(descs))
	return n, s.shortErr(need, len(descs))
}

// RecvPackets is RecvBatch that returns the descriptors of at most packets
// packets (on a MultiBuffer socket a packet may take several descriptors,
// and ErrShortBatch is as for RecvBatch; elsewhere it is RecvBatch with
// descs cut to packets). A count below one takes nothing.
func (s *Socket) RecvPackets(descs []Desc, packets int) (int, error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.exit()
	if s.rx == nil {
		return 0, s.errNoRX
	}
	// Cut descs for a count below one too: a negative one would slice out
	// of range, and an empty descs takes nothing.
	if packets < 1 || !s.sg {
		descs = descs[:max(0, min(len(descs), packets))]
	}
	s.rxMu.Lock()
	defer s.rxMu.Unlock()
	n, need := s.recvLocked(descs, packets)
	return n, s.shortErr(need, len(descs))
}

// shortErr is RecvBatch's error when recvLocked took nothing because the
// packet at the head of the ring needs need descriptors; nil for need 0.
func (s *Socket) shortErr(need, have int) error {
	if need == 0 {
		return nil
	}
	room := s.umem.cfg.FrameSize - s.umem.cfg.Headroom - PacketHeadroom
	return fmt.Errorf("xsk %s: RX: the next packet takes %d descriptors, descs holds %d; pass at least ceil(longest frame / %d bytes) descriptors: %w",
		s.name, need, have, room, ErrShortBatch)
}

// recvLocked takes the descriptors of at most maxPkts whole packets off
// the RX ring into descs and returns how many. On a MultiBuffer socket,
// when it took nothing because the first packet's chain is longer than
// descs, need is that chain's length (0 otherwise) and the packet stays on
// the ring.
func (s *Socket) recvLocked(descs []Desc, maxPkts int) (n, need int) {
	u, q := s.umem, s.q
	idx, got := s.rx.peek(uint32(min(len(descs), 1<<31)))
	if s.sg && got > 0 {
		// Whole packets only, at most maxPkts: descriptors after the
		// last of them stay on the ring (unpeek: the consumer index is
		// not published past them) for the next call, which then
		// starts at a packet's first one. Handing out part of a chain
		// would make the next call return the rest as a packet of its
		// own.
		whole, pkts := uint32(0), 0
		for i := uint32(0); i < got && pkts < maxPkts; i++ {
			if s.rx.at(idx+i).Options&unix.XDP_PKT_CONTD == 0 {
				whole, pkts = i+1, pkts+1
			}
		}
		s.rx.unpeek(got - whole)
		if whole == 0 && got == uint32(len(descs)) && maxPkts > 0 {
			// The first packet continues past descs: find its end
			// among the entries the kernel has published (it
			// publishes whole packets), without consuming any.
			for i, e := got, s.rx.avail(s.rx.size); i < e; i++ {
				if s.rx.at(idx+i).Options&unix.XDP_PKT_CONTD == 0 {
					need = int(i) + 1
					break
				}
			}
		}
		got = whole
	}
	if got > 0 {
		want := kernelState(frameFill, q.id)
		pkts := 0 // RXPackets counts packets (last descriptors), not descriptors
		// A descriptor whose frame is refused (outside the UMEM, or not
		// in this queue's fill state: never expected of the kernel)
		// breaks its packet: the rest of the chain would read as a
		// packet of its own, or run on into the next one. The packet's
		// frames taken are dropped, recycled below, and so are the
		// chain's later ones; the refused frame is not this socket's.
		var drop []Desc
		first, broken := 0, false // descs index of the packet's first descriptor
		for i := range got {
			d := *s.rx.at(idx + i)
			ok := u.Frame(d) != nil
			if !ok {
				u.frameErrors.Add(1)
			} else {
				ok = u.take(d.Addr>>u.shift, want, frameUser)
			}
			switch {
			case !ok && !broken:
				drop = append(drop, descs[first:n]...)
				n, broken = first, true
			case ok && broken:
				drop = append(drop, d)
			case ok:
				descs[n] = d
				n++
			}
			if d.Options&unix.XDP_PKT_CONTD == 0 {
				if !broken {
					pkts++
				}
				first, broken = n, false
			}
		}
		s.rx.release()
		q.fillOut.Add(-int64(n + len(drop)))
		s.rxPackets.Add(uint64(pkts))
		if len(drop) > 0 {
			_ = s.recycleLocked(drop) // they were just taken: none is refused
		}
	}
	added := u.fillUp(q, s.rxScratch)
	// Only zero-copy drivers ever set the fill ring's flag: the driver
	// went to sleep on an empty fill ring and needs a kick.
	if (n == 0 || added > 0) && s.needWakeup && q.fill.needsWakeup() {
		_, _, _ = unix.Syscall6(unix.SYS_RECVFROM, uintptr(s.fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
		s.rxWakeups.Add(1)
	}
	return n, need
}

// Recycle gives received frames back: to the fill ring up to its target
// level, the rest to the free list. A descriptor for a frame the caller
// does not hold is skipped and reported as ErrInvalidDesc after the others
// are recycled.
func (s *Socket) Recycle(descs []Desc) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.exit()
	if s.rx == nil {
		return s.errNoRX
	}
	s.rxMu.Lock()
	defer s.rxMu.Unlock()
	return s.recycleLocked(descs)
}

func (s *Socket) recycleLocked(descs []Desc) error {
	if len(descs) == 0 {
		return nil
	}
	u, q := s.umem, s.q
	bad := 0
	i := 0
	if room := q.target.Load() - q.fillOut.Load(); room > 0 {
		q.fillMu.Lock()
		idx, got := q.fill.reserve(uint32(min(int64(len(descs)), room)))
		fill := kernelState(frameFill, q.id)
		w := uint32(0)
		for ; i < len(descs) && w < got; i++ {
			d := descs[i]
			if u.Frame(d) == nil || !u.take(d.Addr>>u.shift, frameUser, fill) {
				bad++
				continue
			}
			*q.fill.at(idx + w) = d.Addr >> u.shift << u.shift
			w++
		}
		q.fill.cancel(got - w)
		if w > 0 {
			q.fillOut.Add(int64(w))
			q.fill.submit()
		}
		q.fillMu.Unlock()
	}
	if i < len(descs) {
		back := s.rxScratch[:0]
		for ; i < len(descs); i++ {
			d := descs[i]
			if u.Frame(d) == nil || !u.take(d.Addr>>u.shift, frameUser, frameFree) {
				bad++
				continue
			}
			back = append(back, uint32(d.Addr>>u.shift))
		}
		u.release(back)
		if cap(back) > cap(s.rxScratch) {
			s.rxScratch = back[:0]
		}
	}
	if bad > 0 {
		return fmt.Errorf("xsk %s: recycle: %d descriptors: %w", s.name, bad, ErrInvalidDesc)
	}
	return nil
}

// TryReceive calls fn for each descriptor of at most one batch and
// recycles the frames; fn must not keep the slice. It never blocks and
// returns how many descriptors it handled. On a socket without MultiBuffer
// a descriptor is a packet; on a MultiBuffer one a packet may take several,
// handed to fn in order and whole within one call, but nothing here marks
// where one ends: use TryReceiveDescs for that. fn must not call Close,
// RecvBatch, Recycle or Receive on the same socket; it may transmit on it.
func (s *Socket) TryReceive(fn func(frame []byte)) (int, error) {
	return s.tryReceive(fn, nil)
}

// TryReceiveDescs is TryReceive that gives fn each frame's descriptor too.
// On a MultiBuffer socket, d.More() reports that the packet goes on in the
// next descriptor's frame; the descriptor without it ends the packet, and a
// call never ends inside one. fn must not keep frame, nor recycle or
// transmit d: TryReceiveDescs recycles every frame when fn returns.
func (s *Socket) TryReceiveDescs(fn func(d Desc, frame []byte)) (int, error) {
	return s.tryReceive(nil, fn)
}

// tryReceive is TryReceive with fn, or TryReceiveDescs with fnDesc.
func (s *Socket) tryReceive(fn func(frame []byte), fnDesc func(d Desc, frame []byte)) (int, error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.exit()
	if s.rx == nil {
		return 0, s.errNoRX
	}
	s.rxMu.Lock()
	defer s.rxMu.Unlock()
	n, need := s.recvLocked(s.rxDescs, len(s.rxDescs))
	if need > 0 {
		// A MultiBuffer packet with more descriptors than BatchSize:
		// grow the batch to its chain (once per longer chain) rather
		// than fail or hand out part of it.
		s.rxDescs = make([]Desc, need)
		n, _ = s.recvLocked(s.rxDescs, len(s.rxDescs))
	}
	recycled := false
	defer func() {
		// Keep the frame accounting exact even if fn panics.
		if !recycled {
			_ = s.recycleLocked(s.rxDescs[:n])
		}
	}()
	for _, d := range s.rxDescs[:n] {
		if fnDesc != nil {
			fnDesc(d, s.umem.Frame(d))
		} else {
			fn(s.umem.Frame(d))
		}
	}
	recycled = true
	return n, s.recycleLocked(s.rxDescs[:n])
}

// Receive calls fn for every descriptor, as TryReceive does, until ctx
// ends (returning ctx.Err()), the socket is closed (an error wrapping
// ErrClosed) or its interface goes away (an error wrapping ENETDOWN, within
// half a second). While the ring is empty it spins for
// SocketConfig.IdleSpin, then waits in poll(2). The rules for fn are
// TryReceive's.
func (s *Socket) Receive(ctx context.Context, fn func(frame []byte)) error {
	return s.receive(ctx, func() (int, error) { return s.tryReceive(fn, nil) })
}

// ReceiveDescs is Receive that calls fn as TryReceiveDescs does, with each
// frame's descriptor: on a MultiBuffer socket d.More() marks a packet that
// goes on in the next frame.
func (s *Socket) ReceiveDescs(ctx context.Context, fn func(d Desc, frame []byte)) error {
	return s.receive(ctx, func() (int, error) { return s.tryReceive(nil, fn) })
}

func (s *Socket) receive(ctx context.Context, try func() (int, error)) error {
	done := ctx.Done()
	for {
		select {
		case <-done:
			return ctx.Err()
		default:
		}
		n, err := try()
		if err != nil {
			return err
		}
		if n == 0 && !s.spin() {
			ready, err := s.Poll(ctx, healthInterval)
			if err != nil {
				return err
			}
			if !ready {
				if err := s.sockErr(); err != nil {
					return err
				}
			}
		}
	}
}
