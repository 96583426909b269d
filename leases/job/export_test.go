package job

// TakenOverFrom is the fencing token of the earlier run s took over, or 0.
func TakenOverFrom(s *Slot) int64 { return s.previous }
