package fleetlimit

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Validation of the configuration as written: the handler's checks, and
// the setting errors that let the Caddyfile adapter name a mistake's line.

// settingError is a mistake in one setting, named as the Caddyfile and the
// JSON name it, so that the Caddyfile adapter can report the line that gave
// it. The validate methods return it for mistakes that one setting makes.
type settingError struct {
	setting string
	err     error
}

// Error returns the mistake, without the setting's name.
func (e *settingError) Error() string { return e.err.Error() }

// Unwrap returns the mistake.
func (e *settingError) Unwrap() error { return e.err }

// inSetting marks err as a mistake in the named setting.
func inSetting(setting string, err error) error {
	return &settingError{setting: setting, err: err}
}

// setting is one setting of a config struct S, by the name that the JSON
// and the Caddyfile give it: where in S it is.
type setting[S, T any] struct {
	name  string
	field func(*S) *T
}

// oneOf lists names for an error: "a, b or c".
func oneOf(names []string) string {
	switch len(names) {
	case 0:
		return ""
	case 1:
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// headerModes and denialLevels are the values that headers and
// log_denials take.
var (
	headerModes  = []string{"ietf", "legacy", "both", "none"}
	denialLevels = []string{"info", "debug", "off"}
)

// validate checks the configuration as written, before provisioning: the
// handler's settings, its Redis settings and every zone. Provision calls
// it first, and the Caddyfile adapter at the end of the directive (and the
// validate methods of the redis and zone blocks at their ends), so that a
// Caddyfile's mistake comes with its line. A mistake in one setting is a
// *settingError.
func (h *Handler) validate() error {
	if _, err := parseHeaderMode(h.Headers); err != nil {
		return inSetting("headers", fmt.Errorf("unknown headers mode %q (want %s)", h.Headers, oneOf(headerModes)))
	}
	if _, err := parseDenialLevel(h.LogDenials); err != nil {
		return inSetting("log_denials", fmt.Errorf("unknown log_denials %q (want %s)", h.LogDenials, oneOf(denialLevels)))
	}
	if h.MaxKeys < 0 {
		return inSetting("max_keys", errors.New("max_keys must not be negative"))
	}
	if err := h.validateCompat(); err != nil {
		return err
	}
	if h.Redis != nil {
		if err := h.Redis.validate(); err != nil {
			return inSetting("redis", fmt.Errorf("redis: %w", err))
		}
	}
	if len(h.Zones) == 0 && len(h.RateLimits) == 0 {
		return errors.New("at least one zone is required")
	}
	seen := make(map[string]bool, len(h.Zones))
	for i, z := range h.Zones {
		at := zoneSetting(i)
		switch {
		case z == nil:
			return inSetting(at, fmt.Errorf("zone %d is empty", i))
		case seen[z.Name]:
			return inSetting(at, fmt.Errorf("zone %q is defined twice", z.Name))
		}
		seen[z.Name] = true
		if err := z.validate(); err != nil {
			return inSetting(at, fmt.Errorf("zone %q: %w", z.Name, err))
		}
	}
	return nil
}

// zoneSetting names the i-th zone as a setting, for settingError.
func zoneSetting(i int) string { return "zones." + strconv.Itoa(i) }
