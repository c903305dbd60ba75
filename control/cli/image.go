package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/lovelock-dpu/lovelock/images/bfb"
	"github.com/lovelock-dpu/lovelock/images/flash"
)

// imageCommand is `lovelock image`: reading BlueField boot streams and
// flashing them onto a card through its rshim. Building images is
// `make image` (images/cmd/mkimage).
func imageCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "image",
		Usage: "inspect and flash Lovelock DPU images (BlueField .bfb boot streams)",
		Description: "A .bfb is the stream a BlueField card boots from when it is written into its rshim\n" +
			"boot device. `make image` builds bin/image/arm64/lovelock.bfb; see docs/image.md.",
		Subcommands: []*ucli.Command{
			imageInspectCommand(),
			imageFlashCommand(),
		},
	}
}

// inspectedImage is one row of `lovelock image inspect --output json`.
type inspectedImage struct {
	Index   int    `json:"index"`
	Offset  int64  `json:"offset"`
	ID      uint8  `json:"id"`
	Name    string `json:"name"`
	Version uint8  `json:"version"`
	Length  uint32 `json:"length"`
	CRC     string `json:"crc"`
	CRCOK   bool   `json:"crc_ok"`
	Content string `json:"content,omitempty"`
}

func imageInspectCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "inspect",
		Usage:     "list the images of a .bfb: IDs, versions, lengths and CRC status",
		ArgsUsage: "FILE.bfb",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "table", Usage: "table or json"},
		},
		Action: func(c *ucli.Context) error {
			if c.NArg() == 0 {
				return errors.New("image inspect: want one FILE.bfb")
			}
			if err := checkArgs(c, 1); err != nil {
				return err
			}
			file := c.Args().First()
			f, err := os.Open(file)
			if err != nil {
				return fmt.Errorf("image inspect: %w", err)
			}
			defer f.Close()
			images, readErr := bfb.Read(f)
			// Not a boot stream at all (nothing read): the error alone,
			// not an empty table before it.
			if readErr != nil && len(images) == 0 {
				return fmt.Errorf("image inspect %s: not a .bfb boot stream: %w", file, readErr)
			}
			var valErr error
			if readErr == nil {
				valErr = bfb.Validate(images)
			}
			rows := make([]inspectedImage, 0, len(images))
			for i, img := range images {
				row := inspectedImage{Index: i, Offset: img.Offset, ID: uint8(img.ID), Name: img.ID.String(),
					Version: img.Version, Length: img.Header.Length, CRC: fmt.Sprintf("%08x", img.Header.CRC), CRCOK: img.CRCOK}
				// Text images (boot-args, boot-path, boot-desc) are short
				// and worth reading.
				if (img.ID == bfb.IDBootArgs || img.ID == bfb.IDBootPath || img.ID == bfb.IDBootDesc) && len(img.Data) < 512 {
					row.Content = string(img.Data)
				}
				rows = append(rows, row)
			}
			switch c.String("output") {
			case "json":
				out := struct {
					File     string           `json:"file"`
					Images   []inspectedImage `json:"images"`
					Firmware bool             `json:"firmware"`
					Valid    bool             `json:"valid"`
					Error    string           `json:"error,omitempty"`
				}{File: file, Images: rows, Firmware: bfb.HasFirmware(images), Valid: readErr == nil && valErr == nil}
				if err := errors.Join(readErr, valErr); err != nil {
					out.Error = err.Error()
				}
				enc := json.NewEncoder(c.App.Writer)
				enc.SetIndent("", "  ")
				if err := enc.Encode(out); err != nil {
					return err
				}
			case "table":
				tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "#\tOFFSET\tID\tNAME\tVER\tLENGTH\tCRC\tCHECK\tCONTENT")
				for _, r := range rows {
					status := "ok"
					if !r.CRCOK {
						status = "BAD"
					}
					fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t%d\t%d\t%s\t%s\t%s\n",
						r.Index, r.Offset, r.ID, r.Name, r.Version, r.Length, r.CRC, status, r.Content)
				}
				tw.Flush()
				fw := "no (OS-only stream: flash it with --firmware default.bfb)"
				if bfb.HasFirmware(images) {
					fw = "yes"
				}
				fmt.Fprintf(c.App.Writer, "%d images, %d bytes; boot firmware: %s\n", len(images), bfb.Size(images), fw)
			default:
				return fmt.Errorf("image inspect: --output %q: want table or json", c.String("output"))
			}
			if readErr != nil {
				return fmt.Errorf("image inspect %s: %w", file, readErr)
			}
			if valErr != nil {
				return fmt.Errorf("image inspect %s: invalid stream: %w", file, valErr)
			}
			if c.String("output") == "table" {
				fmt.Fprintln(c.App.Writer, "stream valid: every CRC matches, headers agree with the images that follow")
			}
			return nil
		},
	}
}

func imageFlashCommand() *ucli.Command {
	return &ucli.Command{
		Name:  "flash",
		Usage: "write a .bfb onto a BlueField card through its rshim and wait for it to boot",
		Description: "Validates the stream, checks the rshim device, pushes the stream (and bf.cfg) into\n" +
			"RSHIM/boot with a progress bar, then follows the card's log in RSHIM/misc until it reports\n" +
			"success or 'CRITICAL ERROR' (failure), or --timeout passes. Success for a Lovelock stream is\n" +
			"'DPU is ready (Lovelock VERSION)' with the version flashed (lovelockd healthy); for another\n" +
			"OS's stream, 'DPU is ready' or 'Linux up'.\n" +
			"Run it as root where the rshim driver runs (the host or the BMC), or elsewhere with\n" +
			"--remote user@bmc to go through ssh. Exits non-zero unless the card reports success.",
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "bfb", Required: true, Usage: "boot stream to flash (bin/image/arm64/lovelock.bfb)"},
			&ucli.StringFlag{Name: "config", Usage: "bf.cfg to append to the stream"},
			&ucli.StringFlag{Name: "firmware", Usage: "firmware stream (the card's default.bfb) to lay an OS-only .bfb over"},
			&ucli.BoolFlag{Name: "allow-os-only", Usage: "flash a stream that carries no boot firmware"},
			&ucli.StringFlag{Name: "rshim", Value: "/dev/rshim0", Usage: "rshim device directory"},
			&ucli.StringFlag{Name: "remote", Usage: "user@bmc: reach the rshim through ssh"},
			&ucli.DurationFlag{Name: "timeout", Value: 20 * time.Minute, Usage: "how long to wait for the card after pushing"},
			&ucli.DurationFlag{Name: "poll", Value: time.Second, Usage: "how often to read the card's log"},
			&ucli.BoolFlag{Name: "no-progress", Usage: "no progress bar"},
		},
		Action: func(c *ucli.Context) error {
			res, err := flash.Flash(c.Context, flash.Options{
				BFB:         c.String("bfb"),
				Config:      c.String("config"),
				Firmware:    c.String("firmware"),
				AllowOSOnly: c.Bool("allow-os-only"),
				Rshim:       c.String("rshim"),
				Remote:      c.String("remote"),
				Timeout:     c.Duration("timeout"),
				Poll:        c.Duration("poll"),
				Out:         c.App.Writer,
				NoProgress:  c.Bool("no-progress"),
			})
			if err != nil {
				return fmt.Errorf("image flash: %w", err)
			}
			fmt.Fprintf(c.App.Writer, "flashed %d bytes; card says %q\n", res.Bytes, res.Outcome)
			return nil
		},
	}
}
