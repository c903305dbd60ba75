package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lovelock-dpu/lovelock/control/attach"
	"github.com/lovelock-dpu/lovelock/control/rules"
)

// maxBody bounds request bodies: a 64k-rule set in JSON fits comfortably.
const maxBody = 64 << 20

// Handler routes API requests onto svc.
func Handler(svc Service) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		reply(w, svc.Status)
	})
	mux.HandleFunc("GET /v1/ifaces", func(w http.ResponseWriter, r *http.Request) {
		reply(w, svc.Attachments)
	})
	mux.HandleFunc("POST /v1/ifaces", func(w http.ResponseWriter, r *http.Request) {
		var a attach.Attachment
		if decode(w, r, &a) {
			reply(w, func() (Attached, error) { return svc.Attach(a) })
		}
	})
	mux.HandleFunc("DELETE /v1/ifaces/{iface}/{hook}", func(w http.ResponseWriter, r *http.Request) {
		reply(w, func() (struct{}, error) {
			return struct{}{}, svc.Detach(r.PathValue("iface"), attach.Hook(r.PathValue("hook")))
		})
	})
	mux.HandleFunc("GET /v1/rules", func(w http.ResponseWriter, r *http.Request) {
		reply(w, svc.Rules)
	})
	mux.HandleFunc("PUT /v1/rules", func(w http.ResponseWriter, r *http.Request) {
		var s rules.Set
		if decode(w, r, &s) {
			reply(w, func() (Applied, error) { return svc.ApplyRules(s) })
		}
	})
	mux.HandleFunc("POST /v1/rules/check", func(w http.ResponseWriter, r *http.Request) {
		var s rules.Set
		if decode(w, r, &s) {
			reply(w, func() (Applied, error) { return svc.CheckRules(s) })
		}
	})
	mux.HandleFunc("POST /v1/rules", func(w http.ResponseWriter, r *http.Request) {
		var rule rules.Rule
		if decode(w, r, &rule) {
			reply(w, func() (Applied, error) { return svc.AddRule(rule) })
		}
	})
	mux.HandleFunc("DELETE /v1/rules/{name}", func(w http.ResponseWriter, r *http.Request) {
		reply(w, func() (Applied, error) { return svc.DeleteRule(r.PathValue("name")) })
	})
	mux.HandleFunc("GET /v1/stats", func(w http.ResponseWriter, r *http.Request) {
		reply(w, svc.Stats)
	})
	mux.HandleFunc("GET /v1/msg/stats", func(w http.ResponseWriter, r *http.Request) {
		reply(w, svc.MsgStats)
	})
	mux.HandleFunc("GET /v1/services", func(w http.ResponseWriter, r *http.Request) {
		reply(w, svc.Services)
	})
	mux.HandleFunc("GET /v1/services/{name}/stats", func(w http.ResponseWriter, r *http.Request) {
		reply(w, func() (any, error) { return svc.ServiceStats(r.PathValue("name")) })
	})
	mux.HandleFunc("/v1/services/{name}/", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		h := svc.ServiceHandler(name)
		if h == nil {
			Reply(w, nil, &NotFoundError{Err: fmt.Errorf("%s %s: this node runs no %s service with such a call (see 'lovelock services')", r.Method, r.URL.Path, name)})
			return
		}
		http.StripPrefix("/v1/services/"+name, h).ServeHTTP(w, r)
	})
	return mux
}

type errorReply struct {
	Error string `json:"error"`
}

// ReadRequest decodes a JSON request body into v (unknown fields are an
// error), answering 400 itself when it cannot; for services' handlers.
func ReadRequest(w http.ResponseWriter, r *http.Request, v any) bool { return decode(w, r, v) }

// Reply answers with v as JSON, or with err as the API's errors are
// answered (BadRequestError 400, NotFoundError 404, else 500); for
// services' handlers.
func Reply(w http.ResponseWriter, v any, err error) {
	reply(w, func() (any, error) { return v, err })
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeJSON(w, http.StatusRequestEntityTooLarge, errorReply{fmt.Sprintf("request body: larger than the API accepts (%d MiB); "+
				"no call needs that much (a set of the most rules the data plane holds is far smaller): check what the client sent", maxBody>>20)})
			return false
		}
		writeJSON(w, http.StatusBadRequest, errorReply{fmt.Sprintf("request body: %v", err)})
		return false
	}
	return true
}

