package taubench

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Tool is one τ-bench retail tool.
type Tool struct {
	// Name is the tool's name, as in Action.Name.
	Name string
	// Write reports whether the tool can change the database.
	Write bool
	// Params are the tool's keyword parameters, in the reference's order.
	Params []string
	// Run calls the tool with keyword arguments (as decoded from JSON) and
	// returns the reference's answer: a JSON record, a plain id or an
	// "Error: …" text. A check that fails is such an answer and changes
	// nothing; the error is for storage failures only.
	Run func(b Store, args map[string]any) (string, error)
}

// toolList is the table of tools, in the reference's order.
var toolList = []Tool{
	newTool("calculate", false, "expression", runCalculate),
	newTool("cancel_pending_order", true, "order_id reason", cancelPendingOrder),
	newTool("exchange_delivered_order_items", true, "order_id item_ids new_item_ids payment_method_id", exchangeDeliveredOrderItems),
	newTool("find_user_id_by_email", false, "email", findUserIDByEmail),
	newTool("find_user_id_by_name_zip", false, "first_name last_name zip", findUserIDByNameZip),
	newTool("get_order_details", false, "order_id", details(ordersTable, "order_id", "Error: order not found")),
	newTool("get_product_details", false, "product_id", details(productsTable, "product_id", "Error: product not found")),
	newTool("get_user_details", false, "user_id", details(usersTable, "user_id", "Error: user not found")),
	newTool("list_all_product_types", false, "", listAllProductTypes),
	newTool("modify_pending_order_address", true, "order_id address1 address2 city state country zip", modifyPendingOrderAddress),
	newTool("modify_pending_order_items", true, "order_id item_ids new_item_ids payment_method_id", modifyPendingOrderItems),
	newTool("modify_pending_order_payment", true, "order_id payment_method_id", modifyPendingOrderPayment),
	newTool("modify_user_address", true, "user_id address1 address2 city state country zip", modifyUserAddress),
	newTool("return_delivered_order_items", true, "order_id item_ids payment_method_id", returnDeliveredOrderItems),
	newTool("think", false, "thought", func(Store, args) (string, error) { return "", nil }),
	newTool("transfer_to_human_agents", false, "summary", func(Store, args) (string, error) { return "Transfer successful", nil }),
}

// Tools returns every retail tool.
func Tools() []Tool {
	return slices.Clone(toolList)
}

// Lookup returns the tool called name.
func Lookup(name string) (Tool, bool) {
	for _, t := range toolList {
		if t.Name == name {
			return t, true
		}
	}
	return Tool{}, false
}

// --- arguments

// args are a tool's bound keyword arguments: strings for ids and other
// strings the tool inspects, []string for item lists, tree values for the
// rest (stored or ignored as given).
type args map[string]any

func (a args) str(name string) string    { s, _ := a[name].(string); return s }
func (a args) list(name string) []string { l, _ := a[name].([]string); return l }

// Parameter kinds other than string.
var (
	listParams = map[string]bool{"item_ids": true, "new_item_ids": true}
	anyParams  = map[string]bool{"address1": true, "address2": true, "city": true, "state": true,
		"country": true, "zip": true, "thought": true, "summary": true}
)

// newTool builds a Tool whose Run binds the keyword arguments first.
func newTool(name string, write bool, params string, run func(Store, args) (string, error)) Tool {
	ps := strings.Fields(params)
	return Tool{Name: name, Write: write, Params: ps, Run: func(b Store, kwargs map[string]any) (string, error) {
		a, msg := bind(name, ps, kwargs)
		if msg != "" {
			return msg, nil
		}
		return run(b, a)
	}}
}

