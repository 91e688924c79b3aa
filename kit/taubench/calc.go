package taubench

import (
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"
)

// The reference calculate tool checks that the expression only uses
// "0123456789+-*/(). " and then runs str(round(float(eval(expression)), 2))
// in CPython, returning "Error: {exception}" when anything raises. With those
// characters Python still accepts more than + - * /: ** and // (two-character
// operators), unary signs, calls such as 2(3) that fail at run time, the empty
// tuple () and the Ellipsis literal "...". This file reproduces that subset of
// Python 3.11: exact integer arithmetic, IEEE floats, the complex numbers a
// negative base raised to a fractional power produces, and the messages of the
// syntax and run-time errors the reference can return. The arithmetic is in
// pynum.go.
//
// Known deviations, all on inputs no τ-bench task uses: integers are capped at
// maxIntBits bits (Python would compute 9**9**9 for minutes), and the complex
// numbers, which only ever show in error messages, use Go's trigonometric
// functions where CPython uses the C library's.

// calcChars are the characters the reference accepts in an expression.
const calcChars = "0123456789+-*/(). "

// maxIntBits bounds the size of integers during evaluation.
const maxIntBits = 1 << 20

// calculate is the reference calculate tool.
func calculate(expr string) string {
	for _, r := range expr {
		if !strings.ContainsRune(calcChars, r) {
			return "Error: invalid characters in expression"
		}
	}
	f, err := evalToFloat(expr)
	if err != nil {
		return "Error: " + err.Error()
	}
	return pyFloatRepr(round2(f))
}

// evalToFloat is float(eval(expr)).
func evalToFloat(expr string) (float64, error) {
	n, err := parseExpr(expr)
	if err != nil {
		return 0, err
	}
	v, err := n.eval()
	if err != nil {
		return 0, err
	}
	switch v.kind {
	case kindInt:
		return intToFloat(v.i)
	case kindFloat:
		return v.f, nil
	}
	return 0, fmt.Errorf("float() argument must be a string or a real number, not '%s'", v.typeName())
}

// --- tokens

type tokenKind int

const (
	tokNumber tokenKind = iota
	tokOp
	tokEnd      // end of input
	tokEOFError // end of input with '(' still open: fetching it is an error
)

type token struct {
	kind  tokenKind
	text  string
	level int // parenthesis depth after the token, as CPython's tokenizer records it
}

// maxParenLevel is CPython's limit on nested parentheses.
const maxParenLevel = 200

func syntaxError(msg string) error {
	return fmt.Errorf("%s (<string>, line 1)", msg)
}

// tokenize splits a Python expression into tokens; its errors are the
// tokenizer's, which CPython reports ahead of any parser error.
func tokenize(src string) ([]token, error) {
	var toks []token
	level := 0
	isDigit := func(i int) bool { return i < len(src) && src[i] >= '0' && src[i] <= '9' }
	digits := func(i int) int {
		for isDigit(i) {
			i++
		}
		return i
	}
	for i := 0; i < len(src); {
		start := i
		switch c := src[i]; {
		case c == ' ':
			i++
			continue
		case isDigit(i) || c == '.' && isDigit(i+1):
			if c == '0' { // CPython: zeros, then digits only if a point follows
				i = digits(i)
				if i < len(src) && src[i] == '.' {
					i = digits(i + 1)
				} else if strings.Trim(src[start:i], "0") != "" {
					return nil, syntaxError("leading zeros in decimal integer literals are not permitted; use an 0o prefix for octal integers")
				}
			} else {
				i = digits(i)
				if i < len(src) && src[i] == '.' {
					i = digits(i + 1)
				}
			}
			toks = append(toks, token{kind: tokNumber, text: src[start:i], level: level})
			continue
		case c == '(':
			if level >= maxParenLevel {
				return nil, syntaxError("too many nested parentheses")
			}
			level++
			i++
		case c == ')':
			if level == 0 {
				return nil, syntaxError("unmatched ')'")
			}
			level--
			i++
		case strings.HasPrefix(src[i:], "..."):
			i += 3
		case strings.HasPrefix(src[i:], "**"), strings.HasPrefix(src[i:], "//"):
			i += 2
		default: // + - * / and a lone '.'
			i++
		}
		toks = append(toks, token{kind: tokOp, text: src[start:i], level: level})
	}
	if level > 0 {
		return append(toks, token{kind: tokEOFError, level: level}), nil
	}
	return append(toks, token{kind: tokEnd}), nil
}

// --- parser

// node is an expression tree node.
type node struct {
	op   string // "num", "neg", "pos", "call", or a binary operator
	val  value  // for "num" (numbers, (), ...)
	x, y *node  // operands; for "call" the callee and the argument, if any
	star string // for "call": "", "*" or "**" before the argument
}

