package fleetlimit

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
)

// digestSecretKey is where the key digests' secret is kept in Caddy's
// storage when the configuration names none.
const digestSecretKey = "rate_limit/key_digest_secret"

// provisionDigester sets up the digests that logs, statistics and events
// carry instead of client keys: keyed with KeyDigestSecret when set,
// otherwise with a secret generated once and kept in Caddy's storage, so
// that it lasts across restarts and is shared by the nodes that share the
// storage. Without storage the secret is this process's own (the digests
// then change on restart and differ between nodes), and a warning says so.
func (h *Handler) provisionDigester(ctx caddy.Context) error {
	if h.KeyDigestSecret != "" {
		secret, err := h.digestSecret()
		if err != nil {
			return err
		}
		h.digest = limiter.NewDigester([]byte(secret))
		return nil
	}
	secret, err := storedDigestSecret(ctx)
	if err != nil {
		h.logger.Warn("no key digest secret in Caddy's storage; key digests use a secret of this process, so they change on restart and differ between nodes (set key_digest_secret to share one)",
			zap.Error(err))
		secret = make([]byte, 32)
		if _, err := rand.Read(secret); err != nil {
			return fmt.Errorf("generating a key digest secret: %w", err)
		}
	}
	h.digest = limiter.NewDigester(secret)
	return nil
}

// digestSecret returns KeyDigestSecret with its placeholders expanded,
// which must leave a secret.
func (h *Handler) digestSecret() (string, error) {
	secret := caddy.NewReplacer().ReplaceKnown(h.KeyDigestSecret, "")
	if secret == "" {
		return "", errors.New("key_digest_secret is empty once its placeholders are replaced")
	}
	return secret, nil
}

// storedDigestSecret loads the key digests' secret from Caddy's storage,
// generating and storing it first if there is none, under the storage's
// lock so that nodes sharing the storage agree on one.
func storedDigestSecret(ctx caddy.Context) ([]byte, error) {
	st, err := storageOf(ctx)
	if err != nil {
		return nil, err
	}
	c, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if secret, err := st.Load(c, digestSecretKey); err == nil && len(secret) >= 16 {
		return secret, nil
	}
	if err := st.Lock(c, digestSecretKey); err != nil {
		return nil, fmt.Errorf("locking the key digest secret: %w", err)
	}
	defer func() { _ = st.Unlock(context.WithoutCancel(c), digestSecretKey) }()
	secret, err := st.Load(c, digestSecretKey)
	if err == nil && len(secret) >= 16 {
		return secret, nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("loading the key digest secret: %w", err)
	}
	secret = make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, err
	}
	if err := st.Store(c, digestSecretKey, secret); err != nil {
		return nil, fmt.Errorf("storing the key digest secret: %w", err)
	}
	return secret, nil
}

// storageOf returns the configuration's storage. A context made without a
// configuration (a handler provisioned on its own, as tests do) has none:
// Caddy's Storage would dereference the missing configuration.
func storageOf(ctx caddy.Context) (st certmagic.Storage, err error) {
	defer func() {
		if recover() != nil {
			st, err = nil, errors.New("no storage in this context")
		}
	}()
	if st = ctx.Storage(); st == nil {
		return nil, errors.New("no storage")
	}
	return st, nil
}
