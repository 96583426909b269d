package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/pgfence/pgfence/idempotency"
)

// The operator actions of --allow-actions. Each calls what the CLI's command
// calls, so the database records it the same way: pause and resume in
// pgfence.grant_pause_events (role, reason, time), a force release in the
// key's pgfence.lease_events (reason, time), a failed abandoned key in its
// row (failure code "abandoned", epoch, completion time).
type action struct {
	title  string
	fields []field
	// preview describes what the action would do now (read only).
	preview func(s *Server, ctx context.Context, v url.Values) (string, error)
	do      func(s *Server, ctx context.Context, v url.Values) (string, error)
}

type field struct {
	Name, Label, Help string
	Required          bool
	Value             string
}

const csrfCookie = "pgfence_csrf"

var actions = map[string]action{
	"release": {
		title:  "Force-release a lease",
		fields: []field{{Name: "key", Label: "Key", Required: true}, {Name: "reason", Label: "Reason", Required: true, Help: "recorded in the key's history"}},
		preview: func(s *Server, ctx context.Context, v url.Values) (string, error) {
			l, err := s.leases.Get(ctx, v.Get("key"))
			if err != nil {
				return "", err
			}
			if !l.Live {
				return fmt.Sprintf("The lease of %q is not held (token %d); releasing records nothing new.", l.Key, l.Token), nil
			}
			return fmt.Sprintf("Ends the live grant of %q: token %d, holder %s (%s), %s left. Its holder finds out at its next renewal; its lease-checked writes are refused from now on, its fenced writes once the key's next holder has written.",
				l.Key, l.Token, l.Holder, l.HolderInfo, left(l.Remaining)), nil
		},
		do: func(s *Server, ctx context.Context, v url.Values) (string, error) {
			res, err := s.leases.ForceRelease(ctx, v.Get("key"), v.Get("reason"))
			switch {
			case err != nil:
				return "", err
			case !res.Released:
				return fmt.Sprintf("Nothing to release: key %q has no current grant.", v.Get("key")), nil
			case res.WasLive:
				return fmt.Sprintf("Released the live grant of %q (token %d, holder %s).", v.Get("key"), res.Token, res.Holder), nil
			}
			return fmt.Sprintf("Released the expired grant of %q (token %d, holder %s).", v.Get("key"), res.Token, res.Holder), nil
		},
	},
	"pause": {
		title:  "Pause new grants",
		fields: []field{{Name: "prefix", Label: "Key prefix", Help: "empty: every key"}, {Name: "reason", Label: "Reason", Required: true, Help: "recorded with your role in pgfence.grant_pause_events"}},
		preview: func(_ *Server, _ context.Context, v url.Values) (string, error) {
			return fmt.Sprintf("New grants of keys starting with %q will be refused; current holders keep renewing, writing and releasing.", v.Get("prefix")), nil
		},
		do: func(s *Server, ctx context.Context, v url.Values) (string, error) {
			added, err := s.leases.PauseGrants(ctx, v.Get("prefix"), v.Get("reason"))
			if err != nil {
				return "", err
			}
			if !added {
				return fmt.Sprintf("New grants of keys starting with %q are still paused (reason replaced).", v.Get("prefix")), nil
			}
			return fmt.Sprintf("New grants of keys starting with %q are paused.", v.Get("prefix")), nil
		},
	},
	"resume": {
		title:  "Resume grants",
		fields: []field{{Name: "prefix", Label: "Key prefix", Help: "lifts the pause of exactly this prefix"}, {Name: "reason", Label: "Reason", Help: "optional; recorded in pgfence.grant_pause_events"}},
		preview: func(_ *Server, _ context.Context, v url.Values) (string, error) {
			return fmt.Sprintf("Lifts the pause of exactly %q; waiting acquirers are woken.", v.Get("prefix")), nil
		},
		do: func(s *Server, ctx context.Context, v url.Values) (string, error) {
			removed, err := s.leases.ResumeGrants(ctx, v.Get("prefix"), v.Get("reason"))
			if err != nil {
				return "", err
			}
			if !removed {
				return fmt.Sprintf("Prefix %q was not paused (a pause lifts only with its exact prefix).", v.Get("prefix")), nil
			}
			return fmt.Sprintf("New grants of keys starting with %q are allowed again.", v.Get("prefix")), nil
		},
	},
	"fail-abandoned": {
		title: "Fail abandoned idempotency keys",
		fields: []field{{Name: "scope_prefix", Label: "Scope prefix", Help: "empty: every scope"},
			{Name: "expired_for", Label: "Lease ended at least", Help: "e.g. 10m (database clock)"},
			{Name: "limit", Label: "At most", Help: "keys, oldest lease end first (default 100)"}},
		preview: func(s *Server, ctx context.Context, v url.Values) (string, error) {
			o, err := recoverOptions(v)
			if err != nil {
				return "", err
			}
			keys, err := s.store.Abandoned(ctx, s.cfg.Pool, o)
			if err != nil {
				return "", err
			}
			msg := fmt.Sprintf("%d abandoned key(s) match now; each is taken over as a retry would and stores the failure code \"abandoned\" that every retry then replays:", len(keys))
			for _, k := range keys {
				msg += fmt.Sprintf(" %q/%q (recovery point %q);", k.Scope, k.Key, k.RecoveryPoint)
			}
			return msg, nil
		},
		do: func(s *Server, ctx context.Context, v url.Values) (string, error) {
			o, err := recoverOptions(v)
			if err != nil {
				return "", err
			}
			res, err := s.store.Recover(ctx, s.cfg.Pool, o, nil)
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("Marked %d abandoned key(s) failed with code \"abandoned\" (%d found, %d taken first by a retry or another completer).", res.Failed, res.Found, res.Skipped), nil
		},
	},
}

