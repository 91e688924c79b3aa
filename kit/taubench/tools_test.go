package taubench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"
)

// testDataDir returns the τ-bench retail data: $IDEM_TAUBENCH_DATA if set,
// else next to the repository (../shared/taubench/retail from the root).
// Without it the test is skipped, except under CI=true, where it fails: the
// τ-bench run is the acceptance test.
func testDataDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join("..", "..", "..", "shared", "taubench", "retail")
	if env := os.Getenv("IDEM_TAUBENCH_DATA"); env != "" {
		dir = env
	}
	dir, err := FindDataDir(dir)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	return dir
}

// seededImage seeds a bbolt file from dir and returns the file's bytes, so
// that each task can start from a copy.
func seededImage(t *testing.T, dir string) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "template.db")
	db, err := bbolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, Seed(db, dir))
	var image bytes.Buffer
	require.NoError(t, db.View(func(tx *bbolt.Tx) error {
		_, err := tx.WriteTo(&image)
		return err
	}))
	require.NoError(t, db.Close())
	return image.Bytes()
}

// openImage writes a database image to a fresh file and opens it.
func openImage(t *testing.T, image []byte) *bbolt.DB {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tau.db")
	require.NoError(t, os.WriteFile(path, image, 0o600))
	db, err := bbolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	db.NoSync = true // a scratch copy
	t.Cleanup(func() { db.Close() })
	return db
}

// runTool runs one call the way the runner's baseline does: a write in its
// own db.Update, a read in a db.View.
func runTool(t *testing.T, db *bbolt.DB, name string, kwargs map[string]any) string {
	t.Helper()
	tool, ok := Lookup(name)
	require.True(t, ok, "unknown tool %q", name)
	var out string
	run := func(tx *bbolt.Tx) (err error) {
		out, err = tool.Run(BoltStore{BoltTx{tx}}, kwargs)
		return err
	}
	if tool.Write {
		require.NoError(t, db.Update(run))
	} else {
		require.NoError(t, db.View(run))
	}
	return out
}

func dbSnapshot(t *testing.T, db *bbolt.DB) snapshot {
	t.Helper()
	var s snapshot
	require.NoError(t, db.View(func(tx *bbolt.Tx) (err error) {
		s, err = Snapshot(BoltStore{BoltTx{tx}})
		return err
	}))
	return s
}

// TestTasks replays the ground-truth actions of every task on a fresh copy
// of the database and checks each answer and the final state.
func TestTasks(t *testing.T) {
	dir := testDataDir(t)
	tasks, err := LoadTasks(filepath.Join(dir, TasksFile))
	require.NoError(t, err)
	require.Len(t, tasks, 115)
	image := seededImage(t, dir)
	initial := dbSnapshot(t, openImage(t, image))
	require.Len(t, initial["orders"], 1000)
	require.Len(t, initial["users"], 500)
	require.Len(t, initial["products"], 50)
	replayTasks(t, image, initial, tasks)
}

// replayTasks replays every task's actions once each, fault-free, on a fresh
// copy of the database image, and checks each answer against the task's
// reference, text for text, and the final state against its changed records.
func replayTasks(t *testing.T, image []byte, initial snapshot, tasks []Task) {
	t.Helper()
	for _, task := range tasks {
		t.Run(fmt.Sprintf("task%03d", task.ID), func(t *testing.T) {
			t.Parallel()
			db := openImage(t, image)
			for i, a := range task.Actions {
				got := runTool(t, db, a.Name, a.Kwargs)
				switch {
				case !EqualJSON(got, a.Output):
					t.Errorf("action %d %s %v:\n got %.400s\nwant %.400s", i, a.Name, a.Kwargs, got, a.Output)
				case got != a.Output:
					// Records are kept in json.dumps form, so even the text matches.
					t.Errorf("action %d %s: same JSON, other text:\n got %.400s\nwant %.400s", i, a.Name, got, a.Output)
				}
			}
			for _, d := range DiffChanged(initial, dbSnapshot(t, db), task.Changed) {
				t.Error(d)
			}
		})
	}
}

