package limiter

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/caddy-fleetlimit/internal/redistest"
)

func TestCheckCredentials(t *testing.T) {
	t.Parallel()
	const secret, wrong = "correct-horse", "wrong-horse"
	srv := redistest.Start(t, "--requirepass", secret)
	// The ACL line of docs/operations.md for the limiter's user, and one without EVALSHA.
	srv.AddUser("fleetlimit", "pw1", strings.Fields("resetkeys ~rl:* resetchannels -@all +evalsha +eval +script|load +ping +hello +auth +time +mget +set +del +pexpire")...)
	srv.AddUser("noeval", "pw2", "~rl:*", "-@all", "+ping", "+hello", "+auth", "+script|load")
	ctx := context.Background()

	for _, tc := range []struct {
		name     string
		opt      redis.Options
		want     []string // in the error; none: no error
		password string   // never in the error
	}{
		{"right password", redis.Options{Password: secret}, nil, secret},
		{"limiter user", redis.Options{Username: "fleetlimit", Password: "pw1"}, nil, "pw1"},
		{"wrong password", redis.Options{Password: wrong}, []string{"WRONGPASS"}, wrong},
		{"wrong password, RESP2", redis.Options{Password: wrong, Protocol: 2}, []string{"WRONGPASS"}, wrong},
		{"no password", redis.Options{}, []string{"NOAUTH"}, secret},
		{"user without evalsha", redis.Options{Username: "noeval", Password: "pw2"}, []string{"NOPERM", "evalsha", `user "noeval"`, "+evalsha"}, "pw2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			opt := tc.opt
			opt.Addr = srv.Addr
			err := checkCredentials(ctx, newRedisClient(t, &opt))
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("checkCredentials: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrRedisCredentials) {
				t.Fatalf("checkCredentials = %v, want ErrRedisCredentials", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("checkCredentials = %q, want it to name %q", err, w)
				}
			}
			if strings.Contains(err.Error(), tc.password) {
				t.Errorf("checkCredentials = %q holds the password", err)
			}
			t.Logf("%v", err)
		})
	}

	t.Run("unreachable", func(t *testing.T) {
		t.Parallel()
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(redistest.FreePort(t)))
		err := checkCredentials(ctx, newRedisClient(t, &redis.Options{Addr: addr, Password: secret, MaxRetries: -1, DialerRetries: 1}))
		if err == nil || errors.Is(err, ErrRedisCredentials) || strings.Contains(err.Error(), secret) {
			t.Fatalf("checkCredentials with nothing listening = %v, want an error that is not about credentials", err)
		}
	})
}

func TestCheckCredentialsCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3, "--requirepass", "cluster-pw", "--masterauth", "cluster-pw")
	ctx := context.Background()
	for _, pw := range []string{"cluster-pw", "not-it"} {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), Password: pw, DialTimeout: 5 * time.Second})
		t.Cleanup(func() { _ = c.Close() })
		err := checkCredentials(ctx, c)
		switch {
		case pw == "cluster-pw" && err != nil:
			t.Fatalf("checkCredentials with the right password: %v", err)
		case pw == "not-it" && (!errors.Is(err, ErrRedisCredentials) || !strings.Contains(err.Error(), "WRONGPASS")):
			t.Fatalf("checkCredentials with a wrong password = %v, want WRONGPASS", err)
		}
	}
}

// TestRedisStoreWrongPassword: a store whose password Redis refuses fails
// each decision with WRONGPASS (the reply of the connection's HELLO or
// AUTH), not with an empty reply, and never shows the password.
func TestRedisStoreWrongPassword(t *testing.T) {
	t.Parallel()
	const secret, wrong = "store-secret", "store-wrong"
	srv := redistest.Start(t, "--requirepass", secret)
	rule := mustRule(t, "auth", 10, time.Second, 10)
	for _, protocol := range []int{2, 3} {
		for _, pipelines := range []int{1, 3} {
			s := newRedisStore(t, RedisOptions{Address: srv.Addr, Password: wrong, Protocol: protocol, Pipelines: pipelines})
			for i := range 3 {
				results := make([]Result, 1)
				_, err := s.Decide(context.Background(), []Request{{Rule: rule, Key: "203.0.113.7", Cost: 1}}, results)
				if err == nil || !strings.Contains(err.Error(), "WRONGPASS") || !IsAuth(err) || authCode(err) != "WRONGPASS" {
					t.Fatalf("RESP%d, %d pipelines, decision %d: Decide = %v, want WRONGPASS", protocol, pipelines, i, err)
				}
				if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), wrong) {
					t.Fatalf("Decide = %q holds a password", err)
				}
			}
		}
	}
}
