// Command gensample writes the built-in sample of idem taubench (package
// taubench, sample/): a small retail world generated here (products,
// customers, orders: orders.json, users.json, products.json) and tasks
// written for it (tasks_test.jsonl), whose reference outputs and changed
// records come from a fault-free run of the 16 retail tools in this
// process, each task on a fresh copy of the world.
//
// Run it through go generate in kit/taubench after a change to the tools or
// to this generator; the package's tests fail until the committed sample is
// what this program writes. Its output depends on nothing but its code: one
// seed draws the world.
//
//	go generate ./kit/taubench
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"go.etcd.io/bbolt"

	"github.com/idemkit/idem/kit/taubench"
)

// The world's seed and size.
const (
	seed  = 18
	users = 30
)

func main() {
	out := flag.String("out", "sample", "the directory to write the sample's four files into")
	flag.Parse()
	if err := generate(*out); err != nil {
		fmt.Fprintln(os.Stderr, "gensample:", err)
		os.Exit(1)
	}
}

// generate writes the sample into dir, which is created if need be.
func generate(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	w := newWorld(seed, users)
	orders, usersJSON, products, err := w.files()
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{taubench.OrdersFile: orders, taubench.UsersFile: usersJSON, taubench.ProductsFile: products} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	plans, err := (&planner{w: w, used: map[*user]bool{}}).plans()
	if err != nil {
		return err
	}
	var lines bytes.Buffer
	for id, pl := range plans {
		task, err := reference(dir, id, pl)
		if err != nil {
			return fmt.Errorf("task %d: %w", id, err)
		}
		line, err := json.Marshal(task)
		if err != nil {
			return err
		}
		lines.Write(append(line, '\n'))
	}
	return os.WriteFile(filepath.Join(dir, taubench.TasksFile), lines.Bytes(), 0o644)
}

// reference runs the plan's calls once each, in order, on a fresh copy of
// the world in dir, and returns the task: every call with the answer it gave,
// and the records that differ afterwards. A call's arguments go through JSON
// first, as the runner reads them from the tasks file.
func reference(dir string, id int, pl plan) (taubench.Task, error) {
	task := taubench.Task{ID: id, UserID: pl.user.id}
	tmp, err := os.MkdirTemp("", "gensample-")
	if err != nil {
		return task, err
	}
	defer os.RemoveAll(tmp)
	path := filepath.Join(tmp, "world.db")
	if err := taubench.SeedFile(path, dir); err != nil {
		return task, err
	}
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		return task, err
	}
	defer db.Close()
	snapshot := func() (map[string]map[string]json.RawMessage, error) {
		var s map[string]map[string]json.RawMessage
		err := db.View(func(tx *bbolt.Tx) error {
			var err error
			s, err = taubench.Snapshot(taubench.BoltStore{B: taubench.BoltTx{Tx: tx}})
			return err
		})
		return s, err
	}
	initial, err := snapshot()
	if err != nil {
		return task, err
	}
	for i, c := range pl.calls {
		tool, ok := taubench.Lookup(c.name)
		if !ok {
			return task, fmt.Errorf("no tool %q", c.name)
		}
		raw, err := json.Marshal(c.kwargs)
		if err != nil {
			return task, err
		}
		var kwargs map[string]any
		if err := json.Unmarshal(raw, &kwargs); err != nil {
			return task, err
		}
		var output string
		run := func(tx *bbolt.Tx) error {
			var err error
			output, err = tool.Run(taubench.BoltStore{B: taubench.BoltTx{Tx: tx}}, kwargs)
			return err
		}
		if tool.Write {
			err = db.Update(run)
		} else {
			err = db.View(run)
		}
		if err != nil {
			return task, err
		}
		if failed := strings.HasPrefix(output, "Error"); failed != c.fails {
			return task, fmt.Errorf("call %d (%s) answered %q: the scenario wants it to fail: %v", i, c.name, output, c.fails)
		}
		task.Actions = append(task.Actions, taubench.Action{Name: c.name, Kwargs: kwargs, Output: output})
	}
	final, err := snapshot()
	if err != nil {
		return task, err
	}
	task.Changed = map[string]map[string]json.RawMessage{}
	for table, recs := range final {
		for rid, rec := range recs {
			if before, ok := initial[table][rid]; ok && bytes.Equal(before, rec) {
				continue
			}
			if task.Changed[table] == nil {
				task.Changed[table] = map[string]json.RawMessage{}
			}
			task.Changed[table][rid] = rec
		}
		for rid := range initial[table] {
			if _, ok := recs[rid]; !ok {
				return task, errors.New("a tool deleted record " + rid + " of " + table)
			}
		}
	}
	return task, nil
}
