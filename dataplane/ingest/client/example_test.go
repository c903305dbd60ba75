package client_test

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/client"
	"github.com/lovelock-dpu/lovelock/dataplane/ingest/client/clienttest"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/memnet"
)

// Example sends one input to the checksum model and prints the result.
// A stand-in DPU on an in-memory network answers here; against a real
// one, open the transport with udp.Listen and give the DPU's address
// (the testbed's dpu2 is 10.77.0.12:61440).
func Example() {
	net := memnet.New(memnet.Options{MaxPayload: 1472})
	dpuEP, _ := net.Listen(netip.MustParseAddrPort("10.77.0.12:61440"))
	defer dpuEP.Close()
	dpu := clienttest.Start(dpuEP, clienttest.Options{})
	defer dpu.Close()

	tr, _ := net.Listen(netip.MustParseAddrPort("10.77.0.30:0"))
	defer tr.Close()
	c, err := client.New(tr, dpuEP.LocalAddr(), client.Options{Tenant: 1, Timeout: 50 * time.Millisecond})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	input := make([]byte, 10_000) // 8 datagrams of at most 1472 bytes
	for i := range input {
		input[i] = byte(i)
	}
	res, err := c.Infer(context.Background(), "checksum", input, 100*time.Millisecond)
	if err != nil {
		fmt.Println(err)
		return
	}
	st := c.Stats()
	fmt.Printf("output %x from slice %s on GPU %d\n", res.Output, res.Slice, res.GPU)
	fmt.Printf("%d request, %d datagrams sent\n", st.Requests, st.TxDatagrams)
	// Output:
	// output f86c130050c01f7e from slice ref@0 on GPU 0
	// 1 request, 8 datagrams sent
}
