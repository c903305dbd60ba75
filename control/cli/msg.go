package cli

import (
	"fmt"
	"strconv"

	ucli "github.com/urfave/cli/v2"
)

func msgCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "msg",
		Usage: "the messaging service (Buddy): small messages aggregated and routed by the DPU's agent",
		Description: "lovelockd runs the routing agent when its config names a messaging cluster file\n" +
			"(--msg-cluster, --msg-node; --msg-transport xdp --msg-iface IFACE for AF_XDP); docs/messaging.md\n" +
			"describes the service, its file and knobs.",
		Subcommands: []*ucli.Command{{
			Name:  "stats",
			Usage: "per destination: bytes, messages, bundles, average bundle size, flush reasons; drops",
			Flags: []ucli.Flag{outputFlag()},
			Action: func(c *ucli.Context) error {
				asJSON, err := wantJSON(c)
				if err != nil {
					return err
				}
				st, err := client(c).MsgStats(c.Context)
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(c.App.Writer, st)
				}
				w := c.App.Writer
				fmt.Fprintf(w, "%s %s, mode %s, %d workers, transfer size %d bytes\n\n", st.Role, st.Node, st.Mode, st.Workers, st.TransferSize)
				tw := newTable(w)
				fmt.Fprintln(tw, "DESTINATION\tADDR\tBYTES\tMESSAGES\tBUNDLES\tAVG BUNDLE\tFULL\tTIMEOUT\tIDLE\tEXPLICIT\tRETRANSMITS\tBLOCKED\tPROBES\tPEER RESETS\tPEER")
				for _, d := range st.Destinations {
					peer := "up"
					if d.PeerDead {
						peer = "dead" // silent for peer_timeout: its messages are dropped until it answers a probe
					}
					avg := "-" // no bundle, no average
					if d.Bundles > 0 {
						avg = fmt.Sprintf("%.0f", d.AvgBundleBytes)
					}
					fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", d.Name, d.Addr, d.Bytes, d.Messages, d.Bundles,
						avg, d.Flushes.Full, d.Flushes.Timeout, d.Flushes.Idle, d.Flushes.Explicit, d.Retransmits, d.Blocked, d.Probes, d.PeerResets, peer)
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				r := st.Received
				fmt.Fprintf(w, "\nreceived: %d bundles, %d messages, %d bytes, %d duplicates", r.Bundles, r.Messages, r.Bytes, r.Duplicates)
				if r.Refused > 0 {
					fmt.Fprintf(w, ", %d refused while draining (sent again to the next run)", r.Refused)
				}
				if r.Unconfirmed > 0 {
					fmt.Fprintf(w, ", %d refused until the sender confirmed the link's start (sent again)", r.Unconfirmed)
				}
				fmt.Fprintln(w)
				dr := st.Drops
				// Every counter that Total sums, so that the parts add up.
				fmt.Fprintf(w, "drops: %d in all: malformed %d, bad bundle %d, bad credit %d, unknown rank %d, wrong tenant %d, "+
					"wrong dest %d, out of window %d, oversize %d, orphans %d, too many links %d, stale gap %d, dead peer %d, send errors %d, mailbox %d, closed %d\n",
					dr.Total(), dr.Malformed, dr.BadBundle, dr.BadCredit, dr.UnknownRank, dr.WrongTenant, dr.WrongDest, dr.OutOfWindow,
					dr.Oversize, dr.Orphans, dr.TooManyLinks, dr.StaleGap, dr.DeadPeer, dr.SendErrors, dr.Mailbox, dr.Closed)
				if len(st.Transport) > 0 {
					fmt.Fprintln(w, "\ntransport (xsk: AF_XDP sockets; kernel: what XDP passed to the stack, and what no AF_XDP socket could send):")
					tw := newTable(w)
					fmt.Fprintln(tw, "WORKER\tPATH\tIFACE\tQUEUE\tMODE\tRX\tTX\tTX FALLBACK\tDROPPED")
					for _, p := range st.Transport {
						iface, queue, mode := p.Interface, strconv.Itoa(p.Queue), p.Mode
						if p.MultiBuffer {
							mode += "+sg" // XDP_USE_SG: datagrams up to the MTU
						}
						if p.Path != "xsk" {
							iface, queue, mode = "-", "-", "-"
						}
						fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\n", p.Worker, p.Path, iface, queue, mode, p.RX, p.TX, p.TXFallback, p.Dropped)
					}
					if err := tw.Flush(); err != nil {
						return err
					}
				}
				for _, d := range st.TransportDegraded {
					fmt.Fprintf(w, "transport degraded: %s\n", d)
				}
				return nil
			},
		}},
	}
}
