package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"text/tabwriter"

	ucli "github.com/urfave/cli/v2"
	"github.com/vishvananda/netns"

	llnetns "github.com/lovelock-dpu/lovelock/control/netns"
	"github.com/lovelock-dpu/lovelock/control/testbed"
)

// testbedPrefixEnv lets scripts (the Vagrant VM, CI) choose the prefix once.
const testbedPrefixEnv = "LOVELOCK_TESTBED_PREFIX"

// testbedCommand returns `lovelock testbed`: up, down, status and exec for
// the network-namespace testbed of package control/testbed.
func testbedCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "testbed",
		Usage: "build, inspect and tear down the local network-namespace testbed",
		Description: strings.TrimSpace(`
The testbed is a small Lovelock cluster on this machine: every node is a Linux
network namespace, wired by veth pairs and named as on a real BlueField card,
so one configuration works on both. Needs root.

` + testbedDrawing() + `

Nodes:
` + testbedNodeList() + `

Names: node N lives in the namespace <prefix>N (default prefix "ll-", so
ll-host0, ll-fabric), visible to 'ip netns list'. Interface names are the same
whatever the prefix: pf0hpf is the DPU's representor of its host's PCIe
function, p0 the DPU's uplink, eth0 a host's NIC, <node>-<iface> a port of the
fabric bridge br0. Addresses: fabric 10.77.0.0/24 (dpu0 .10, dpu1 .11, dpu2
.12, mem0 .20, client .30) and fd77::/64; host links 10.77.10-12.0/24 (host .1,
DPU .2) and fd77:10-12::/64. docs/testbed.md has the full plan.

'up' is safe to repeat and repairs a damaged testbed; 'down' removes the testbed
with exactly this prefix (not one whose prefix starts with it), also after a crash.`),
		Flags: []ucli.Flag{testbedPrefixFlag()},
		Subcommands: []*ucli.Command{
			trafficCommand(),
			{
				Name:  "up",
				Usage: "create the testbed, or repair it to match the plan (safe to repeat)",
				Description: "Creates the namespaces, veth pairs, bridge, addresses, routes and permanent\n" +
					"neighbour entries that are missing, replaces wrong ones, mounts bpffs on\n" +
					"/sys/fs/bpf if needed, and waits until every link has carrier.",
				Flags:  []ucli.Flag{testbedPrefixFlag()},
				Action: testbedUp,
			},
			{
				Name:  "down",
				Usage: "remove the testbed: its namespaces <prefix><node>, and its veths",
				Description: "Removes the /run/netns entries of the testbed with exactly this prefix (also\n" +
					"ones left by a crash or a half-built 'up'): <prefix><node> for its nodes, and\n" +
					"<prefix>* entries whose interfaces this tool marked as the prefix's, but not\n" +
					"those of a testbed whose prefix starts with this one (ll-x- beside ll-); then\n" +
					"any veth marked as the prefix's in the root namespace. Safe to repeat.\n" +
					"Processes still running inside a node keep running.",
				Flags:  []ucli.Flag{testbedPrefixFlag()},
				Action: testbedDown,
			},
			{
				Name:  "status",
				Usage: "show nodes, interfaces, addresses, and what is missing",
				Description: "Compares what exists with the plan. The table lists each node's interfaces\n" +
					"(PEER is the other end of the veth); --output json adds loopback and raw\n" +
					"states. The first line says complete, absent, or what is missing.",
				Flags: []ucli.Flag{
					testbedPrefixFlag(),
					&ucli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "table", Usage: "output format: table or json"},
				},
				Action: testbedStatus,
			},
			{
				Name:      "exec",
				Usage:     "run a command inside a node: exec NODE -- COMMAND [ARG...]",
				ArgsUsage: "NODE -- COMMAND [ARG...]",
				Description: "Replaces this process with COMMAND (looked up in PATH) running in NODE's\n" +
					"network namespace, e.g.\n\n" +
					"   lovelock testbed exec host0 -- ping -c1 10.77.11.1\n" +
					"   lovelock testbed exec dpu0 -- ip -br addr\n\n" +
					"Unlike 'ip netns exec', it keeps this machine's mount namespace, so\n" +
					"/sys/fs/bpf (bpffs) and its pins stay visible inside the node.\n" +
					"NODE is one of: " + strings.Join(testbed.DefaultSpec().NodeNames(), ", ") + ".",
				Flags:  []ucli.Flag{testbedPrefixFlag()},
				Action: testbedExec,
			},
		},
	}
}

