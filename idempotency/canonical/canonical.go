// Package canonical writes JSON texts in their RFC 8785 (JSON
// Canonicalization Scheme) form: the bytes the idempotency edge fingerprints
// a JSON body by, so that two bodies that differ only in member order,
// whitespace, escapes or number spelling are the same request.
//
// The form is pinned: the vectors of RFC 8785 and a corpus of generated
// documents (testdata/corpus.golden) hold every output byte for byte, since
// a fingerprint stored before a change must still match its retries after it.
package canonical

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// ErrNotCanonicalizable is returned by JSON and Exact for input that is not
// I-JSON (RFC 7493): malformed JSON, invalid UTF-8, lone surrogates, duplicate
// object member names, numbers outside the IEEE 754 double range, or nesting
// deeper than maxDepth; and by Exact for a number a double does not hold
// exactly.
var ErrNotCanonicalizable = errors.New("canonical: not canonicalizable JSON")

// maxDepth bounds nesting so that hostile input cannot exhaust the stack.
const maxDepth = 512

// JSON returns the RFC 8785 (JSON Canonicalization Scheme) form of the JSON
// text in data: no insignificant whitespace, object members sorted by the
// UTF-16 code units of their names, numbers in ECMAScript's shortest
// round-trip form, strings with minimal escaping. Two JSON texts that differ
// only in member order, whitespace, escapes or number spelling (1.0 vs 1e0)
// canonicalize to the same bytes, and JSON(JSON(x)) == JSON(x).
func JSON(data []byte) ([]byte, error) {
	return canonicalize(data, false)
}

// Exact is JSON that also refuses a number whose literal carries more
// precision than an IEEE 754 double keeps (the integer 9007199254740993, or
// 0.10000000000000000001), which RFC 8785 would equate with its neighbour:
// where the canonical form decides that two requests are the same, two
// different numbers must never canonicalize alike.
func Exact(data []byte) ([]byte, error) {
	return canonicalize(data, true)
}

// canonicalize is JSON, or Exact with exact.
//
// It works in time and memory linear in the input, whatever its shape: one
// pass parses the text into a flat tree whose scalars (and member names)
// are already written in canonical form, each once, into one buffer; each
// object's members are sorted by their names; a second pass writes the
// tree out, copying each scalar once. Writing each object's canonical
// members into a buffer of its own and copying it into its parent's would
// copy a value once per level it is nested in: a 1 MiB string under 511
// objects cost half a gigabyte of copying.
func canonicalize(data []byte, exact bool) ([]byte, error) {
	p := &jcsParser{in: data, exact: exact, buf: make([]byte, 0, len(data))}
	// Every node but the root takes two bytes of input at least (a value
	// and its separator), so the first chunk is sized to the body: a
	// request of a hundred bytes does not zero a whole chunk.
	p.nodes.first = min(nodeChunk, len(data)/2+1)
	p.skipSpace()
	root, err := p.value(0)
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if p.pos != len(p.in) {
		return nil, p.errorf("trailing data")
	}
	return p.write(make([]byte, 0, len(p.buf)+2*p.nodes.n), root), nil
}

type jcsParser struct {
	in    []byte
	pos   int
	exact bool // refuse numbers a double does not hold exactly

	buf   []byte    // the canonical bytes of every scalar and member name, in input order
	nodes nodeStore // every value and member parsed
	open  []int32   // the children of the containers being parsed, innermost last
	kids  []int32   // the children of each parsed container, a range per container
	names []string  // the members' names, decoded

	byName []namedNode // an object's members while they are sorted, reused
}

// namedNode is an object member's name and node, as its object sorts them.
type namedNode struct {
	name string
	node int32
}

// jcsNode is a value or an object member of the parse tree.
//
// It holds no pointer (a member's name is an index into names), so that
// the nodes of a large body are not scanned by the garbage collector.
type jcsNode struct {
	kind  byte  // jcsScalar, jcsObject, jcsArray or jcsMember
	value int32 // a member's value
	name  int32 // a member's name, decoded (the sort key), in names
	// from, to: a scalar's canonical bytes, or a member's name, in buf; a
	// container's children in kids.
	from, to int
}

