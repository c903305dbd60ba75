package testenv

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"runtime"
	"runtime/debug"
)

// UDPFrame is an Ethernet/IPv4/UDP frame from 10.0.0.1:5555 to
// 10.0.0.2:dport with a 4-byte payload: what steering tests run through
// the programs (BPF_PROG_RUN).
func UDPFrame(dport uint16) []byte {
	f := make([]byte, 14+20+8+4)
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:]
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(ip[2:], 20+8+4)
	copy(ip[12:], []byte{10, 0, 0, 1, 10, 0, 0, 2})
	udp := ip[20:]
	binary.BigEndian.PutUint16(udp[0:], 5555)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], 8+4)
	return f
}

// UDPFrames returns the Ethernet/IPv4 frames of a UDP datagram carrying
// payload from src to dst, in IP fragments of at most mtu bytes of IP
// packet as a sender's kernel cuts it (one frame when it fits): a first
// fragment with the UDP header, then fragments of datagram data alone.
// Addresses must be IPv4; the UDP checksum is 0 (none).
func UDPFrames(src, dst netip.AddrPort, payload []byte, mtu int) [][]byte {
	dgram := make([]byte, 8+len(payload))
	binary.BigEndian.PutUint16(dgram[0:], src.Port())
	binary.BigEndian.PutUint16(dgram[2:], dst.Port())
	binary.BigEndian.PutUint16(dgram[4:], uint16(len(dgram)))
	copy(dgram[8:], payload)
	per := (mtu - 20) &^ 7 // fragment data is cut at multiples of 8 bytes
	var frames [][]byte
	for off := 0; off < len(dgram); off += per {
		end := min(off+per, len(dgram))
		f := make([]byte, 14+20+end-off)
		binary.BigEndian.PutUint16(f[12:], 0x0800)
		ip := f[14:]
		ip[0], ip[8], ip[9] = 0x45, 64, 17
		binary.BigEndian.PutUint16(ip[2:], uint16(20+end-off))
		frag := uint16(off / 8)
		if end < len(dgram) {
			frag |= 0x2000 // more fragments
		}
		binary.BigEndian.PutUint16(ip[6:], frag)
		s4, d4 := src.Addr().As4(), dst.Addr().As4()
		copy(ip[12:], s4[:])
		copy(ip[16:], d4[:])
		copy(ip[20:], dgram[off:end])
		frames = append(frames, f)
	}
	return frames
}

// ReadByte reads b[i] from memory that may fault (a far-memory mapping
// whose chunk was poisoned raises SIGBUS): ok is false and fault the
// address when the read faulted. Any other panic goes on.
func ReadByte(b []byte, i int) (v byte, fault uintptr, ok bool) {
	fault, ok = faulting(func() { v = b[i] })
	return v, fault, ok
}

// WriteByte writes b[i] = v to memory that may fault, as ReadByte reads.
func WriteByte(b []byte, i int, v byte) (fault uintptr, ok bool) {
	return faulting(func() { b[i] = v })
}

// faulting runs access, turning a memory fault in it into ok false and the
// faulting address.
func faulting(access func()) (fault uintptr, ok bool) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		var ae interface{ Addr() uintptr }
		if e, isErr := r.(runtime.Error); isErr && errors.As(e, &ae) {
			fault, ok = ae.Addr(), false
			return
		}
		panic(r)
	}()
	access()
	return 0, true
}
