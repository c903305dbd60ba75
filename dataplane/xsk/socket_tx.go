package xsk

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// lockTX enters the socket for a send and takes the TX lock, after taking
// back completed frames; unlockTX undoes it.
func (s *Socket) lockTX() error {
	if err := s.enter(); err != nil {
		return err
	}
	if s.tx == nil {
		s.exit()
		return s.errNoTX
	}
	s.txMu.Lock()
	s.reclaim()
	return nil
}

func (s *Socket) unlockTX() {
	s.txMu.Unlock()
	s.exit()
}

// MaxTXFrags is how many descriptors Transmit gives one frame on a
// MultiBuffer socket: the kernel builds a copy-mode frame as an skb with at
// most MAX_SKB_FRAGS (17) fragments.
const MaxTXFrags = 16

// Transmit copies frames into free UMEM frames and submits them to the TX
// ring, first taking back completed frames. On a MultiBuffer socket a frame
// longer than one UMEM frame (FrameSize-Headroom) takes several, up to
// MaxTXFrags, as one packet of descriptors chained by XDP_PKT_CONTD. It returns how many frames it
// queued; when that is fewer than len(frames) the error says why:
// ErrRingFull (TX ring full), ErrNoFrames (no free frame), or
// ErrFrameTooLarge (frames[n] is empty or longer than FrameSize-Headroom).
// The first two are transient: Poll or Reclaim, then send the rest.
func (s *Socket) Transmit(frames [][]byte) (int, error) {
	if len(frames) == 0 {
		return 0, nil
	}
	if err := s.lockTX(); err != nil {
		return 0, err
	}
	defer s.unlockTX()

	if s.sg {
		return s.transmitMulti(frames)
	}
	u, q := s.umem, s.q
	limit := u.cfg.FrameSize - u.cfg.Headroom
	st := kernelState(frameTX, q.id)
	sent := 0
	var err error
	for sent < len(frames) && err == nil {
		want := min(len(frames)-sent, cap(s.txScratch))
		n := 0
		for ; n < want; n++ {
			if l := len(frames[sent+n]); l == 0 || l > limit {
				err = fmt.Errorf("xsk %s: TX: frame %d is %d bytes, want 1..%d: %w", s.name, sent+n, l, limit, ErrFrameTooLarge)
				break
			}
		}
		if n == 0 {
			break
		}
		idx, got := s.tx.reserve(uint32(n))
		if got == 0 {
			err = s.errRingFull
			break
		}
		fr := u.alloc(s.txScratch[:0:got], st)
		s.tx.cancel(got - uint32(len(fr)))
		for i, fi := range fr {
			addr := uint64(fi)<<u.shift + uint64(u.cfg.Headroom)
			l := copy(u.area[addr:], frames[sent+i])
			*s.tx.at(idx + uint32(i)) = Desc{Addr: addr, Len: uint32(l)}
		}
		if len(fr) > 0 {
			s.tx.submit()
			sent += len(fr)
		}
		switch {
		case len(fr) < int(got):
			err = s.errNoFrames
		case int(got) < n:
			err = s.errRingFull
		}
	}
	if sent > 0 {
		s.txPackets.Add(uint64(sent))
		if kerr := s.kick(); kerr != nil {
			return sent, kerr
		}
	}
	return sent, err
}

// transmitMulti is Transmit on a MultiBuffer socket: each frame takes as
// many UMEM frames as it needs, all reserved and submitted together, so the
// kernel never sees part of a packet.
func (s *Socket) transmitMulti(frames [][]byte) (int, error) {
	u, q := s.umem, s.q
	limit := u.cfg.FrameSize - u.cfg.Headroom
	st := kernelState(frameTX, q.id)
	sent, queued := 0, 0
	var err error
	for sent < len(frames) {
		f := frames[sent]
		if len(f) == 0 || len(f) > MaxTXFrags*limit {
			err = fmt.Errorf("xsk %s: TX: frame %d is %d bytes, want 1..%d: %w", s.name, sent, len(f), MaxTXFrags*limit, ErrFrameTooLarge)
			break
		}
		parts := uint32((len(f) + limit - 1) / limit)
		idx, got := s.tx.reserve(parts)
		if got < parts {
			s.tx.cancel(got)
			err = s.errRingFull
			break
		}
		fr := u.alloc(s.txFrags[:0:parts], st)
		if uint32(len(fr)) < parts {
			for _, fi := range fr {
				u.state[fi].Store(frameFree)
			}
			u.release(fr)
			s.tx.cancel(got)
			err = s.errNoFrames
			break
		}
		for i, fi := range fr {
			addr := uint64(fi)<<u.shift + uint64(u.cfg.Headroom)
			l := copy(u.area[addr:addr+uint64(limit)], f[i*limit:])
			d := Desc{Addr: addr, Len: uint32(l)}
			if i < len(fr)-1 {
				d.Options = unix.XDP_PKT_CONTD
			}
			*s.tx.at(idx + uint32(i)) = d
		}
		sent++
		if queued++; queued == cap(s.txScratch) {
			s.tx.submit()
			queued = 0
		}
	}
	if sent > 0 {
		s.tx.submit()
		s.txPackets.Add(uint64(sent))
		if kerr := s.kick(); kerr != nil {
			return sent, kerr
		}
	}
	return sent, err
}

