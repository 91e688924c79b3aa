package taubench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
)

// numberTolerance is how far apart two numbers may be and still be equal.
const numberTolerance = 1e-6

// EqualJSON reports whether two tool answers are the same: equal as parsed
// JSON values, with numbers equal within 1e-6, when both parse as JSON;
// equal as strings otherwise (plain ids, "Error: …" texts, the empty answer
// of think, and JSON-looking text that does not parse).
func EqualJSON(a, b string) bool {
	va, errA := decodeAny([]byte(a))
	vb, errB := decodeAny([]byte(b))
	if errA != nil || errB != nil {
		return a == b
	}
	return len(diffValues("", va, vb, 1)) == 0
}

// DiffChanged checks the final database against a task's expectation: the
// records that differ from the initial database must be exactly those of
// want (Task.Changed), each equal to its listed value, and every other
// record must be unchanged. It returns the differences found, readable and
// sorted; none means the state is right. Records compare as JSON values,
// with numbers within 1e-6.
func DiffChanged(initial, final snapshot, want map[string]map[string]json.RawMessage) []string {
	var diffs []string
	for _, t := range unionKeys(initial, final, want) {
		for _, id := range unionKeys(initial[t], final[t], want[t]) {
			got, inFinal := final[t][id]
			before, inInitial := initial[t][id]
			if w, listed := want[t][id]; listed {
				switch {
				case !inFinal:
					diffs = append(diffs, fmt.Sprintf("%s %s: missing, want %s", t, id, brief(w)))
				default:
					diffs = append(diffs, diffRecords(fmt.Sprintf("%s %s", t, id), got, w)...)
				}
				continue
			}
			switch {
			case !inFinal:
				diffs = append(diffs, fmt.Sprintf("%s %s: deleted, want unchanged", t, id))
			case !inInitial:
				diffs = append(diffs, fmt.Sprintf("%s %s: unexpected new record %s", t, id, brief(got)))
			case !bytes.Equal(got, before):
				diffs = append(diffs, diffRecords(fmt.Sprintf("%s %s (want unchanged)", t, id), got, before)...)
			}
		}
	}
	return diffs
}

// maxRecordDiffs bounds the differences reported for one record.
const maxRecordDiffs = 5

// diffRecords returns the differences between two records' JSON, prefixed.
func diffRecords(prefix string, got, want []byte) []string {
	vg, errG := decodeAny(got)
	vw, errW := decodeAny(want)
	if errG != nil || errW != nil {
		if bytes.Equal(got, want) {
			return nil
		}
		return []string{fmt.Sprintf("%s: got %s, want %s", prefix, brief(got), brief(want))}
	}
	diffs := diffValues("", vg, vw, maxRecordDiffs)
	for i, d := range diffs {
		diffs[i] = prefix + ": " + d
	}
	return diffs
}

// diffValues returns up to limit differences between two decoded JSON
// values, each naming the path where it is.
func diffValues(path string, got, want any, limit int) []string {
	var out []string
	var walk func(path string, got, want any)
	walk = func(path string, got, want any) {
		if len(out) >= limit {
			return
		}
		at := path
		if at == "" {
			at = "value"
		}
		switch w := want.(type) {
		case map[string]any:
			g, ok := got.(map[string]any)
			if !ok {
				break
			}
			for _, k := range unionKeys(g, w) {
				gv, inG := g[k]
				wv, inW := w[k]
				sub := path + "." + k
				if path == "" {
					sub = k
				}
				switch {
				case !inG:
					out = append(out, fmt.Sprintf("%s: missing, want %s", sub, show(wv)))
				case !inW:
					out = append(out, fmt.Sprintf("%s: unexpected %s", sub, show(gv)))
				default:
					walk(sub, gv, wv)
				}
				if len(out) >= limit {
					return
				}
			}
			return
		case []any:
			g, ok := got.([]any)
			if !ok {
				break
			}
			if len(g) != len(w) {
				out = append(out, fmt.Sprintf("%s: got %d elements %s, want %d %s", at, len(g), show(g), len(w), show(w)))
				return
			}
			for i := range w {
				walk(fmt.Sprintf("%s[%d]", path, i), g[i], w[i])
			}
			return
		case json.Number:
			if g, ok := got.(json.Number); ok && numbersEqual(g, w) {
				return
			}
		default:
			if got == want {
				return
			}
		}
		out = append(out, fmt.Sprintf("%s: got %s, want %s", at, show(got), show(want)))
	}
	walk(path, got, want)
	return out
}

func numbersEqual(a, b json.Number) bool {
	if a == b {
		return true
	}
	x, errX := strconv.ParseFloat(string(a), 64)
	y, errY := strconv.ParseFloat(string(b), 64)
	return errX == nil && errY == nil && math.Abs(x-y) <= numberTolerance
}

// decodeAny decodes one JSON value, numbers as json.Number.
func decodeAny(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("unexpected data after the JSON value")
	}
	return v, nil
}

// show formats a decoded value for a message.
func show(v any) string {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return brief(data)
}

// brief shortens JSON text for a message.
func brief(data []byte) string {
	const max = 120
	if len(data) > max {
		return string(data[:max]) + "…"
	}
	return string(data)
}

// unionKeys returns the keys of the maps, sorted.
func unionKeys[V any](maps ...map[string]V) []string {
	seen := map[string]bool{}
	var keys []string
	for _, m := range maps {
		for k := range m {
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	sort.Strings(keys)
	return keys
}
