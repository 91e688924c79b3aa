package main

import (
	"fmt"
	"slices"
)

// The sample's tasks: what a customer asks an agent for, as the tool calls a
// correct agent makes, written for the generated world. Each scenario picks
// the customer and the orders it needs; a call marked fails must answer an
// "Error: …" (the agent's mistake, or a refusal it must meet), every other
// write call must succeed, and the generator checks both when it runs them.

// call is one tool call of a task.
type call struct {
	name   string
	kwargs map[string]any
	fails  bool
}

// plan is a task before its reference run: the customer and the calls.
type plan struct {
	user  *user
	calls []call
}

// planner writes the tasks, giving each a customer no earlier task had.
type planner struct {
	w    *world
	used map[*user]bool
}

// scenario writes one task, or returns false if the world has no customer
// for it.
type scenario func(p *planner) (plan, bool)

// scenarios are the sample's tasks, in order.
var scenarios = []scenario{
	cancelOrder("no longer needed", false),
	cancelOrder("ordered by mistake", true),
	cancelWithBadReason,
	cancelDeliveredThenReturn,
	modifyOrderAddress,
	modifyUserAddress,
	modifyUserAndOrderAddress,
	modifyItems(1, false),
	modifyItems(1, true),
	modifyItems(2, false),
	modifyPayment,
	returnItems(false),
	returnItems(true),
	returnWithWrongMethod,
	exchangeItems(1),
	exchangeItems(2),
	exchangeUnavailable,
	browseCatalogue,
	wrongZipThenEmail,
	totalsThenAddress,
	addressThenPayment,
	unknownOrderThenCancel,
	modifyItemsThenCancel,
	cancelOrder("no longer needed", false),
}

func (p *planner) plans() ([]plan, error) {
	var out []plan
	for i, s := range scenarios {
		pl, ok := s(p)
		if !ok {
			return nil, fmt.Errorf("task %d: the world has no customer for it (change the seed or the sizes)", i)
		}
		p.used[pl.user] = true
		out = append(out, pl)
	}
	return out, nil
}

// order returns the first order, of a customer no task has, that accept
// takes.
func (p *planner) order(accept func(o *order) bool) (*order, bool) {
	for _, o := range p.w.orders {
		if !p.used[o.u] && accept(o) {
			return o, true
		}
	}
	return nil, false
}

func status(s string) func(*order) bool { return func(o *order) bool { return o.status == s } }

func and(fs ...func(*order) bool) func(*order) bool {
	return func(o *order) bool {
		for _, f := range fs {
			if !f(o) {
				return false
			}
		}
		return true
	}
}

func paidBy(source string) func(*order) bool {
	return func(o *order) bool { return o.pay.source == source }
}

// giftCard returns u's gift card, or nil.
func (u *user) giftCard() *payment {
	for _, pm := range u.payments {
		if pm.source == "gift_card" {
			return pm
		}
	}
	return nil
}

// other returns a payment method of u other than pm that is not a gift card,
// or nil.
func (u *user) other(pm *payment) *payment {
	for _, m := range u.payments {
		if m != pm && m.source != "gift_card" {
			return m
		}
	}
	return nil
}

// swap returns, for each of the order's first n items, another available
// variant of its product; nil if one has none.
func swap(o *order, n int) []*variant {
	if len(o.items) < n {
		return nil
	}
	var out []*variant
	for _, it := range o.items[:n] {
		i := slices.IndexFunc(it.p.variants, func(v *variant) bool { return v != it.v && v.available })
		if i < 0 {
			return nil
		}
		out = append(out, it.p.variants[i])
	}
	return out
}

func canSwap(n int) func(*order) bool { return func(o *order) bool { return swap(o, n) != nil } }

// priceDiff is what swapping the first items for vs costs.
func priceDiff(o *order, vs []*variant) money {
	var d money
	for i, v := range vs {
		d += v.price - o.items[i].v.price
	}
	return d
}

func itemIDs(o *order, n int) []string {
	var ids []string
	for _, it := range o.items[:n] {
		ids = append(ids, it.v.itemID)
	}
	return ids
}

func variantIDs(vs []*variant) []string {
	var ids []string
	for _, v := range vs {
		ids = append(ids, v.itemID)
	}
	return ids
}

// Calls.

func findByNameZip(u *user) call {
	return call{name: "find_user_id_by_name_zip", kwargs: map[string]any{"first_name": u.first, "last_name": u.last, "zip": u.addr.zip}}
}

func findByEmail(u *user) call {
	return call{name: "find_user_id_by_email", kwargs: map[string]any{"email": u.email}}
}