// TestSeedKeepsReferenceText checks that stored records are in json.dumps
// form: a read tool's answer is the reference's text byte for byte.
func TestSeedKeepsReferenceText(t *testing.T) {
	dir := testDataDir(t)
	tasks, err := LoadTasks(filepath.Join(dir, TasksFile))
	require.NoError(t, err)
	db := openImage(t, seededImage(t, dir))
	checked := 0
	for _, task := range tasks {
		for _, a := range task.Actions {
			if a.Name != "get_product_details" && a.Name != "list_all_product_types" {
				continue // orders and users may have been changed by an earlier action
			}
			require.Equal(t, a.Output, runTool(t, db, a.Name, a.Kwargs))
			checked++
		}
	}
	require.NotZero(t, checked)
}

// writeDataset writes a small synthetic retail database into a directory.
func writeDataset(t *testing.T, orders, users, products string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range map[string]string{OrdersFile: orders, UsersFile: users, ProductsFile: products, TasksFile: ""} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600))
	}
	return dir
}

func seedDataset(t *testing.T, dir string) *bbolt.DB {
	t.Helper()
	db, err := bbolt.Open(filepath.Join(t.TempDir(), "tau.db"), 0o600, nil)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	require.NoError(t, Seed(db, dir))
	return db
}

const (
	twinUsers = `{
		"zed_9": {"name": {"first_name": "Ann", "last_name": "Lee"}, "address": {"zip": "10001"}, "email": "ann@example.com",
			"payment_methods": {"gift_card_1": {"source": "gift_card", "balance": 86, "id": "gift_card_1"},
				"credit_card_2": {"source": "credit_card", "id": "credit_card_2"}}, "orders": ["#W1", "#W2"]},
		"amy_1": {"name": {"first_name": "ann", "last_name": "LEE"}, "address": {"zip": "10001"}, "email": "Ann@Example.com",
			"payment_methods": {}, "orders": []}
	}`
	twinProducts = `{
		"p2": {"name": "Lamp", "product_id": "p2", "variants": {
			"i1": {"item_id": "i1", "options": {"color": "red"}, "available": true, "price": 10.1},
			"i2": {"item_id": "i2", "options": {"color": "blue"}, "available": true, "price": 81.93},
			"i3": {"item_id": "i3", "options": {"color": "green"}, "available": false, "price": 5}}},
		"p1": {"name": "Chair", "product_id": "p1", "variants": {}}
	}`
	twinOrders = `{
		"#W1": {"order_id": "#W1", "user_id": "zed_9", "items": [
			{"name": "Lamp", "product_id": "p2", "item_id": "i1", "price": 10.1, "options": {"color": "red"}},
			{"name": "Lamp", "product_id": "p2", "item_id": "i1", "price": 10.1, "options": {"color": "red"}}],
			"status": "pending", "payment_history": [{"transaction_type": "payment", "amount": 20.2, "payment_method_id": "gift_card_1"}]},
		"#W2": {"order_id": "#W2", "user_id": "zed_9", "items": [], "status": "delivered", "payment_history": []}
	}`
)

// TestFileOrder checks that lookups follow the data file's order, not
// bbolt's sorted keys: "zed_9" comes first in the file.
func TestFileOrder(t *testing.T) {
	db := seedDataset(t, writeDataset(t, twinOrders, twinUsers, twinProducts))
	require.Equal(t, "zed_9", runTool(t, db, "find_user_id_by_name_zip",
		map[string]any{"first_name": "ANN", "last_name": "lee", "zip": "10001"}))
	require.Equal(t, "zed_9", runTool(t, db, "find_user_id_by_email", map[string]any{"email": "ANN@example.COM"}))
	require.Equal(t, "Error: user not found", runTool(t, db, "find_user_id_by_name_zip",
		map[string]any{"first_name": "Ann", "last_name": "Lee", "zip": "10002"}))
	require.Equal(t, `{"Chair": "p1", "Lamp": "p2"}`, runTool(t, db, "list_all_product_types", map[string]any{}))
}

