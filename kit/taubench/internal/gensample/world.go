package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
)

// The retail world of the sample: products with variants, customers with
// payment methods, and their orders, drawn from one seeded generator. Every
// name, id and price is made up here; nothing comes from τ-bench's data.

// field is one member of an ordered JSON object.
type field struct {
	key string
	val any
}

// obj is a JSON object that keeps its members in order, as the records of the
// data files do (the tools answer with keys in stored order).
type obj []field

// MarshalJSON writes the members in order.
func (o obj) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, f := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := json.Marshal(f.key)
		if err != nil {
			return nil, err
		}
		v, err := json.Marshal(f.val)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// money is an amount in cents, written as a float with two decimals at most
// and always a decimal point (Python's json.dumps of a float: 12.5, 40.0).
type money int

// MarshalJSON writes the amount in dollars.
func (m money) MarshalJSON() ([]byte, error) {
	s := strconv.FormatFloat(float64(m)/100, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return []byte(s), nil
}

// String is the amount as the data files write it, for calculate's
// expressions.
func (m money) String() string {
	b, _ := m.MarshalJSON()
	return string(b)
}

type option struct{ name, value string }

type variant struct {
	itemID    string
	options   []option
	available bool
	price     money
}

type product struct {
	name, id string
	variants []*variant
}

type payment struct {
	id, source, brand, lastFour string
	balance                     money // gift cards
}

type address struct {
	address1, address2, city, state, zip string
}

type user struct {
	id, first, last, email string
	addr                   address
	payments               []*payment
	orders                 []*order
}

type item struct {
	p *product
	v *variant
}

type order struct {
	id       string
	u        *user
	addr     address
	items    []item
	status   string
	tracking string
	pay      *payment
}

func (o *order) total() money {
	var t money
	for _, it := range o.items {
		t += it.v.price
	}
	return t
}

// world is the whole database, each table in file order.
type world struct {
	rng      *rand.Rand
	products []*product
	users    []*user
	orders   []*order
	ids      map[string]bool // every id drawn, so that none repeats
}

// The catalogue: each product's name, its options and the price range of its
// variants, in cents.
var catalogue = []struct {
	name     string
	options  [][]string // each axis: its name, then its values
	min, max int
}{
	{"Trail Backpack", [][]string{{"capacity", "20L", "32L", "45L"}, {"color", "moss", "slate", "ember"}}, 5900, 13900},
	{"Ceramic Mug", [][]string{{"size", "small", "large"}, {"glaze", "matte", "glossy"}, {"color", "chalk", "indigo"}}, 1200, 2900},
	{"Reading Lamp", [][]string{{"light", "warm", "cool", "tunable"}, {"finish", "brass", "graphite"}}, 3400, 8900},
	{"Wireless Mouse", [][]string{{"grip", "palm", "claw"}, {"color", "black", "sand"}, {"power", "AA", "rechargeable"}}, 1900, 6400},
	{"Exercise Mat", [][]string{{"thickness", "4mm", "6mm", "8mm"}, {"material", "rubber", "cork"}}, 2500, 7900},
	{"Rain Jacket", [][]string{{"size", "S", "M", "L", "XL"}, {"color", "navy", "signal red"}}, 8900, 18900},
	{"Stovetop Kettle", [][]string{{"capacity", "1L", "1.7L"}, {"material", "steel", "glass"}, {"control", "dial", "touch"}}, 3900, 11900},
	{"Bike Helmet", [][]string{{"size", "S", "M", "L"}, {"visor", "yes", "no"}}, 4900, 15900},
}

var (
	firstNames = []string{"Amara", "Bastian", "Corin", "Delphine", "Emeka", "Farah", "Gideon", "Hana", "Ilse",
		"Joaquin", "Keziah", "Lorcan", "Mireille", "Nuno", "Odile", "Pavel", "Quilla", "Rafferty", "Saoirse",
		"Tobias", "Ulla", "Vikram", "Wren", "Ximena", "Yannick", "Zofia"}
	lastNames = []string{"Abernathy", "Bellweather", "Castellano", "Drummond", "Eskildsen", "Fairbairn",
		"Galloway", "Hollis", "Ingleby", "Jessop", "Kettering", "Lindqvist", "Marchetti", "Northcote",
		"Okonkwo", "Pemberton", "Quayle", "Rasmussen", "Sandoval", "Thorne"}
	streets = []string{"Alder Lane", "Beacon Street", "Cobble Row", "Dunmore Avenue", "Elmwood Court",
		"Foxglove Way", "Granary Road", "Heron Drive", "Ivy Terrace", "Juniper Place"}
	// places are a city, its state and the first three digits of its zips.
	places = [][3]string{{"Portland", "OR", "972"}, {"Madison", "WI", "537"}, {"Savannah", "GA", "314"},
		{"Boulder", "CO", "803"}, {"Burlington", "VT", "054"}, {"Tucson", "AZ", "857"}, {"Ithaca", "NY", "148"}}
	brands = []string{"visa", "mastercard", "amex"}
)

// newWorld draws the world: every product of the catalogue with three to
// five variants, nusers customers with one to three payment methods and one
// to four orders each.
func newWorld(seed uint64, nusers int) *world {
	w := &world{rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), ids: map[string]bool{}}
	for _, c := range catalogue {
		p := &product{name: c.name, id: w.digits(10)}
		combos := combinations(c.options)
		w.rng.Shuffle(len(combos), func(i, j int) { combos[i], combos[j] = combos[j], combos[i] })
		n := min(len(combos), 3+w.rng.IntN(3))
		for i, opts := range combos[:n] {
			p.variants = append(p.variants, &variant{
				itemID: w.digits(10), options: opts,
				available: i == 0 || w.rng.IntN(4) > 0, // at least one available
				price:     money(c.min + w.rng.IntN(c.max-c.min)),
			})
		}
		w.products = append(w.products, p)
	}
	for range nusers {
		w.users = append(w.users, w.newUser())
	}
	return w
}

