package farmem

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/wire"
)

// packer builds the datagrams of one batch: records for several peers,
// packed greedily, several per datagram where they fit, into datagrams of
// at most max bytes per (peer, tenant, type); data too large for the room
// left is split into FragUnit-aligned fragments. It reuses its buffers from
// batch to batch, so a steady sender does not allocate.
type packer struct {
	max   int
	floor uint64
	flags wire.Flags // header flags of datagrams opened from now on
	seq   uint32
	out   []transport.Packet
	open  []openDgram
	spare [][]byte
}

type openDgram struct {
	addr   netip.AddrPort
	tenant uint32
	typ    wire.Type
	idx    int // into out
}

func newPacker(max int) *packer {
	if max > 65507 {
		max = 65507
	}
	return &packer{max: max}
}

// room is the most data bytes one record can carry in an empty datagram.
func (p *packer) room() int { return p.max - wire.HeaderLen - PreambleLen - RecordHdrLen }

// dgram returns the index in out of the open datagram for the key with
// at least need bytes free, opening a new one if there is none.
func (p *packer) dgram(addr netip.AddrPort, tenant uint32, typ wire.Type, region uint32, need int) int {
	for i := range p.open {
		o := &p.open[i]
		if o.addr == addr && o.tenant == tenant && o.typ == typ {
			if p.max-len(p.out[o.idx].Data) >= need {
				return o.idx
			}
			p.open[i] = p.open[len(p.open)-1]
			p.open = p.open[:len(p.open)-1]
			break
		}
	}
	var b []byte
	if n := len(p.spare); n > 0 {
		b, p.spare = p.spare[n-1][:0], p.spare[:n-1]
	} else {
		b = make([]byte, 0, p.max)
	}
	p.seq++
	h := wire.Header{Version: wire.Version, Type: typ, Flags: p.flags, Tenant: tenant, Dst: region, Seq: p.seq}
	b = h.AppendTo(b, nil)
	b = binary.BigEndian.AppendUint64(b, p.floor)
	p.out = append(p.out, transport.Packet{Addr: addr, Data: b})
	p.open = append(p.open, openDgram{addr, tenant, typ, len(p.out) - 1})
	return len(p.out) - 1
}

// add packs r (r.Data is ignored) with data, fragmenting data when frag is
// set; otherwise the record must fit one datagram.
func (p *packer) add(addr netip.AddrPort, tenant uint32, typ wire.Type, r Record, data []byte, frag bool) error {
	if !frag || len(data) == 0 {
		if len(data) > p.room() {
			return fmt.Errorf("%w: %v record of %d data bytes exceeds a %d-byte datagram", ErrBadRequest, r.Op, len(data), p.max)
		}
		dst := r.Region
		if r.Op == OpCreate && typ != wire.TypeMemReply {
			dst = 0 // a create request's region holds half its nonce
		}
		i := p.dgram(addr, tenant, typ, dst, RecordHdrLen+len(data))
		p.put(i, &r, data)
		return nil
	}
	base := r.Frag
	for off := 0; off < len(data); {
		i := p.dgram(addr, tenant, typ, r.Region, RecordHdrLen+min(FragUnit, len(data)-off))
		free := p.max - len(p.out[i].Data) - RecordHdrLen
		n := len(data) - off
		if n > free {
			n = free - free%FragUnit
		}
		r.Frag = base + uint32(off)
		p.put(i, &r, data[off:off+n])
		off += n
	}
	return nil
}

func (p *packer) put(i int, r *Record, data []byte) {
	d := p.out[i].Data
	n := len(d)
	d = d[:n+RecordHdrLen]
	putRecordHdr(d[n:], r, len(data))
	d = append(d, data...)
	binary.BigEndian.PutUint32(d[wire.OffsetLength:], uint32(len(d)-wire.HeaderLen))
	p.out[i].Data = d
}

// flush sends every datagram packed and returns how many datagrams and
// bytes went out: not the ones the transport refused, nor those left when
// it closed.
func (p *packer) flush(tr transport.Transport) (pkts, bytes int, err error) {
	if len(p.out) == 0 {
		return 0, 0, nil
	}
	var refused, refusedBytes int
	pkts, err = transport.SendAll(tr, p.out, func(pk transport.Packet, _ error) {
		refused++
		refusedBytes += len(pk.Data)
	})
	for i, o := range p.out {
		if i < pkts+refused { // SendAll went this far: sent or refused
			bytes += len(o.Data)
		}
		p.spare = append(p.spare, o.Data)
	}
	bytes -= refusedBytes
	clear(p.out)
	p.out = p.out[:0]
	p.open = p.open[:0]
	return pkts, bytes, err
}