func reply[T any](w http.ResponseWriter, fn func() (T, error)) {
	v, err := fn()
	if err != nil {
		code := http.StatusInternalServerError
		var bad *BadRequestError
		var nf *NotFoundError
		switch {
		case errors.As(err, &bad):
			code = http.StatusBadRequest
		case errors.As(err, &nf):
			code = http.StatusNotFound
		}
		writeJSON(w, code, errorReply{err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// ErrSocketInUse reports that another process, another lovelockd, answers
// on the API socket.
var ErrSocketInUse = errors.New("another lovelockd serves it")

// Listener is the API's unix socket, created by Listen. It removes its socket
// file when it closes, but only if the file is still the socket it created:
// a socket another daemon put there since is left alone.
type Listener struct {
	ln   *net.UnixListener
	path string
	dev  uint64
	ino  uint64
}

// Listen creates the API socket at path, mode 0600 in a 0700 directory. It
// refuses (ErrSocketInUse, naming the socket and the holder's pid) when a
// process answers on a socket already there; a socket nobody answers on,
// left by a daemon that died, is removed and replaced. Anything at path that
// is not a socket is an error and stays untouched. Call it before saying the
// daemon is ready, so that a second daemon fails at start.
func Listen(path string) (*Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("api socket dir: %w", err)
	}
	if err := clearStale(path); err != nil {
		return nil, err
	}
	old := unix.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("api socket %s: %w", path, err)
	}
	// Close must not unlink a path that may be another daemon's by then.
	ln.SetUnlinkOnClose(false)
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		ln.Close()
		return nil, fmt.Errorf("api socket %s: %w", path, err)
	}
	return &Listener{ln: ln, path: path, dev: uint64(st.Dev), ino: uint64(st.Ino)}, nil
}

// clearStale removes a socket at path that nobody answers on, and refuses
// one somebody does.
func clearStale(path string) error {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("api socket %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return fmt.Errorf("api socket %s: the path exists and is not a socket; remove it or choose another --socket", path)
	}
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err == nil {
		holder := ""
		if uc, ok := c.(*net.UnixConn); ok {
			if raw, err := uc.SyscallConn(); err == nil {
				raw.Control(func(fd uintptr) {
					if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
						holder = fmt.Sprintf(" (pid %d)", cred.Pid)
					}
				})
			}
		}
		c.Close()
		return fmt.Errorf("api socket %s: %w%s; stop it, or give this one another --socket", path, ErrSocketInUse, holder)
	}
	if !errors.Is(err, unix.ECONNREFUSED) {
		return fmt.Errorf("api socket %s: cannot tell whether a daemon serves it: %w", path, err)
	}
	// Nobody listens: a socket left by a daemon that died.
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("api socket: remove stale %s: %w", path, err)
	}
	return nil
}

// Path is the socket's path.
func (l *Listener) Path() string { return l.path }

// Close stops listening and removes the socket file if it is still the one
// Listen created.
func (l *Listener) Close() error {
	err := l.ln.Close()
	var st unix.Stat_t
	if unix.Lstat(l.path, &st) == nil && uint64(st.Dev) == l.dev && uint64(st.Ino) == l.ino {
		os.Remove(l.path)
	}
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// Serve answers API requests until ctx ends, then closes l. Connections from
// processes not running as root are refused (SO_PEERCRED), besides the
// socket's mode.
func (l *Listener) Serve(ctx context.Context, h http.Handler) error {
	defer l.Close()
	srv := &http.Server{Handler: rootOnly(h), ConnContext: withPeerCred}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	if err := srv.Serve(l.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("api: %w", err)
	}
	return nil
}

// Serve is Listen and Listener.Serve: it answers API requests on a unix
// socket at path until ctx ends.
func Serve(ctx context.Context, path string, h http.Handler) error {
	l, err := Listen(path)
	if err != nil {
		return err
	}
	return l.Serve(ctx, h)
}

type peerKey struct{}

func withPeerCred(ctx context.Context, c net.Conn) context.Context {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return ctx
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return ctx
	}
	var cred *unix.Ucred
	raw.Control(func(fd uintptr) {
		cred, _ = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if cred == nil {
		return ctx
	}
	return context.WithValue(ctx, peerKey{}, cred)
}

func rootOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cred, _ := r.Context().Value(peerKey{}).(*unix.Ucred)
		if cred == nil || cred.Uid != 0 {
			writeJSON(w, http.StatusForbidden, errorReply{"lovelockd API: root only"})
			return
		}
		h.ServeHTTP(w, r)
	})
}
