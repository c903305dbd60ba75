package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"

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
	return mux
}

type errorReply struct {
	Error string `json:"error"`
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(io.LimitReader(r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
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

// Serve answers API requests on a unix socket at path until ctx ends. The
// socket is created mode 0600 in a 0700 directory, and connections from
// processes not running as root are refused as well (SO_PEERCRED).
func Serve(ctx context.Context, path string, h http.Handler) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("api socket dir: %w", err)
	}
	// A socket left by a daemon that died is in the way; remove it.
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("api socket: remove stale %s: %w", path, err)
	}
	old := unix.Umask(0o177)
	ln, err := net.Listen("unix", path)
	unix.Umask(old)
	if err != nil {
		return fmt.Errorf("api socket: %w", err)
	}
	srv := &http.Server{Handler: rootOnly(h), ConnContext: withPeerCred}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("api: %w", err)
	}
	return nil
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