func userDetails(u *user) call {
	return call{name: "get_user_details", kwargs: map[string]any{"user_id": u.id}}
}

func orderDetails(o *order) call {
	return call{name: "get_order_details", kwargs: map[string]any{"order_id": o.id}}
}

func productDetails(p *product) call {
	return call{name: "get_product_details", kwargs: map[string]any{"product_id": p.id}}
}

func cancel(o *order, reason string) call {
	return call{name: "cancel_pending_order", kwargs: map[string]any{"order_id": o.id, "reason": reason}}
}

func addressArgs(a address, kw map[string]any) map[string]any {
	kw["address1"], kw["address2"], kw["city"], kw["state"], kw["country"], kw["zip"] =
		a.address1, a.address2, a.city, a.state, "USA", a.zip
	return kw
}

func calculate(expr string) call {
	return call{name: "calculate", kwargs: map[string]any{"expression": expr}}
}

func think(thought string) call {
	return call{name: "think", kwargs: map[string]any{"thought": thought}}
}

// Scenarios.

// cancelOrder: the customer, found by name and zip, cancels a pending order
// (one paid by gift card, whose refund goes back on the card at once, if
// giftCard).
func cancelOrder(reason string, giftCard bool) scenario {
	return func(p *planner) (plan, bool) {
		pay := func(o *order) bool { return (o.pay.source == "gift_card") == giftCard }
		o, ok := p.order(and(status("pending"), pay))
		if !ok {
			return plan{}, false
		}
		return plan{o.u, []call{findByNameZip(o.u), userDetails(o.u), orderDetails(o), cancel(o, reason)}}, true
	}
}

// cancelWithBadReason: the agent first gives a reason the tool refuses.
func cancelWithBadReason(p *planner) (plan, bool) {
	o, ok := p.order(status("pending"))
	if !ok {
		return plan{}, false
	}
	bad := cancel(o, "found it cheaper elsewhere")
	bad.fails = true
	return plan{o.u, []call{findByEmail(o.u), orderDetails(o), bad, cancel(o, "no longer needed")}}, true
}

// cancelDeliveredThenReturn: a delivered order cannot be cancelled; the
// customer returns its items instead, to the original payment method.
func cancelDeliveredThenReturn(p *planner) (plan, bool) {
	o, ok := p.order(and(status("delivered"), func(o *order) bool { return o.pay.source != "gift_card" }))
	if !ok {
		return plan{}, false
	}
	bad := cancel(o, "no longer needed")
	bad.fails = true
	ret := call{name: "return_delivered_order_items", kwargs: map[string]any{"order_id": o.id,
		"item_ids": itemIDs(o, len(o.items)), "payment_method_id": o.pay.id}}
	return plan{o.u, []call{findByNameZip(o.u), orderDetails(o), bad, ret}}, true
}

func modifyOrderAddress(p *planner) (plan, bool) {
	o, ok := p.order(status("pending"))
	if !ok {
		return plan{}, false
	}
	mod := call{name: "modify_pending_order_address", kwargs: addressArgs(p.w.newAddress(), map[string]any{"order_id": o.id})}
	return plan{o.u, []call{findByEmail(o.u), userDetails(o.u), orderDetails(o), mod}}, true
}

func modifyUserAddress(p *planner) (plan, bool) {
	o, ok := p.order(func(*order) bool { return true })
	if !ok {
		return plan{}, false
	}
	mod := call{name: "modify_user_address", kwargs: addressArgs(p.w.newAddress(), map[string]any{"user_id": o.u.id})}
	return plan{o.u, []call{findByNameZip(o.u), userDetails(o.u), mod}}, true
}

// modifyUserAndOrderAddress: the customer moved; the default address and a
// pending order's both change.
func modifyUserAndOrderAddress(p *planner) (plan, bool) {
	o, ok := p.order(status("pending"))
	if !ok {
		return plan{}, false
	}
	a := p.w.newAddress()
	return plan{o.u, []call{findByEmail(o.u), userDetails(o.u),
		{name: "modify_user_address", kwargs: addressArgs(a, map[string]any{"user_id": o.u.id})},
		orderDetails(o),
		{name: "modify_pending_order_address", kwargs: addressArgs(a, map[string]any{"order_id": o.id})},
	}}, true
}

