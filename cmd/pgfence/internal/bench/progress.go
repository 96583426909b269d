package bench

import (
	"fmt"
	"io"
	"os"
	"time"
)

// startProgress shows what runs on w: on a terminal a line refreshed with the
// elapsed and remaining time, elsewhere one line when the step starts. d is the
// step's duration and left the whole run's estimate (0: unknown). The returned
// function clears the line.
func startProgress(w io.Writer, label string, d, left time.Duration) (done func()) {
	return startProgressStatus(w, label, d, left, nil)
}

// isTerminal reports whether w is a terminal (progress lines are redrawn).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// startProgressStatus is startProgress with a status (how far the step has
// come) appended to the refreshed line; nil for none.
func startProgressStatus(w io.Writer, label string, d, left time.Duration, status func() string) (done func()) {
	tty := isTerminal(w)
	if d > 0 {
		label += " for " + d.String()
	}
	if !tty {
		if left > 0 {
			label += fmt.Sprintf(" (about %s left in all)", left.Round(time.Second))
		}
		fmt.Fprintf(w, "  %s\n", label)
		return func() {}
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		start := time.Now()
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			el := time.Since(start)
			line := fmt.Sprintf("\r\033[K  %s: %s elapsed", label, el.Round(100*time.Millisecond))
			if status != nil {
				line += ", " + status()
			}
			if left > 0 {
				line += fmt.Sprintf(", about %s left in all", max(left-el, 0).Round(time.Second))
			}
			fmt.Fprint(w, line)
			select {
			case <-stop:
				fmt.Fprint(w, "\r\033[K")
				return
			case <-t.C:
			}
		}
	}()
	return func() { close(stop); <-stopped }
}
