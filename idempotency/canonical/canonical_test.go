package canonical_test

import (
	"encoding/json"
	"math"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency/canonical"
)

func TestJSON(t *testing.T) {
	t.Parallel()
	cases := []struct{ in, want string }{
		// RFC 8785 section 3.2.2 example (numbers, literals, string escaping).
		{`{
  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}`, `{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}`},
		// RFC 8785 section 3.2.3: sorting by UTF-16 code units.
		{`{"\u20ac": "Euro Sign", "\r": "Carriage Return", "\ufb33": "Hebrew Letter Dalet With Dagesh",
		  "1": "One", "\ud83d\ude00": "Emoji: Grinning Face", "\u0080": "Control", "\u00f6": "Latin Small Letter O With Diaeresis"}`,
			`{"\r":"Carriage Return","1":"One","` + "\u0080" + `":"Control","ö":"Latin Small Letter O With Diaeresis","€":"Euro Sign","😀":"Emoji: Grinning Face","` + "\ufb33" + `":"Hebrew Letter Dalet With Dagesh"}`},
		{` [ ] `, `[]`},
		{`{"b":{"d":1,"c":[{}, -0, 1.0e0]},"a":"x"}`, `{"a":"x","b":{"c":[{},0,1],"d":1}}`},
		{`123456789012345678901234`, `1.2345678901234569e+23`},
		{`1e21`, `1e+21`},
		{`1e20`, `100000000000000000000`},
		{`0.000001`, `0.000001`},
		{`0.0000001`, `1e-7`},
		{`-5e-324`, `-5e-324`},
		{`"\u2028"`, "\"\u2028\""},
		// Integers of up to 15 digits are their own canonical form (0 for -0);
		// longer ones go through the double.
		{`[-0, 0, 7, -15, 100, 999999999999999, -999999999999999, 1000000000000000, 12345678901234567]`,
			`[0,0,7,-15,100,999999999999999,-999999999999999,1000000000000000,12345678901234568]`},
	}
	for _, c := range cases {
		got, err := canonical.JSON([]byte(c.in))
		require.NoError(t, err, c.in)
		require.Equal(t, c.want, string(got), c.in)
	}
	for _, bad := range []string{``, `{`, `{"a":1,"a":2}`, `-`, `[-]`, `-01`, `00`, `[1,]`, `01`, `1.`, `1e`, `"\ud800"`, "\"\xff\"",
		`1e400`, `{"a" 1}`, `tru`, `nul`, `[1] x`, "\"a\x01\"", `"\x"`} {
		_, err := canonical.JSON([]byte(bad))
		require.ErrorIs(t, err, canonical.ErrNotCanonicalizable, "%q", bad)
	}
}

// ES6 number serialisation agrees with the shortest round-trip value for a
// spread of doubles (parse back gives the same float).
func TestJSONNumbersRoundTrip(t *testing.T) {
	t.Parallel()
	for _, f := range []float64{1, -1, 0.1, 1.0 / 3, 1e-7, 1e21, 1e300, math.MaxFloat64, math.SmallestNonzeroFloat64, 123e-20, 9007199254740993} {
		out, err := canonical.JSON([]byte(strconv.FormatFloat(f, 'g', -1, 64)))
		require.NoError(t, err)
		back, err := strconv.ParseFloat(string(out), 64)
		require.NoError(t, err)
		require.Equal(t, f, back, string(out))
	}
}

func FuzzJSON(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":[true,null,"x"]}`, `[1e30, -0, 0.1]`, `"\u00e9\ud83d\ude00"`, `{}`, `{"a":{"b":{"c":[]}}}`, `12.5e-3`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		canon, err := canonical.JSON(in)
		if err != nil {
			return
		}
		again, err := canonical.JSON(canon)
		if err != nil {
			t.Fatalf("canonical form %q does not canonicalize: %v", canon, err)
		}
		if string(again) != string(canon) {
			t.Fatalf("not idempotent: %q -> %q -> %q", in, canon, again)
		}
		if !json.Valid(canon) {
			t.Fatalf("canonical form %q is not valid JSON", canon)
		}
		// Re-encoding through encoding/json (which reorders object members and
		// re-spells strings) canonicalizes to the same bytes.
		var v any
		if err := json.Unmarshal(canon, &v); err != nil {
			t.Fatalf("unmarshal canonical form: %v", err)
		}
		re, err := json.Marshal(v)
		if err != nil {
			return
		}
		third, err := canonical.JSON(re)
		if err != nil {
			t.Fatalf("re-encoded %q does not canonicalize: %v", re, err)
		}
		if string(third) != string(canon) {
			t.Fatalf("re-encoding changed the canonical form: %q vs %q", third, canon)
		}
	})
}