// combinations returns every choice of one value per option axis.
func combinations(axes [][]string) [][]option {
	out := [][]option{nil}
	for _, axis := range axes {
		var next [][]option
		for _, prefix := range out {
			for _, v := range axis[1:] {
				next = append(next, append(append([]option(nil), prefix...), option{axis[0], v}))
			}
		}
		out = next
	}
	return out
}

// digits draws an id of n digits that was never drawn before.
func (w *world) digits(n int) string {
	for {
		var b strings.Builder
		b.WriteByte(byte('1' + w.rng.IntN(9)))
		for range n - 1 {
			b.WriteByte(byte('0' + w.rng.IntN(10)))
		}
		if s := b.String(); !w.ids[s] {
			w.ids[s] = true
			return s
		}
	}
}

func pick[T any](w *world, from []T) T { return from[w.rng.IntN(len(from))] }

func (w *world) newAddress() address {
	place := pick(w, places)
	a := address{
		address1: fmt.Sprintf("%d %s", 10+w.rng.IntN(980), pick(w, streets)),
		city:     place[0], state: place[1], zip: place[2] + fmt.Sprintf("%02d", w.rng.IntN(100)),
	}
	switch w.rng.IntN(3) {
	case 0:
		a.address2 = fmt.Sprintf("Suite %d", 100+w.rng.IntN(900))
	case 1:
		a.address2 = fmt.Sprintf("Apt %d", 1+w.rng.IntN(40))
	}
	return a
}

// newUser draws a customer with a name no other customer has, payment
// methods (a credit card, PayPal and a gift card, each with some chance, at
// least one) and orders.
func (w *world) newUser() *user {
	var first, last string
	for {
		first, last = pick(w, firstNames), pick(w, lastNames)
		taken := false
		for _, u := range w.users {
			taken = taken || (u.first == first && u.last == last)
		}
		if !taken {
			break
		}
	}
	n := w.digits(4)
	u := &user{
		id:    strings.ToLower(first+"_"+last) + "_" + n,
		first: first, last: last,
		email: strings.ToLower(first+"."+last) + n + "@example.org",
		addr:  w.newAddress(),
	}
	for len(u.payments) == 0 {
		if w.rng.IntN(4) > 0 {
			u.payments = append(u.payments, &payment{id: "credit_card_" + w.digits(7), source: "credit_card",
				brand: pick(w, brands), lastFour: w.digits(4)})
		}
		if w.rng.IntN(3) == 0 {
			u.payments = append(u.payments, &payment{id: "paypal_" + w.digits(7), source: "paypal"})
		}
		if w.rng.IntN(2) == 0 {
			u.payments = append(u.payments, &payment{id: "gift_card_" + w.digits(7), source: "gift_card",
				balance: money(w.rng.IntN(40000))})
		}
	}
	for range 1 + w.rng.IntN(4) {
		w.newOrder(u)
	}
	return u
}

// statuses are the order statuses, drawn in these proportions.
var statuses = []string{"pending", "pending", "pending", "delivered", "delivered", "delivered", "processed", "cancelled"}

