package election

// ResignPending is how many resignations wait for e's Run to take them.
func ResignPending(e *Election) int { return len(e.resign) }
