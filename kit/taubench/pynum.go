package taubench

import (
	"fmt"
	"math"
	"math/big"
	"sync"
)

// The objects a calculate expression evaluates to and CPython 3.11's
// arithmetic on them (see calc.go).

type valueKind int

const (
	kindInt valueKind = iota
	kindFloat
	kindComplex
	kindTuple    // only the empty tuple can be written
	kindEllipsis // "..."
)

// value is a Python object an expression can evaluate to.
type value struct {
	kind valueKind
	i    *big.Int
	f    float64
	c    complex128
}

func (v value) typeName() string {
	return [...]string{"int", "float", "complex", "tuple", "ellipsis"}[v.kind]
}

func (v value) numeric() bool { return v.kind <= kindComplex }

// repr is Python's repr of the value (used in call error messages).
func (v value) repr() string {
	switch v.kind {
	case kindInt:
		return v.i.String()
	case kindFloat:
		return pyFloatRepr(v.f)
	case kindComplex:
		re, im := real(v.c), imag(v.c)
		if re == 0 && !math.Signbit(re) {
			return formatPyFloat(im, false, false) + "j"
		}
		return "(" + formatPyFloat(re, false, false) + formatPyFloat(im, false, true) + "j)"
	case kindTuple:
		return "()"
	}
	return "Ellipsis"
}

func intValue(i *big.Int) (value, error) {
	if i.BitLen() > maxIntBits {
		return value{}, errIntTooLarge
	}
	return value{kind: kindInt, i: i}, nil
}

func floatValue(f float64) value      { return value{kind: kindFloat, f: f} }
func complexValue(c complex128) value { return value{kind: kindComplex, c: c} }

var errIntTooLarge = fmt.Errorf("int too large to convert to float")

// intToFloat converts as Python does: correctly rounded, OverflowError past
// the float range.
func intToFloat(i *big.Int) (float64, error) {
	f, _ := new(big.Float).SetInt(i).Float64()
	if math.IsInf(f, 0) {
		return 0, errIntTooLarge
	}
	return f, nil
}

// toFloat converts an int or float operand to float64.
func (v value) toFloat() (float64, error) {
	if v.kind == kindInt {
		return intToFloat(v.i)
	}
	return v.f, nil
}

// toComplex converts a numeric operand to complex128.
func (v value) toComplex() (complex128, error) {
	if v.kind == kindComplex {
		return v.c, nil
	}
	f, err := v.toFloat()
	return complex(f, 0), err
}

func unary(op string, x value) (value, error) {
	if !x.numeric() {
		return value{}, typeError("bad operand type for unary %s: '%s'", map[string]string{"neg": "-", "pos": "+"}[op], x.typeName())
	}
	if op == "pos" {
		return x, nil
	}
	switch x.kind {
	case kindInt:
		return value{kind: kindInt, i: new(big.Int).Neg(x.i)}, nil
	case kindFloat:
		return floatValue(-x.f), nil
	}
	return complexValue(-x.c), nil
}

// binaryOp applies op with Python's dispatch: sequences, then complex, int
// and float arithmetic.
func binaryOp(op string, x, y value) (value, error) {
	switch {
	case !x.numeric() || !y.numeric():
		return sequenceOp(op, x, y)
	case x.kind == kindComplex || y.kind == kindComplex:
		return complexOp(op, x, y)
	case x.kind == kindInt && y.kind == kindInt:
		return intOp(op, x.i, y.i)
	}
	a, err := x.toFloat()
	if err != nil {
		return value{}, err
	}
	b, err := y.toFloat()
	if err != nil {
		return value{}, err
	}
	return floatOp(op, a, b)
}

func unsupported(op string, x, y value) error {
	if op == "**" {
		op = "** or pow()"
	}
	return typeError("unsupported operand type(s) for %s: '%s' and '%s'", op, x.typeName(), y.typeName())
}

