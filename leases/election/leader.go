package election

import (
	"time"

	"github.com/pgfence/pgfence/leases"
)

// Leader is the leadership of an election at one moment, as the database
// recorded it.
type Leader struct {
	// Term is the fencing token of the leader's grant: it increases with
	// every term, and the leader's fenced writes carry it. 0 when nobody
	// leads.
	Term int64
	// Holder is the holder id (a UUID) of the leader's grant.
	Holder string
	// Value is what the leader published: its HolderInfo when elected, or
	// its latest [Term.Proclaim].
	Value string
	// Since is when the term began, by the database clock. For Term 0 it is
	// when the last term ended as [Election.Observe] and [Config.OnLeader]
	// saw it, and zero from [Election.Leader].
	Since time.Time
}

// apply returns the leadership after ev, and whether it changed.
func (l Leader) apply(ev leases.Event) (Leader, bool) {
	switch {
	case ev.Granted():
		return Leader{Term: ev.Token, Holder: ev.Holder, Value: ev.HolderInfo, Since: ev.At}, true
	case ev.Kind == "info_changed" && ev.Token == l.Term:
		if ev.HolderInfo == l.Value {
			return l, false
		}
		l.Value = ev.HolderInfo
		return l, true
	case ev.Ended() && ev.Token == l.Term && l.Term != 0:
		return Leader{Since: ev.At}, true
	}
	return l, false
}
