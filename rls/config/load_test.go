package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeTree writes files (path: content) under a new directory.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestLoadDir(t *testing.T) {
	dir := writeTree(t, map[string]string{
		"api.yaml":            "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
		"no-extension":        "domain: plain\n",
		"sub/nested.yml":      "domain: nested\n",
		".hidden.yaml":        "domain: api\n",
		".git/config":         "not yaml: [",
		"..2026_01_01/x.yaml": "domain: api\n",
	})
	// A Kubernetes ConfigMap: a link to a file in a hidden directory.
	if err := os.Symlink(filepath.Join(dir, "..2026_01_01", "x.yaml"), filepath.Join(dir, "linked.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "..2026_01_01", "x.yaml"), []byte("domain: linked\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "sub"), filepath.Join(dir, "dirlink")); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.Domains(), ","); got != "api,linked,nested,plain" {
		t.Errorf("domains %s, want api,linked,nested,plain", got)
	}
	if l := cfg.Match("api", ents("k", "v")); l == nil || l.Source != filepath.Join(dir, "api.yaml")+":3" {
		t.Errorf("api rule %+v", l)
	}
	if w := cfg.Warnings(); len(w) != 1 || !strings.Contains(w[0], "dirlink: a link to a directory is not followed") {
		t.Errorf("warnings %q", w)
	}

	// The directory itself may be a link.
	link := filepath.Join(t.TempDir(), "current")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	cfg, err = LoadDir(link)
	if err != nil {
		t.Fatal(err)
	}
	if l := cfg.Match("api", ents("k", "v")); l == nil || l.Source != filepath.Join(link, "api.yaml")+":3" {
		t.Errorf("through a linked directory: %+v", l)
	}
}

func TestLoadDirErrors(t *testing.T) {
	if _, err := LoadDir(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing directory loaded")
	}
	dir := writeTree(t, map[string]string{
		"a.yaml":     "domain: same\n",
		"sub/b.yaml": "domain: other\n---\ndomain: x\n",
		"z.yaml":     "domain: same\n",
	})
	_, err := LoadDir(dir)
	want := filepath.Join(dir, "z.yaml") + `:1: duplicate domain "same" (first defined at ` + filepath.Join(dir, "a.yaml") + ":1)"
	if err == nil || err.Error() != want {
		t.Errorf("error %v, want %s", err, want)
	}
	if os.Getuid() != 0 {
		dir = writeTree(t, map[string]string{"locked.yaml": "domain: d\n"})
		if err := os.Chmod(filepath.Join(dir, "locked.yaml"), 0); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadDir(dir); err == nil {
			t.Error("an unreadable file was skipped")
		}
	}
	dir = writeTree(t, map[string]string{"bad.yaml": "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: eon}\n"})
	_, err = LoadDir(dir)
	if err == nil || !strings.HasPrefix(err.Error(), filepath.Join(dir, "bad.yaml")+":4: ") {
		t.Errorf("error %v, want it at bad.yaml:4", err)
	}
}
