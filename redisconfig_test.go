package fleetlimit

import (
	"os"
	"testing"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

// TestRedisPoolKeyFollowsTLSFiles: certificates rotated in place (same
// paths, new contents) give a new pool key, so that a reload connects with
// them instead of reusing the client built from the old ones; the same
// files give the same key.
func TestRedisPoolKeyFollowsTLSFiles(t *testing.T) {
	t.Parallel()
	files := redistest.GenerateTLS(t)
	cfg := &RedisConfig{Address: "127.0.0.1:6379", TLS: &RedisTLS{
		CA: files.CAFile, Cert: files.ClientCertFile, Key: files.ClientKeyFile, ServerName: files.ServerName,
	}}
	key := func() string {
		t.Helper()
		o, err := cfg.options()
		if err != nil {
			t.Fatal(err)
		}
		return o.poolKey()
	}
	before := key()
	if again := key(); again != before {
		t.Fatal("the same files gave another pool key")
	}
	// Rotate: new certificates written over the old paths.
	rotated := redistest.GenerateTLS(t)
	for from, to := range map[string]string{
		rotated.CAFile: files.CAFile, rotated.ClientCertFile: files.ClientCertFile, rotated.ClientKeyFile: files.ClientKeyFile,
	} {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if after := key(); after == before {
		t.Fatal("certificates rotated in place kept the pool key: a reload would keep the old client")
	}
}

// TestRedisDisableStallClock: disable_stall_clock reaches the store's
// options, and a configuration with the clock off gets a store of its own
// (a store has one clock), not the pooled one of the same Redis with the
// clock on.
func TestRedisDisableStallClock(t *testing.T) {
	t.Parallel()
	opts := func(off bool) redisOptions {
		t.Helper()
		o, err := (&RedisConfig{Address: "127.0.0.1:6379", DisableStallClock: off}).options()
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	on, off := opts(false), opts(true)
	if on.DisableStallClock || !off.DisableStallClock {
		t.Fatalf("DisableStallClock: %v with the setting off, %v with it on", on.DisableStallClock, off.DisableStallClock)
	}
	if on.poolKey() == off.poolKey() {
		t.Fatal("the stall clock on and off share a pool key: the second configuration would get the first's store")
	}
}