// parser is a PEG parser over the token list that mirrors CPython's: a first
// pass with the plain grammar and, if that fails, a second pass with the
// "invalid_" rules that raise the specific messages. Sub-parses backtrack; err
// is CPython's pending exception, which makes every rule fail.
type parser struct {
	toks    []token
	invalid bool // second pass: raise the specific syntax errors
	err     error
	memo    map[memoKey]memoResult
}

type memoKey struct {
	pos     int
	invalid bool
}

type memoResult struct {
	n   *node
	end int
	ok  bool
}

// parseExpr parses src as eval() does.
func parseExpr(src string) (*node, error) {
	src = strings.TrimLeft(src, " ") // eval strips leading spaces and tabs
	toks, err := tokenize(src)
	if err != nil {
		return nil, err
	}
	if len(toks) == 1 && toks[0].kind == tokEnd {
		return nil, fmt.Errorf("invalid syntax (<string>, line 0)")
	}
	for _, invalid := range []bool{false, true} {
		p := &parser{toks: toks, invalid: invalid, memo: map[memoKey]memoResult{}}
		n, end, ok := p.expression(0)
		if ok && p.peek(end).kind == tokEnd {
			return n, nil
		}
		if p.err != nil {
			return nil, p.err
		}
	}
	return nil, syntaxError("invalid syntax")
}

// peek returns the token at pos; fetching the end of an input with open
// parentheses raises the tokenizer's error.
func (p *parser) peek(pos int) token {
	t := p.toks[pos]
	if t.kind == tokEOFError && p.err == nil {
		p.err = syntaxError("'(' was never closed")
	}
	return t
}

// is reports whether the token at pos is the operator op.
func (p *parser) is(pos int, op string) bool {
	t := p.peek(pos)
	return p.err == nil && t.kind == tokOp && t.text == op
}

// raise records a second-pass syntax error.
func (p *parser) raise(msg string) {
	if p.err == nil {
		p.err = syntaxError(msg)
	}
}

// expression: in the second pass CPython first tries invalid_expression, which
// reports two expressions in a row inside brackets as a missing comma.
func (p *parser) expression(pos int) (*node, int, bool) {
	if p.invalid {
		if _, aEnd, ok := p.sum(pos); ok {
			p.invalid = false // b is parsed as expression_without_invalid
			_, bEnd, ok := p.expression(aEnd)
			p.invalid = true
			if ok && p.toks[bEnd-1].level != 0 {
				p.raise("invalid syntax. Perhaps you forgot a comma?")
			}
		}
		if p.err != nil {
			return nil, 0, false
		}
	}
	return p.sum(pos)
}

// sum: term (('+' | '-') term)*, memoized as CPython memoizes its rules.
func (p *parser) sum(pos int) (*node, int, bool) {
	key := memoKey{pos, p.invalid}
	if r, ok := p.memo[key]; ok {
		return r.n, r.end, r.ok
	}
	n, end, ok := p.binary(pos, p.term, "+", "-")
	p.memo[key] = memoResult{n, end, ok}
	return n, end, ok
}

// term: factor (('*' | '/' | '//') factor)*.
func (p *parser) term(pos int) (*node, int, bool) {
	return p.binary(pos, p.factor, "*", "/", "//")
}

// binary parses a left-associative chain; an operator whose right operand
// does not parse is left for the caller, as PEG backtracking does.
func (p *parser) binary(pos int, operand func(int) (*node, int, bool), ops ...string) (*node, int, bool) {
	n, pos, ok := operand(pos)
	for ok {
		t := p.peek(pos)
		if p.err != nil {
			return nil, 0, false
		}
		if t.kind != tokOp || !slices.Contains(ops, t.text) {
			break
		}
		y, end, ok := operand(pos + 1)
		if p.err != nil {
			return nil, 0, false
		}
		if !ok {
			break
		}
		n, pos = &node{op: t.text, x: n, y: y}, end
	}
	return n, pos, ok
}

// factor: ('+' | '-') factor | power.
func (p *parser) factor(pos int) (*node, int, bool) {
	for _, op := range []string{"+", "-"} {
		if p.is(pos, op) {
			x, end, ok := p.factor(pos + 1)
			if !ok {
				return nil, 0, false
			}
			return &node{op: map[string]string{"+": "pos", "-": "neg"}[op], x: x}, end, true
		}
	}
	if p.err != nil {
		return nil, 0, false
	}
	return p.power(pos)
}

// power: primary ['**' factor].
func (p *parser) power(pos int) (*node, int, bool) {
	base, pos, ok := p.primary(pos)
	if !ok {
		return nil, 0, false
	}
	if p.is(pos, "**") {
		if exp, end, ok := p.factor(pos + 1); ok {
			return &node{op: "**", x: base, y: exp}, end, true
		}
	}
	if p.err != nil {
		return nil, 0, false
	}
	return base, pos, true
}

