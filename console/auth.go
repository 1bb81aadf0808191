package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// Role is what a signed-in person may do.
type Role int

const (
	// Viewer reads every page (payloads too, unless HidePayloads).
	Viewer Role = iota + 1
	// Operator also replays, archives, pauses, resumes and cancels jobs.
	Operator
)

func (r Role) String() string {
	switch r {
	case Viewer:
		return "viewer"
	case Operator:
		return "operator"
	}
	return "none"
}

// ParseRole reads "viewer" or "operator".
func ParseRole(s string) (Role, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "viewer":
		return Viewer, nil
	case "operator":
		return Operator, nil
	}
	return 0, fmt.Errorf("role %q: use viewer or operator", s)
}

// Identity is who makes a request.
type Identity struct {
	Name string
	Role Role
}

// Token is a built-in credential: whoever presents Secret is Name with Role.
type Token struct {
	Name   string
	Role   Role
	Secret string
}

// BasicUser is an HTTP basic-auth user; PasswordHash is a bcrypt hash (htpasswd -B).
type BasicUser struct {
	Name         string
	Role         Role
	PasswordHash []byte
}

// ErrUnauthenticated is what an Authenticate hook returns for a request it does not know.
var ErrUnauthenticated = errors.New("console: not signed in")

// Auth says who may look and who may act. At least one way in is required: Tokens, Basic,
// Authenticate, or LocalOnly.
type Auth struct {
	// Tokens are bearer tokens: sent as "Authorization: Bearer …", or typed once into the sign-in
	// form, which sets a signed session cookie. TokensFromEnv reads OUTBOXKIT_CONSOLE_TOKENS.
	// Secrets are at least 16 bytes.
	Tokens []Token
	// Basic are HTTP basic-auth users.
	Basic []BasicUser
	// Authenticate is the team's own: it reads what its middleware put on the request (an SSO
	// header, a context value) and returns who it is, or ErrUnauthenticated. Tried first.
	Authenticate func(*http.Request) (Identity, error)
	// SessionKey signs session cookies and CSRF tokens. Default: random per process (sessions end
	// on restart). Consoles behind one load balancer need the same key.
	SessionKey []byte
	// LocalOnly serves without credentials, only to requests from a loopback address that came
	// through no proxy (no Forwarded or X-Forwarded-For header), as "local:$USER" with LocalRole:
	// `outboxctl console` on the operator's own machine.
	LocalOnly bool
	// LocalRole is LocalOnly's role. Default Operator.
	LocalRole Role
}

// MinSecretLen is the shortest token secret New accepts.
const MinSecretLen = 16

func (a Auth) validate() error {
	if len(a.Tokens) == 0 && len(a.Basic) == 0 && a.Authenticate == nil && !a.LocalOnly {
		return errors.New("field Auth: no way in: set Auth.Tokens, Auth.Basic, Auth.Authenticate or Auth.LocalOnly")
	}
	var errs []error
	for _, t := range a.Tokens {
		if len(t.Secret) < MinSecretLen {
			errs = append(errs, fmt.Errorf("field Auth.Tokens: the secret of %q is shorter than %d bytes", t.Name, MinSecretLen))
		}
		if t.Role != Viewer && t.Role != Operator {
			errs = append(errs, fmt.Errorf("field Auth.Tokens: %q has no role (viewer or operator)", t.Name))
		}
	}
	for _, u := range a.Basic {
		if _, err := bcrypt.Cost(u.PasswordHash); err != nil {
			errs = append(errs, fmt.Errorf("field Auth.Basic: the password hash of %q is not bcrypt: %v", u.Name, err))
		}
	}
	return errors.Join(errs...)
}

// hasCredentials reports whether anyone can sign in other than from the same machine.
func (a Auth) hasCredentials() bool {
	return len(a.Tokens) > 0 || len(a.Basic) > 0 || a.Authenticate != nil
}

// TokensFromEnv reads OUTBOXKIT_CONSOLE_TOKENS: "alice:operator:SECRET,carol:viewer:SECRET".
func TokensFromEnv() ([]Token, error) { return ParseTokens(os.Getenv("OUTBOXKIT_CONSOLE_TOKENS")) }