// sequenceOp handles operands that are () or "...": tuples concatenate and
// repeat, everything else is a TypeError.
func sequenceOp(op string, x, y value) (value, error) {
	tuple := value{kind: kindTuple}
	switch {
	case op == "+" && x.kind == kindTuple:
		if y.kind != kindTuple {
			return value{}, typeError("can only concatenate tuple (not \"%s\") to tuple", y.typeName())
		}
		return tuple, nil
	case op == "*" && (x.kind == kindTuple || y.kind == kindTuple):
		count := y
		if x.kind != kindTuple {
			count = x
		}
		if count.kind != kindInt {
			return value{}, typeError("can't multiply sequence by non-int of type '%s'", count.typeName())
		}
		if !count.i.IsInt64() {
			return value{}, fmt.Errorf("cannot fit 'int' into an index-sized integer")
		}
		return tuple, nil
	}
	return value{}, unsupported(op, x, y)
}

func intOp(op string, a, b *big.Int) (value, error) {
	switch op {
	case "+":
		return intValue(new(big.Int).Add(a, b))
	case "-":
		return intValue(new(big.Int).Sub(a, b))
	case "*":
		if a.BitLen()+b.BitLen() > maxIntBits+1 {
			return value{}, errIntTooLarge
		}
		return intValue(new(big.Int).Mul(a, b))
	case "/":
		if b.Sign() == 0 {
			return value{}, fmt.Errorf("division by zero")
		}
		if a.Sign() == 0 { // CPython keeps the sign: 0/-1 is -0.0
			return floatValue(math.Copysign(0, float64(b.Sign()))), nil
		}
		f, _ := new(big.Rat).SetFrac(a, b).Float64() // correctly rounded, as CPython
		if math.IsInf(f, 0) {
			return value{}, fmt.Errorf("integer division result too large for a float")
		}
		return floatValue(f), nil
	case "//":
		if b.Sign() == 0 {
			return value{}, fmt.Errorf("integer division or modulo by zero")
		}
		q, r := new(big.Int).QuoRem(a, b, new(big.Int))
		if r.Sign() != 0 && (r.Sign() < 0) != (b.Sign() < 0) {
			q.Sub(q, big.NewInt(1))
		}
		return intValue(q)
	}
	// "**"
	if b.Sign() < 0 { // int ** negative int is float ** float
		fa, err := intToFloat(a)
		if err != nil {
			return value{}, err
		}
		fb, err := intToFloat(b)
		if err != nil {
			return value{}, err
		}
		return floatPow(fa, fb)
	}
	if a.CmpAbs(big.NewInt(1)) > 0 && (!b.IsInt64() || float64(a.BitLen()-1)*float64(b.Int64()) > maxIntBits) {
		return value{}, errIntTooLarge
	}
	return intValue(new(big.Int).Exp(a, b, nil))
}

func floatOp(op string, a, b float64) (value, error) {
	switch op {
	case "+":
		return floatValue(a + b), nil
	case "-":
		return floatValue(a - b), nil
	case "*":
		return floatValue(float64(a * b)), nil // float64() forbids fusing into an FMA
	case "/":
		if b == 0 {
			return value{}, fmt.Errorf("float division by zero")
		}
		return floatValue(a / b), nil
	case "//":
		if b == 0 {
			return value{}, fmt.Errorf("float floor division by zero")
		}
		return floatValue(floorDiv(a, b)), nil
	}
	return floatPow(a, b)
}

// floorDiv is CPython's float floor division (_float_div_mod).
func floorDiv(vx, wx float64) float64 {
	mod := math.Mod(vx, wx)
	div := (vx - mod) / wx
	if mod != 0 && (wx < 0) != (mod < 0) {
		div -= 1.0
	}
	if div == 0 {
		return math.Copysign(0, vx/wx)
	}
	floor := math.Floor(div)
	if div-floor > 0.5 {
		floor += 1.0
	}
	return floor
}