// bind binds keyword arguments to parameters the way Python binds them to
// the reference's invoke(data, …), answering with the same TypeError texts.
// Beyond Python, a parameter the tool inspects must have the right JSON type
// (string, or list of strings), else the answer is an error saying so; the
// reference's answer would depend on how Python treats the wrong type.
func bind(name string, params []string, kwargs map[string]any) (args, string) {
	fn := className(name) + ".invoke()"
	if _, ok := kwargs["data"]; ok {
		return nil, fmt.Sprintf("Error: %s got multiple values for keyword argument 'data'", fn)
	}
	var unexpected []string
	for k := range kwargs {
		if !slices.Contains(params, k) {
			unexpected = append(unexpected, k)
		}
	}
	if len(unexpected) > 0 {
		sort.Strings(unexpected) // Python names the first in call order; Go maps have none
		return nil, fmt.Sprintf("Error: %s got an unexpected keyword argument '%s'", fn, unexpected[0])
	}
	var missing []string
	for _, p := range params {
		if _, ok := kwargs[p]; !ok {
			missing = append(missing, "'"+p+"'")
		}
	}
	if n := len(missing); n > 0 {
		list, plural := missing[0], ""
		switch {
		case n == 2:
			list, plural = missing[0]+" and "+missing[1], "s"
		case n > 2:
			list, plural = strings.Join(missing[:n-1], ", ")+", and "+missing[n-1], "s"
		}
		return nil, fmt.Sprintf("Error: %s missing %d required positional argument%s: %s", fn, n, plural, list)
	}
	a := args{}
	for _, p := range params {
		v := kwargs[p]
		switch {
		case anyParams[p]:
			a[p] = treeValue(v)
		case listParams[p]:
			l, ok := stringList(v)
			if !ok {
				return nil, fmt.Sprintf("Error: argument '%s' must be a list of strings", p)
			}
			a[p] = l
		default:
			s, ok := v.(string)
			if !ok {
				return nil, fmt.Sprintf("Error: argument '%s' must be a string", p)
			}
			a[p] = s
		}
	}
	return a, ""
}

// className is the reference's class for a tool: cancel_pending_order is
// CancelPendingOrder.
func className(name string) string {
	var b strings.Builder
	for _, part := range strings.Split(name, "_") {
		if part != "" {
			b.WriteString(strings.ToUpper(part[:1]) + part[1:])
		}
	}
	return b.String()
}

func stringList(v any) ([]string, bool) {
	switch v := v.(type) {
	case []string:
		return v, true
	case []any:
		l := make([]string, len(v))
		for i, e := range v {
			s, ok := e.(string)
			if !ok {
				return nil, false
			}
			l[i] = s
		}
		return l, true
	}
	return nil, false
}

// treeValue converts an argument decoded by encoding/json into a tree value.
// A float64 with an integral value becomes an int, as Python's json would
// have decoded it.
func treeValue(v any) any {
	switch v := v.(type) {
	case float64:
		if v == math.Trunc(v) && math.Abs(v) < 1<<53 {
			return json.Number(strconv.FormatFloat(v, 'f', -1, 64))
		}
		return v
	case int:
		return json.Number(strconv.Itoa(v))
	case []any:
		l := make([]any, len(v))
		for i, e := range v {
			l[i] = treeValue(e)
		}
		return l
	case []string:
		l := make([]any, len(v))
		for i, e := range v {
			l[i] = e
		}
		return l
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		o := &object{}
		for _, k := range keys {
			o.set(k, treeValue(v[k]))
		}
		return o
	case float32:
		return treeValue(float64(v))
	case nil, bool, string, json.Number, *object:
		return v
	}
	return fmt.Sprint(v) // not a JSON value: keep its text
}

// keyError is the answer when the reference's code raises KeyError(key).
func keyError(key string) string { return "Error: " + pyStrRepr(key) }

// --- read-only tools

func runCalculate(_ Store, a args) (string, error) {
	return calculate(a.str("expression")), nil
}

// findUser returns the id of the first user in file order that match accepts.
func findUser(b Store, match func(u *object) bool) (string, error) {
	found := ""
	err := forEachInFileOrder(b, usersTable, func(id string, u *object) bool {
		if match(u) {
			found = id
		}
		return found == ""
	})
	if err != nil {
		return "", err
	}
	if found == "" {
		return "Error: user not found", nil
	}
	return found, nil
}

func findUserIDByEmail(b Store, a args) (string, error) {
	email := strings.ToLower(a.str("email"))
	return findUser(b, func(u *object) bool {
		return strings.ToLower(u.str("email")) == email
	})
}

func findUserIDByNameZip(b Store, a args) (string, error) {
	first, last, zip := strings.ToLower(a.str("first_name")), strings.ToLower(a.str("last_name")), a.str("zip")
	return findUser(b, func(u *object) bool {
		name := u.obj("name")
		return strings.ToLower(name.str("first_name")) == first &&
			strings.ToLower(name.str("last_name")) == last &&
			u.obj("address").str("zip") == zip
	})
}

