package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"

	"github.com/lovelock-dpu/lovelock/control/attach"
	"github.com/lovelock-dpu/lovelock/control/rules"
	"github.com/lovelock-dpu/lovelock/dataplane/messaging"
)

// ErrNoDaemon reports that no lovelockd answers on the socket.
var ErrNoDaemon = errors.New("lovelockd is not running (start it with 'systemctl start lovelockd' or run lovelockd)")

// ErrNotSocket reports that the socket's path holds something else (a
// file, a directory): no lovelockd can serve there either (Listen refuses
// it).
var ErrNotSocket = errors.New("exists and is not a socket: remove it, or pass --socket PATH")

// ErrNoSocket reports a client given no socket path.
var ErrNoSocket = errors.New("no API socket given: pass --socket PATH (default " + DefaultSocket + ")")

// Client talks to lovelockd over its unix socket.
type Client struct {
	socket string
	hc     *http.Client
}

// NewClient returns a client for the daemon listening on socket.
func NewClient(socket string) *Client {
	return &Client{socket: socket, hc: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}}
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	if c.socket == "" {
		return ErrNoSocket
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://lovelockd"+path, body)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			// connect(2) says ECONNREFUSED on a file or a directory
			// too, where no daemon can listen.
			if fi, err := os.Stat(c.socket); err == nil && fi.Mode().Type() != fs.ModeSocket {
				return fmt.Errorf("%s: %w", c.socket, ErrNotSocket)
			}
			return fmt.Errorf("%s: %w", c.socket, ErrNoDaemon)
		}
		return fmt.Errorf("lovelockd at %s: %w", c.socket, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e errorReply
		err := fmt.Errorf("lovelockd: %s %s: %s", method, path, resp.Status)
		if json.NewDecoder(resp.Body).Decode(&e) == nil && e.Error != "" {
			err = errors.New(e.Error)
		}
		// Keep the kind, so callers can tell a bad request or a missing
		// thing from a failure of the node (errors.As).
		switch resp.StatusCode {
		case http.StatusBadRequest:
			return &BadRequestError{Err: err}
		case http.StatusNotFound:
			return &NotFoundError{Err: err}
		}
		return err
	}
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("lovelockd: %s %s: decode reply: %w", method, path, err)
	}
	return nil
}

// Status asks for the daemon's status.
func (c *Client) Status(ctx context.Context) (s Status, err error) {
	return s, c.do(ctx, http.MethodGet, "/v1/status", nil, &s)
}

// Attachments lists attached interface hooks.
func (c *Client) Attachments(ctx context.Context) (a []attach.Attachment, err error) {
	return a, c.do(ctx, http.MethodGet, "/v1/ifaces", nil, &a)
}

// Attach attaches the classifier to an interface hook.
func (c *Client) Attach(ctx context.Context, a attach.Attachment) (r Attached, err error) {
	return r, c.do(ctx, http.MethodPost, "/v1/ifaces", a, &r)
}

// Detach detaches the classifier from an interface hook.
func (c *Client) Detach(ctx context.Context, iface string, hook attach.Hook) error {
	return c.do(ctx, http.MethodDelete, "/v1/ifaces/"+url.PathEscape(iface)+"/"+url.PathEscape(string(hook)), nil, nil)
}

// Rules returns the live rule set.
func (c *Client) Rules(ctx context.Context) (s rules.Set, err error) {
	return s, c.do(ctx, http.MethodGet, "/v1/rules", nil, &s)
}

// ApplyRules replaces the whole rule set atomically.
func (c *Client) ApplyRules(ctx context.Context, s rules.Set) (r Applied, err error) {
	return r, c.do(ctx, http.MethodPut, "/v1/rules", s, &r)
}

// CheckRules checks a whole rule set as ApplyRules would, on the node,
// without changing anything.
func (c *Client) CheckRules(ctx context.Context, s rules.Set) (r Applied, err error) {
	return r, c.do(ctx, http.MethodPost, "/v1/rules/check", s, &r)
}

// AddRule adds one rule to the live set.
func (c *Client) AddRule(ctx context.Context, rule rules.Rule) (r Applied, err error) {
	return r, c.do(ctx, http.MethodPost, "/v1/rules", rule, &r)
}

// DeleteRule removes the rule called name.
func (c *Client) DeleteRule(ctx context.Context, name string) (r Applied, err error) {
	return r, c.do(ctx, http.MethodDelete, "/v1/rules/"+url.PathEscape(name), nil, &r)
}

// MsgStats reads the messaging agent's counters.
func (c *Client) MsgStats(ctx context.Context) (s messaging.Stats, err error) {
	return s, c.do(ctx, http.MethodGet, "/v1/msg/stats", nil, &s)
}

// Services reads the status of each service lovelockd runs.
func (c *Client) Services(ctx context.Context) (s []ServiceStatus, err error) {
	return s, c.do(ctx, http.MethodGet, "/v1/services", nil, &s)
}

// ServiceStats reads the named service's counters into v (the service's
// own stats type, e.g. messaging.Stats).
func (c *Client) ServiceStats(ctx context.Context, name string, v any) error {
	return c.do(ctx, http.MethodGet, "/v1/services/"+url.PathEscape(name)+"/stats", nil, v)
}

// ServiceCall calls a service's own API under /v1/services/NAME/PATH, for
// what is particular to one service (a memory server's regions): in is
// sent as JSON (nil: no body), the reply decoded into out (nil: ignored).
func (c *Client) ServiceCall(ctx context.Context, method, name, path string, in, out any) error {
	return c.do(ctx, method, "/v1/services/"+url.PathEscape(name)+"/"+strings.TrimPrefix(path, "/"), in, out)
}

// Stats reads the data plane's counters.
func (c *Client) Stats(ctx context.Context) (s Stats, err error) {
	return s, c.do(ctx, http.MethodGet, "/v1/stats", nil, &s)
}
