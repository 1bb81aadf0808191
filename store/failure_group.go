package store

import (
	"crypto/sha256"
	"encoding/binary"
	"regexp"
	"strings"
)

// NormalizerVersion names the rules FailureGroupOf applies. It goes into every group's id, so a
// release that changes the rules gives old and new letters different ids instead of mixing them
// in one group under a pattern that no longer describes some of them (such a release resets the
// groups, and Console.Regroup fills them again).
const NormalizerVersion = 1

// The placeholders a normalised error shows where a value was: they read as "a value was here"
// and do not occur in the errors being grouped.
const (
	placeholderID   = "‹id›"
	placeholderNum  = "‹n›"
	placeholderStr  = "‹…›"
	placeholderTime = "‹time›"
	placeholderAddr = "‹addr›"
	placeholderMail = "‹email›"
)

var normalizeRules = []struct {
	re   *regexp.Regexp
	repl string
}{
	// Order matters: whole tokens that contain digits go before bare numbers.
	{regexp.MustCompile(`\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?`), placeholderTime},
	{regexp.MustCompile(`(?i)\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b`), placeholderID},
	{regexp.MustCompile(`[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}`), placeholderMail},
	{regexp.MustCompile(`\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b|\[[0-9a-fA-F:]+\](?::\d+)?`), placeholderAddr},
	// Quoted values — a decode error quotes the bad character, a business error the customer —
	// become one placeholder inside their quotes.
	{regexp.MustCompile(`"(?:[^"\\]|\\.)*"`), `"` + placeholderStr + `"`},
	{regexp.MustCompile(`'(?:[^'\\]|\\.)*'`), `'` + placeholderStr + `'`},
	{regexp.MustCompile("`[^`]*`"), "`" + placeholderStr + "`"},
	// Long hex runs (hashes, trace ids, delivery tags), then identifiers that end in digits
	// (order-1234, c-0042, SKU-977): the identifier's word stays, its number goes.
	{regexp.MustCompile(`(?i)\b(?:0x)?[0-9a-f]{12,}\b`), placeholderID},
	{regexp.MustCompile(`\b([A-Za-z][A-Za-z_]*[-_#/:])\d[\w-]*`), "${1}" + placeholderNum},
	{regexp.MustCompile(`[-+]?\b\d+(?:[.,]\d+)*(?:[eE][-+]?\d+)?`), placeholderNum},
}

var spaces = regexp.MustCompile(`\s+`)

// MaxPatternLen bounds a normalised error, in runes: a group is about its cause, which the start
// of an error states; a stack trace or response body after it would split groups for nothing.
const MaxPatternLen = 200

// NormalizeError turns an error text into the pattern its failure group is named by: times, ids,
// e-mail and network addresses, quoted values and numbers become placeholders, whitespace
// collapses, and the result is cut at MaxPatternLen runes. Words stay: "409 Conflict" and "500
// Internal Server Error" remain two causes.
func NormalizeError(s string) string {
	for _, r := range normalizeRules {
		s = r.re.ReplaceAllString(s, r.repl)
	}
	s = strings.TrimSpace(spaces.ReplaceAllString(s, " "))
	if r := []rune(s); len(r) > MaxPatternLen {
		s = string(r[:MaxPatternLen]) + "…"
	}
	return s
}

// FailureGroupOf is the failure group of an error of an event type: the first 8 bytes of
// SHA-256(NormalizerVersion, event type, NUL, pattern) as a signed integer, and the pattern.
// Drivers compute it in Go when they store a dead letter, so every database files the same error
// under the same id. The same cause on two event types is two groups: a decode error of
// OrderPlaced and one of OrderPaid are usually two bugs.
func FailureGroupOf(eventType, errText string) (id int64, pattern string) {
	pattern = NormalizeError(errText)
	h := sha256.New()
	h.Write([]byte{NormalizerVersion})
	h.Write([]byte(eventType))
	h.Write([]byte{0})
	h.Write([]byte(pattern))
	return int64(binary.BigEndian.Uint64(h.Sum(nil)[:8])), pattern
}
