package fleetlimit_test

import (
	"testing"
)

// badPolicyCaddyfiles are mistakes in the policies' settings (tiers,
// reserve, concurrency, count_status, ban, dry_run): each must fail
// adaptation with an error that names its line and says what is wrong.
var badPolicyCaddyfiles = []struct {
	name      string
	caddyfile string
	line      int
	phrase    string
}{
	{"rate placeholder without a period", `:80 {
	rate_limit {
		zone api {
			rate {plan_rate}
		}
	}
}`, 4, `rate needs two arguments: rate <n|placeholder> <duration>`},
	{"burst placeholder with a window", `:80 {
	rate_limit {
		zone api {
			algorithm sliding_window
			rate {plan_rate} 1m
			burst {plan_burst}
		}
	}
}`, 6, `burst applies to token_bucket and leaky_bucket only`},
	{"reserve of 100%", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			reserve 100%
		}
	}
}`, 5, `reserve must be a whole percentage from 0 to 99`},
	{"reserve not a number", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			reserve most
		}
	}
}`, 5, `reserve must be a whole percentage from 0 to 99`},
	{"concurrency without a limit", `:80 {
	rate_limit {
		zone api {
			algorithm concurrency
		}
	}
}`, 3, `a concurrency zone needs limit <n>`},
	{"concurrency with a rate", `:80 {
	rate_limit {
		zone api {
			algorithm concurrency
			limit 4
			rate 10 1s
		}
	}
}`, 6, `a concurrency zone takes limit <n>, not a rate`},
	{"concurrency with a reserve", `:80 {
	rate_limit {
		zone api {
			algorithm concurrency
			limit 4
			reserve 20
		}
	}
}`, 6, `reserve applies to the rate algorithms, not concurrency`},
	{"lease on a token bucket", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			lease 1m
		}
	}
}`, 5, `lease applies to the concurrency algorithm only`},
	{"limit on a token bucket", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			limit 4
		}
	}
}`, 5, `limit applies to algorithm concurrency only`},
	{"count_status of a bad code", `:80 {
	rate_limit {
		zone login {
			rate 5 15m
			count_status 4x1
		}
	}
}`, 5, `count_status takes status codes from 100 to 599 and classes 1xx to 5xx, got "4x1"`},
	{"count_status on a leaky bucket", `:80 {
	rate_limit {
		zone login {
			algorithm leaky_bucket
			rate 5 15m
			count_status 401
		}
	}
}`, 6, `count_status does not apply to leaky_bucket`},
	{"count_status on concurrency", `:80 {
	rate_limit {
		zone login {
			algorithm concurrency
			limit 3
			count_status 401
		}
	}
}`, 6, `count_status does not apply to concurrency`},
	{"ban without its words", `:80 {
	rate_limit {
		zone login {
			rate 5 15m
			ban 1h 10 15m
		}
	}
}`, 5, `ban takes: ban <duration> after <n> in <window>`},
	{"ban after zero denials", `:80 {
	rate_limit {
		zone login {
			rate 5 15m
			ban 1h after 0 in 15m
		}
	}
}`, 5, `ban denials must be a positive integer`},
	{"dry_run with an argument", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			dry_run yes
		}
	}
}`, 5, `wrong argument count`},
}

// TestPolicyCaddyfileBadInput checks the policies' mistakes: refused at the
// right line with a clear message.
func TestPolicyCaddyfileBadInput(t *testing.T) {
	for _, tc := range badPolicyCaddyfiles {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			checkBadCaddyfile(t, tc.caddyfile, tc.line, tc.phrase)
		})
	}
}
