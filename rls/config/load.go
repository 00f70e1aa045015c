package config

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// File is one configuration file: its name, which errors and warnings
// give, and its content.
type File struct {
	Name string
	Data []byte
}

// Load builds a Config from files of the reference's YAML format, one
// domain a file, in order. A domain may be defined in one file only. The
// error names the file and the line of the first mistake.
func Load(files []File) (*Config, error) {
	b := newBuilder()
	for _, f := range files {
		d, warnings, err := readYAML(f.Name, f.Data)
		if err != nil {
			return nil, err
		}
		b.cfg.warnings = append(b.cfg.warnings, warnings...)
		if err := b.add(d); err != nil {
			return nil, err
		}
	}
	return b.cfg, nil
}

// LoadDir builds a Config from every file under dir, in subdirectories
// too, whatever their names end with, as envoyproxy/ratelimit reads its
// runtime directory ($RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/config) with
// RUNTIME_IGNOREDOTFILES=true: files and directories whose names begin
// with a dot are skipped. So a Kubernetes ConfigMap mounted as the
// directory is read once, through its links, not again through its hidden
// "..data" copies. A link to a file is followed; a link to a directory is
// not (a warning says so). A file that cannot be read fails the load.
func LoadDir(dir string) (*Config, error) {
	files, warnings, err := readDir(dir)
	if err != nil {
		return nil, err
	}
	cfg, err := Load(files)
	if err != nil {
		return nil, err
	}
	cfg.warnings = append(warnings, cfg.warnings...)
	return cfg, nil
}

// readDir reads the files that LoadDir loads, in lexical order, each named
// by its path under dir (dir itself may be a link).
func readDir(dir string) ([]File, []string, error) {
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("reading rate limit configuration: %w", err)
	}
	var files []File
	var warnings []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if rel, err := filepath.Rel(root, path); err == nil {
			path = filepath.Join(dir, rel)
		}
		switch {
		case path != filepath.Clean(dir) && strings.HasPrefix(d.Name(), "."):
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		case d.IsDir():
			return nil
		}
		info, err := os.Stat(path) // follows a link
		switch {
		case err != nil:
			return err
		case info.IsDir():
			warnings = append(warnings, fmt.Sprintf("%s: a link to a directory is not followed", path))
			return nil
		case !info.Mode().IsRegular():
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files = append(files, File{Name: path, Data: data})
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("reading rate limit configuration: %w", err)
	}
	return files, warnings, nil
}
