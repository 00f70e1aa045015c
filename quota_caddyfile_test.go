package fleetlimit_test

import "testing"

// badQuotaCaddyfiles are mistakes in a quota: each fails adaptation with an
// error that names its line and says what is wrong.
var badQuotaCaddyfiles = []struct {
	name      string
	caddyfile string
	line      int
	phrase    string
}{
	{"quota not a number", `:80 {
	rate_limit {
		zone api {
			quota lots per month
		}
	}
}`, 4, `quota must be a positive integer, got "lots"`},
	{"quota of zero", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			quota 0 per day
		}
	}
}`, 5, `quota must be a positive integer, got "0"`},
	{"quota too large", `:80 {
	rate_limit {
		zone api {
			quota 2000000000000 per day
		}
	}
}`, 4, `quota must be at most 2^40 per period`},
	{"quota of a year", `:80 {
	rate_limit {
		zone api {
			quota 10 per year
		}
	}
}`, 4, `unknown quota period "year" (want day, week or month)`},
	{"quota without per", `:80 {
	rate_limit {
		zone api {
			quota 10 month
		}
	}
}`, 4, `quota takes: quota <n|placeholder> per day|week|month [tz <IANA zone>]`},
	{"quota in an unknown zone", `:80 {
	rate_limit {
		zone api {
			rate 10 1s
			quota 10000 per month tz Europe/Atlantis
		}
	}
}`, 5, `unknown quota time zone "Europe/Atlantis"`},
	{"quota in the node's zone", `:80 {
	rate_limit {
		zone api {
			quota 10000 per month tz Local
		}
	}
}`, 4, `quota time zone "Local" would differ between nodes`},
	{"quota tz without a zone", `:80 {
	rate_limit {
		zone api {
			quota 10000 per month tz
		}
	}
}`, 4, `quota takes: quota <n|placeholder> per day|week|month [tz <IANA zone>]`},
	{"quota only, with a burst", `:80 {
	rate_limit {
		zone api {
			quota 100 per day
			burst 5
		}
	}
}`, 5, `a zone with only a quota takes no burst`},
	{"quota only, with an algorithm", `:80 {
	rate_limit {
		zone api {
			algorithm sliding_window
			quota 100 per day
		}
	}
}`, 4, `a zone with only a quota takes no algorithm`},
	{"cost above the quota", `:80 {
	rate_limit {
		zone api {
			rate 100 1s
			quota 10 per day
			cost 20
		}
	}
}`, 5, `cost 20 exceeds quota 10`},
	{"quota's name taken", `:80 {
	rate_limit {
		zone api {
			rate 100 1s
			quota 10 per day
		}
		zone api.quota {
			rate 1 1s
		}
	}
}`, 3, `its quota is reported as zone "api.quota", the name of another zone`},
}

func TestQuotaCaddyfileBadInput(t *testing.T) {
	for _, tc := range badQuotaCaddyfiles {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			checkBadCaddyfile(t, tc.caddyfile, tc.line, tc.phrase)
		})
	}
}
