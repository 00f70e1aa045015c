package fleetlimit_test

import "testing"

// TestCostHeaderBadCaddyfile checks that a bad cost_header is reported at
// its own line: no header name, one that is not a field name, and a zone
// whose algorithm cannot owe a cost (the error names the algorithm).
func TestCostHeaderBadCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		name, caddyfile string
		line            int
		phrase          string
	}{
		{"no header name", `:80 {
	rate_limit {
		zone llm {
			rate 1000 1m
			cost_header
		}
	}
}`, 5, `zone "llm": cost_header takes one response header name: cost_header <header>`},
		{"two names", `:80 {
	rate_limit {
		zone llm {
			rate 1000 1m
			cost_header X-Tokens-Used X-Other
		}
	}
}`, 5, `cost_header takes one response header name`},
		{"not a field name", `:80 {
	rate_limit {
		zone llm {
			rate 1000 1m
			cost_header X-Tokens:Used
		}
	}
}`, 5, `zone "llm": cost_header "X-Tokens:Used" is not a header field name`},
		{"sliding window", `:80 {
	rate_limit {
		zone llm {
			algorithm sliding_window
			rate 1000 1m
			cost_header X-Tokens-Used
		}
	}
}`, 6, `cost_header applies to token_bucket zones and quotas only, not sliding_window`},
		{"caddy-ratelimit form", `:80 {
	rate_limit {
		zone llm {
			window 1m
			events 1000
			cost_header X-Tokens-Used
		}
	}
}`, 6, `cost_header applies to token_bucket zones and quotas only, not sliding_log`},
		{"concurrency", `:80 {
	rate_limit {
		zone llm {
			algorithm concurrency
			limit 4
			cost_header X-Tokens-Used
		}
	}
}`, 6, `cost_header applies to token_bucket zones and quotas only, not concurrency`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			checkBadCaddyfile(t, tc.caddyfile, tc.line, tc.phrase)
		})
	}
}