func testbedPrefixFlag() ucli.Flag {
	return &ucli.StringFlag{
		Name:    "prefix",
		Value:   testbed.DefaultPrefix,
		Usage:   "namespace-name prefix: node N lives in namespace <prefix>N",
		EnvVars: []string{testbedPrefixEnv},
	}
}

func testbedDrawing() string {
	return `   host0 ──(eth0 ⇄ pf0hpf)── dpu0 ──(p0 ⇄ dpu0-p0)──────────┐  fabric: bridge br0,
   host1 ──(eth0 ⇄ pf0hpf)── dpu1 ──(p0 ⇄ dpu1-p0)──────────┤  the top-of-rack switch
   gpu0  ──(eth0 ⇄ pf0hpf)── dpu2 ──(p0 ⇄ dpu2-p0)──────────┤
                             mem0 ──(eth0 ⇄ mem0-eth0)──────┤
                           client ──(eth0 ⇄ client-eth0)────┘`
}

func testbedNodeList() string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, n := range testbed.DefaultSpec().Nodes {
		fmt.Fprintf(tw, "   %s\t%s\n", n.Name, n.Description)
	}
	tw.Flush()
	return strings.TrimRight(b.String(), "\n")
}

// testbedSpec returns the default testbed with the prefix given on the
// subcommand, on `testbed`, or in the environment, in that order.
func testbedSpec(c *ucli.Context) testbed.Spec {
	spec := testbed.DefaultSpec()
	for _, cc := range c.Lineage() {
		if cc.Command != nil && cc.IsSet("prefix") {
			spec.Prefix = cc.String("prefix")
			break
		}
	}
	return spec
}

func testbedUp(c *ucli.Context) error {
	spec := testbedSpec(c)
	if err := testbed.Up(c.Context, spec); err != nil {
		// Up stops at the first failure and leaves what it built: say
		// how to remove it, with the prefix the user gave.
		if st, serr := testbed.Status(spec); serr == nil && nodesPresent(st) > 0 {
			return fmt.Errorf("%w; testbed %s is half-built (%d of %d nodes): run 'lovelock testbed%s down' to remove it, or 'up' again once the cause is fixed",
				err, spec.Prefix, nodesPresent(st), len(st.Nodes), testbedPrefixArg(spec.Prefix))
		}
		return err
	}
	host1, _ := spec.NodeAddr("host1")
	fmt.Fprintf(c.App.Writer, "testbed %s: up (%d nodes, %d links)\ntry: lovelock testbed%s exec host0 -- ping -c1 %s\n",
		spec.Prefix, len(spec.Nodes), len(spec.Links), testbedPrefixArg(spec.Prefix), host1)
	return nil
}

func testbedDown(c *ucli.Context) error {
	spec := testbedSpec(c)
	if err := testbed.Down(c.Context, spec); err != nil {
		return err
	}
	fmt.Fprintf(c.App.Writer, "testbed %s: down\n", spec.Prefix)
	return nil
}

func testbedPrefixArg(prefix string) string {
	if prefix == testbed.DefaultPrefix {
		return ""
	}
	return " --prefix " + prefix
}

func testbedStatus(c *ucli.Context) error {
	format := c.String("output")
	if format != "table" && format != "json" {
		return fmt.Errorf("testbed status: unknown --output %q: want table or json", format)
	}
	st, err := testbed.Status(testbedSpec(c))
	if err != nil {
		return err
	}
	if format == "json" {
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		if err := enc.Encode(st); err != nil {
			return err
		}
	} else if err := writeTestbedTable(c.App.Writer, st); err != nil {
		return err
	}
	return statusErr(st)
}

// ErrTestbedNotUp is what `testbed status` returns, after printing its
// report, when the testbed is absent or incomplete: the exit status says
// whether the testbed is usable.
var ErrTestbedNotUp = errors.New("testbed not up")

