package messaging_test

import (
	"context"
	"fmt"
	"log"
	"net/netip"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
	"github.com/lovelock-dpu/lovelock/dataplane/transport"
	"github.com/lovelock-dpu/lovelock/dataplane/transport/udp"
)

// Two processes of one application on a host, with ranks 0-1 and 2-3,
// exchange messages through the node's routing agent (ModeHost; on a
// BlueField the agent runs on the DPU, ModeDPU, and only its address
// changes). Every process uses the same Config.
func ExampleClient() {
	loopback := netip.MustParseAddrPort("127.0.0.1:0")
	// Real deployments name fixed addresses in the config file; here the
	// sockets come first, so that the ports are free ones.
	agentSock, _ := udp.Listen(loopback, udp.Options{})
	sockA, _ := udp.Listen(loopback, udp.Options{})
	sockB, _ := udp.Listen(loopback, udp.Options{})

	cfg := messaging.Defaults()
	cfg.Mode = messaging.ModeHost
	cfg.Workers = 1
	cfg.Nodes = []messaging.Node{{
		Name:  "node0",
		Agent: agentSock.LocalAddr(),
		Clients: []messaging.ClientSpec{
			{Name: "a", Addr: sockA.LocalAddr(), Ranks: messaging.Range(0, 1)},
			{Name: "b", Addr: sockB.LocalAddr(), Ranks: messaging.Range(2, 3)},
		},
	}}

	agent, err := messaging.NewAgent(cfg, "node0", messaging.AgentOptions{Transports: []transport.Transport{agentSock}})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go agent.Run(ctx)

	a, err := messaging.NewClient(cfg, "node0", "a", messaging.ClientOptions{Transport: sockA})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()
	b, err := messaging.NewClient(cfg, "node0", "b", messaging.ClientOptions{Transport: sockB})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	// Send does not wait for the network: the messages are bundled and
	// leave when a bundle fills, its flush timeout passes, the sender
	// goes idle, or on Flush.
	for i, word := range []string{"fire", "and", "forget"} {
		if err := a.Send(uint32(2+i%2), []byte(word)); err != nil {
			log.Fatal(err)
		}
	}
	if err := a.Flush(ctx); err != nil {
		log.Fatal(err)
	}
	for range 3 {
		m, err := b.Recv(ctx)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("rank %d: %s\n", m.Rank, m.Payload)
	}
	// Unordered output:
	// rank 2: fire
	// rank 3: and
	// rank 2: forget
}
