package console

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgfence/pgfence/pgfence/pgfencetest"
)

// The overview runs the doctor once at once, then reuses its findings and
// reruns it in the background when they are older than DoctorEvery; Close
// waits for a run in flight.
func TestDoctorRerunsInTheBackground(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	var runs atomic.Int32
	release := make(chan struct{})
	s, err := New(context.Background(), &Config{Pool: pool, DoctorEvery: time.Nanosecond, Doctor: func(context.Context) []Finding {
		n := runs.Add(1)
		if n > 1 {
			<-release // a slow run: the overview must not wait for it
		}
		return []Finding{{Name: "run", Status: "ok", Detail: strings.Repeat("I", int(n))}}
	}})
	if err != nil {
		t.Fatal(err)
	}
	overview := func() string {
		w := httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://localhost/", nil))
		if w.Code != http.StatusOK {
			t.Fatalf("overview: %d\n%s", w.Code, w.Body)
		}
		return w.Body.String()
	}
	if body := overview(); !strings.Contains(body, "<td>I</td>") {
		t.Fatalf("the first overview lacks the first run's finding:\n%s", body)
	}
	if body := overview(); !strings.Contains(body, "<td>I</td>") { // returns while run 2 waits
		t.Fatalf("the second overview lacks the cached finding:\n%s", body)
	}
	close(release)
	s.Close() // waits for run 2
	if n := runs.Load(); n != 2 {
		t.Errorf("the doctor ran %d times, want 2", n)
	}
	if f := s.doctor.findings; len(f) != 1 || f[0].Detail != "II" {
		t.Errorf("after the background run the findings are %+v", f)
	}
}
