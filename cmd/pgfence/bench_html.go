package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/pgfence/pgfence/cmd/pgfence/internal/benchreport"
)

// htmlFlag registers --html FILE on a bench command.
func htmlFlag(fs *flag.FlagSet) *string {
	return fs.String("html", "", "also write the tables and their curves to `FILE`, one self-contained HTML page (inline SVG, nothing loaded from elsewhere)")
}

// htmlReport is the file of --html. It is made in FILE's directory before
// the run, so that a path that cannot be written fails before minutes of
// measuring, and renamed to FILE once written, so that a failed run leaves
// an earlier report as it was.
type htmlReport struct {
	path string
	tmp  *os.File
}

// createHTML starts --html's file; nil when path is empty.
func createHTML(path string) (*htmlReport, error) {
	if path == "" {
		return nil, nil
	}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return nil, usageError("--html: %s is a directory; name the file to write", path)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return nil, usageError("--html: cannot write %s: %v", path, err)
	}
	return &htmlReport{path: path, tmp: tmp}, nil
}

// write renders the report into the file and puts it in place. An error
// comes after the command printed its output: the figures are not lost.
// hint says which runs have curves, for a run that has none.
func (h *htmlReport) write(render func(io.Writer) error, hint string) error {
	if h == nil {
		return nil
	}
	err := render(h.tmp)
	if errors.Is(err, benchreport.ErrNoCurves) {
		return &cliError{msg: fmt.Sprintf("--html: %v, so %s was not written (the figures are in the output above)", err, h.path), hint: hint, code: exitUsage}
	}
	if err == nil {
		err = h.tmp.Close()
	}
	if err == nil {
		err = os.Rename(h.tmp.Name(), h.path)
	}
	if err != nil {
		return &cliError{msg: fmt.Sprintf("--html: writing %s: %v (the figures are in the output above)", h.path, err), code: exitFailure, err: err}
	}
	h.tmp = nil
	return nil
}

// close removes the temporary file of a report that was not written.
func (h *htmlReport) close() {
	if h != nil && h.tmp != nil {
		h.tmp.Close()
		os.Remove(h.tmp.Name())
	}
}
