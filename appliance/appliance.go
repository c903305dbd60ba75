// Package appliance is the Lovelock appliance: the lovelockd daemon that owns
// a DPU's data plane (daemon), its configuration (config), the frame its
// services plug into (service), and how it is supervised on the card. The
// build's version lives in control/buildinfo, below every binary that
// prints it.
package appliance