// TransmitDescs submits frames the caller holds (from RecvBatch) to the TX
// ring without copying, for forwarding. Sent frames return to the free list
// when they complete. On a MultiBuffer socket a packet's descriptors keep
// their XDP_PKT_CONTD chaining, as RecvBatch returned them, and only whole
// packets are submitted. It returns how many descriptors it queued,
// descs[:n]; descs[n:] stay with the caller. The error is ErrRingFull when
// the ring filled up, or ErrInvalidDesc when a descriptor of the first
// packet not queued is not the caller's to send, or that packet is chained
// (XDP_PKT_CONTD) past the end of descs or on a socket without MultiBuffer.
func (s *Socket) TransmitDescs(descs []Desc) (int, error) {
	if len(descs) == 0 {
		return 0, nil
	}
	if err := s.lockTX(); err != nil {
		return 0, err
	}
	defer s.unlockTX()

	u := s.umem
	st := kernelState(frameTX, s.q.id)
	idx, got := s.tx.reserve(uint32(min(len(descs), 1<<31)))
	var err error
	// whole counts the descriptors up to the end of the last complete
	// packet: a descriptor with XDP_PKT_CONTD continues into the next one,
	// and the kernel would join whatever is submitted next to a packet cut
	// there (or, with the flag dropped, send each part as a packet).
	w, whole, pkts := uint32(0), uint32(0), 0
	for ; w < got; w++ {
		d := descs[w]
		contd := d.Options & unix.XDP_PKT_CONTD
		if contd != 0 && !s.sg {
			err = fmt.Errorf("xsk %s: TX: descriptor %d (addr %#x len %d) continues a multi-buffer packet (XDP_PKT_CONTD) on a socket without MultiBuffer; copy the packet with Transmit instead: %w",
				s.name, w, d.Addr, d.Len, ErrInvalidDesc)
			break
		}
		if u.Frame(d) == nil || !u.take(d.Addr>>u.shift, frameUser, st) {
			err = fmt.Errorf("xsk %s: TX: descriptor %d (addr %#x len %d): %w", s.name, w, d.Addr, d.Len, ErrInvalidDesc)
			break
		}
		*s.tx.at(idx + w) = Desc{Addr: d.Addr, Len: d.Len, Options: contd}
		if contd == 0 {
			whole = w + 1
			pkts++
		}
	}
	// The descriptors of a packet cut short stay the caller's.
	for _, d := range descs[whole:w] {
		u.state[d.Addr>>u.shift].Store(frameUser)
	}
	s.tx.cancel(got - whole)
	switch {
	case err != nil:
	case w == uint32(len(descs)) && whole < w:
		err = fmt.Errorf("xsk %s: TX: descriptor %d (addr %#x len %d) continues a packet (XDP_PKT_CONTD) past the last descriptor given; pass the packet's descriptors together: %w",
			s.name, w-1, descs[w-1].Addr, descs[w-1].Len, ErrInvalidDesc)
	case int(whole) < len(descs):
		err = s.errRingFull
	}
	if whole > 0 {
		s.tx.submit()
		// TXPackets counts packets, as Transmit's does, not the
		// descriptors a multi-buffer packet takes.
		s.txPackets.Add(uint64(pkts))
		if kerr := s.kick(); kerr != nil {
			return int(whole), kerr
		}
	}
	return int(whole), err
}

// Reclaim takes completed TX frames off the completion ring and returns
// them to the free list; it returns how many frames it freed (a completion
// naming a frame not in transmit is refused and not counted). Transmit
// does this itself.
func (s *Socket) Reclaim() (int, error) {
	if err := s.enter(); err != nil {
		return 0, err
	}
	defer s.exit()
	return s.reclaim(), nil
}

func (s *Socket) reclaim() int {
	s.compMu.Lock()
	defer s.compMu.Unlock()
	return s.umem.drainCompletions(s.q, s.comp)
}

// kick wakes the kernel's transmit path when it asks (need_wakeup), or
// always without need_wakeup. In copy mode the sendto itself transmits, at
// most 32 frames a call, and stops early when the completion ring or socket
// buffer is full, so kick repeats while that makes progress.
func (s *Socket) kick() error {
	for range s.maxKicks {
		if s.needWakeup && !s.tx.needsWakeup() {
			return nil
		}
		_, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(s.fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
		s.txWakeups.Add(1)
		if e != 0 && !transient(e) {
			return fmt.Errorf("xsk %s: wake TX: %w", s.name, e)
		}
		if s.mode == ModeZeroCopy || s.tx.unconsumed() == 0 {
			return nil
		}
		if s.reclaim() == 0 && e == 0 {
			return nil // stalled on a full completion ring: the next call retries
		}
	}
	return nil
}
