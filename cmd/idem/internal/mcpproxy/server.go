package mcpproxy

import (
	"bytes"
	"encoding/json"
	"sort"
	"strings"
)

// The server's side of the session: its messages, and the answers the proxy waits for.

// expect registers a wait for the server's answer to the proxy's request iid.
func (s *session) expect(iid string) chan []byte {
	ch := make(chan []byte, 1)
	s.mu.Lock()
	s.internal[idKey(jsonString(iid))] = ch
	s.mu.Unlock()
	return ch
}

func (s *session) unexpect(iid string) {
	s.mu.Lock()
	delete(s.internal, idKey(jsonString(iid)))
	s.mu.Unlock()
}

// fromChild handles one message of server c.
func (s *session) fromChild(c *child, msg []byte) {
	var h header
	if json.Unmarshal(msg, &h) != nil {
		s.writeClient(msg)
		return
	}
	switch {
	case h.Method == "" && h.hasID():
		k := idKey(h.ID)
		s.mu.Lock()
		if ch, ok := s.internal[k]; ok {
			delete(s.internal, k)
			s.mu.Unlock()
			ch <- bytes.Clone(msg)
			return
		}
		if strings.HasPrefix(k, `"`+internalPrefix) {
			s.mu.Unlock()
			return // the answer to a request the proxy gave up on
		}
		pd, ok := s.pending[k]
		if ok {
			delete(s.pending, k)
		}
		var res struct {
			Result json.RawMessage `json:"result"`
		}
		_ = json.Unmarshal(msg, &res)
		if ok && (pd.method == "initialize" || pd.method == "server/discover") && res.Result != nil {
			s.initialized = true
		}
		if ok && pd.method == "tools/list" {
			s.noteTools(res.Result)
		}
		s.mu.Unlock()
		s.writeClient(msg)
	case h.hasID():
		s.mu.Lock()
		c.requests[idKey(h.ID)] = true
		s.mu.Unlock()
		s.writeClient(msg)
	default:
		s.writeClient(msg)
	}
}

// noteTools remembers which tools a tools/list result marks read-only and
// which it lists; on the last page (no nextCursor), it reports the tools of
// the configuration that no page listed. Called with s.mu held.
func (s *session) noteTools(result json.RawMessage) {
	var r struct {
		Tools []struct {
			Name        string `json:"name"`
			Annotations struct {
				ReadOnlyHint bool `json:"readOnlyHint"`
			} `json:"annotations"`
		} `json:"tools"`
		NextCursor string `json:"nextCursor"`
	}
	if json.Unmarshal(result, &r) != nil {
		return
	}
	for _, t := range r.Tools {
		s.readOnly[t.Name] = t.Annotations.ReadOnlyHint
		s.listed[t.Name] = true
	}
	if r.NextCursor != "" {
		return
	}
	var missing []string
	for name := range s.cfg.Tools {
		if !s.listed[name] && !s.warned["unlisted:"+name] {
			s.warned["unlisted:"+name] = true
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	for _, name := range missing {
		s.warn("tool %q is in the configuration, but the server does not list it: check its name", name)
	}
}