// modifyItems: the first n items of a pending order become other variants,
// the difference paid or refunded by a card or PayPal, or by the gift card
// (which must cover it) if giftCard.
func modifyItems(n int, giftCard bool) scenario {
	return func(p *planner) (plan, bool) {
		var pm *payment
		o, ok := p.order(and(status("pending"), canSwap(n), func(o *order) bool {
			if giftCard {
				pm = o.u.giftCard()
				return pm != nil && pm.balance >= priceDiff(o, swap(o, n))
			}
			pm = o.u.other(nil)
			return pm != nil
		}))
		if !ok {
			return plan{}, false
		}
		vs := swap(o, n)
		calls := []call{findByNameZip(o.u), orderDetails(o), productDetails(o.items[0].p)}
		calls = append(calls, call{name: "modify_pending_order_items", kwargs: map[string]any{"order_id": o.id,
			"item_ids": itemIDs(o, n), "new_item_ids": variantIDs(vs), "payment_method_id": pm.id}})
		return plan{o.u, calls}, true
	}
}

// modifyPayment: a pending order paid by card or PayPal moves to another
// method of the customer (the gift card if it covers the order).
func modifyPayment(p *planner) (plan, bool) {
	var to *payment
	o, ok := p.order(and(status("pending"), func(o *order) bool {
		if o.pay.source == "gift_card" {
			return false
		}
		to = nil
		for _, m := range o.u.payments {
			if m != o.pay && (m.source != "gift_card" || m.balance >= o.total()) {
				to = m
			}
		}
		return to != nil
	}))
	if !ok {
		return plan{}, false
	}
	return plan{o.u, []call{findByEmail(o.u), userDetails(o.u), orderDetails(o),
		{name: "modify_pending_order_payment", kwargs: map[string]any{"order_id": o.id, "payment_method_id": to.id}}}}, true
}

// returnItems: the customer returns the first item of a delivered order (all
// of them, refunded to the gift card, if giftCard).
func returnItems(giftCard bool) scenario {
	return func(p *planner) (plan, bool) {
		o, ok := p.order(and(status("delivered"), func(o *order) bool {
			return !giftCard || (o.u.giftCard() != nil && o.pay.source != "gift_card")
		}))
		if !ok {
			return plan{}, false
		}
		ids, pm := itemIDs(o, 1), o.pay
		if giftCard {
			ids, pm = itemIDs(o, len(o.items)), o.u.giftCard()
		}
		return plan{o.u, []call{findByNameZip(o.u), userDetails(o.u), orderDetails(o),
			{name: "return_delivered_order_items", kwargs: map[string]any{"order_id": o.id, "item_ids": ids, "payment_method_id": pm.id}}}}, true
	}
}

// returnWithWrongMethod: a refund to a card the order was not paid with is
// refused; the agent then uses the original method.
func returnWithWrongMethod(p *planner) (plan, bool) {
	o, ok := p.order(and(status("delivered"), func(o *order) bool { return o.u.other(o.pay) != nil && o.pay.source != "gift_card" }))
	if !ok {
		return plan{}, false
	}
	ret := func(pm *payment, fails bool) call {
		return call{name: "return_delivered_order_items", kwargs: map[string]any{"order_id": o.id,
			"item_ids": itemIDs(o, 1), "payment_method_id": pm.id}, fails: fails}
	}
	return plan{o.u, []call{findByEmail(o.u), orderDetails(o), ret(o.u.other(o.pay), true), ret(o.pay, false)}}, true
}

// exchangeItems: the first n items of a delivered order are exchanged for
// other variants; the agent works out the price difference first.
func exchangeItems(n int) scenario {
	return func(p *planner) (plan, bool) {
		o, ok := p.order(and(status("delivered"), canSwap(n), paidBy("credit_card")))
		if !ok {
			return plan{}, false
		}
		vs := swap(o, n)
		calls := []call{findByNameZip(o.u), orderDetails(o)}
		expr := ""
		for i, v := range vs {
			calls = append(calls, productDetails(o.items[i].p))
			if i > 0 {
				expr += " + "
			}
			expr += fmt.Sprintf("(%s - %s)", v.price, o.items[i].v.price)
		}
		calls = append(calls, calculate(expr), call{name: "exchange_delivered_order_items", kwargs: map[string]any{
			"order_id": o.id, "item_ids": itemIDs(o, n), "new_item_ids": variantIDs(vs), "payment_method_id": o.pay.id}})
		return plan{o.u, calls}, true
	}
}

