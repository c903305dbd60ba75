// Package appliance is the Lovelock appliance: the lovelockd daemon that owns
// a DPU's data plane, its configuration, and how it is supervised on the card.
// This package holds what the daemon and the image share.
package appliance

// Version is the build's version, set by the linker (-X) from `git describe`.
var Version = "dev"