// newOrder draws an order of u: one to four items, a status, and one payment
// by one of u's methods.
func (w *world) newOrder(u *user) {
	o := &order{id: "#S" + w.digits(7), u: u, addr: u.addr, status: pick(w, statuses), pay: pick(w, u.payments)}
	for range 1 + w.rng.IntN(4) {
		p := pick(w, w.products)
		o.items = append(o.items, item{p: p, v: pick(w, p.variants)})
	}
	if o.status == "delivered" || o.status == "processed" {
		o.tracking = w.digits(12)
	}
	u.orders = append(u.orders, o)
	w.orders = append(w.orders, o)
}

// JSON of the records, as the data files hold them.

func (a address) json() obj {
	return obj{{"address1", a.address1}, {"address2", a.address2}, {"city", a.city},
		{"country", "USA"}, {"state", a.state}, {"zip", a.zip}}
}

func options(opts []option) obj {
	o := obj{}
	for _, op := range opts {
		o = append(o, field{op.name, op.value})
	}
	return o
}

func (p *product) json() obj {
	vs := obj{}
	for _, v := range p.variants {
		vs = append(vs, field{v.itemID, obj{{"item_id", v.itemID}, {"options", options(v.options)},
			{"available", v.available}, {"price", v.price}}})
	}
	return obj{{"name", p.name}, {"product_id", p.id}, {"variants", vs}}
}

func (u *user) json() obj {
	pms := obj{}
	for _, pm := range u.payments {
		rec := obj{{"source", pm.source}}
		switch pm.source {
		case "credit_card":
			rec = append(rec, field{"brand", pm.brand}, field{"last_four", pm.lastFour})
		case "gift_card":
			rec = append(rec, field{"balance", pm.balance})
		}
		pms = append(pms, field{pm.id, append(rec, field{"id", pm.id})})
	}
	orders := []string{}
	for _, o := range u.orders {
		orders = append(orders, o.id)
	}
	return obj{{"name", obj{{"first_name", u.first}, {"last_name", u.last}}}, {"address", u.addr.json()},
		{"email", u.email}, {"payment_methods", pms}, {"orders", orders}}
}

func (o *order) json() obj {
	items := []obj{}
	ids := []string{}
	for _, it := range o.items {
		items = append(items, obj{{"name", it.p.name}, {"product_id", it.p.id}, {"item_id", it.v.itemID},
			{"price", it.v.price}, {"options", options(it.v.options)}})
		ids = append(ids, it.v.itemID)
	}
	fulfillments := []obj{}
	if o.tracking != "" {
		fulfillments = append(fulfillments, obj{{"tracking_id", []string{o.tracking}}, {"item_ids", ids}})
	}
	history := []obj{{{"transaction_type", "payment"}, {"amount", o.total()}, {"payment_method_id", o.pay.id}}}
	if o.status == "cancelled" {
		history = append(history, obj{{"transaction_type", "refund"}, {"amount", o.total()}, {"payment_method_id", o.pay.id}})
	}
	return obj{{"order_id", o.id}, {"user_id", o.u.id}, {"address", o.addr.json()}, {"items", items},
		{"fulfillments", fulfillments}, {"status", o.status}, {"payment_history", history}}
}

// files returns the three data files: each a JSON object of the records by
// id, in file order.
func (w *world) files() (orders, users, products []byte, err error) {
	// A JSON object with one record a line.
	table := func(n int, rec func(i int) (string, obj)) ([]byte, error) {
		var b bytes.Buffer
		b.WriteString("{\n")
		for i := range n {
			id, r := rec(i)
			k, err := json.Marshal(id)
			if err != nil {
				return nil, err
			}
			v, err := json.Marshal(r)
			if err != nil {
				return nil, err
			}
			b.WriteString("  ")
			b.Write(k)
			b.WriteString(": ")
			b.Write(v)
			if i < n-1 {
				b.WriteByte(',')
			}
			b.WriteByte('\n')
		}
		b.WriteString("}\n")
		return b.Bytes(), nil
	}
	if orders, err = table(len(w.orders), func(i int) (string, obj) { return w.orders[i].id, w.orders[i].json() }); err != nil {
		return
	}
	if users, err = table(len(w.users), func(i int) (string, obj) { return w.users[i].id, w.users[i].json() }); err != nil {
		return
	}
	products, err = table(len(w.products), func(i int) (string, obj) { return w.products[i].id, w.products[i].json() })
	return
}