// floatPow is CPython's float_pow.
func floatPow(iv, iw float64) (value, error) {
	isOddInt := func(x float64) bool { return math.Mod(math.Abs(x), 2) == 1 }
	switch {
	case iw == 0:
		return floatValue(1), nil
	case math.IsNaN(iv):
		return floatValue(iv), nil
	case math.IsNaN(iw):
		if iv == 1 {
			return floatValue(1), nil
		}
		return floatValue(iw), nil
	case math.IsInf(iw, 0):
		iv = math.Abs(iv)
		switch {
		case iv == 1:
			return floatValue(1), nil
		case (iw > 0) == (iv > 1):
			return floatValue(math.Abs(iw)), nil
		}
		return floatValue(0), nil
	case math.IsInf(iv, 0):
		if iw > 0 {
			if isOddInt(iw) {
				return floatValue(iv), nil
			}
			return floatValue(math.Abs(iv)), nil
		}
		if isOddInt(iw) {
			return floatValue(math.Copysign(0, iv)), nil
		}
		return floatValue(0), nil
	case iv == 0:
		if iw < 0 {
			return value{}, fmt.Errorf("0.0 cannot be raised to a negative power")
		}
		if isOddInt(iw) {
			return floatValue(iv), nil
		}
		return floatValue(0), nil
	}
	negate := false
	if iv < 0 {
		if iw != math.Floor(iw) { // the result is complex
			return complexOp("**", floatValue(iv), floatValue(iw))
		}
		iv, negate = -iv, isOddInt(iw)
	}
	if iv == 1 {
		if negate {
			return floatValue(-1), nil
		}
		return floatValue(1), nil
	}
	r := pow(iv, iw)
	if math.IsInf(r, 0) {
		return value{}, fmt.Errorf("(34, 'Numerical result out of range')")
	}
	if negate {
		r = -r
	}
	return floatValue(r), nil
}

// complexOp is CPython's complex arithmetic; a real operand becomes complex(x, 0).
func complexOp(op string, x, y value) (value, error) {
	if op == "//" {
		return value{}, unsupported(op, x, y)
	}
	a, err := x.toComplex()
	if err != nil {
		return value{}, err
	}
	b, err := y.toComplex()
	if err != nil {
		return value{}, err
	}
	switch op {
	case "+":
		return complexValue(complex(real(a)+real(b), imag(a)+imag(b))), nil
	case "-":
		return complexValue(complex(real(a)-real(b), imag(a)-imag(b))), nil
	case "*":
		return complexValue(cprod(a, b)), nil
	case "/":
		q, ok := cquot(a, b)
		if !ok {
			return value{}, fmt.Errorf("complex division by zero")
		}
		return complexValue(q), nil
	}
	var r complex128
	ok := true
	if imag(b) == 0 && real(b) == math.Floor(real(b)) && math.Abs(real(b)) <= 100 {
		r, ok = cpowi(a, int(real(b)))
	} else {
		r, ok = cpow(a, b)
	}
	switch {
	case !ok:
		return value{}, fmt.Errorf("0.0 to a negative or complex power")
	case math.IsInf(real(r), 0) || math.IsInf(imag(r), 0):
		return value{}, fmt.Errorf("complex exponentiation")
	}
	return complexValue(r), nil
}

// cprod is CPython's _Py_c_prod.
func cprod(a, b complex128) complex128 {
	return complex(float64(real(a)*real(b))-float64(imag(a)*imag(b)), float64(real(a)*imag(b))+float64(imag(a)*real(b)))
}

// cquot is CPython's _Py_c_quot; ok is false for a zero divisor.
func cquot(a, b complex128) (complex128, bool) {
	ar, ai, br, bi := real(a), imag(a), real(b), imag(b)
	switch absR, absI := math.Abs(br), math.Abs(bi); {
	case absR >= absI:
		if absR == 0 {
			return 0, false
		}
		ratio := bi / br
		denom := br + float64(bi*ratio)
		return complex((ar+float64(ai*ratio))/denom, (ai-float64(ar*ratio))/denom), true
	case absI >= absR:
		ratio := br / bi
		denom := float64(br*ratio) + bi
		return complex((float64(ar*ratio)+ai)/denom, (float64(ai*ratio)-ar)/denom), true
	}
	return complex(math.NaN(), math.NaN()), true
}

// cpowi is CPython's c_powi: repeated squaring for small integer exponents.
func cpowi(x complex128, n int) (complex128, bool) {
	neg := n < 0
	if neg {
		n = -n
	}
	r, p := complex128(1), x
	for mask := 1; mask > 0 && n >= mask; mask <<= 1 {
		if n&mask != 0 {
			r = cprod(r, p)
		}
		p = cprod(p, p)
	}
	if neg {
		return cquot(1, r)
	}
	return r, true
}

