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

// No page waits for the doctor: the overview starts its run in the
// background, shows the findings of the last run that ended, and reruns it
// when they are older than DoctorEvery; Close waits for a run in flight.
func TestDoctorRunsInTheBackground(t *testing.T) {
	t.Parallel()
	pool := pgfencetest.NewPool(t)
	var runs atomic.Int32
	release := make(chan struct{}, 2)
	s, err := New(context.Background(), &Config{Pool: pool, DoctorEvery: time.Nanosecond, Doctor: func(context.Context) []Finding {
		n := runs.Add(1)
		<-release // a slow run: the overview must not wait for it
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
	if body := overview(); !strings.Contains(body, "first run is under way") { // returns while run 1 waits
		t.Fatalf("the first overview waited for the doctor, or does not say it runs:\n%s", body)
	}
	release <- struct{}{}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		s.doctor.Lock()
		done := s.doctor.findings != nil
		s.doctor.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the doctor's first run never ended")
		}
	}
	if body := overview(); !strings.Contains(body, "<td>I</td>") { // shows run 1, starts run 2
		t.Fatalf("the overview lacks the first run's finding:\n%s", body)
	}
	release <- struct{}{}
	s.Close() // waits for run 2
	if n := runs.Load(); n != 2 {
		t.Errorf("the doctor ran %d times, want 2", n)
	}
	if f := s.doctor.findings; len(f) != 1 || f[0].Detail != "II" {
		t.Errorf("after the background run the findings are %+v", f)
	}
}
