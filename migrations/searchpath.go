package migrations

import (
	"bytes"
	"io/fs"
	"path/filepath"
	"strings"
)

// searchPathPin is the first statement of every migration the migrator runs
// and of every script: for the rest of the transaction, every name that is
// not schema-qualified resolves in pg_catalog only, so that no object of
// another schema (say, public, which the database owner controls) is
// picked up by a column default, a constraint or a statement of a migration
// run as the migrating role.
const searchPathPin = `SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);`

// pinnedFS is the migrations as goose runs them: searchPathPin first in
// each Up and Down section.
type pinnedFS struct{}

func (pinnedFS) Open(name string) (fs.File, error) {
	f, err := files.Open(name)
	if err != nil || !migrationName.MatchString(filepath.Base(name)) {
		return f, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	raw, err := fs.ReadFile(files, name)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	for _, line := range strings.SplitAfter(string(raw), "\n") {
		b.WriteString(line)
		if t := strings.TrimSpace(line); t == "-- +goose Up" || t == "-- +goose Down" {
			b.WriteString(searchPathPin + "\n")
		}
	}
	return &memFile{Reader: bytes.NewReader(b.Bytes()), info: sizedInfo{FileInfo: info, size: int64(b.Len())}}, nil
}

type memFile struct {
	*bytes.Reader
	info fs.FileInfo
}

func (f *memFile) Stat() (fs.FileInfo, error) { return f.info, nil }
func (f *memFile) Close() error               { return nil }

type sizedInfo struct {
	fs.FileInfo
	size int64
}

func (i sizedInfo) Size() int64 { return i.size }
