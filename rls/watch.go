package rls

import (
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/fleetlimit/caddy-fleetlimit/limiter"
	"github.com/fleetlimit/caddy-fleetlimit/observe"
	"github.com/fleetlimit/caddy-fleetlimit/rls/config"
)

// Rules follow their files, as envoyproxy/ratelimit's do: every
// ConfigRefreshInterval the app looks at ConfigDir's files (names, sizes,
// modification times, links followed, so that a Kubernetes ConfigMap's
// update shows), and when they changed it loads them again. New rules take
// the place of the old between two calls; rules that do not load are
// logged with the file and line, and the old ones stay.

// defaultRefreshInterval is ConfigRefreshInterval's default.
const defaultRefreshInterval = 10 * time.Second

// watcher reloads the rules of a directory when its files change.
type watcher struct {
	dir       string
	every     time.Duration
	policy    limiter.Policy
	fleetSize int64
	store     limiter.Store
	service   *service
	logger    *zap.Logger
	// ctx and obsBase give each load of the rules its zones in the
	// observe package (observeRules).
	ctx     caddy.Context
	obsBase observe.Config
	last    [sha256.Size]byte // the files' fingerprint at the last load
	stop    chan struct{}
	done    chan struct{}
}

// start starts watching; the fingerprint is the files' now.
func (w *watcher) start() {
	w.last, _ = fingerprint(w.dir)
	w.stop, w.done = make(chan struct{}), make(chan struct{})
	go w.run()
}

// close stops watching and waits until it has.
func (w *watcher) close() {
	close(w.stop)
	<-w.done
}

// run looks at the files every w.every until stopped.
func (w *watcher) run() {
	defer close(w.done)
	t := time.NewTicker(w.every)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
			w.check()
		}
	}
}

// check loads the rules again if the files changed.
func (w *watcher) check() {
	sum, err := fingerprint(w.dir)
	if err != nil || sum == w.last {
		return // unreadable now: the load would fail; try at the next tick
	}
	w.last = sum
	cfg, err := config.LoadDir(w.dir)
	if err == nil {
		var rs *rules
		if rs, err = compileRules(cfg, w.policy, w.fleetSize, w.store); err == nil {
			err = rs.observeRules(w.ctx, w.obsBase)
		}
		if err == nil {
			if old := w.service.rules.Swap(rs); old != nil {
				if err := old.releaseObserved(); err != nil {
					w.logger.Warn("releasing the previous rules' statistics", zap.Error(err))
				}
			}
			w.logger.Info("rate limit service rules reloaded", zap.Strings("domains", cfg.Domains()), zap.Int("rules", len(cfg.Limits())))
			return
		}
	}
	w.logger.Error("rate limit service rules changed but do not load; the previous rules stay", zap.Error(err))
}

// fingerprint hashes the names, sizes and modification times of the files
// under dir that config.LoadDir reads (names starting with a dot skipped,
// links to files followed).
func fingerprint(dir string) ([sha256.Size]byte, error) {
	h := sha256.New()
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return [sha256.Size]byte{}, err
	}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case path != root && strings.HasPrefix(d.Name(), "."):
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		case d.IsDir():
			return nil
		}
		info, err := os.Stat(path)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%d\x00%d\x00", path, info.Size(), info.ModTime().UnixNano())
		return nil
	})
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum, err
}
