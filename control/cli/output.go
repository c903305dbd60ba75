package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"text/tabwriter"

	ucli "github.com/urfave/cli/v2"

	"github.com/lovelock-dpu/lovelock/control/api"
)

// outputFlag is the --output flag of listing commands.
func outputFlag() ucli.Flag {
	return &ucli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "table", Usage: "output format: table or json"}
}

// wantJSON reads --output, refusing unknown formats.
func wantJSON(c *ucli.Context) (bool, error) {
	switch f := c.String("output"); f {
	case "table", "":
		return false, nil
	case "json":
		return true, nil
	default:
		return false, fmt.Errorf("--output %q: want table or json", f)
	}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

// socketFlag is the global --socket flag naming lovelockd's API socket.
func socketFlag() ucli.Flag {
	return &ucli.StringFlag{
		Name: "socket", Value: api.DefaultSocket, EnvVars: []string{"LOVELOCK_SOCKET"},
		Usage: "lovelockd's API socket (the daemon must be running; root only)",
	}
}

// client returns an API client for the --socket of the app.
func client(c *ucli.Context) *api.Client {
	for _, ctx := range c.Lineage() {
		if ctx.IsSet("socket") {
			return api.NewClient(ctx.String("socket"))
		}
	}
	return api.NewClient(c.String("socket"))
}

// uint32Flag reads a UintFlag that holds a 32-bit ID (a tenant, a region),
// refusing a value past 32 bits: converted, 4294967296 would be 0 (the
// infrastructure tenant) and 4294967297 region 1.
func uint32Flag(c *ucli.Context, name string) (uint32, error) {
	v := c.Uint(name)
	if v > math.MaxUint32 {
		return 0, fmt.Errorf("--%s %d: want 0 to %d", name, v, uint32(math.MaxUint32))
	}
	return uint32(v), nil
}
