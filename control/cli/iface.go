package cli

import (
	"errors"
	"fmt"
	"strings"

	ucli "github.com/urfave/cli/v2"

	"github.com/lovelock-dpu/lovelock/control/attach"
)

func ifaceCommand() *ucli.Command {
	hookFlag := &ucli.StringFlag{Name: "hook", Value: string(attach.HookXDP), Usage: "where the classifier runs: xdp, tc-ingress or tc-egress (host-originated packets)"}
	return &ucli.Command{
		Name:  "iface",
		Usage: "attach the steering classifier to interfaces, detach it, list attachments",
		Description: "Attachments are BPF links pinned by lovelockd: they keep classifying while the daemon\n" +
			"restarts. XDP runs in native (driver) mode unless --mode generic is given; TC hooks see\n" +
			"skbs, e.g. host-originated packets on tc-egress.",
		Subcommands: []*ucli.Command{
			{
				Name:   "list",
				Usage:  "list attached interface hooks",
				Flags:  []ucli.Flag{outputFlag()},
				Action: ifaceList,
			},
			{
				Name:      "attach",
				Usage:     "attach the classifier to an interface (idempotent)",
				ArgsUsage: "IFACE",
				Flags: []ucli.Flag{hookFlag,
					&ucli.StringFlag{Name: "mode", Usage: "XDP: native (default) or generic for drivers without XDP; TC: tcx (kernel 6.6+) or clsact (default: tcx where the kernel has it)"}},
				Action: ifaceAttach,
			},
			{
				Name:      "detach",
				Usage:     "detach the classifier from an interface hook, or from all with --all",
				ArgsUsage: "IFACE | --all",
				Flags:     []ucli.Flag{hookFlag, &ucli.BoolFlag{Name: "all", Usage: "detach every attachment"}},
				Action:    ifaceDetach,
			},
		},
	}
}

func ifaceList(c *ucli.Context) error {
	asJSON, err := wantJSON(c)
	if err != nil {
		return err
	}
	list, err := client(c).Attachments(c.Context)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(c.App.Writer, list)
	}
	// A pin is not a running program: say what the kernel runs.
	state := map[attach.Attachment]string{}
	if st, err := client(c).Status(c.Context); err == nil {
		for _, l := range st.Links {
			key := attach.Attachment{Iface: l.Iface, Hook: l.Hook, Mode: l.Mode}
			if l.Live {
				state[key] = "running"
			} else {
				state[key] = "NOT RUNNING (see 'lovelock status')"
			}
		}
	}
	tw := newTable(c.App.Writer)
	fmt.Fprintln(tw, "IFACE\tHOOK\tVIA\tSTATE")
	for _, a := range list {
		via := "link"
		if a.Mode == attach.ModeClsact {
			via = "clsact filter"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", a.Iface, a.Hook, via, dash(state[a]))
	}
	return tw.Flush()
}

func oneIface(c *ucli.Context) (string, error) {
	if c.NArg() == 0 {
		return "", fmt.Errorf("%s: want exactly one interface name (see --help)", c.Command.FullName())
	}
	if err := checkArgs(c, 1); err != nil {
		return "", err
	}
	return c.Args().First(), nil
}

func ifaceAttach(c *ucli.Context) error {
	name, err := oneIface(c)
	if err != nil {
		return err
	}
	hook, err := attach.ParseHook(c.String("hook"))
	if err != nil {
		return err
	}
	a := attach.Attachment{Iface: name, Hook: hook, Mode: attach.Mode(c.String("mode"))}
	if err := a.Validate(); err != nil {
		return err
	}
	res, err := client(c).Attach(c.Context, a)
	if err != nil {
		return err
	}
	if res.Adopted {
		fmt.Fprintf(c.App.Writer, "%s %s: already attached\n", name, hook)
	} else {
		fmt.Fprintf(c.App.Writer, "%s %s: attached\n", name, hook)
	}
	return nil
}

func ifaceDetach(c *ucli.Context) error {
	cl := client(c)
	if c.Bool("all") {
		if c.NArg() != 0 {
			return errors.New("iface detach: --all takes no interface name")
		}
		list, err := cl.Attachments(c.Context)
		if err != nil {
			return err
		}
		// One attachment that cannot be detached must not keep the
		// others attached: go on, and report every failure at the end.
		var failed []string
		for _, a := range list {
			if err := cl.Detach(c.Context, a.Iface, a.Hook); err != nil {
				failed = append(failed, fmt.Sprintf("%s %s: %v", a.Iface, a.Hook, err))
				continue
			}
			fmt.Fprintf(c.App.Writer, "%s %s: detached\n", a.Iface, a.Hook)
		}
		if len(failed) > 0 {
			return fmt.Errorf("iface detach --all: %d of %d attachments not detached (the others were; see 'lovelock iface list'):\n  %s",
				len(failed), len(list), strings.Join(failed, "\n  "))
		}
		return nil
	}
	name, err := oneIface(c)
	if err != nil {
		return err
	}
	hook, err := attach.ParseHook(c.String("hook"))
	if err != nil {
		return err
	}
	if err := cl.Detach(c.Context, name, hook); err != nil {
		return err
	}
	fmt.Fprintf(c.App.Writer, "%s %s: detached\n", name, hook)
	return nil
}