// details answers get_order_details, get_user_details and
// get_product_details: the stored record as it is.
func details(t table, param, notFound string) func(Store, args) (string, error) {
	return func(b Store, a args) (string, error) {
		data, err := getRaw(b, t, a.str(param))
		if err != nil {
			return "", err
		}
		if data == nil {
			return notFound, nil
		}
		return string(data), nil
	}
}

func listAllProductTypes(b Store, _ args) (string, error) {
	byName := map[string]any{} // a later product of the same name wins, as in a dict
	err := forEachInFileOrder(b, productsTable, func(_ string, p *object) bool {
		byName[p.str("name")] = p.get("product_id")
		return true
	})
	if err != nil {
		return "", err
	}
	names := make([]string, 0, len(byName))
	for name := range byName {
		names = append(names, name)
	}
	sort.Strings(names)
	out := &object{}
	for _, name := range names {
		out.set(name, byName[name])
	}
	return string(dumps(out)), nil
}

// --- helpers of the write tools

// orderInStatus loads order id and checks that its status is want. When a
// check fails it returns the reference's answer: "Error: order not found",
// or wrongStatus.
func orderInStatus(b Store, id, want, wrongStatus string) (order *object, answer string, err error) {
	order, err = getRecord(b, ordersTable, id)
	switch {
	case err != nil:
		return nil, "", err
	case order == nil:
		return nil, "Error: order not found", nil
	case order.str("status") != want:
		return nil, wrongStatus, nil
	}
	return order, "", nil
}

// orderUser loads the user who placed order; a missing user is the
// reference's KeyError.
func orderUser(b Store, order *object) (user *object, answer string, err error) {
	id := order.str("user_id")
	user, err = getRecord(b, usersTable, id)
	if err == nil && user == nil {
		return nil, keyError(id), nil
	}
	return user, "", err
}

// paymentMethod returns the user's payment method id, or nil.
func paymentMethod(user *object, id string) *object {
	return user.obj("payment_methods").obj(id)
}

// isGiftCard reports whether a payment method is a gift card by its source,
// as the reference checks a method it is given.
func isGiftCard(pm *object) bool { return pm.str("source") == "gift_card" }

// isGiftCardID reports whether a payment method id names a gift card, as
// the reference checks the methods of an order's payment history.
func isGiftCardID(id string) bool { return strings.Contains(id, "gift_card") }

// addBalance moves a gift card's balance by delta, rounded to cents.
func addBalance(pm *object, delta any) {
	pm.set("balance", roundNum(addNum(pm.get("balance"), delta)))
}

// missingItem returns the first id of ids that occurs in ids more often than
// among the order's items.
func missingItem(order *object, ids []string) (string, bool) {
	have := map[string]int{}
	for _, it := range order.list("items") {
		if it, ok := it.(*object); ok {
			have[it.str("item_id")]++
		}
	}
	want := map[string]int{}
	for _, id := range ids {
		want[id]++
	}
	for _, id := range ids {
		if want[id] > have[id] {
			return id, true
		}
	}
	return "", false
}

// firstItem returns the order's first item whose item_id is id.
func firstItem(order *object, id string) *object {
	for _, it := range order.list("items") {
		if it, ok := it.(*object); ok && it.str("item_id") == id {
			return it
		}
	}
	return nil
}

// priceDifference checks that each new item is an available variant of the
// product of the item it replaces and returns Σ(new price − old price), as
// the reference sums it (unrounded), with the new variants. The items must
// be present (missingItem).
func priceDifference(b Store, order *object, ids, newIDs []string) (diff any, variants []*object, answer string, err error) {
	if len(ids) != len(newIDs) {
		return nil, nil, "Error: the number of items to be exchanged should match", nil
	}
	products := map[string]*object{}
	diff = json.Number("0")
	for i, id := range ids {
		item := firstItem(order, id)
		pid := item.str("product_id")
		product, ok := products[pid]
		if !ok {
			if product, err = getRecord(b, productsTable, pid); err != nil {
				return nil, nil, "", err
			}
			if product == nil {
				return nil, nil, keyError(pid), nil
			}
			products[pid] = product
		}
		variant := product.obj("variants").obj(newIDs[i])
		if variant == nil || !truthy(variant.get("available")) {
			return nil, nil, fmt.Sprintf("Error: new item %s not found or available", newIDs[i]), nil
		}
		diff = addNum(diff, subNum(variant.get("price"), item.get("price")))
		variants = append(variants, variant)
	}
	return diff, variants, "", nil
}

