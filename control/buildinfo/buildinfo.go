// Package buildinfo holds what the build stamps into every Lovelock binary:
// the CLI, lovelockd and the image's init share it.
package buildinfo

// Version is the build's version, set by the linker (-X) from `git describe`.
var Version = "dev"
