package redistest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Do sends one command (TLS when s.TLS is set, after AUTH when Password or
// Username is set) and returns the reply rendered as text: integers and
// strings as they are, arrays as lines, nil (a nil string or a nil array)
// as "(nil)". An error reply, also inside an array, is returned as an error.
func (s *Server) Do(args ...string) (string, error) {
	v, err := s.do(args...)
	if err != nil {
		return "", err
	}
	return render(v), nil
}

// MustDo is Do that fails the test on error.
func (s *Server) MustDo(args ...string) string {
	s.p.t.Helper()
	out, err := s.Do(args...)
	if err != nil {
		s.p.t.Fatalf("redis %s %v: %v", s.Addr, args, err)
	}
	return out
}

// cmdTimeout bounds one command of Do, connecting included.
const cmdTimeout = 5 * time.Second

// do is Do with the reply as a value: a string, an int64, nil, or an
// []any of these.
func (s *Server) do(args ...string) (any, error) {
	return s.doAsking(false, args...)
}

// doAsking is do preceded, on the same connection, by ASKING when asking
// (a command for a slot that a Cluster node is importing).
func (s *Server) doAsking(asking bool, args ...string) (any, error) {
	cl, done := s.client()
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	cmdArgs := make([]any, len(args))
	for i, a := range args {
		cmdArgs[i] = a
	}
	var cmd *redis.Cmd
	if asking {
		// A pipeline runs on one connection, in order.
		pipe := cl.Pipeline()
		ask := pipe.Do(ctx, "ASKING")
		cmd = pipe.Do(ctx, cmdArgs...)
		_, _ = pipe.Exec(ctx)
		if err := ask.Err(); err != nil {
			done(err)
			return nil, fmt.Errorf("ASKING: %w", err)
		}
	} else {
		cmd = cl.Do(ctx, cmdArgs...)
	}
	v, err := cmd.Result()
	done(err)
	switch {
	case errors.Is(err, redis.Nil):
		return nil, nil
	case err != nil:
		return nil, err
	}
	if err := errorIn(v); err != nil {
		return nil, err
	}
	return v, nil
}

// clientKey tells apart the clients of one process: a view (As) may
// authenticate as another user.
type clientKey struct {
	username, password string
	tls                *tls.Config
}

// client returns a go-redis client for s's address and credentials: the
// process's, shared by every command to it with those credentials, or for a
// Server value that only names an address a client of its own. done takes
// the command's error: it closes a client of its own, and drops a shared
// one after a failure that is not a Redis reply (a refused connection, a
// timeout), so that the next command starts afresh, not behind go-redis'
// back-off for a server that refused connections.
func (s *Server) client() (cl *redis.Client, done func(error)) {
	if s.p == nil {
		cl := redis.NewClient(s.options())
		return cl, func(error) { _ = cl.Close() }
	}
	key := clientKey{s.Username, s.Password, s.TLS}
	p := s.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.clients == nil {
		p.clients = make(map[clientKey]*redis.Client)
	}
	cl = p.clients[key]
	if cl == nil {
		cl = redis.NewClient(s.options())
		p.clients[key] = cl
	}
	return cl, func(err error) {
		var reply redis.Error
		if err == nil || errors.Is(err, redis.Nil) || errors.As(err, &reply) {
			return
		}
		p.mu.Lock()
		if p.clients[key] == cl {
			delete(p.clients, key)
		}
		p.mu.Unlock()
		_ = cl.Close()
	}
}

// closeClients closes the process's clients (when it stops).
func (p *process) closeClients() {
	p.mu.Lock()
	clients := p.clients
	p.clients = nil
	p.mu.Unlock()
	for _, cl := range clients {
		_ = cl.Close()
	}
}

// options are the go-redis options of s's clients: RESP2, so that replies
// are the flat arrays the callers parse; no retries, so that a command runs
// once at most.
func (s *Server) options() *redis.Options {
	opt := &redis.Options{
		Addr:            s.Addr,
		Username:        s.Username,
		Password:        s.Password,
		TLSConfig:       s.TLS,
		Protocol:        2,
		DisableIdentity: true,
		DialTimeout:     time.Second,
		DialerRetries:   1,
		ReadTimeout:     cmdTimeout,
		WriteTimeout:    cmdTimeout,
		MaxRetries:      -1,
	}
	if s.Username != "" && s.Password == "" {
		// go-redis authenticates only with a password; a user made with
		// nopass takes any.
		user := s.Username
		opt.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
			return cn.AuthACL(ctx, user, "").Err()
		}
	}
	return opt
}

// accepts reports whether something accepts TCP connections on addr.
func accepts(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// errorIn returns the first error reply inside an array reply v.
func errorIn(v any) error {
	switch v := v.(type) {
	case error:
		return v
	case []any:
		for _, p := range v {
			if err := errorIn(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// render is how Do shows a reply value.
func render(v any) string {
	switch v := v.(type) {
	case nil:
		return "(nil)"
	case string:
		return v
	case int64:
		return strconv.FormatInt(v, 10)
	case []any:
		parts := make([]string, len(v))
		for i, p := range v {
			parts[i] = render(p)
		}
		return strings.Join(parts, "\n")
	}
	return fmt.Sprint(v)
}

// isReplyError reports whether err is an error reply starting with prefix.
func isReplyError(err error, prefix string) bool {
	var reply redis.Error
	return errors.As(err, &reply) && strings.HasPrefix(reply.Error(), prefix)
}