// TestWriteTools exercises the write tools on the synthetic database,
// including the Python number semantics the reference relies on.
func TestWriteTools(t *testing.T) {
	dir := writeDataset(t, twinOrders, twinUsers, twinProducts)

	t.Run("failed check changes nothing", func(t *testing.T) {
		db := seedDataset(t, dir)
		before := dbSnapshot(t, db)
		require.Equal(t, "Error: invalid reason", runTool(t, db, "cancel_pending_order",
			map[string]any{"order_id": "#W1", "reason": "changed my mind"}))
		require.Equal(t, "Error: i2 not found", runTool(t, db, "modify_pending_order_items",
			map[string]any{"order_id": "#W1", "item_ids": []any{"i2"}, "new_item_ids": []any{"i1"}, "payment_method_id": "gift_card_1"}))
		require.Equal(t, "Error: new item i3 not found or available", runTool(t, db, "modify_pending_order_items",
			map[string]any{"order_id": "#W1", "item_ids": []any{"i1"}, "new_item_ids": []any{"i3"}, "payment_method_id": "gift_card_1"}))
		require.Equal(t, "Error: insufficient gift card balance to pay for the new item", runTool(t, db, "modify_pending_order_items",
			map[string]any{"order_id": "#W1", "item_ids": []any{"i1", "i1"}, "new_item_ids": []any{"i2", "i2"}, "payment_method_id": "gift_card_1"}))
		require.Equal(t, "Error: non-delivered order cannot be returned", runTool(t, db, "return_delivered_order_items",
			map[string]any{"order_id": "#W1", "item_ids": []any{"i1"}, "payment_method_id": "gift_card_1"}))
		require.Equal(t, "Error: list index out of range", runTool(t, db, "return_delivered_order_items",
			map[string]any{"order_id": "#W2", "item_ids": []any{}, "payment_method_id": "credit_card_2"}))
		require.Empty(t, DiffChanged(before, dbSnapshot(t, db), nil))
	})

	t.Run("cancel refunds a gift card at once", func(t *testing.T) {
		db := seedDataset(t, dir)
		out := runTool(t, db, "cancel_pending_order", map[string]any{"order_id": "#W1", "reason": "no longer needed"})
		require.Contains(t, out, `"status": "cancelled", "payment_history": [{"transaction_type": "payment", "amount": 20.2, "payment_method_id": "gift_card_1"}, {"transaction_type": "refund", "amount": 20.2, "payment_method_id": "gift_card_1"}], "cancel_reason": "no longer needed"}`)
		user := runTool(t, db, "get_user_details", map[string]any{"user_id": "zed_9"})
		require.Contains(t, user, `"balance": 106.2,`) // the int 86 became a float
		require.Equal(t, "Error: non-pending order cannot be cancelled", runTool(t, db, "cancel_pending_order",
			map[string]any{"order_id": "#W1", "reason": "no longer needed"}))
	})

	t.Run("modify items one of two equal items", func(t *testing.T) {
		db := seedDataset(t, dir)
		out := runTool(t, db, "modify_pending_order_items",
			map[string]any{"order_id": "#W1", "item_ids": []any{"i1"}, "new_item_ids": []any{"i2"}, "payment_method_id": "gift_card_1"})
		require.Contains(t, out, `"items": [{"name": "Lamp", "product_id": "p2", "item_id": "i2", "price": 81.93, "options": {"color": "blue"}}, {"name": "Lamp", "product_id": "p2", "item_id": "i1"`)
		require.Contains(t, out, `{"transaction_type": "payment", "amount": 71.83000000000001, "payment_method_id": "gift_card_1"}`) // unrounded, as the reference
		require.Contains(t, out, `"status": "pending (item modified)"`)
		user := runTool(t, db, "get_user_details", map[string]any{"user_id": "zed_9"})
		require.Contains(t, user, `"balance": 14.17,`)
	})

	t.Run("arguments bind as in Python", func(t *testing.T) {
		db := seedDataset(t, dir)
		require.Equal(t, "Error: CancelPendingOrder.invoke() missing 1 required positional argument: 'reason'",
			runTool(t, db, "cancel_pending_order", map[string]any{"order_id": "#W1"}))
		require.Equal(t, "Error: ModifyUserAddress.invoke() missing 3 required positional arguments: 'state', 'country', and 'zip'",
			runTool(t, db, "modify_user_address", map[string]any{"user_id": "zed_9", "address1": "a", "address2": "b", "city": "c"}))
		require.Equal(t, "Error: ReturnDeliveredOrderItems.invoke() got an unexpected keyword argument 'note'",
			runTool(t, db, "return_delivered_order_items", map[string]any{"order_id": "#W2", "item_ids": []any{}, "payment_method_id": "gift_card_1", "note": "x"}))
		require.Equal(t, "Error: argument 'item_ids' must be a list of strings",
			runTool(t, db, "return_delivered_order_items", map[string]any{"order_id": "#W2", "item_ids": "i1", "payment_method_id": "gift_card_1"}))
	})
}

