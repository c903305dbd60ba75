package trace

import (
	"fmt"
	"io"
	"os"

	"github.com/lovelock-dpu/lovelock/dataplane/ingest/sched"
)

// NodeColumns are the columns of openb_node_list_*.csv.
var NodeColumns = []string{"sn", "cpu_milli", "memory_mib", "gpu", "model"}

// Node is one row of an openb node list.
type Node struct {
	Name      string
	CPUMilli  int
	MemoryMiB int
	GPUs      int
	Model     string // V100M16, T4, G2, …: none of them MIG-capable
	Line      int
}

// LoadNodes reads a node list file.
func LoadNodes(path string) ([]Node, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("node list: %w", err)
	}
	defer f.Close()
	nodes, err := ReadNodes(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return nodes, nil
}

// ReadNodes reads a node list; errors name the line and column.
func ReadNodes(r io.Reader) ([]Node, error) {
	var nodes []Node
	err := table(r, NodeColumns, func(line int, get func(string) string) error {
		n := Node{Name: get("sn"), Model: get("model"), Line: line}
		for _, f := range []struct {
			name string
			dst  *int
		}{{"cpu_milli", &n.CPUMilli}, {"memory_mib", &n.MemoryMiB}, {"gpu", &n.GPUs}} {
			v, err := intField(get, f.name, false)
			if err != nil {
				return err
			}
			*f.dst = int(v)
		}
		nodes = append(nodes, n)
		return nil
	})
	return nodes, err
}

// Fleet turns the GPUs of nodes into a fleet of card: the trace's GPU models
// (V100, T4, …) have no MIG, so each of their GPUs stands for one MIG card of
// the chosen type. Nodes without GPUs are left out.
func Fleet(nodes []Node, card string) ([]sched.Fleet, error) {
	n := 0
	for _, nd := range nodes {
		n += nd.GPUs
	}
	if n == 0 {
		return nil, fmt.Errorf("node list: no GPUs in %d nodes", len(nodes))
	}
	return []sched.Fleet{{Card: card, Count: n}}, nil
}
