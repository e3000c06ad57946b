package meter

import "github.com/gpuarb/gpuarb/ioctlspy"

// Stream capture: between cuStreamBeginCapture and cuStreamEndCapture,
// what is launched on the capturing stream is recorded into a graph and
// runs nothing (it runs when the graph is launched, as the graph's cost).
// A stream that waits on an event recorded in a capture joins it (the
// fork of a multi-stream capture) until that capture ends. Counted as
// work, the captured launches of a program that captures its graphs at
// start (CUDA graphs in PyTorch, LLM decode) made its first sync prove
// a huge backlog drained in no time, and collapsed its costs.

// maxCapturedEvents bounds the events a context remembers as recorded in
// a capture (a capture forks to a few streams).
const maxCapturedEvents = 256

// capture begins or ends a stream capture.
func (m *Meter) capture(c *gpuContext, e *ioctlspy.StreamCapture) {
	if e.Begin {
		s := m.streamOf(c, e.Stream)
		s.capturing, s.captureOf = true, e.Stream
		return
	}
	for _, s := range c.streams {
		if s.capturing && s.captureOf == e.Stream {
			s.capturing = false
		}
	}
	for ev, of := range c.capturedEvents {
		if of == e.Stream {
			delete(c.capturedEvents, ev)
		}
	}
}

// capturing tells whether the stream with key h is in a stream capture.
func (c *gpuContext) capturing(h uint64) bool {
	s := c.findStream(h)
	return s != nil && s.capturing
}

// recordCaptured notes an event recorded on the stream with key h and
// tells whether the record was captured (a node of the graph, marking
// nothing of the stream's work).
func (c *gpuContext) recordCaptured(h, event uint64) bool {
	s := c.findStream(h)
	if s == nil || !s.capturing {
		delete(c.capturedEvents, event)
		return false
	}
	if _, ok := c.capturedEvents[event]; ok || len(c.capturedEvents) < maxCapturedEvents {
		c.capturedEvents[event] = s.captureOf
	}
	return true
}

// joinCapture makes the stream with key h join the capture an event it
// waits on was recorded in.
func (c *gpuContext) joinCapture(h, event uint64) {
	of, ok := c.capturedEvents[event]
	if !ok {
		return
	}
	if s, folded := c.stream(h); !folded && !s.capturing {
		s.capturing, s.captureOf = true, of
	}
}
