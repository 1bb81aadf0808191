package console

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// ErrNoAuthOnNetwork is returned by ListenAndServe for a non-loopback address and a handler that
// only serves its own machine.
var ErrNoAuthOnNetwork = errors.New("refusing to listen beyond this machine without authentication: set OUTBOXKIT_CONSOLE_TOKENS " +
	"(name:role:secret), a basic-auth file, or an Authenticate hook, or listen on 127.0.0.1")

// ListenAndServe serves h on addr until ctx ends, with h's jobs running (Start) meanwhile, then
// shuts down gracefully. It refuses an address beyond loopback when h has no credentials
// (Auth.LocalOnly alone). ready, when set, is called with the address once it listens.
func ListenAndServe(ctx context.Context, addr string, h *Handler, ready func(addr string)) error {
	if !h.cfg.Auth.hasCredentials() && !loopbackAddr(addr) {
		return fmt.Errorf("console on %s: %w", addr, ErrNoAuthOnNetwork)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("console: listen on %s: %w", addr, err)
	}
	if err := h.Start(ctx); err != nil {
		_ = ln.Close()
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	if h.cfg.Prefix != "" {
		mux := http.NewServeMux()
		mux.Handle(h.cfg.Prefix+"/", h)
		mux.Handle("GET /{$}", http.RedirectHandler(h.cfg.Prefix+"/", http.StatusFound))
		srv.Handler = mux
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	if ready != nil {
		ready(ln.Addr().String())
	}
	select {
	case err = <-errc:
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = srv.Shutdown(sctx)
		cancel()
		if serr := <-errc; err == nil {
			err = serr // http.ErrServerClosed, cleared below, unless Serve had failed already
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if serr := h.Stop(sctx); err == nil {
		err = serr
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// loopbackAddr reports whether addr listens on this machine only: "localhost", 127.0.0.0/8, ::1.
// An empty host (":8089") is every interface.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