func TestLookup(t *testing.T) {
	require.Len(t, Tools(), 16)
	writes := 0
	for _, tool := range Tools() {
		got, ok := Lookup(tool.Name)
		require.True(t, ok)
		require.Equal(t, tool.Name, got.Name)
		if tool.Write {
			writes++
		}
	}
	require.Equal(t, 7, writes)
	_, ok := Lookup("modify_user_email")
	require.False(t, ok)
}

func TestRound2(t *testing.T) {
	for _, c := range []struct{ in, want float64 }{
		{2.675, 2.67}, // really 2.67499999999999982236431605997495353221893310546875
		{-2.675, -2.67},
		{0.125, 0.12}, // exact tie: to even
		{0.375, 0.38},
		{-0.125, -0.12},
		{1.005, 1.0},
		{0.145, 0.14},
		{1.115, 1.11},
		{0.005, 0.01},
		{0.015, 0.01},
		{0.025, 0.03},
		{1234.565, 1234.57},
		{178.645, 178.65}, // math.RoundToEven(x*100)/100 gives 178.64
		{9014.275, 9014.27},
		{86 - 71.96, 14.04},
		{8276.230000000001, 8276.23},
		{1e300, 1e300},
		{5e-324, 0},
		{7.5, 7.5},
	} {
		require.Equal(t, c.want, round2(c.in), "round2(%v)", c.in)
	}
	require.True(t, math.Signbit(round2(-0.001)), "round(-0.001, 2) is -0.0")
	require.True(t, math.IsInf(round2(math.Inf(1)), 1))
}

func TestPyFloatRepr(t *testing.T) {
	for in, want := range map[float64]string{
		41:                  "41.0",
		3.33:                "3.33",
		1.5:                 "1.5",
		100:                 "100.0",
		0.0001:              "0.0001",
		0.00001:             "1e-05",
		2.5e-5:              "2.5e-05",
		1e16:                "1e+16",
		1e22:                "1e+22",
		1234567890123456:    "1234567890123456.0",
		12345678901234567:   "1.2345678901234568e+16",
		0.30000000000000004: "0.30000000000000004",
		-17.99:              "-17.99",
		math.Inf(-1):        "-inf",
	} {
		require.Equal(t, want, pyFloatRepr(in), "repr(%v)", in)
	}
	require.Equal(t, "-0.0", pyFloatRepr(math.Copysign(0, -1)))
	require.Equal(t, "Infinity", pyJSONFloat(math.Inf(1)))
}

func TestCalculate(t *testing.T) {
	// Expected values are CPython 3.11's str(round(float(eval(e)), 2)).
	for expr, want := range map[string]string{
		"3131.1 + 4777.75 + 367.38":         "8276.23",
		"155.33 - 147.05 + 268.77 - 235.13": "41.92",
		"135.24 - 153.23":                   "-17.99",
		"164.28":                            "164.28",
		"(2 + 3) * 8.2":                     "41.0",
		"10 / 3":                            "3.33",
		"  (  1  +  2  )  ":                 "3.0",
		"2**3**2":                           "512.0",
		"-2**2":                             "-4.0",
		"2**-1":                             "0.5",
		"-7//2":                             "-4.0",
		"-7.5//2":                           "-4.0",
		"0.125":                             "0.12",
		"1.":                                "1.0",
		".5":                                "0.5",
		"00":                                "0.0",
		"0/-1":                              "-0.0",
		"10**20":                            "1e+20",
		"10**400-10**400+1":                 "1.0",
		"2**0.5":                            "1.41",
		"125.01 ** 71":                      "7.63972309305256e+148",
		"1 +":                               "Error: invalid syntax (<string>, line 1)",
		"":                                  "Error: invalid syntax (<string>, line 0)",
		"(1 2)":                             "Error: invalid syntax. Perhaps you forgot a comma? (<string>, line 1)",
		"(1 + 2":                            "Error: '(' was never closed (<string>, line 1)",
		"1)":                                "Error: unmatched ')' (<string>, line 1)",
		"007":                               "Error: leading zeros in decimal integer literals are not permitted; use an 0o prefix for octal integers (<string>, line 1)",
		"(*1)":                              "Error: cannot use starred expression here (<string>, line 1)",
		"1/0":                               "Error: division by zero",
		"1.0/0":                             "Error: float division by zero",
		"1//0":                              "Error: integer division or modulo by zero",
		"0**-1":                             "Error: 0.0 cannot be raised to a negative power",
		"10**400*1.0":                       "Error: int too large to convert to float",
		"10.0**400":                         "Error: (34, 'Numerical result out of range')",
		"(-8)**0.5":                         "Error: float() argument must be a string or a real number, not 'complex'",
		"2(3)":                              "Error: 'int' object is not callable",
		"()":                                "Error: float() argument must be a string or a real number, not 'tuple'",
		"() + 1":                            "Error: can only concatenate tuple (not \"int\") to tuple",
		"...":                               "Error: float() argument must be a string or a real number, not 'ellipsis'",
		"1e5":                               "Error: invalid characters in expression",
		"2 % 3":                             "Error: invalid characters in expression",
	} {
		require.Equal(t, want, calculate(expr), "calculate(%q)", expr)
	}
}