// sortedList returns the ids sorted, as a JSON list.
func sortedList(ids []string) []any {
	s := slices.Clone(ids)
	sort.Strings(s)
	l := make([]any, len(s))
	for i, id := range s {
		l[i] = id
	}
	return l
}

// address builds an address object in the reference's key order.
func address(a args) *object {
	return newObject("address1", a["address1"], "address2", a["address2"], "city", a["city"],
		"state", a["state"], "country", a["country"], "zip", a["zip"])
}

func transaction(kind string, amount any, paymentMethodID string) *object {
	return newObject("transaction_type", kind, "amount", amount, "payment_method_id", paymentMethodID)
}

// --- write tools

func cancelPendingOrder(b Store, a args) (string, error) {
	id := a.str("order_id")
	order, answer, err := orderInStatus(b, id, "pending", "Error: non-pending order cannot be cancelled")
	if order == nil {
		return answer, err
	}
	reason := a.str("reason")
	if reason != "no longer needed" && reason != "ordered by mistake" {
		return "Error: invalid reason", nil
	}
	var user *object
	var refunds []any
	for _, p := range order.list("payment_history") {
		payment, _ := p.(*object)
		pmID := payment.str("payment_method_id")
		refunds = append(refunds, transaction("refund", payment.get("amount"), pmID))
		if !isGiftCardID(pmID) {
			continue
		}
		if user == nil { // a gift card is refunded at once
			if user, answer, err = orderUser(b, order); user == nil {
				return answer, err
			}
		}
		pm := paymentMethod(user, pmID)
		if pm == nil {
			return keyError(pmID), nil
		}
		addBalance(pm, payment.get("amount"))
	}
	order.set("status", "cancelled")
	order.set("cancel_reason", reason)
	order.set("payment_history", append(order.list("payment_history"), refunds...))
	if user != nil {
		if _, err := putRecord(b, usersTable, order.str("user_id"), user); err != nil {
			return "", err
		}
	}
	return putRecord(b, ordersTable, id, order)
}

func modifyPendingOrderAddress(b Store, a args) (string, error) {
	id := a.str("order_id")
	order, answer, err := orderInStatus(b, id, "pending", "Error: non-pending order cannot be modified")
	if order == nil {
		return answer, err
	}
	order.set("address", address(a))
	return putRecord(b, ordersTable, id, order)
}

func modifyUserAddress(b Store, a args) (string, error) {
	id := a.str("user_id")
	user, err := getRecord(b, usersTable, id)
	if user == nil {
		if err != nil {
			return "", err
		}
		return "Error: user not found", nil
	}
	user.set("address", address(a))
	return putRecord(b, usersTable, id, user)
}

func modifyPendingOrderPayment(b Store, a args) (string, error) {
	id, pmID := a.str("order_id"), a.str("payment_method_id")
	order, answer, err := orderInStatus(b, id, "pending", "Error: non-pending order cannot be modified")
	if order == nil {
		return answer, err
	}
	user, answer, err := orderUser(b, order)
	if user == nil {
		return answer, err
	}
	pm := paymentMethod(user, pmID)
	if pm == nil {
		return "Error: payment method not found", nil
	}
	history := order.list("payment_history")
	if len(history) == 0 {
		return "Error: list index out of range", nil
	}
	first, _ := history[0].(*object)
	if len(history) > 1 || first.str("transaction_type") != "payment" {
		return "Error: there should be exactly one payment for a pending order", nil
	}
	oldID := first.str("payment_method_id")
	if oldID == pmID {
		return "Error: the new payment method should be different from the current one", nil
	}
	amount := first.get("amount")
	if isGiftCard(pm) && lessNum(pm.get("balance"), amount) {
		return "Error: insufficient gift card balance to pay for the order", nil
	}
	order.set("payment_history", append(history, transaction("payment", amount, pmID), transaction("refund", amount, oldID)))
	userChanged := false
	if isGiftCard(pm) {
		addBalance(pm, negNum(amount))
		userChanged = true
	}
	if isGiftCardID(oldID) {
		old := paymentMethod(user, oldID)
		if old == nil {
			return keyError(oldID), nil
		}
		addBalance(old, amount)
		userChanged = true
	}
	if userChanged {
		if _, err := putRecord(b, usersTable, order.str("user_id"), user); err != nil {
			return "", err
		}
	}
	return putRecord(b, ordersTable, id, order)
}

