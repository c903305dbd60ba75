package cli

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
)

// ErrorLine is the line lovelock prints for err (Explain's): prefixed with
// "lovelock: " unless it names its command already, as usage errors do
// ("lovelock rules: unknown command …").
func ErrorLine(err error) string {
	msg := Explain(err).Error()
	if strings.HasPrefix(msg, "lovelock ") {
		return msg
	}
	return "lovelock: " + msg
}

// Explain adds to err what the user can do about it where err does not say
// so itself. Run by a user other than root, a permission error (the API
// socket's "permission denied", netlink's "operation not permitted", bpffs's
// "open /sys/fs/bpf: permission denied", the API's "root only") says that
// lovelock needs root.
func Explain(err error) error {
	return explain(err, os.Geteuid())
}

func explain(err error, euid int) error {
	if err == nil || euid == 0 {
		return err
	}
	msg := err.Error()
	if errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES) ||
		strings.Contains(msg, "permission denied") || strings.Contains(msg, "operation not permitted") ||
		strings.Contains(msg, "root only") {
		return fmt.Errorf("%w\nthis needs root: run lovelock as root (for example with sudo)", err)
	}
	return err
}
