package main

import (
	ucli "github.com/urfave/cli/v2"

	"github.com/lovelock-dpu/lovelock/control/attach"
)

// interfaceFlags turns --xdp, --xdp-generic and --tc-egress into attachments.
func interfaceFlags(c *ucli.Context) []attach.Attachment {
	var out []attach.Attachment
	for _, name := range c.StringSlice("xdp") {
		out = append(out, attach.Attachment{Iface: name, Hook: attach.HookXDP, Mode: attach.ModeNative})
	}
	for _, name := range c.StringSlice("xdp-generic") {
		out = append(out, attach.Attachment{Iface: name, Hook: attach.HookXDP, Mode: attach.ModeGeneric})
	}
	for _, name := range c.StringSlice("tc-egress") {
		out = append(out, attach.Attachment{Iface: name, Hook: attach.HookTCEgress})
	}
	return out
}