// exchangeUnavailable: the variant the customer asks for first is sold out.
func exchangeUnavailable(p *planner) (plan, bool) {
	var soldOut *variant
	o, ok := p.order(and(status("delivered"), canSwap(1), func(o *order) bool {
		it := o.items[0]
		i := slices.IndexFunc(it.p.variants, func(v *variant) bool { return !v.available && v != it.v })
		if i < 0 {
			return false
		}
		soldOut = it.p.variants[i]
		return true
	}))
	if !ok {
		return plan{}, false
	}
	ex := func(v *variant, fails bool) call {
		return call{name: "exchange_delivered_order_items", kwargs: map[string]any{"order_id": o.id,
			"item_ids": itemIDs(o, 1), "new_item_ids": []string{v.itemID}, "payment_method_id": o.pay.id}, fails: fails}
	}
	return plan{o.u, []call{findByEmail(o.u), orderDetails(o), productDetails(o.items[0].p),
		ex(soldOut, true), ex(swap(o, 1)[0], false)}}, true
}

// browseCatalogue: questions about products only, then a hand-over to a
// person.
func browseCatalogue(p *planner) (plan, bool) {
	o, ok := p.order(func(*order) bool { return true })
	if !ok {
		return plan{}, false
	}
	return plan{o.u, []call{
		{name: "list_all_product_types", kwargs: map[string]any{}},
		productDetails(p.w.products[2]), productDetails(p.w.products[5]),
		think("The customer wants a lamp and a jacket; compare the available variants."),
		{name: "transfer_to_human_agents", kwargs: map[string]any{"summary": "The customer asks for a discount on a lamp and a jacket."}},
	}}, true
}

// wrongZipThenEmail: the customer gives an old zip, then the email; a
// processed order cannot be cancelled, so the agent hands over.
func wrongZipThenEmail(p *planner) (plan, bool) {
	o, ok := p.order(status("processed"))
	if !ok {
		return plan{}, false
	}
	find := findByNameZip(o.u)
	find.kwargs["zip"] = "00000"
	find.fails = true
	bad := cancel(o, "no longer needed")
	bad.fails = true
	return plan{o.u, []call{find, findByEmail(o.u), orderDetails(o), bad,
		{name: "transfer_to_human_agents", kwargs: map[string]any{"summary": "The customer wants to cancel a processed order."}}}}, true
}

// totalsThenAddress: the customer asks what two orders cost together, then
// changes the address of a pending one.
func totalsThenAddress(p *planner) (plan, bool) {
	var other *order
	o, ok := p.order(and(status("pending"), func(o *order) bool {
		other = nil
		for _, x := range o.u.orders {
			if x != o {
				other = x
			}
		}
		return other != nil
	}))
	if !ok {
		return plan{}, false
	}
	return plan{o.u, []call{findByNameZip(o.u), userDetails(o.u), orderDetails(o), orderDetails(other),
		calculate(fmt.Sprintf("%s + %s", o.total(), other.total())),
		{name: "modify_pending_order_address", kwargs: addressArgs(p.w.newAddress(), map[string]any{"order_id": o.id})}}}, true
}

// addressThenPayment: two writes on one pending order.
func addressThenPayment(p *planner) (plan, bool) {
	var to *payment
	o, ok := p.order(and(status("pending"), func(o *order) bool {
		to = o.u.other(o.pay)
		return to != nil
	}))
	if !ok {
		return plan{}, false
	}
	return plan{o.u, []call{findByEmail(o.u), orderDetails(o),
		{name: "modify_pending_order_address", kwargs: addressArgs(p.w.newAddress(), map[string]any{"order_id": o.id})},
		{name: "modify_pending_order_payment", kwargs: map[string]any{"order_id": o.id, "payment_method_id": to.id}}}}, true
}

// unknownOrderThenCancel: a mistyped order id first.
func unknownOrderThenCancel(p *planner) (plan, bool) {
	o, ok := p.order(status("pending"))
	if !ok {
		return plan{}, false
	}
	bad := orderDetails(&order{id: "#S0000000"})
	bad.fails = true
	return plan{o.u, []call{findByNameZip(o.u), bad, orderDetails(o), cancel(o, "ordered by mistake")}}, true
}

// modifyItemsThenCancel: once its items are modified, an order can no longer
// be cancelled.
func modifyItemsThenCancel(p *planner) (plan, bool) {
	var pm *payment
	o, ok := p.order(and(status("pending"), canSwap(1), func(o *order) bool {
		pm = o.u.other(nil)
		return pm != nil
	}))
	if !ok {
		return plan{}, false
	}
	bad := cancel(o, "no longer needed")
	bad.fails = true
	return plan{o.u, []call{findByEmail(o.u), orderDetails(o), productDetails(o.items[0].p),
		{name: "modify_pending_order_items", kwargs: map[string]any{"order_id": o.id, "item_ids": itemIDs(o, 1),
			"new_item_ids": variantIDs(swap(o, 1)), "payment_method_id": pm.id}},
		bad}}, true
}