func TestEqualJSON(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{`{"a": 1, "b": [1.5, "x"]}`, `{"b":[1.5,"x"],"a":1}`, true},
		{`{"amount": 71.83000000000001}`, `{"amount": 71.83}`, true},
		{`{"balance": 60}`, `{"balance": 60.0}`, true},
		{`{"amount": 71.84}`, `{"amount": 71.83}`, false},
		{`{"a": 1}`, `{"a": 1, "b": null}`, false},
		{`[1, 2]`, `[2, 1]`, false},
		{"41.92", "41.920000001", true},
		{"yusuf_rossi_9620", "yusuf_rossi_9620", true},
		{"Error: order not found", "Error: user not found", false},
		{"", "", true},
		{`{"a": 1`, `{"a": 1`, true},   // does not parse: compared as text
		{`{"a": 1`, `{"a":  1`, false}, // likewise
		{`"x"`, `"x" `, true},
		{`1 2`, `1 2`, true},
	} {
		require.Equal(t, c.want, EqualJSON(c.a, c.b), "EqualJSON(%q, %q)", c.a, c.b)
	}
}

func TestDiffChanged(t *testing.T) {
	raw := func(s string) json.RawMessage { return json.RawMessage(s) }
	initial := snapshot{
		"orders": {"#W1": raw(`{"status": "pending", "amount": 1.5}`), "#W2": raw(`{"status": "pending"}`)},
		"users":  {"u1": raw(`{"balance": 10}`)},
	}
	final := snapshot{
		"orders": {"#W1": raw(`{"status": "cancelled", "amount": 1.5000000001}`), "#W2": raw(`{"status":"pending"}`)},
		"users":  {"u1": raw(`{"balance": 11.5}`)},
	}
	want := map[string]map[string]json.RawMessage{"orders": {"#W1": raw(`{"amount": 1.5, "status": "cancelled"}`)}}
	require.Equal(t, []string{`users u1 (want unchanged): balance: got 11.5, want 10`}, DiffChanged(initial, final, want))

	want["users"] = map[string]json.RawMessage{"u1": raw(`{"balance": 11.5}`)}
	require.Empty(t, DiffChanged(initial, final, want))

	want["orders"]["#W3"] = raw(`{"status": "pending"}`)
	final["orders"]["#W1"] = raw(`{"status": "cancelled", "amount": 1.5, "cancel_reason": "x"}`)
	require.Equal(t, []string{
		`orders #W1: cancel_reason: unexpected "x"`,
		`orders #W3: missing, want {"status": "pending"}`,
	}, DiffChanged(initial, final, want))
}

func TestFindDataDir(t *testing.T) {
	_, err := FindDataDir(filepath.Join(t.TempDir(), "nowhere"))
	require.ErrorContains(t, err, "github.com/sierra-research/tau-bench")
	require.ErrorContains(t, err, "../shared/taubench/retail")
	require.ErrorContains(t, err, "--data DIR")
	require.Equal(t, filepath.Join("root", "..", "shared", "taubench", "retail"), DefaultDataDir("root"))
}
