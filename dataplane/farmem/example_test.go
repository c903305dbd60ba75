package farmem_test

import (
	"context"
	"fmt"
	"log"
	"net/netip"
	"os"
	"time"

	"github.com/lovelock-dpu/lovelock/dataplane/farmem"
)

// A host process allocates a far-memory region through its DPU agent,
// writes and reads it through the explicit API, and makes the writes
// durable with Sync. Here the memory node, the agent and the client share
// one process on loopback; on the testbed they run on mem0, dpu0 and host0.
func ExampleClient() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	state, _ := os.MkdirTemp("", "farmem-example")
	defer os.RemoveAll(state)

	server, err := farmem.NewServer(farmem.ServerOptions{
		StateDir: state, Capacity: 1 << 30, Addr: netip.MustParseAddrPort("127.0.0.1:0"),
	})
	if err != nil {
		log.Fatal(err)
	}
	go server.Run(ctx)

	agent, err := farmem.NewAgent(farmem.AgentConfig{
		Listen:  netip.MustParseAddrPort("127.0.0.1:0"),
		Servers: []farmem.ServerSpec{{Addr: server.Addr()}},
	}, farmem.AgentOptions{})
	if err != nil {
		log.Fatal(err)
	}
	go agent.Run(ctx)

	client, err := farmem.NewClient(farmem.ClientOptions{Server: agent.Addr(), Tenant: 1})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	region, err := client.Alloc(ctx, 1<<20) // 1 MiB, this process its writer
	if err != nil {
		log.Fatal(err)
	}
	defer region.Close()
	if _, err := region.WriteAt([]byte("far away"), 200_000); err != nil {
		log.Fatal(err)
	}
	if err := region.Sync(); err != nil {
		log.Fatal(err)
	}
	buf := make([]byte, 8)
	if _, err := region.ReadAt(buf, 200_000); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s (region of %d bytes)\n", buf, region.Size())
	// Output: far away (region of 1048576 bytes)
}
