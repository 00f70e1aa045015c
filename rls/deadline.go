package rls

import (
	"context"
	"sync"

	"time"
)

// decisionContext returns ctx with its deadline, if any, brought forward
// to half the time left: the decision waits for the store at most that
// (and at most the store's timeout), and the other half is for the answer's
// way back. The caller's deadline is counted from its side: the call's
// way here, on a loaded node or network, eats into it unseen, and an
// answer that arrives late is no answer (Envoy applies its own failure
// mode). With Envoy's 20ms, a store that has not answered in 10ms is
// answered for by the on_error policy.
func decisionContext(ctx context.Context) (context.Context, context.CancelFunc) {
	d, ok := ctx.Deadline()
	if !ok {
		return ctx, func() {}
	}
	dc := &decisionCtx{Context: ctx, deadline: d.Add(-time.Until(d) / 2)}
	return dc, dc.cancel
}

// decisionCtx is a call's context ending at an earlier deadline, as
// context.WithDeadline's does, but its timer is armed only when its Done
// channel is first asked for. A decision that the store answers in time
// (nearly all) reads only the deadline and Err; a timer armed, registered
// with the call's context and stopped again on every call cost a
// twentieth of the service's CPU.
type decisionCtx struct {
	context.Context // the call's
	deadline        time.Time

	mu sync.Mutex
	// timed is the context.WithDeadline behind Done, made by its first
	// call, and stop its cancel function; ended is set by cancel.
	timed context.Context
	stop  context.CancelFunc
	ended bool
}

// Deadline returns the decision's deadline.
func (c *decisionCtx) Deadline() (time.Time, bool) { return c.deadline, true }

// Done returns a channel closed when the call's context ends, the
// deadline passes or cancel is called, arming the timer on its first call.
func (c *decisionCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timed == nil {
		c.timed, c.stop = context.WithDeadline(c.Context, c.deadline)
		if c.ended {
			c.stop()
		}
	}
	return c.timed.Done()
}

// Err returns the error Done's channel closed with, or would have: the
// call's context's, context.DeadlineExceeded from the deadline on, and
// context.Canceled once cancel was called.
func (c *decisionCtx) Err() error {
	c.mu.Lock()
	timed, ended := c.timed, c.ended
	c.mu.Unlock()
	switch {
	case timed != nil:
		return timed.Err()
	case c.Context.Err() != nil:
		return c.Context.Err()
	case !time.Now().Before(c.deadline):
		return context.DeadlineExceeded
	case ended:
		return context.Canceled
	}
	return nil
}

// Value returns the value of key. Once Done was asked for, that is the
// timed context's, so that a context derived from this one (which asks
// for Done first) finds the timed context's cancellation and ends with
// it, rather than by a goroutine of its own.
func (c *decisionCtx) Value(key any) any {
	c.mu.Lock()
	timed := c.timed
	c.mu.Unlock()
	if timed != nil {
		return timed.Value(key)
	}
	return c.Context.Value(key)
}

// cancel ends the context, stopping the timer if it was armed.
func (c *decisionCtx) cancel() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ended = true
	if c.stop != nil {
		c.stop()
	}
}