// primary: atom followed by calls "(" [["*" | "**"] expression] ")".
func (p *parser) primary(pos int) (*node, int, bool) {
	n, pos, ok := p.atom(pos)
	for ok && p.is(pos, "(") {
		call, end, ok := p.call(n, pos+1)
		if !ok {
			break
		}
		n, pos = call, end
	}
	if ok && p.is(pos, ".") {
		p.peek(pos + 1) // CPython looks for the attribute's NAME, which cannot be spelt
	}
	if p.err != nil {
		return nil, 0, false
	}
	return n, pos, ok
}

func (p *parser) call(callee *node, pos int) (*node, int, bool) {
	if p.is(pos, ")") {
		return &node{op: "call", x: callee}, pos + 1, true
	}
	star := ""
	if p.is(pos, "*") || p.is(pos, "**") {
		star = p.toks[pos].text
		pos++
	}
	arg, end, ok := p.expression(pos)
	if !ok || !p.is(end, ")") {
		return nil, 0, false
	}
	return &node{op: "call", x: callee, y: arg, star: star}, end + 1, true
}

// maxIntDigits is CPython's limit on decimal digits in an int literal.
const maxIntDigits = 4300

// atom: NUMBER | "..." | group.
func (p *parser) atom(pos int) (*node, int, bool) {
	t := p.peek(pos)
	switch {
	case p.err != nil:
		return nil, 0, false
	case t.kind == tokNumber && strings.Contains(t.text, "."):
		f, _ := strconv.ParseFloat(t.text, 64) // too large gives +Inf, as in CPython
		return &node{op: "num", val: floatValue(f)}, pos + 1, true
	case t.kind == tokNumber:
		if len(t.text) > maxIntDigits {
			p.err = syntaxError(fmt.Sprintf("Exceeds the limit (%d digits) for integer string conversion: value has %d digits; use sys.set_int_max_str_digits() to increase the limit - Consider hexadecimal for huge integer literals to avoid decimal conversion limits.", maxIntDigits, len(t.text)))
			return nil, 0, false
		}
		i, _ := new(big.Int).SetString(t.text, 10)
		return &node{op: "num", val: value{kind: kindInt, i: i}}, pos + 1, true
	case t.kind == tokOp && t.text == "...":
		return &node{op: "num", val: value{kind: kindEllipsis}}, pos + 1, true
	case t.kind == tokOp && t.text == "(":
		return p.group(pos + 1)
	}
	return nil, 0, false
}

// group parses what follows "(": ")" (the empty tuple) or expression ")".
// In the second pass a starred expression there is CPython's invalid_group.
func (p *parser) group(pos int) (*node, int, bool) {
	if p.is(pos, ")") {
		return &node{op: "num", val: value{kind: kindTuple}}, pos + 1, true
	}
	if p.is(pos, "*") || p.is(pos, "**") {
		// The first pass reads "*" expr as a tuple item, then finds no ','.
		star := p.toks[pos].text
		if star == "*" || p.invalid {
			if _, end, ok := p.expression(pos + 1); ok && p.is(end, ")") && p.invalid {
				p.raise(map[string]string{
					"*":  "cannot use starred expression here",
					"**": "cannot use double starred expression here",
				}[star])
			}
		}
		return nil, 0, false
	}
	n, end, ok := p.expression(pos)
	if !ok || !p.is(end, ")") {
		return nil, 0, false
	}
	return n, end + 1, true
}

// --- evaluation

func typeError(format string, args ...any) error { return fmt.Errorf(format, args...) }

// eval evaluates the tree in Python's order: operands left to right, then
// the operation.
func (n *node) eval() (value, error) {
	switch n.op {
	case "num":
		return n.val, nil
	case "neg", "pos":
		x, err := n.x.eval()
		if err != nil {
			return value{}, err
		}
		return unary(n.op, x)
	case "call":
		return n.evalCall()
	}
	x, err := n.x.eval()
	if err != nil {
		return value{}, err
	}
	y, err := n.y.eval()
	if err != nil {
		return value{}, err
	}
	return binaryOp(n.op, x, y)
}

// evalCall evaluates a call; no value here is callable.
func (n *node) evalCall() (value, error) {
	callee, err := n.x.eval()
	if err != nil {
		return value{}, err
	}
	if n.y != nil {
		arg, err := n.y.eval()
		if err != nil {
			return value{}, err
		}
		switch {
		case n.star == "*" && arg.kind != kindTuple:
			return value{}, typeError("%s argument after * must be an iterable, not %s", callee.repr(), arg.typeName())
		case n.star == "**":
			return value{}, typeError("%s argument after ** must be a mapping, not %s", callee.repr(), arg.typeName())
		}
	}
	return value{}, typeError("'%s' object is not callable", callee.typeName())
}
