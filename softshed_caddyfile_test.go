package fleetlimit_test

import (
	"strings"
	"testing"
)

// badSoftShedCaddyfiles are mistakes in soft_shed: each must fail
// adaptation with an error that names its line and says what is wrong.
var badSoftShedCaddyfiles = []struct {
	name      string
	caddyfile string
	line      int
	phrase    string
}{
	{"percent of 100", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			soft_shed 100
		}
	}
}`, 5, `soft_shed must be a whole percentage from 1 to 99, got "100"`},
	{"percent of 0", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			soft_shed 0%
		}
	}
}`, 5, `soft_shed must be a whole percentage from 1 to 99, got "0%"`},
	{"percent not a number", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			soft_shed most 1s
		}
	}
}`, 5, `soft_shed must be a whole percentage from 1 to 99, got "most"`},
	{"bad max delay", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			soft_shed 80 soon
		}
	}
}`, 5, `soft_shed's max delay must be a positive duration of at most 1h0m0s, got "soon"`},
	{"max delay over an hour", `:80 {
	rate_limit {
		zone api {
			rate 10 1s

			soft_shed 80 2h
		}
	}
}`, 6, `soft_shed's max delay must be a positive duration of at most 1h0m0s, got "2h"`},
	{"no arguments", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			soft_shed
		}
	}
}`, 5, `soft_shed takes: soft_shed <percent> [<max_delay>]`},
	{"on a leaky bucket", `:80 {
	rate_limit {
		zone api {
			algorithm leaky_bucket
			rate 10 1s
			soft_shed 80
		}
	}
}`, 6, `soft_shed applies to token_bucket only`},
	{"on a sliding window, before the algorithm", `:80 {
	rate_limit {
		zone api {
			soft_shed 80 1s
			rate 10 1m
			algorithm sliding_window
		}
	}
}`, 4, `soft_shed applies to token_bucket only`},
	{"on caddy-ratelimit's form", `:80 {
	rate_limit {
		zone api {
			window 1m
			events 10
			soft_shed 50
		}
	}
}`, 6, `soft_shed applies to token_bucket only`},
	{"on concurrency", `:80 {
	rate_limit {
		zone api {
			algorithm concurrency
			limit 4
			soft_shed 50
		}
	}
}`, 6, `soft_shed applies to token_bucket only`},
	{"on a quota alone", `:80 {
	rate_limit {
		zone api {
			quota 1000 per day
			soft_shed 50
		}
	}
}`, 5, `soft_shed applies to token_bucket only`},
	{"max_waiting on a plain token bucket", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			max_waiting 10
		}
	}
}`, 5, `max_waiting applies to leaky_bucket and soft_shed zones only`},
}

// TestSoftShedCaddyfileBadInput checks soft_shed's mistakes: refused at
// the right line with a clear message.
func TestSoftShedCaddyfileBadInput(t *testing.T) {
	for _, tc := range badSoftShedCaddyfiles {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			checkBadCaddyfile(t, tc.caddyfile, tc.line, tc.phrase)
		})
	}
}

// TestSoftShedBadJSON: JSON, which skips the Caddyfile's checks, is
// refused at provisioning with the same messages.
func TestSoftShedBadJSON(t *testing.T) {
	for _, c := range []struct{ zone, phrase string }{
		{`"rate":10,"per":1000000000,"soft_shed":100`, "soft_shed must be a whole percentage from 1 to 99, got 100"},
		{`"rate":10,"per":1000000000,"soft_shed":-5`, "soft_shed must be a whole percentage from 1 to 99, got -5"},
		{`"rate":10,"per":1000000000,"soft_shed_max_delay":"1s"`, "soft_shed_max_delay needs soft_shed <percent>"},
		{`"rate":10,"per":1000000000,"soft_shed":50,"soft_shed_max_delay":"2h"`, "soft_shed's max delay must be positive and at most 1h0m0s, got 2h0m0s"},
		{`"algorithm":"fixed_window","rate":10,"per":1000000000,"soft_shed":50`, "soft_shed applies to token_bucket only"},
	} {
		err := provisionHandler([]byte(`{"zones":[{"name":"a",` + c.zone + `}]}`))
		if err == nil || !strings.Contains(err.Error(), c.phrase) {
			t.Errorf("zone {%s}: %v, want an error saying %q", c.zone, err, c.phrase)
		}
	}
}
