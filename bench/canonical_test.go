package bench

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oncekit/oncekit/idempotency/canonical"
)

// canonicalInputs are bodies shaped to make a canonicalizer slow, each about
// 1 MiB: what an unauthenticated client can send the edge before any claim.
func canonicalInputs() map[string][]byte {
	const size = 1 << 20
	long := strings.Repeat("x", size)
	deep := strings.Repeat(`{"a":`, 511) + `"` + long + `"` + strings.Repeat("}", 511)
	var wide strings.Builder
	wide.WriteByte('{')
	for i := 0; wide.Len() < size; i++ {
		if i > 0 {
			wide.WriteByte(',')
		}
		wide.WriteString(`"k` + strings.Repeat("z", i%7) + strconv.Itoa(i) + `":` + strconv.Itoa(i))
	}
	wide.WriteByte('}')
	escaped := `"` + strings.Repeat(`\u00e9\n\"\ud83d\ude00`, size/24) + `"`
	var numbers strings.Builder
	numbers.WriteByte('[')
	for i := 0; numbers.Len() < size; i++ {
		if i > 0 {
			numbers.WriteByte(',')
		}
		numbers.WriteString("1." + strings.Repeat("0", 300) + strconv.Itoa(i) + "e-5")
	}
	numbers.WriteByte(']')
	arrays := strings.Repeat("[", 511) + strings.Repeat("1,", size/2) + "1" + strings.Repeat("]", 511)
	return map[string][]byte{
		"deep-objects": []byte(deep),
		"deep-arrays":  []byte(arrays),
		"wide-object":  []byte(wide.String()),
		"long-string":  []byte(escaped),
		"long-numbers": []byte(numbers.String()),
		"nested-mixed": []byte(strings.Repeat(`[{"b":1,"a":`, 255) + `"` + long + `"` + strings.Repeat("}]", 255)),
	}
}

// medianOf times fn reps times and returns the median.
func medianOf(reps int, fn func()) time.Duration {
	ds := make([]time.Duration, reps)
	for i := range ds {
		start := time.Now()
		fn()
		ds[i] = time.Since(start)
	}
	slices.Sort(ds)
	return ds[reps/2]
}

// BenchmarkCanonicalJSON canonicalizes adversarial bodies of about 1 MiB
// (511 levels of nesting around a long string, a wide object, a long
// escaped string, long numbers) with canonical.JSON, and in the
// same iteration decodes the same bytes with encoding/json into an any (the
// peer: what a handler would do with the body). Reported per input:
// canon-ms and json-ms (medians of 5 runs each, alternated) and
// x-encoding-json, their ratio. benchsum's target is the worst input's
// median ratio: at most 3.
func BenchmarkCanonicalJSON(b *testing.B) {
	inputs := canonicalInputs()
	names := make([]string, 0, len(inputs))
	for name := range inputs {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		in := inputs[name]
		b.Run(name, func(b *testing.B) {
			for range b.N {
				canon := medianOf(5, func() {
					if _, err := canonical.JSON(in); err != nil {
						b.Fatal(err)
					}
				})
				peer := medianOf(5, func() {
					var v any
					if err := json.Unmarshal(in, &v); err != nil {
						b.Fatal(err)
					}
				})
				b.ReportMetric(float64(canon.Microseconds())/1000, "canon-ms")
				b.ReportMetric(float64(peer.Microseconds())/1000, "json-ms")
				b.ReportMetric(canon.Seconds()/peer.Seconds(), "x-encoding-json")
			}
		})
	}
}
