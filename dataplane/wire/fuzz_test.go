package wire

import (
	"bytes"
	"testing"
)

// FuzzDecode: Decode never panics; what it accepts re-encodes to the same
// bytes; what it rejects wraps one of its four sentinels. The seed corpus is
// in testdata/fuzz/FuzzDecode; wirelayer's FuzzLayer holds the gopacket layer
// to Decode on the same corpus.
func FuzzDecode(f *testing.F) {
	f.Add(llBytes(TypeBundle, FlagAckReq, 3))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, payload, err := Decode(b)

		if err != nil {
			switch StatusOf(err) {
			case StatusTruncated, StatusBadVersion, StatusBadLength, StatusUnknownType:
			default:
				t.Fatalf("error %v wraps none of Decode's sentinels", err)
			}
			return
		}
		if h.Version != Version || !h.Type.Known() || int(h.Length) != len(payload) {
			t.Fatalf("accepted %+v with %d payload bytes", h, len(payload))
		}
		if got := h.AppendTo(nil, payload); !bytes.Equal(got, b) {
			t.Fatalf("re-encoded:\n got % x\nwant % x", got, b)
		}
	})
}
