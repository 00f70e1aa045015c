package chaos

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"
)

// banSeen is a ban as the admin API listed it (GET /rate_limit/bans).
type banSeen struct {
	Zone  string    `json:"zone"`
	Key   string    `json:"key"`
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
}

// banWatcher polls every node's ban list during the load and keeps every
// ban it saw.
type banWatcher struct {
	mu   sync.Mutex
	bans map[banSeen]bool
}

// banPoll is how often the ban lists are read: bans last seconds.
const banPoll = 250 * time.Millisecond

// watchBans polls the admin endpoints admins() returns until ctx ends.
func watchBans(ctx context.Context, admins func() []string) *banWatcher {
	w := &banWatcher{bans: map[banSeen]bool{}}
	cl := &http.Client{Timeout: 2 * time.Second}
	go func() {
		tick := time.NewTicker(banPoll)
		defer tick.Stop()
		for {
			for _, a := range admins() {
				w.read(cl, a)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

func (w *banWatcher) read(cl *http.Client, admin string) {
	resp, err := cl.Get("http://" + admin + "/rate_limit/bans?limit=1000")
	if err != nil {
		return
	}
	defer resp.Body.Close()
	var body struct {
		Bans []banSeen `json:"bans"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&body) != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, b := range body.Bans {
		w.bans[b] = true
	}
}

// list returns the bans seen.
func (w *banWatcher) list() []banSeen {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []banSeen
	for b := range w.bans {
		out = append(out, b)
	}
	return out
}