func statusErr(st testbed.Report) error {
	if st.Complete {
		return nil
	}
	if nodesPresent(st) == 0 {
		return fmt.Errorf("testbed %s is absent: %w (run 'lovelock testbed%s up')", st.Prefix, ErrTestbedNotUp, testbedPrefixArg(st.Prefix))
	}
	return fmt.Errorf("testbed %s is incomplete, %d problems: %w (run 'lovelock testbed%s up' to repair it)",
		st.Prefix, len(st.Problems), ErrTestbedNotUp, testbedPrefixArg(st.Prefix))
}

func nodesPresent(st testbed.Report) int {
	n := 0
	for _, node := range st.Nodes {
		if node.Present {
			n++
		}
	}
	return n
}

// writeTestbedTable prints one row per interface (loopback left out), grouped
// by node, then what is missing.
func writeTestbedTable(w io.Writer, st testbed.Report) error {
	fmt.Fprintln(w, st.Summary())
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tROLE\tNAMESPACE\tIFACE\tSTATE\tMAC\tPEER\tADDRESSES")
	for _, n := range st.Nodes {
		if !n.Present {
			fmt.Fprintf(tw, "%s\t%s\t%s\t-\tabsent\t\t\t\n", n.Name, n.Role, n.Namespace)
			continue
		}
		first := true
		for _, ifc := range n.Interfaces {
			if ifc.Name == "lo" {
				continue
			}
			name, role, ns := "", "", ""
			if first {
				name, role, ns = n.Name, string(n.Role), n.Namespace
				first = false
			}
			state := ifc.OperState
			if !ifc.Up {
				state = "admin-down"
			}
			addrs := strings.Join(ifc.Addresses, ",")
			if ifc.Master != "" {
				addrs = "port of " + ifc.Master
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, role, ns, ifc.Name, state, ifc.MAC, testbedDash(ifc.Peer), testbedDash(addrs))
		}
		if first {
			fmt.Fprintf(tw, "%s\t%s\t%s\t-\tempty\t\t\t\n", n.Name, n.Role, n.Namespace)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(st.Problems) > 0 {
		fmt.Fprintf(w, "\nmissing or wrong (run 'lovelock testbed%s up' to repair):\n", testbedPrefixArg(st.Prefix))
		for _, p := range st.Problems {
			fmt.Fprintf(w, "  %s\n", p)
		}
	}
	return nil
}

func testbedDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// testbedExec replaces the process with the command, inside the node's
// network namespace. It enters the namespace with setns on a locked thread
// and calls execve from that thread, which is all a namespace switch needs:
// unlike `ip netns exec` it does not unshare the mount namespace and remount
// /sys, so bpffs at /sys/fs/bpf stays as it is.
func testbedExec(c *ucli.Context) error {
	const usage = "usage: lovelock testbed exec NODE -- COMMAND [ARG...]  (e.g. lovelock testbed exec host0 -- ping -c1 10.77.11.1)"
	args := c.Args().Slice()
	if len(args) == 0 {
		return errors.New("testbed exec: no node given; " + usage)
	}
	spec := testbedSpec(c)
	node := args[0]
	if _, err := spec.Node(node); err != nil {
		return fmt.Errorf("testbed exec: %w", err)
	}
	if len(args) < 2 || args[1] != "--" {
		return errors.New("testbed exec: put -- between the node and the command; " + usage)
	}
	argv := args[2:]
	if len(argv) == 0 {
		return errors.New("testbed exec: no command after --; " + usage)
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return fmt.Errorf("testbed exec: %w", err)
	}
	nsName := spec.Namespace(node)
	ns, err := netns.GetFromName(nsName)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("testbed exec: node %s: namespace %s does not exist; run 'lovelock testbed%s up' first", node, nsName, testbedPrefixArg(spec.Prefix))
		}
		return fmt.Errorf("testbed exec: node %s: %w", node, err)
	}
	defer ns.Close()
	// On success Exec does not return: the new program inherits this
	// thread's network namespace. On failure Do puts the thread back.
	err = llnetns.Do(ns, func() error {
		return syscall.Exec(path, argv, os.Environ())
	})
	return fmt.Errorf("testbed exec: node %s: %s: %w", node, path, err)
}
