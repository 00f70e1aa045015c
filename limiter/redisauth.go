package limiter

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ErrRedisCredentials is wrapped by the error of a Redis that refuses the
// store's credentials (WRONGPASS, NOAUTH) or a command the store needs
// (NOPERM). Its text names the reply's code and, for NOPERM, the command,
// never the password.
var ErrRedisCredentials = errors.New("redis refused the credentials")

// probeSHA is a script digest that no script has: EVALSHA of it answers
// NOSCRIPT when the user may run EVALSHA and NOPERM when not, and runs
// nothing either way (ACLs are checked before the command).
const probeSHA = "0000000000000000000000000000000000000000"

// checkCredentials checks, in two round trips, that Redis accepts the
// client's credentials (the connection's HELLO or AUTH, then PING) and
// lets the user run EVALSHA, the command of every decision. Its error
// wraps ErrRedisCredentials when Redis refuses either; any other error
// (Redis unreachable, say) only means that nothing could be checked, and
// is left to the decisions' failure policy.
func checkCredentials(ctx context.Context, client redis.UniversalClient) error {
	if err := client.Ping(ctx).Err(); err != nil {
		return credentialsError(client, "PING", err)
	}
	err := client.EvalSha(ctx, probeSHA, nil).Err()
	if err == nil || redis.HasErrorPrefix(err, "NOSCRIPT") {
		return nil
	}
	return credentialsError(client, "EVALSHA", err)
}

// credentialsError describes the failure of command (sent by
// checkCredentials) for the client's user.
func credentialsError(client redis.UniversalClient, command string, err error) error {
	who := ""
	if u := clientUser(client); u != "" {
		who = fmt.Sprintf(" for user %q", u)
	}
	code := authCode(err)
	switch {
	case code == "":
		return fmt.Errorf("checking redis credentials%s with %s: %w", who, command, err)
	case code == "NOPERM":
		refused, _ := noPermCommand(err)
		if refused == "" {
			refused = strings.ToLower(command)
		}
		return fmt.Errorf("%w%s: the user may not run %s (grant it +%s): %w", ErrRedisCredentials, who, refused, refused, err)
	default:
		return fmt.Errorf("%w%s: %w", ErrRedisCredentials, who, err) // the reply starts with its code
	}
}

// clientUser is the ACL user name of a client's options ("" for the
// default user).
func clientUser(client redis.UniversalClient) string {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().Username
	case *redis.ClusterClient:
		return c.Options().Username
	}
	return ""
}