// RFC 8785 appendix B: doubles (as IEEE 754 bit patterns) and their
// canonical text.
func TestJSONRFC8785Numbers(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		bits uint64
		want string
	}{
		{0x0000000000000000, "0"}, {0x8000000000000000, "0"},
		{0x0000000000000001, "5e-324"}, {0x8000000000000001, "-5e-324"},
		{0x7fefffffffffffff, "1.7976931348623157e+308"}, {0xffefffffffffffff, "-1.7976931348623157e+308"},
		{0x4340000000000000, "9007199254740992"}, {0xc340000000000000, "-9007199254740992"},
		{0x4430000000000000, "295147905179352830000"},
		{0x44b52d02c7e14af5, "9.999999999999997e+22"}, {0x44b52d02c7e14af6, "1e+23"},
		{0x44b52d02c7e14af7, "1.0000000000000001e+23"},
		{0x444b1ae4d6e2ef4e, "999999999999999700000"}, {0x444b1ae4d6e2ef4f, "999999999999999900000"},
		{0x444b1ae4d6e2ef50, "1e+21"},
		{0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"}, {0x3eb0c6f7a0b5ed8d, "0.000001"},
		{0x41b3de4355555553, "333333333.3333332"}, {0x41b3de4355555554, "333333333.33333325"},
		{0x41b3de4355555555, "333333333.3333333"}, {0x41b3de4355555556, "333333333.3333334"},
		{0x41b3de4355555557, "333333333.33333343"},
		{0xbecbf647612f3696, "-0.0000033333333333333333"},
		{0x43143ff3c1cb0959, "1424953923781206.2"},
	} {
		in := strconv.FormatFloat(math.Float64frombits(c.bits), 'g', -1, 64)
		got, err := canonical.JSON([]byte(in))
		require.NoError(t, err, in)
		require.Equal(t, c.want, string(got), "%016x", c.bits)
	}
}

// Canonicalizing costs memory linear in the body, whatever its shape: a
// 1 MiB string under 511 levels of objects allocated some 550 MB when each
// level copied its members into its parent.
func TestJSONLinearMemory(t *testing.T) {
	long := strings.Repeat("x", 1<<20)
	for name, body := range map[string]string{
		"deep objects": strings.Repeat(`{"a":`, 511) + `"` + long + `"` + strings.Repeat("}", 511),
		"deep mixed":   strings.Repeat(`[{"b":1,"a":`, 255) + `"` + long + `"` + strings.Repeat("}]", 255),
	} {
		in := []byte(body)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := canonical.JSON(in)
		runtime.ReadMemStats(&after)
		require.NoError(t, err)
		allocated := after.TotalAlloc - before.TotalAlloc
		require.Less(t, allocated, uint64(6*len(body)), "%s: %d bytes allocated for a body of %d", name, allocated, len(body))
	}
}

// A body of any size canonicalizes the same, however its nodes fall into
// the store's chunks: a small first chunk that grows, then full ones (a
// document of 30,001 nodes here, members sorted in every object).
func TestJSONAcrossNodeChunks(t *testing.T) {
	var in, want strings.Builder
	in.WriteString("[")
	want.WriteString("[")
	for i := range 10000 {
		if i > 0 {
			in.WriteString(", ")
			want.WriteString(",")
		}
		n := strconv.Itoa(i)
		in.WriteString(`{"b": ` + n + `, "a": "` + n + `"}`)
		want.WriteString(`{"a":"` + n + `","b":` + n + `}`)
	}
	in.WriteString("]")
	want.WriteString("]")
	got, err := canonical.JSON([]byte(in.String()))
	require.NoError(t, err)
	require.Equal(t, want.String(), string(got))
	for _, small := range []string{`1`, `[]`, `{"a":1}`, `[1,2,3,[4,[5]]]`, `{"z":{"y":{"x":[true,false,null]}}}`} {
		got, err := canonical.JSON([]byte(small))
		require.NoError(t, err)
		var a, b any
		require.NoError(t, json.Unmarshal([]byte(small), &a))
		require.NoError(t, json.Unmarshal(got, &b))
		require.Equal(t, a, b, small)
	}
}

// A request body's size: what the edge fingerprints on every request.
func BenchmarkJSONSmallBody(b *testing.B) {
	body := []byte(`{"id":"3f0c2a8e-8d1b-4c55-9a7e-0b7e1d2c3a4b","amount":100,"currency":"EUR"}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := canonical.JSON(body); err != nil {
			b.Fatal(err)
		}
	}
}
