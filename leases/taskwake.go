package leases

import "strings"

// taskNotifyChannel is the channel on which pgfence.task_enqueue announces
// the first open task of a key (payload: the key), and pgfence.task_retry
// and pgfence.task_skip a key they unblock.
const taskNotifyChannel = "pgfence_task_enqueued"

type taskWake struct {
	prefix string
	ch     chan struct{} // buffered, 1
}

// WakeOnTasks is for the consumers of package leases/tasks: the channel it
// returns receives a value when a task key that starts with prefix gets its
// first open task (announced by pgfence.task_enqueue), and whenever the
// client's LISTEN connection goes down or comes up (announcements may be
// missed meanwhile). It starts that connection, unless
// [Config.DisableWakeups] (then the channel stays quiet: poll). stop ends
// the subscription. The announcements are hints: keep polling as well.
func (c *Client) WakeOnTasks(prefix string) (wake <-chan struct{}, stop func()) {
	w := &taskWake{prefix: prefix, ch: make(chan struct{}, 1)}
	c.mu.Lock()
	c.taskWakes[w] = struct{}{}
	c.mu.Unlock()
	c.startListener()
	return w.ch, func() {
		c.mu.Lock()
		delete(c.taskWakes, w)
		c.mu.Unlock()
	}
}

// wakeTasks wakes the task subscribers whose prefix key starts with, or
// every subscriber when key is "".
func (c *Client) wakeTasks(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for w := range c.taskWakes {
		if key == "" || strings.HasPrefix(key, w.prefix) {
			offer(w.ch, struct{}{})
		}
	}
}
