package rls

import (
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	fleetlimit "github.com/fleetlimit/caddy-fleetlimit"
)

func init() {
	httpcaddyfile.RegisterGlobalOption("rate_limit_rls", parseGlobalOption)
}

// parseGlobalOption sets up the rate_limit_rls app from its global option:
//
//	{
//	    rate_limit_rls {
//	        listen <addresses...>
//	        config_dir <directory>
//	        xds {
//	            address <host:port>
//	            node_id <id>
//	            tls {
//	                cert_file <file>
//	                key_file <file>
//	                ca_file <file>
//	                server_name <name>
//	            }
//	            backoff_initial <duration>
//	            backoff_max <duration>
//	        }
//	        redis {
//	            # as in the rate_limit directive
//	        }
//	        tls {
//	            listen <addresses...>
//	            cert_file <file>
//	            key_file <file>
//	            client_ca_file <file>
//	        }
//	        on_error local|deny|allow
//	        fleet_size <n>
//	        max_keys <n>
//	        max_descriptors <n>
//	        max_entries <n>
//	        max_entry_bytes <n>
//	        config_refresh_interval <duration>
//	        grace_period <duration>
//	    }
//	}
func parseGlobalOption(d *caddyfile.Dispenser, existing any) (any, error) {
	if existing != nil {
		return nil, d.Err("rate_limit_rls is given twice")
	}
	app := new(App)
	if err := app.UnmarshalCaddyfile(d); err != nil {
		return nil, err
	}
	return httpcaddyfile.App{Name: "rate_limit_rls", Value: caddyconfig.JSON(app, nil)}, nil
}

// UnmarshalCaddyfile reads the rate_limit_rls global option, the
// dispenser on its name. Errors carry the file and line.
func (a *App) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the option's name
	start := *d
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		if err := a.unmarshalSetting(d, d.Val()); err != nil {
			return err
		}
	}
	if err := a.Validate(); err != nil {
		return start.Errf("rate_limit_rls: %v", err)
	}
	return nil
}

// counts are the settings that take one non-negative whole number.
var counts = map[string]func(a *App) *int{
	"max_keys":        func(a *App) *int { return &a.MaxKeys },
	"max_descriptors": func(a *App) *int { return &a.MaxDescriptors },
	"max_entries":     func(a *App) *int { return &a.MaxEntries },
	"max_entry_bytes": func(a *App) *int { return &a.MaxEntryBytes },
}

// unmarshalSetting reads one setting of the block.
func (a *App) unmarshalSetting(d *caddyfile.Dispenser, sub string) error {
	switch sub {
	case "listen":
		args := d.RemainingArgs()
		if len(args) == 0 {
			return d.ArgErr()
		}
		a.Listen = append(a.Listen, args...)
		return nil
	case "redis":
		if a.Redis != nil {
			return d.Err("rate_limit_rls: only one redis block is allowed")
		}
		a.Redis = new(fleetlimit.RedisConfig)
		return a.Redis.UnmarshalCaddyfile(d)
	case "tls":
		if a.TLS != nil {
			return d.Err("rate_limit_rls: only one tls block is allowed")
		}
		a.TLS = new(TLS)
		return a.TLS.unmarshalCaddyfile(d)
	case "xds":
		if a.XDS != nil {
			return d.Err("rate_limit_rls: only one xds block is allowed")
		}
		a.XDS = new(XDS)
		return a.XDS.unmarshalCaddyfile(d)
	}
	var arg string
	if !d.Args(&arg) || d.NextArg() {
		return d.Errf("rate_limit_rls %s takes one argument", sub)
	}
	switch sub {
	case "config_dir":
		a.ConfigDir = arg
	case "on_error":
		a.OnError = arg
	case "fleet_size":
		n, err := strconv.ParseInt(arg, 10, 64)
		if err != nil || n < 1 {
			return d.Errf("rate_limit_rls fleet_size must be a positive whole number, got %q", arg)
		}
		a.FleetSize = n
	case "grace_period", "config_refresh_interval":
		dur, err := caddy.ParseDuration(arg)
		if err != nil || dur < 0 {
			return d.Errf("rate_limit_rls %s must be a duration, got %q", sub, arg)
		}
		if sub == "grace_period" {
			a.GracePeriod = caddy.Duration(dur)
		} else {
			a.ConfigRefreshInterval = caddy.Duration(dur)
		}
	default:
		field, ok := counts[sub]
		if !ok {
			return d.Errf("unknown rate_limit_rls setting %q (want listen, config_dir, xds, redis, tls, on_error, fleet_size, "+
				"max_keys, max_descriptors, max_entries, max_entry_bytes, config_refresh_interval or grace_period)", sub)
		}
		n, err := strconv.Atoi(arg)
		if err != nil || n < 0 {
			return d.Errf("rate_limit_rls %s must be a whole number, got %q", sub, arg)
		}
		*field(a) = n
	}
	return nil
}

