package config

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// FuzzLoad feeds Load arbitrary files: it must not panic, must answer
// within a bound that follows from the file's size, and a file it accepts
// must give rules that their own entries find.
func FuzzLoad(f *testing.F) {
	names, _ := filepath.Glob(filepath.Join("testdata", "*.yaml"))
	for _, n := range names {
		data, err := os.ReadFile(n)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(valuesConfig))
	f.Add([]byte(sameAsXDS))
	f.Add([]byte("domain: d\ndescriptors: &l\n  - key: k\n    descriptors: *l\n"))
	f.Add([]byte("domain: d\ndescriptors:\n  - {key: k, rate_limit: {<<: {unit: day}, requests_per_unit: 1}}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<16 {
			return
		}
		start := time.Now()
		cfg, err := Load([]File{{Name: "fuzz.yaml", Data: data}})
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("Load took %v on %d bytes", d, len(data))
		}
		if err != nil {
			return
		}
		for _, l := range cfg.Limits() {
			es := entriesOf(l)
			if m := cfg.Match(l.Domain, es); m != nil {
				m.MetricKey(es)
				m.AppendCounterKey(nil, es)
			}
		}
	})
}