// cpow is CPython's _Py_c_pow; ok is false for 0 to a negative or complex power.
func cpow(a, b complex128) (complex128, bool) {
	switch {
	case b == 0:
		return 1, true
	case a == 0:
		return 0, imag(b) == 0 && real(b) >= 0
	}
	vabs := math.Hypot(real(a), imag(a))
	length := pow(vabs, real(b))
	at := math.Atan2(imag(a), real(a))
	phase := float64(at * real(b))
	if imag(b) != 0 {
		length /= math.Exp(float64(at * imag(b)))
		phase += float64(imag(b) * math.Log(vabs))
	}
	return complex(float64(length*math.Cos(phase)), float64(length*math.Sin(phase))), true
}

// powPrec is the working precision of pow, in bits.
const powPrec = 192

// pow returns x**y for finite x > 0 and finite y, correctly rounded but for
// results within 2**-180 of a rounding boundary. CPython calls the C
// library's pow, which is correctly rounded in practice; Go's math.Pow can be
// several units in the last place off for large results.
func pow(x, y float64) float64 {
	if x == 1 || y == 0 {
		return 1
	}
	t := new(big.Float).SetPrec(powPrec).SetFloat64(y)
	t.Mul(t, bigLog(x)) // t = y * ln x
	switch tf, _ := t.Float64(); {
	case tf > 1000:
		return math.Inf(1)
	case tf < -1000:
		return 0
	}
	r, _ := bigExp(t).Float64()
	return r
}

var bigLn2 = sync.OnceValue(func() *big.Float {
	third := new(big.Float).SetPrec(powPrec).SetInt64(1)
	third.Quo(third, big.NewFloat(3))
	return atanh2(third) // ln 2 = 2 atanh(1/3)
})

// bigLog returns ln x for finite x > 0.
func bigLog(x float64) *big.Float {
	frac, exp := math.Frexp(x) // x = frac * 2**exp, frac in [0.5, 1)
	f := new(big.Float).SetPrec(powPrec).SetFloat64(frac)
	num := new(big.Float).SetPrec(powPrec).Sub(f, big.NewFloat(1))
	den := new(big.Float).SetPrec(powPrec).Add(f, big.NewFloat(1))
	r := atanh2(num.Quo(num, den)) // ln f = 2 atanh((f-1)/(f+1))
	e := new(big.Float).SetPrec(powPrec).SetInt64(int64(exp))
	return r.Add(r, e.Mul(e, bigLn2()))
}

// atanh2 returns 2 atanh(z) = 2 (z + z**3/3 + z**5/5 + …) for |z| <= 1/3.
func atanh2(z *big.Float) *big.Float {
	sum := new(big.Float).SetPrec(powPrec).Set(z)
	z2 := new(big.Float).SetPrec(powPrec).Mul(z, z)
	term := new(big.Float).SetPrec(powPrec).Set(z)
	for k := int64(3); ; k += 2 {
		term.Mul(term, z2)
		q := new(big.Float).SetPrec(powPrec).Quo(term, new(big.Float).SetInt64(k))
		if q.Sign() == 0 || q.MantExp(nil)-sum.MantExp(nil) < -powPrec {
			break
		}
		sum.Add(sum, q)
	}
	return sum.Mul(sum, big.NewFloat(2))
}

// bigExp returns e**t for |t| <= 1000.
func bigExp(t *big.Float) *big.Float {
	// t = k ln 2 + r with |r| <= ln2/2; e**r from its series after halving r
	// eight times, then squared back; e**t = e**r * 2**k.
	kf := new(big.Float).Quo(t, bigLn2())
	k, _ := kf.Float64()
	kInt := int64(math.Round(k))
	r := new(big.Float).SetPrec(powPrec).SetInt64(kInt)
	r.Sub(t, r.Mul(r, bigLn2()))
	const halvings = 8
	r.SetMantExp(r, -halvings)
	sum := new(big.Float).SetPrec(powPrec).SetInt64(1)
	term := new(big.Float).SetPrec(powPrec).SetInt64(1)
	for n := int64(1); ; n++ {
		term.Mul(term, r)
		term.Quo(term, new(big.Float).SetInt64(n))
		if term.Sign() == 0 || term.MantExp(nil) < -powPrec-4 {
			break
		}
		sum.Add(sum, term)
	}
	for range halvings {
		sum.Mul(sum, sum)
	}
	return sum.SetMantExp(sum, int(kInt))
}