// unmarshalCaddyfile reads the tls block, the dispenser on `tls`.
func (t *TLS) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	start := *d
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
		if sub == "listen" {
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			t.Listen = append(t.Listen, args...)
			continue
		}
		var arg string
		if !d.Args(&arg) || d.NextArg() {
			return d.Errf("rate_limit_rls tls %s takes one argument", sub)
		}
		switch sub {
		case "cert_file":
			t.CertFile = arg
		case "key_file":
			t.KeyFile = arg
		case "client_ca_file":
			t.ClientCAFile = arg
		default:
			return d.Errf("unknown rate_limit_rls tls setting %q (want listen, cert_file, key_file or client_ca_file)", sub)
		}
	}
	if err := t.validate(); err != nil {
		return start.Errf("rate_limit_rls tls: %v", err)
	}
	return nil
}

// unmarshalCaddyfile reads the xds block, the dispenser on `xds`.
func (x *XDS) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	start := *d
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
		if sub == "tls" {
			if x.TLS != nil {
				return d.Err("rate_limit_rls xds: only one tls block is allowed")
			}
			x.TLS = new(XDSTLS)
			if err := x.TLS.unmarshalCaddyfile(d); err != nil {
				return err
			}
			continue
		}
		var arg string
		if !d.Args(&arg) || d.NextArg() {
			return d.Errf("rate_limit_rls xds %s takes one argument", sub)
		}
		switch sub {
		case "address":
			x.Address = arg
		case "node_id":
			x.NodeID = arg
		case "backoff_initial", "backoff_max":
			dur, err := caddy.ParseDuration(arg)
			if err != nil || dur <= 0 {
				return d.Errf("rate_limit_rls xds %s must be a positive duration, got %q", sub, arg)
			}
			if sub == "backoff_initial" {
				x.BackoffInitial = caddy.Duration(dur)
			} else {
				x.BackoffMax = caddy.Duration(dur)
			}
		default:
			return d.Errf("unknown rate_limit_rls xds setting %q (want address, node_id, tls, backoff_initial or backoff_max)", sub)
		}
	}
	if err := x.validate(); err != nil {
		return start.Errf("rate_limit_rls xds: %v", err)
	}
	return nil
}

// unmarshalCaddyfile reads the xds block's tls block, the dispenser on
// `tls`; an empty block (or none) is TLS with the system's authorities.
func (t *XDSTLS) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
		var arg string
		if !d.Args(&arg) || d.NextArg() {
			return d.Errf("rate_limit_rls xds tls %s takes one argument", sub)
		}
		switch sub {
		case "cert_file":
			t.CertFile = arg
		case "key_file":
			t.KeyFile = arg
		case "ca_file":
			t.CAFile = arg
		case "server_name":
			t.ServerName = arg
		default:
			return d.Errf("unknown rate_limit_rls xds tls setting %q (want cert_file, key_file, ca_file or server_name)", sub)
		}
	}
	return nil
}
