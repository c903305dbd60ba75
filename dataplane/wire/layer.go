package wire

import (
	"sync"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// layerTypeNumber is LayerTypeLovelock's number: "LL" in ASCII, outside
// gopacket's reserved 0-999 and its shared application range 1000-1999.
const layerTypeNumber = 0x4c4c

// LayerTypeLovelock is the gopacket layer type of the Lovelock header. Its
// number is fixed, so Lovelock layers serialize and a DecodingLayerParser
// decodes them without registration; gopacket learns its name and decoder,
// and UDP to DefaultPort decodes as it, once RegisterLayer has run.
const LayerTypeLovelock = gopacket.LayerType(layerTypeNumber)

var registerOnce sync.Once

// RegisterLayer registers LayerTypeLovelock with gopacket (its name and its
// decoder) and makes UDP to or from DefaultPort decode as Lovelock. Only
// programs that decode captures call it (lovelock capture, tests): importing
// wire changes no gopacket table, so the data plane's binaries carry no
// registration they do not use and no other package's layer number can
// collide with ours at start-up. It may be called more than once; gopacket
// keeps its tables in unsynchronised global maps, so call it during
// start-up, before any goroutine decodes packets.
func RegisterLayer() {
	registerOnce.Do(func() {
		gopacket.RegisterLayerType(layerTypeNumber, gopacket.LayerTypeMetadata{
			Name:    "Lovelock",
			Decoder: gopacket.DecodeFunc(decodeLovelock),
		})
		layers.RegisterUDPPortLayerType(layers.UDPPort(DefaultPort), LayerTypeLovelock)
	})
}

// RegisterPort makes gopacket decode UDP packets to or from port as Lovelock
// (gopacket's UDP decoder looks at the destination port first, then the
// source port), registering the layer first (RegisterLayer). Call it for a
// configured port other than DefaultPort, during start-up, as RegisterLayer.
func RegisterPort(port uint16) {
	RegisterLayer()
	layers.RegisterUDPPortLayerType(layers.UDPPort(port), LayerTypeLovelock)
}

// Lovelock is the Lovelock header as a gopacket layer. It is a Layer, a
// DecodingLayer and a SerializableLayer; its payload is the service payload,
// which decodes as gopacket.LayerTypePayload.
type Lovelock struct {
	layers.BaseLayer
	Header
}

var (
	_ gopacket.Layer             = (*Lovelock)(nil)
	_ gopacket.DecodingLayer     = (*Lovelock)(nil)
	_ gopacket.SerializableLayer = (*Lovelock)(nil)
)

// LayerType returns LayerTypeLovelock.
func (l *Lovelock) LayerType() gopacket.LayerType { return LayerTypeLovelock }

// CanDecode returns LayerTypeLovelock.
func (l *Lovelock) CanDecode() gopacket.LayerClass { return LayerTypeLovelock }

// NextLayerType returns gopacket.LayerTypePayload: the service payload is
// opaque to this layer.
func (l *Lovelock) NextLayerType() gopacket.LayerType { return gopacket.LayerTypePayload }

// DecodeFromBytes decodes data, the UDP payload, with Decode: a header that
// Decode rejects is an error here too, so a capture shows why a packet is
// malformed. A payload cut short by the capture length fails ErrBadLength;
// df is told the packet is truncated when data is shorter than a header.
func (l *Lovelock) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	h, payload, err := Decode(data)
	if err != nil {
		if StatusOf(err) == StatusTruncated {
			df.SetTruncated()
		}
		return err
	}
	l.Header = h
	l.BaseLayer = layers.BaseLayer{Contents: data[:HeaderLen], Payload: payload}
	return nil
}

// SerializeTo prepends the header to the bytes already in b. With
// opts.FixLengths, Length is set to the length of those bytes first (and
// stays set in l); otherwise l.Length is written as is, which lets tests
// build packets with a wrong length.
func (l *Lovelock) SerializeTo(b gopacket.SerializeBuffer, opts gopacket.SerializeOptions) error {
	payloadLen := len(b.Bytes())
	dst, err := b.PrependBytes(HeaderLen)
	if err != nil {
		return err
	}
	if opts.FixLengths {
		l.Length = uint32(payloadLen)
	}
	l.Header.put(dst)
	return nil
}

func decodeLovelock(data []byte, p gopacket.PacketBuilder) error {
	l := &Lovelock{}
	if err := l.DecodeFromBytes(data, p); err != nil {
		return err
	}
	p.AddLayer(l)
	return p.NextDecoder(l.NextLayerType())
}
