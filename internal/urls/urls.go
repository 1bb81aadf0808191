// Package urls hides the password of a database or broker URL in messages and logs, and says
// which database a store URL names.
package urls

import (
	"net/url"
	"regexp"
	"strings"
)

// Redact returns raw with its password replaced by ***, parsed or not.
func Redact(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "***")
			return strings.Replace(u.String(), "%2A%2A%2A", "***", 1)
		}
		return raw
	}
	// Not a URL Go can parse: hide whatever sits between "user:" and "@" all the same.
	return userinfoPassword.ReplaceAllString(raw, "${1}:***@")
}

var userinfoPassword = regexp.MustCompile(`^([^:/?#]+://[^:/?#@]*):[^@/?#]*@`)

// Dialect is the database a store URL names by its scheme: "postgres" (postgres://,
// postgresql://), "mysql", or "" for another (sqlite://, a typo).
func Dialect(raw string) string {
	scheme, _, _ := strings.Cut(strings.ToLower(raw), "://")
	switch scheme {
	case "postgres", "postgresql":
		return "postgres"
	case "mysql":
		return "mysql"
	}
	return ""
}
