package canonical_test

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/oncekit/oncekit/idempotency/canonical"
)

var updateCorpus = flag.Bool("update-corpus", false, "rewrite testdata/corpus.golden from the current canonical.JSON")

// corpusSize is how many generated documents the corpus holds.
const corpusSize = 600

// genJSON writes a random JSON text of up to depth levels: objects with
// names in several scripts (so that UTF-16 order differs from UTF-8 order),
// arrays, escaped and raw strings, numbers in every spelling, literals, and
// whitespace. The same seed always gives the same text.
func genJSON(r *rand.Rand, b *strings.Builder, depth int) {
	ws := func() {
		if r.IntN(4) == 0 {
			b.WriteString([]string{" ", "\n", "\t ", "\r\n  "}[r.IntN(4)])
		}
	}
	ws()
	kind := r.IntN(10)
	if depth <= 0 && kind < 4 {
		kind += 4
	}
	switch {
	case kind < 2:
		n := r.IntN(6)
		b.WriteByte('{')
		seen := map[string]bool{}
		for i := range n {
			name := genString(r)
			if seen[name] {
				continue
			}
			seen[name] = true
			if i > 0 && len(seen) > 1 {
				b.WriteByte(',')
			}
			ws()
			b.WriteString(strconv.Quote(name))
			ws()
			b.WriteByte(':')
			genJSON(r, b, depth-1)
		}
		ws()
		b.WriteByte('}')
	case kind < 4:
		n := r.IntN(6)
		b.WriteByte('[')
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			genJSON(r, b, depth-1)
		}
		ws()
		b.WriteByte(']')
	case kind < 6:
		s := genString(r)
		if r.IntN(2) == 0 {
			b.WriteString(jsonEscapeAll(s))
		} else {
			b.WriteString(strconv.Quote(s))
		}
	case kind < 9:
		b.WriteString(genNumber(r))
	default:
		b.WriteString([]string{"true", "false", "null"}[r.IntN(3)])
	}
	ws()
}

var corpusRunes = []rune("aZ09_-$ \u00e9\u00f6\u0080\u20ac\ufb33\U0001F600\U00010437\u3042\u05d0\u2028\t\n\"\\/")

func genString(r *rand.Rand) string {
	n := r.IntN(8)
	rs := make([]rune, n)
	for i := range rs {
		rs[i] = corpusRunes[r.IntN(len(corpusRunes))]
	}
	return string(rs)
}

// jsonEscapeAll writes s as a JSON string with every character escaped as
// \uXXXX (surrogate pairs beyond the BMP).
func jsonEscapeAll(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, c := range s {
		if c > 0xffff {
			c -= 0x10000
			fmt.Fprintf(&b, `\u%04x\u%04X`, 0xd800+(c>>10), 0xdc00+(c&0x3ff))
			continue
		}
		fmt.Fprintf(&b, `\u%04x`, c)
	}
	b.WriteByte('"')
	return b.String()
}

func genNumber(r *rand.Rand) string {
	switch r.IntN(6) {
	case 0:
		return strconv.Itoa(r.IntN(2000) - 1000)
	case 1:
		return strconv.FormatFloat(r.NormFloat64()*1e6, 'f', r.IntN(6), 64)
	case 2:
		return strconv.FormatFloat(r.Float64(), 'e', -1, 64)
	case 3:
		return strconv.FormatFloat(math.Float64frombits(r.Uint64()&^(0x7ff<<52)|uint64(r.IntN(0x7fe))<<52), 'g', -1, 64)
	case 4:
		return []string{"-0", "0.0", "1E30", "4.50", "2e-3", "1e21", "1e-7", "100000000000000000000"}[r.IntN(8)]
	default:
		return strconv.Itoa(r.IntN(10)) + "." + strconv.Itoa(r.IntN(1000)) + "e" + strconv.Itoa(r.IntN(40)-20)
	}
}

// corpus returns the generated documents, the same on every run.
func corpus() []string {
	r := rand.New(rand.NewPCG(8785, 2026))
	out := make([]string, corpusSize)
	for i := range out {
		var b strings.Builder
		genJSON(r, &b, 1+r.IntN(6))
		out[i] = b.String()
	}
	return out
}

// The canonical form of a fixed corpus of generated documents is pinned:
// testdata/corpus.golden holds the SHA-256 of each document's
// canonical form (or "error"), written once with -update-corpus. Any change
// to JSON that changes a fingerprint fails here, since stored
// fingerprints would no longer match their retries.
func TestJSONCorpusUnchanged(t *testing.T) {
	t.Parallel()
	var lines []string
	for _, doc := range corpus() {
		out, err := canonical.JSON([]byte(doc))
		if err != nil {
			lines = append(lines, "error")
			continue
		}
		sum := sha256.Sum256(out)
		lines = append(lines, hex.EncodeToString(sum[:]))
	}
	const golden = "testdata/corpus.golden"
	if *updateCorpus {
		require.NoError(t, os.WriteFile(golden, []byte(strings.Join(lines, "\n")+"\n"), 0o644))
	}
	f, err := os.Open(golden)
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	var want []string
	for sc.Scan() {
		want = append(want, sc.Text())
	}
	require.NoError(t, sc.Err())
	require.Len(t, want, corpusSize)
	errs := 0
	for i := range want {
		require.Equal(t, want[i], lines[i], "document %d: %s", i, corpus()[i])
		if want[i] == "error" {
			errs++
		}
	}
	require.Less(t, errs, corpusSize/10, "the corpus is mostly valid JSON")
}