func modifyPendingOrderItems(b Store, a args) (string, error) {
	id, ids, newIDs, pmID := a.str("order_id"), a.list("item_ids"), a.list("new_item_ids"), a.str("payment_method_id")
	order, answer, err := orderInStatus(b, id, "pending", "Error: non-pending order cannot be modified")
	if order == nil {
		return answer, err
	}
	if missing, ok := missingItem(order, ids); ok {
		return fmt.Sprintf("Error: %s not found", missing), nil
	}
	diff, variants, answer, err := priceDifference(b, order, ids, newIDs)
	if diff == nil {
		return answer, err
	}
	user, answer, err := orderUser(b, order)
	if user == nil {
		return answer, err
	}
	pm := paymentMethod(user, pmID)
	if pm == nil {
		return "Error: payment method not found", nil
	}
	if isGiftCard(pm) && lessNum(pm.get("balance"), diff) {
		return "Error: insufficient gift card balance to pay for the new item", nil
	}
	kind := "refund"
	if toFloat(diff) > 0 {
		kind = "payment"
	}
	order.set("payment_history", append(order.list("payment_history"), transaction(kind, absNum(diff), pmID)))
	if isGiftCard(pm) {
		addBalance(pm, negNum(diff))
		if _, err := putRecord(b, usersTable, order.str("user_id"), user); err != nil {
			return "", err
		}
	}
	for i, oldID := range ids {
		item := firstItem(order, oldID) // an item changed before no longer matches
		item.set("item_id", newIDs[i])
		item.set("price", variants[i].get("price"))
		item.set("options", variants[i].get("options"))
	}
	order.set("status", "pending (item modified)")
	return putRecord(b, ordersTable, id, order)
}

func returnDeliveredOrderItems(b Store, a args) (string, error) {
	id, ids, pmID := a.str("order_id"), a.list("item_ids"), a.str("payment_method_id")
	order, answer, err := orderInStatus(b, id, "delivered", "Error: non-delivered order cannot be returned")
	if order == nil {
		return answer, err
	}
	user, answer, err := orderUser(b, order)
	if user == nil {
		return answer, err
	}
	if paymentMethod(user, pmID) == nil {
		return "Error: payment method not found", nil
	}
	if !isGiftCardID(pmID) {
		history := order.list("payment_history")
		if len(history) == 0 {
			return "Error: list index out of range", nil
		}
		if first, _ := history[0].(*object); pmID != first.str("payment_method_id") {
			return "Error: payment method should be either the original payment method or a gift card", nil
		}
	}
	if _, ok := missingItem(order, ids); ok {
		return "Error: some item not found", nil
	}
	order.set("status", "return requested")
	order.set("return_items", sortedList(ids))
	order.set("return_payment_method_id", pmID)
	return putRecord(b, ordersTable, id, order)
}

func exchangeDeliveredOrderItems(b Store, a args) (string, error) {
	id, ids, newIDs, pmID := a.str("order_id"), a.list("item_ids"), a.list("new_item_ids"), a.str("payment_method_id")
	order, answer, err := orderInStatus(b, id, "delivered", "Error: non-delivered order cannot be exchanged")
	if order == nil {
		return answer, err
	}
	if missing, ok := missingItem(order, ids); ok {
		return fmt.Sprintf("Error: %s not found", missing), nil
	}
	diff, _, answer, err := priceDifference(b, order, ids, newIDs)
	if diff == nil {
		return answer, err
	}
	diff = roundNum(diff)
	user, answer, err := orderUser(b, order)
	if user == nil {
		return answer, err
	}
	pm := paymentMethod(user, pmID)
	if pm == nil {
		return "Error: payment method not found", nil
	}
	if isGiftCard(pm) && lessNum(pm.get("balance"), diff) {
		return "Error: insufficient gift card balance to pay for the price difference", nil
	}
	order.set("status", "exchange requested")
	order.set("exchange_items", sortedList(ids))
	order.set("exchange_new_items", sortedList(newIDs))
	order.set("exchange_payment_method_id", pmID)
	order.set("exchange_price_difference", diff)
	return putRecord(b, ordersTable, id, order)
}
