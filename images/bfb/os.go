package bfb

import "strings"

// RshimBootPath is the UEFI device path of a kernel that comes in the rshim
// boot stream, as NVIDIA's build-bfb writes it for device "rshim".
const RshimBootPath = "VenHw(F019E406-8C9C-11E5-8797-001ACA00BFC4)/Image"

// Console arguments for the card's UARTs and the rshim console, as NVIDIA's
// build-bfb writes them ("--uart all") for BlueField-1/2 and as BlueField-3
// streams carry them. hvc0 exists only with the mlxbf-tmfifo driver.
const (
	ConsoleBF2 = "console=ttyAMA1 console=hvc0 console=ttyAMA0 earlycon=pl011,0x01000000 earlycon=pl011,0x01800000"
	ConsoleBF3 = "console=hvc0 console=ttyAMA0 earlycon=pl011,0x13010000"
)

// OS is an operating system to boot from the rshim boot stream: the images
// that follow the firmware in an OS stream such as NVIDIA's own.
type OS struct {
	// Kernel is an uncompressed arm64 Image (UEFI rejects gzip).
	Kernel []byte
	// Initramfs is the initial RAM filesystem (newc cpio, may be gzipped).
	Initramfs []byte
	// Description is the boot menu entry's title.
	Description string
	// ArgsBF2 and ArgsBF3 are the kernel command lines for BlueField-1/2
	// (boot-args version 0) and BlueField-3 (version 2). "initrd=initramfs"
	// makes UEFI hand the stream's initramfs to the kernel.
	ArgsBF2, ArgsBF3 string
}

// Images returns the OS's images in emit order: boot description, boot
// path, boot arguments v0 and v2, kernel and initramfs.
func (o OS) Images() []Image {
	return Merge(nil, []Image{
		{ID: IDBootDesc, Data: []byte(o.Description)},
		{ID: IDBootPath, Data: []byte(RshimBootPath)},
		{ID: IDBootArgs, Version: 0, Data: []byte(o.ArgsBF2)},
		{ID: IDBootArgs, Version: 2, Data: []byte(o.ArgsBF3)},
		{ID: IDImage, Data: o.Kernel},
		{ID: IDInitramfs, Data: o.Initramfs},
	})
}

// LovelockDescription is the boot description of a Lovelock image's stream;
// `lovelock image flash` reads the version back from it (LovelockVersion).
func LovelockDescription(version string) string { return "Lovelock " + version + " from rshim" }

// LovelockVersion returns the version of the Lovelock image a boot
// description names, and false for another OS's description.
func LovelockVersion(desc string) (string, bool) {
	v, ok := strings.CutPrefix(strings.TrimRight(desc, "\x00 \n"), "Lovelock ")
	if !ok {
		return "", false
	}
	v, ok = strings.CutSuffix(v, " from rshim")
	if !ok || v == "" || strings.Contains(v, " ") {
		return "", false
	}
	return v, true
}

// ReadyMessage is the line the Lovelock image's /init writes into the rshim
// log once lovelockd reports health ok. It names the version, so that the
// flash counts only the image it flashed as up, not an OS the card fell back
// to (NVIDIA's says plain "DPU is ready").
func ReadyMessage(version string) string { return "DPU is ready (Lovelock " + version + ")" }
