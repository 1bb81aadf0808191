// Package urls hides the password of a database or broker URL in messages and logs.
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