// nodeStore holds the nodes in chunks of a fixed size: adding one never
// copies the others, which for half a million nodes in one slice was most
// of the time (each doubling a long copy the garbage collector waits on).
//
// The first chunk starts at the capacity first (when set) and grows by
// append up to nodeChunk nodes, like the others hold: at() reads by index,
// and no caller keeps a node's pointer across an add.
type nodeStore struct {
	chunks [][]jcsNode
	n      int
	first  int
}

const nodeChunk = 4096

func (s *nodeStore) add(n jcsNode) int32 {
	if s.n%nodeChunk == 0 {
		size := nodeChunk
		if s.n == 0 && s.first > 0 {
			size = s.first
		}
		s.chunks = append(s.chunks, make([]jcsNode, 0, size))
	}
	c := &s.chunks[len(s.chunks)-1]
	*c = append(*c, n)
	s.n++
	return int32(s.n - 1)
}

func (s *nodeStore) at(i int32) *jcsNode { return &s.chunks[i/nodeChunk][i%nodeChunk] }

const (
	jcsScalar byte = iota
	jcsObject
	jcsArray
	jcsMember
)

func (p *jcsParser) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: offset %d: %s", ErrNotCanonicalizable, p.pos, fmt.Sprintf(format, args...))
}

func (p *jcsParser) skipSpace() {
	for p.pos < len(p.in) {
		switch p.in[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// add appends n to the tree and returns its index.
func (p *jcsParser) add(n jcsNode) int32 {
	return p.nodes.add(n)
}

// scalar adds the scalar whose canonical bytes buf holds from from on.
func (p *jcsParser) scalar(from int) int32 {
	return p.add(jcsNode{kind: jcsScalar, from: from, to: len(p.buf)})
}

func (p *jcsParser) value(depth int) (int32, error) {
	if depth > maxDepth {
		return 0, p.errorf("nested deeper than %d", maxDepth)
	}
	if p.pos >= len(p.in) {
		return 0, p.errorf("unexpected end of input")
	}
	from := len(p.buf)
	switch c := p.in[p.pos]; {
	case c == '{':
		return p.object(depth)
	case c == '[':
		return p.array(depth)
	case c == '"':
		s, err := p.str()
		if err != nil {
			return 0, err
		}
		p.buf = appendJCSString(p.buf, s)
		return p.scalar(from), nil
	case c == '-' || (c >= '0' && c <= '9'):
		if err := p.number(); err != nil {
			return 0, err
		}
		return p.scalar(from), nil
	default:
		for _, lit := range []string{"true", "false", "null"} {
			if bytes.HasPrefix(p.in[p.pos:], []byte(lit)) {
				p.pos += len(lit)
				p.buf = append(p.buf, lit...)
				return p.scalar(from), nil
			}
		}
		return 0, p.errorf("unexpected character %q", c)
	}
}

// closeContainer adds a container of kind whose children are open[mark:],
// and drops them from open.
func (p *jcsParser) closeContainer(kind byte, mark int) int32 {
	from := len(p.kids)
	p.kids = append(p.kids, p.open[mark:]...)
	p.open = p.open[:mark]
	return p.add(jcsNode{kind: kind, from: from, to: len(p.kids)})
}

func (p *jcsParser) object(depth int) (int32, error) {
	p.pos++ // {
	mark := len(p.open)
	p.skipSpace()
	if p.pos < len(p.in) && p.in[p.pos] == '}' {
		p.pos++
		return p.closeContainer(jcsObject, mark), nil
	}
	for {
		p.skipSpace()
		if p.pos >= len(p.in) || p.in[p.pos] != '"' {
			return 0, p.errorf("expected member name")
		}
		name, err := p.str()
		if err != nil {
			return 0, err
		}
		p.skipSpace()
		if p.pos >= len(p.in) || p.in[p.pos] != ':' {
			return 0, p.errorf("expected ':'")
		}
		p.pos++
		p.skipSpace()
		from := len(p.buf)
		p.buf = appendJCSString(p.buf, name)
		p.names = append(p.names, name)
		m := jcsNode{kind: jcsMember, from: from, to: len(p.buf), name: int32(len(p.names) - 1)}
		if m.value, err = p.value(depth + 1); err != nil {
			return 0, err
		}
		p.open = append(p.open, p.add(m))
		end, err := p.separator('}', "object")
		if err != nil {
			return 0, err
		}
		if end {
			break
		}
	}
	members := p.open[mark:]
	if len(members) > 1 {
		// Sorted as (name, node) pairs side by side, not through the
		// nodes: a wide object's sort then reads contiguous memory.
		byName := p.byName[:0]
		for _, m := range members {
			byName = append(byName, namedNode{p.names[p.nodes.at(m).name], m})
		}
		slices.SortFunc(byName, func(a, b namedNode) int { return compareUTF16(a.name, b.name) })
		for i := range byName {
			if i > 0 && byName[i].name == byName[i-1].name {
				return 0, p.errorf("duplicate member name %q", byName[i].name)
			}
			members[i] = byName[i].node
		}
		p.byName = byName
	}
	return p.closeContainer(jcsObject, mark), nil
}

func (p *jcsParser) array(depth int) (int32, error) {
	p.pos++ // [
	mark := len(p.open)
	p.skipSpace()
	if p.pos < len(p.in) && p.in[p.pos] == ']' {
		p.pos++
		return p.closeContainer(jcsArray, mark), nil
	}
	for {
		p.skipSpace()
		v, err := p.value(depth + 1)
		if err != nil {
			return 0, err
		}
		p.open = append(p.open, v)
		end, err := p.separator(']', "array")
		if err != nil {
			return 0, err
		}
		if end {
			return p.closeContainer(jcsArray, mark), nil
		}
	}
}

// write appends the canonical form of node i to out.
func (p *jcsParser) write(out []byte, i int32) []byte {
	n := p.nodes.at(i)
	switch n.kind {
	case jcsScalar:
		return append(out, p.buf[n.from:n.to]...)
	case jcsMember:
		out = append(out, p.buf[n.from:n.to]...)
		out = append(out, ':')
		return p.write(out, n.value)
	}
	open, closing := byte('['), byte(']')
	if n.kind == jcsObject {
		open, closing = '{', '}'
	}
	out = append(out, open)
	for k, child := range p.kids[n.from:n.to] {
		if k > 0 {
			out = append(out, ',')
		}
		out = p.write(out, child)
	}
	return append(out, closing)
}

// compareUTF16 orders a and b by their UTF-16 code units, as RFC 8785
// sorts member names, without converting them: code points order as their
// units do, except that a code point above U+FFFF is written with a
// surrogate pair (U+D800-U+DFFF), which sorts below U+E000-U+FFFF.
func compareUTF16(a, b string) int {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	if i == len(a) || i == len(b) {
		return cmp.Compare(len(a), len(b))
	}
	if a[i] < utf8.RuneSelf && b[i] < utf8.RuneSelf {
		return cmp.Compare(a[i], b[i]) // two ASCII characters: one unit each
	}
	for i > 0 && !utf8.RuneStart(a[i]) {
		i-- // the differing character starts before the first differing byte
	}
	ra, _ := utf8.DecodeRuneInString(a[i:])
	rb, _ := utf8.DecodeRuneInString(b[i:])
	return cmp.Compare(utf16Units(ra), utf16Units(rb))
}

// utf16Units returns r's UTF-16 code units as one number that orders as
// the units do: the unit itself, or the surrogate pair high then low.
func utf16Units(r rune) uint32 {
	if r < 0x10000 {
		return uint32(r) << 16
	}
	hi, lo := utf16.EncodeRune(r)
	return uint32(hi)<<16 | uint32(lo)
}

// separator reads what follows a member of an object or an element of an
// array (what): ',' before the next one, or closing, the container's end,
// which it reports as end.
func (p *jcsParser) separator(closing byte, what string) (end bool, err error) {
	p.skipSpace()
	if p.pos >= len(p.in) {
		return false, p.errorf("unterminated %s", what)
	}
	switch p.in[p.pos] {
	case ',':
		p.pos++
		return false, nil
	case closing:
		p.pos++
		return true, nil
	}
	return false, p.errorf("expected ',' or '%c'", closing)
}

// str parses a JSON string at p.pos and returns its decoded value, rejecting
// invalid UTF-8 and unpaired surrogates.
func (p *jcsParser) str() (string, error) {
	p.pos++ // opening quote
	// Most strings are plain ASCII without escapes: one allocation.
	start := p.pos
	for p.pos < len(p.in) {
		if c := p.in[p.pos]; c == '"' || c == '\\' || c < 0x20 || c >= utf8.RuneSelf {
			break
		}
		p.pos++
	}
	if p.pos < len(p.in) && p.in[p.pos] == '"' {
		p.pos++
		return string(p.in[start : p.pos-1]), nil
	}
	var b strings.Builder
	b.Grow(p.pos - start + 16)
	b.Write(p.in[start:p.pos])
	for {
		if p.pos >= len(p.in) {
			return "", p.errorf("unterminated string")
		}
		c := p.in[p.pos]
		switch {
		case c == '"':
			p.pos++
			return b.String(), nil
		case c == '\\':
			if p.pos+1 >= len(p.in) {
				return "", p.errorf("unterminated escape")
			}
			e := p.in[p.pos+1]
			p.pos += 2
			switch e {
			case '"', '\\', '/':
				b.WriteByte(e)
			case 'b':
				b.WriteByte('\b')
			case 'f':
				b.WriteByte('\f')
			case 'n':
				b.WriteByte('\n')
			case 'r':
				b.WriteByte('\r')
			case 't':
				b.WriteByte('\t')
			case 'u':
				r, err := p.hex4()
				if err != nil {
					return "", err
				}
				if utf16.IsSurrogate(r) {
					if r >= 0xdc00 || p.pos+1 >= len(p.in) || p.in[p.pos] != '\\' || p.in[p.pos+1] != 'u' {
						return "", p.errorf("unpaired surrogate")
					}
					p.pos += 2
					r2, err := p.hex4()
					if err != nil {
						return "", err
					}
					if r = utf16.DecodeRune(r, r2); r == utf8.RuneError {
						return "", p.errorf("unpaired surrogate")
					}
				}
				b.WriteRune(r)
			default:
				return "", p.errorf("bad escape \\%c", e)
			}
		case c < 0x20:
			return "", p.errorf("control character in string")
		case c < utf8.RuneSelf:
			b.WriteByte(c)
			p.pos++
		default:
			r, size := utf8.DecodeRune(p.in[p.pos:])
			if r == utf8.RuneError && size <= 1 {
				return "", p.errorf("invalid UTF-8")
			}
			b.Write(p.in[p.pos : p.pos+size])
			p.pos += size
		}
	}
}

func (p *jcsParser) hex4() (rune, error) {
	if p.pos+4 > len(p.in) {
		return 0, p.errorf("short \\u escape")
	}
	n, err := strconv.ParseUint(string(p.in[p.pos:p.pos+4]), 16, 32)
	if err != nil {
		return 0, p.errorf("bad \\u escape")
	}
	p.pos += 4
	return rune(n), nil
}

func (p *jcsParser) number() error {
	start := p.pos
	if p.in[p.pos] == '-' {
		p.pos++
	}
	digits := func() int {
		n := 0
		for p.pos < len(p.in) && p.in[p.pos] >= '0' && p.in[p.pos] <= '9' {
			p.pos++
			n++
		}
		return n
	}
	intStart := p.pos
	n := digits()
	if n == 0 || (n > 1 && p.in[intStart] == '0') {
		return p.errorf("bad number")
	}
	if n <= 15 && (p.pos == len(p.in) || !isNumberTail(p.in[p.pos])) {
		// An integer of at most 15 digits is a double exactly, the
		// shortest digits of which are its own: its canonical form is the
		// literal (0 for -0), with nothing to parse or format.
		if p.in[intStart] == '0' {
			p.buf = append(p.buf, '0')
		} else {
			p.buf = append(p.buf, p.in[start:p.pos]...)
		}
		return nil
	}
	if p.pos < len(p.in) && p.in[p.pos] == '.' {
		p.pos++
		if digits() == 0 {
			return p.errorf("bad number")
		}
	}
	if p.pos < len(p.in) && (p.in[p.pos] == 'e' || p.in[p.pos] == 'E') {
		p.pos++
		if p.pos < len(p.in) && (p.in[p.pos] == '+' || p.in[p.pos] == '-') {
			p.pos++
		}
		if digits() == 0 {
			return p.errorf("bad number")
		}
	}
	f, err := strconv.ParseFloat(string(p.in[start:p.pos]), 64)
	if err != nil || math.IsInf(f, 0) {
		return p.errorf("number out of range")
	}
	if p.exact && !isShortest(string(p.in[start:p.pos]), f) {
		return p.errorf("number %s is not exact in double precision", p.in[start:p.pos])
	}
	p.buf = appendES6Number(p.buf, f)
	return nil
}

// isNumberTail reports whether c continues a number literal past its
// integer part: a fraction or an exponent.
func isNumberTail(c byte) bool { return c == '.' || c == 'e' || c == 'E' }

// isShortest reports whether the number literal lit (valid JSON) has the same
// significant digits and magnitude as the shortest decimal that round-trips
// its double f: then no other number with a different value maps to f.
func isShortest(lit string, f float64) bool {
	d1, e1 := decimalDigits(lit)
	if f == 0 {
		return d1 == "" // 0, -0, 0.0e5 are zero; 1e-400 merely underflows
	}
	d2, e2 := decimalDigits(strconv.FormatFloat(f, 'e', -1, 64))
	return d1 == d2 && e1 == e2
}

// decimalDigits returns the significant digits of a decimal literal (no sign,
// no leading or trailing zeros) and the power of ten of its first digit.
func decimalDigits(lit string) (digits string, exp int) {
	lit = strings.TrimPrefix(lit, "-")
	mant, e, _ := strings.Cut(strings.ToLower(lit), "e")
	if e != "" {
		exp, _ = strconv.Atoi(e) // only compared when the digits are not all zero
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	all := intPart + frac
	lead := len(all) - len(strings.TrimLeft(all, "0"))
	all = strings.TrimRight(all[lead:], "0")
	return all, exp + len(intPart) - 1 - lead
}

// appendES6Number formats f as ECMAScript's Number.prototype.toString does
// (RFC 8785 section 3.2.2.3): shortest round-trip digits, fixed notation for
// 1e-6 <= |f| < 1e21, otherwise exponent notation with an explicit sign.
func appendES6Number(out []byte, f float64) []byte {
	if f == 0 {
		return append(out, '0') // also for -0
	}
	abs := math.Abs(f)
	if abs >= 1e-6 && abs < 1e21 {
		return strconv.AppendFloat(out, f, 'f', -1, 64)
	}
	s := strconv.FormatFloat(f, 'e', -1, 64)
	// Go writes at least two exponent digits (1e-07); ECMAScript does not.
	mant, exp, _ := strings.Cut(s, "e")
	sign, digits := exp[:1], strings.TrimLeft(exp[1:], "0")
	out = append(out, mant...)
	out = append(out, 'e')
	out = append(out, sign...)
	return append(out, digits...)
}

// appendJCSString writes s as a JSON string with RFC 8785's minimal escaping:
// only '"', '\\' and control characters are escaped, the usual ones by their
// short forms and the rest as lower-case \u00xx.
func appendJCSString(out []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	out = append(out, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '"', '\\':
			out = append(out, '\\', c)
		case '\b':
			out = append(out, '\\', 'b')
		case '\f':
			out = append(out, '\\', 'f')
		case '\n':
			out = append(out, '\\', 'n')
		case '\r':
			out = append(out, '\\', 'r')
		case '\t':
			out = append(out, '\\', 't')
		default:
			if c < 0x20 {
				out = append(out, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			} else {
				out = append(out, c)
			}
		}
	}
	return append(out, '"')
}
