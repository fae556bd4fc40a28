// Package redact hides credentials in text the command is about to print:
// URLs in every form they carry one (user and password, a token alone, a
// password holding '@' or ':' unencoded, a password in the query) and
// keyword/value connection strings (password=...).
//
// It is the command's own copy of what the library masks in its errors:
// an internal package of the library is no API, and a later version of
// the library, which a build may select under this command, may change
// it. FuzzAgreesWithLibrary holds the two to the same output.
package redact

import (
	"regexp"
	"strings"
)

// Mask replaces each credential.
const Mask = "xxxxx"

var (
	scheme = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://`)
	// kvSecret is a keyword/value setting that holds a secret, in a libpq
	// connection string or a query.
	kvSecret = regexp.MustCompile(`(?i)\b((?:ssl)?password|passwd|pwd|token|secret|api[_-]?key|access[_-]?token)(\s*=\s*)('[^']*'|[^\s&;,]+)`)
)

// String returns s with the credentials of every URL and keyword/value
// setting in it masked.
func String(s string) string {
	locs := scheme.FindAllStringIndex(s, -1)
	if len(locs) > 0 {
		var b strings.Builder
		last := 0
		for i, loc := range locs {
			if loc[0] < last {
				continue
			}
			end := len(s)
			if i+1 < len(locs) {
				end = locs[i+1][0]
			}
			if ws := strings.IndexAny(s[loc[1]:end], " \t\r\n\"'<>`"); ws >= 0 {
				end = loc[1] + ws
			}
			b.WriteString(s[last:loc[0]])
			b.WriteString(rawURL(s[loc[0]:end], loc[1]-loc[0]))
			last = end
		}
		b.WriteString(s[last:])
		s = b.String()
	}
	return kvSecret.ReplaceAllString(s, "${1}${2}"+Mask)
}

// rawURL masks the user information of u, whose scheme and "://" take its
// first n bytes, as written (unencoded '@', ':' or '/' in a password
// included; a '?' or '#' in a password must be percent-encoded, as in any URL):
// everything before the last '@' ahead of the query. A '@' in a
// path is taken for user information too: masking too much is safe.
func rawURL(u string, n int) string {
	rest := u[n:]
	if q := strings.IndexAny(rest, "?#"); q >= 0 {
		rest = rest[:q]
	}
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return u
	}
	user, _, hasPassword := strings.Cut(rest[:at], ":")
	masked := Mask
	if hasPassword && user != "" {
		masked = user + ":" + Mask
	}
	// A user without a password is a token: the user is the secret.
	return u[:n] + masked + u[n+at:]
}
