// Package taubench implements the retail tools of τ-bench (Sierra Research,
// github.com/sierra-research/tau-bench) over bbolt or Postgres, so that real
// agent tool traffic can be replayed through the dedupe engine of either
// backend (Backend).
//
// The tools reproduce the reference Python implementation: each takes the
// keyword arguments of a task action and returns the exact text the reference
// returns (a JSON record in json.dumps form, a plain id, or "Error: …"). The
// database is three tables of JSON records by id (bbolt buckets, or Postgres
// tables in a schema), and the tools reach it only through the Store
// interface, so that they can run inside either engine's transactions
// (BoltStore over an *idem.Tx, PgStore over idempg's pgx.Tx).
package taubench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// The files of the retail domain.
const (
	OrdersFile   = "orders.json"
	UsersFile    = "users.json"
	ProductsFile = "products.json"
	TasksFile    = "tasks_test.jsonl"
)

// DefaultDataDir returns where the retail data is expected relative to the
// repository root: <root>/../shared/taubench/retail.
func DefaultDataDir(repoRoot string) string {
	return filepath.Join(repoRoot, "..", "shared", "taubench", "retail")
}

// FindDataDir checks that dir holds the retail data files and returns it
// cleaned. When it does not, the error says where to get τ-bench.
func FindDataDir(dir string) (string, error) {
	dir = filepath.Clean(dir)
	var missing []string
	for _, f := range []string{OrdersFile, UsersFile, ProductsFile, TasksFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			missing = append(missing, f)
		}
	}
	if len(missing) == 0 {
		return dir, nil
	}
	return "", fmt.Errorf("τ-bench retail data not found in %s (missing %s): get τ-bench from "+
		"https://github.com/sierra-research/tau-bench (the retail domain: orders, users, products and "+
		"the test tasks) and put it at ../shared/taubench/retail relative to the repository root, "+
		"or point to it with --data DIR", dir, strings.Join(missing, ", "))
}

// Task is one τ-bench task: the ground-truth tool calls and the database
// records they change.
type Task struct {
	// ID is the task's number.
	ID int `json:"task"`
	// UserID is the customer the task is about.
	UserID string `json:"user_id"`
	// Actions are the tool calls, in order, all on one database.
	Actions []Action `json:"actions"`
	// Changed holds, per table ("orders", "users", "products"), every record
	// that differs from the initial database after all actions ran, as it
	// must look then. Records not listed are unchanged.
	Changed map[string]map[string]json.RawMessage `json:"changed"`
}

// Action is one tool call of a task with the reference's answer.
type Action struct {
	// Name is the tool's name.
	Name string `json:"name"`
	// Kwargs are the tool's keyword arguments, decoded from JSON.
	Kwargs map[string]any `json:"kwargs"`
	// Output is the exact text the reference returned.
	Output string `json:"output"`
}

// LoadTasks reads a tasks file: JSON objects one after another (one a line).
func LoadTasks(path string) ([]Task, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var tasks []Task
	dec := json.NewDecoder(f)
	for {
		var t Task
		err := dec.Decode(&t)
		if errors.Is(err, io.EOF) {
			return tasks, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: task %d: %w", path, len(tasks)+1, err)
		}
		for i, a := range t.Actions {
			if a.Name == "" {
				return nil, fmt.Errorf("%s: task %d: action %d has no name", path, t.ID, i)
			}
		}
		tasks = append(tasks, t)
	}
}