func recoverOptions(v url.Values) (*idempotency.RecoverOptions, error) {
	o := &idempotency.RecoverOptions{ScopePrefix: v.Get("scope_prefix")}
	var err error
	if e := v.Get("expired_for"); e != "" {
		if o.ExpiredFor, err = time.ParseDuration(e); err != nil || o.ExpiredFor < 0 {
			return nil, fmt.Errorf("lease ended at least %q: want a duration such as 10m", e)
		}
	}
	if l := v.Get("limit"); l != "" {
		if o.Limit, err = strconv.Atoi(l); err != nil || o.Limit < 1 {
			return nil, fmt.Errorf("at most %q: want a positive number", l)
		}
	}
	return o, nil
}

type confirmData struct {
	Name, Title, Preview, Err, Result string
	Fields                            []field
}

// confirm shows what the action would do and the form that does it.
func (s *Server) confirm(name string, a action) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v := r.URL.Query()
		d := confirmData{Name: name, Title: a.title}
		for _, f := range a.fields {
			f.Value = v.Get(f.Name)
			d.Fields = append(d.Fields, f)
		}
		var err error
		if d.Preview, err = a.preview(s, r.Context(), v); err != nil {
			d.Err = err.Error()
		}
		s.render(w, r, http.StatusOK, "confirm", a.title, d)
	}
}

// act runs the action, if the POST comes from the console's own form.
func (s *Server) act(name string, a action) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := s.checkForm(r); err != nil {
			s.fail(w, r, http.StatusForbidden, err)
			return
		}
		d := confirmData{Name: name, Title: a.title}
		for _, f := range a.fields {
			f.Value = r.PostForm.Get(f.Name)
			if f.Required && f.Value == "" {
				s.fail(w, r, http.StatusBadRequest, fmt.Errorf("%s is required", f.Label))
				return
			}
			d.Fields = append(d.Fields, f)
		}
		res, err := a.do(s, r.Context(), r.PostForm)
		if err != nil {
			s.fail(w, r, http.StatusBadRequest, err)
			return
		}
		d.Result = res
		s.render(w, r, http.StatusOK, "confirm", a.title, d)
	}
}

// checkForm refuses a POST that does not come from a page of this console:
// its Origin must be the console's, and the process's token must be in both
// the form and the SameSite cookie.
func (s *Server) checkForm(r *http.Request) error {
	origin := r.Header.Get("Origin")
	if u, err := url.Parse(origin); origin == "" || err != nil || u.Host != r.Host {
		return fmt.Errorf("refused: the request comes from %q, not from a page of this console", origin)
	}
	if err := r.ParseForm(); err != nil {
		return err
	}
	c, err := r.Cookie(csrfCookie)
	if err != nil || !same(c.Value, s.csrf) || !same(r.PostForm.Get("csrf"), s.csrf) {
		return errors.New("refused: the form's token does not match this console's (reload the page and confirm again)")
	}
	return nil
}