// ParseTokens reads tokens written as TokensFromEnv reads them.
func ParseTokens(s string) ([]Token, error) {
	var out []Token
	for _, part := range strings.Split(s, ",") {
		if strings.TrimSpace(part) == "" {
			continue
		}
		fields := strings.SplitN(strings.TrimSpace(part), ":", 3)
		if len(fields) != 3 || fields[0] == "" {
			return nil, fmt.Errorf("console tokens: %q is not name:role:secret", redactSecret(part))
		}
		role, err := ParseRole(fields[1])
		if err != nil {
			return nil, fmt.Errorf("console tokens: %s: %w", fields[0], err)
		}
		if len(fields[2]) < MinSecretLen {
			return nil, fmt.Errorf("console tokens: the secret of %s is shorter than %d bytes", fields[0], MinSecretLen)
		}
		out = append(out, Token{Name: fields[0], Role: role, Secret: fields[2]})
	}
	return out, nil
}

func redactSecret(part string) string {
	if i := strings.LastIndex(part, ":"); i >= 0 {
		return part[:i+1] + "…"
	}
	return "…"
}

const sessionCookie, csrfCookie = "obk_session", "obk_csrf"

// sessionTTL is how long a sign-in lasts.
const sessionTTL = 12 * time.Hour

func randomID() string {
	b := make([]byte, 18)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

func (h *Handler) sign(parts ...string) string {
	m := hmac.New(sha256.New, h.key)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// cookiePath is where the console's cookies apply: its prefix, or its fleet's, so that one
// sign-in serves the fleet page and every tenant's console.
func (h *Handler) cookiePath() string {
	if h.cookieRoot != "" {
		return h.cookieRoot
	}
	return h.cfg.Prefix + "/"
}

// fingerprint names a token without revealing it: a session ends when its token leaves the config.
func (h *Handler) fingerprint(secret string) string { return h.sign("token", secret)[:16] }

// session is name|role|expires|fingerprint|signature.
func (h *Handler) newSession(id Identity, fp string) string {
	body := strings.Join([]string{url.QueryEscape(id.Name), strconv.Itoa(int(id.Role)), strconv.FormatInt(h.cfg.Now().Add(sessionTTL).Unix(), 10), fp}, "|")
	return body + "|" + h.sign("session", body)
}

func (h *Handler) readSession(v string) (Identity, bool) {
	i := strings.LastIndex(v, "|")
	if i < 0 {
		return Identity{}, false
	}
	body, sig := v[:i], v[i+1:]
	if subtle.ConstantTimeCompare([]byte(sig), []byte(h.sign("session", body))) != 1 {
		return Identity{}, false
	}
	f := strings.Split(body, "|")
	if len(f) != 4 {
		return Identity{}, false
	}
	name, _ := url.QueryUnescape(f[0])
	role, _ := strconv.Atoi(f[1])
	exp, _ := strconv.ParseInt(f[2], 10, 64)
	if h.cfg.Now().Unix() > exp {
		return Identity{}, false
	}
	for _, t := range h.cfg.Auth.Tokens {
		if t.Name == name && Role(role) == t.Role && h.fingerprint(t.Secret) == f[3] {
			return Identity{Name: name, Role: Role(role)}, true
		}
	}
	return Identity{}, false
}

// csrfToken is HMAC(key, the browser's CSRF cookie): a token no other site can read or forge. It
// sets the cookie on the first page a browser sees.
func (h *Handler) csrfToken(w http.ResponseWriter, r *http.Request) string {
	v := ""
	if c, err := r.Cookie(csrfCookie); err == nil && len(c.Value) >= 16 {
		v = c.Value
	} else {
		v = randomID()
		http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: v, Path: h.cookiePath(), HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
		r.AddCookie(&http.Cookie{Name: csrfCookie, Value: v})
	}
	return h.sign("csrf", v)
}

func (h *Handler) validCSRF(r *http.Request) bool {
	c, err := r.Cookie(csrfCookie)
	if err != nil || len(c.Value) < 16 {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(h.sign("csrf", c.Value))) == 1
}

// bearer reports whether the request authenticates with a bearer token (an API call: no cookie a
// cross-site page could make the browser send).
func (h *Handler) bearer(r *http.Request) bool {
	_, ok := h.tokenIdentity(strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
	return ok && strings.HasPrefix(r.Header.Get("Authorization"), "Bearer ")
}

func (h *Handler) tokenIdentity(secret string) (Identity, bool) {
	if secret == "" {
		return Identity{}, false
	}
	found := Identity{}
	for _, t := range h.cfg.Auth.Tokens {
		// Every token is compared, in constant time: the answer's time tells nothing.
		if subtle.ConstantTimeCompare([]byte(secret), []byte(t.Secret)) == 1 {
			found = Identity{Name: t.Name, Role: t.Role}
		}
	}
	return found, found.Name != ""
}

// identity says who makes r: the team's hook, a bearer token, basic auth, the session cookie,
// or, with LocalOnly, the person at this machine; on a tenant's console, whom its fleet's handler
// authenticated.
func (h *Handler) identity(r *http.Request) (Identity, bool) {
	if id, ok := r.Context().Value(identityKey{}).(Identity); ok && h.tenant != nil {
		return id, true // authenticated by the fleet's handler, which serves this one
	}
	a := h.cfg.Auth
	if a.Authenticate != nil {
		if id, err := a.Authenticate(r); err == nil && id.Name != "" && id.Role != 0 {
			return id, true
		}
	}
	if auth := r.Header.Get("Authorization"); strings.HasPrefix(auth, "Bearer ") {
		return h.tokenIdentity(strings.TrimPrefix(auth, "Bearer "))
	}
	if name, pass, ok := r.BasicAuth(); ok {
		for _, u := range a.Basic {
			if u.Name == name && bcrypt.CompareHashAndPassword(u.PasswordHash, []byte(pass)) == nil {
				return Identity{Name: u.Name, Role: u.Role}, true
			}
		}
		return Identity{}, false
	}
	if c, err := r.Cookie(sessionCookie); err == nil {
		if id, ok := h.readSession(c.Value); ok {
			return id, true
		}
	}
	if a.LocalOnly && localRequest(r) {
		user := os.Getenv("USER")
		if user == "" {
			user = "operator"
		}
		return Identity{Name: "local:" + user, Role: a.LocalRole}, true
	}
	return Identity{}, false
}

// localRequest reports whether r comes from this machine, directly: a proxy in between means
// someone else may be behind it.
func localRequest(r *http.Request) bool {
	if r.Header.Get("Forwarded") != "" || r.Header.Get("X-Forwarded-For") != "" || r.Header.Get("X-Real-Ip") != "" {
		return false
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// page is a handler for one signed-in person.
type page func(w http.ResponseWriter, r *http.Request, id Identity)

// auth lets through requests of at least role min. Nobody signed in is sent to the sign-in page
// (a GET) or refused (a POST); a viewer trying an operator's action is refused with the role it
// needs, and the refusal is audited.
func (h *Handler) auth(min Role, next page) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, ok := h.identity(r)
		if !ok {
			if r.Method == http.MethodGet && h.cfg.Auth.hasCredentials() {
				http.Redirect(w, r, h.cfg.Prefix+"/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			if h.cfg.Auth.LocalOnly && !h.cfg.Auth.hasCredentials() {
				h.refuse(w, r, http.StatusForbidden, "Refused: this console serves only its own machine (no credentials are configured), and this request came from elsewhere or through a proxy.")
				return
			}
			h.refuse(w, r, http.StatusUnauthorized, "Sign in first.")
			return
		}
		if id.Role < min {
			h.audit(r, id, auditEntryFor(r, h.cfg.Prefix), fmt.Sprintf("refused: the %s role cannot do this", id.Role), false)
			h.refuse(w, r, http.StatusForbidden, "Refused: you are signed in as "+id.Name+" with the "+id.Role.String()+
				" role, which can look but not act. Ask someone with the operator role.")
			return
		}
		next(w, r, id)
	}
}

func (h *Handler) loginPage(w http.ResponseWriter, r *http.Request) {
	h.render(w, r, "login", "Sign in", "", Identity{}, r.URL.Query().Get("next"), nil)
}

func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	secret := r.PostFormValue("token")
	id, ok := h.tokenIdentity(secret)
	if !ok {
		w.WriteHeader(http.StatusUnauthorized)
		h.render(w, r, "login", "Sign in", "", Identity{}, r.PostFormValue("next"), &flash{Text: "That token is not valid."})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: h.newSession(id, h.fingerprint(secret)), Path: h.cookiePath(),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil, MaxAge: int(sessionTTL.Seconds())})
	next := r.PostFormValue("next")
	if !strings.HasPrefix(next, h.cfg.Prefix+"/") || strings.HasPrefix(next, "//") || strings.Contains(next, "\\") {
		next = h.cfg.Prefix + "/" // never an open redirect
	}
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: h.cookiePath(), MaxAge: -1})
	http.Redirect(w, r, h.cfg.Prefix+"/login", http.StatusSeeOther)
}
