// Package doccheck keeps the prose honest. It reads README.md and every docs/**/*.md and fails
// when what they say no longer matches the repository:
//
//   - TestLinks: every relative link and image — [text](path), [text](path#anchor), [ref]: path,
//     href="…", src="…" — names a file or directory that exists, and an #anchor names a heading of
//     the target (GitHub's slugs: lower case, punctuation dropped, spaces to hyphens, -1, -2… for a
//     repeated heading) or an <a id="…"> in it. Links with a scheme (https:, mailto:) are not
//     fetched; a link that starts with / is refused (GitHub and pkg.go.dev resolve it differently).
//   - TestGoSnippets: every ```go block compiles against the code of this tree, and passes go vet.
//   - TestNamedAPI: every outboxkit identifier named in inline code — `forwarder.New`,
//     `middleware.StackConfig.Consumer`, `store.Console.SetPause` — exists in the package's source.
//
// # The snippet convention
//
// A ```go block whose first line that is not a comment is a package clause is a file, compiled as
// it stands, in a package of its own.
//
// Any other block is a fragment. It may begin with import declarations (shown to the reader as
// they are); the rest is either declarations (types, functions — whatever parses as the body of a
// Go file) or statements, which are compiled as the body of a function returning error. Variables
// a statement fragment declares at its top level need not be used afterwards; everything else must
// compile as written.
//
// What a fragment uses without declaring it comes from three places:
//
//   - packages it names by their usual name (context, sql, http, pgx, message, pipeline, store,
//     forwarder, middleware, amqpbackend…: the table wellKnown below) are imported for it;
//   - an HTML comment on the line above the block, hidden when the page is rendered, adds imports
//     and declares the names the fragment is given:
//     <!-- go: imports github.com/x/y, name github.com/x/z; given ctx, db, broker -->
//     "imports" takes import paths, each optionally preceded by the name to import it under;
//     "given" takes names from the table givens below (ctx, db, st, pool, broker, router, reg…),
//     each declared at package level with its usual type, so that the fragment may also shadow it;
//   - nothing else: an unknown given, or a directive with no ```go block under it, fails the test.
//
// A block that must not be compiled (pseudo-code, a diff) is not a ```go block: use ```text.
//
// All snippets compile in one go build and one go vet of a module made under t.TempDir(), which
// requires this one through a replace to the repository root and copies its go.sum, with
// GOPROXY=off: it needs the module cache the repository's own tests need, and no network. Each
// fragment's generated file carries //line directives, so an error names the markdown file and
// line, as in docs/consumers.md:120:5.
package doccheck

import (
	"bytes"
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"
)

const module = "github.com/outboxkit/outboxkit"

// wellKnown maps the name a fragment uses a package by to its import path: a fragment that uses it
// and neither declares nor imports that name gets the import.
var wellKnown = map[string]string{
	"context": "context",
	"errors":  "errors",
	"fmt":     "fmt",
	"http":    "net/http",
	"log":     "log",
	"os":      "os",
	"slog":    "log/slog",
	"sql":     "database/sql",
	"time":    "time",

	"watermill":  "github.com/ThreeDotsLabs/watermill",
	"message":    "github.com/ThreeDotsLabs/watermill/message",
	"pgx":        "github.com/jackc/pgx/v5",
	"pgxpool":    "github.com/jackc/pgx/v5/pgxpool",
	"prometheus": "github.com/prometheus/client_golang/prometheus",

	"outboxkit":       module,
	"backends":        module + "/backends",
	"allbackends":     module + "/backends/allbackends",
	"amqpbackend":     module + "/backends/amqpbackend",
	"kafkabackend":    module + "/backends/kafkabackend",
	"memorybackend":   module + "/backends/memorybackend",
	"natsbackend":     module + "/backends/natsbackend",
	"postgresbackend": module + "/backends/postgresbackend",
	"redisbackend":    module + "/backends/redisbackend",
	"console":         module + "/console",
	"forwarder":       module + "/forwarder",
	"pglog":           module + "/forwarder/pglog",
	"mysqlbinlog":     module + "/forwarder/mysqlbinlog",
	"handlers":        module + "/handlers",
	"idempotency":     module + "/idempotency",
	"middleware":      module + "/middleware",
	"pipeline":        module + "/pipeline",
	"prom":            module + "/prom",
	"store":           module + "/store",
	"allstores":       module + "/store/allstores",
	"mysqlstore":      module + "/store/mysqlstore",
	"pgsqlstore":      module + "/store/pgsqlstore",
	"pgxstore":        module + "/store/pgxstore",
	"sqlitestore":     module + "/store/sqlitestore",
}

// A given is a name a fragment may use without declaring it, when its directive says so.
type given struct {
	decl  string   // Go declarations at package level
	needs []string // other givens decl uses
}

// givens are declared with the types the guides use them with throughout: db is a store opened by
// URL (database/sql), st a pgx store, and so on.
var givens = map[string]given{
	"ctx":         {decl: "var ctx context.Context"},
	"db":          {decl: "var db *store.DB // store.Open: any database, *sql.Tx"},
	"st":          {decl: "var st *pgxstore.Store // pgxstore: pgx.Tx"},
	"pool":        {decl: "var pool *pgxpool.Pool"},
	"broker":      {decl: "var broker *backends.Backend"},
	"brokerURL":   {decl: "var brokerURL string"},
	"router":      {decl: "var router *message.Router"},
	"reg":         {decl: "var reg prometheus.Registerer"},
	"mux":         {decl: "var mux *http.ServeMux"},
	"req":         {decl: "var req *http.Request"},
	"tokens":      {decl: "var tokens []console.Token"},
	"id":          {decl: "var id string // the aggregate's id"},
	"customer":    {decl: "var customer string"},
	"OrderPlaced": {decl: "type OrderPlaced struct {\n\tID         string `json:\"id\"`\n\tCustomer   string `json:\"customer\"`\n\tTotalCents int64  `json:\"total_cents\"`\n}"},
	"order":       {decl: "var order OrderPlaced", needs: []string{"OrderPlaced"}},
	"billOrder":   {decl: "func billOrder(ctx context.Context, tx *sql.Tx, o OrderPlaced) error { return nil }", needs: []string{"OrderPlaced"}},
}

// root is the repository's root: two levels above this package.
func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil || !bytes.HasPrefix(mod, []byte("module "+module+"\n")) {
		t.Fatalf("%s is not the root of %s (%v)", dir, module, err)
	}
	return dir
}

// pages returns README.md and every markdown file under docs/, relative to the root, with
// slashes.
func pages(t *testing.T, rootDir string) []string {
	t.Helper()
	out := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(rootDir, "docs"), func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, _ := filepath.Rel(rootDir, p)
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A page is a markdown file split into what the checks read.
type page struct {
	path     string   // relative to the root, with slashes
	paras    []para   // prose outside fenced blocks: runs of non-blank lines
	blocks   []block  // fenced code blocks
	problems []string // what makes its blocks unreadable: TestGoSnippets reports them
}

type para struct {
	line int    // of its first line, 1-based
	text string // its lines joined with \n
}

type block struct {
	line int    // of the opening fence
	lang string // the info string's first word
	code string // the content, the fence's indentation removed
	dir  *direct
}

type direct struct {
	line    int
	imports []importSpec
	given   []string
}

type importSpec struct{ name, path string }

var (
	fenceRe     = regexp.MustCompile("^(\\s*)(`{3,}|~{3,})\\s*([^`\\s]*)")
	directiveRe = regexp.MustCompile(`^\s*<!--\s*go:(.*?)-->\s*$`)
)

func readPage(t *testing.T, rootDir, rel string) *page {
	t.Helper()
	pg := &page{path: rel}
	problem := func(line int, format string, args ...any) {
		pg.problems = append(pg.problems, fmt.Sprintf("%s:%d: ", rel, line)+fmt.Sprintf(format, args...))
	}
	data, err := os.ReadFile(filepath.Join(rootDir, filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.ReplaceAll(string(data), "\r\n", "\n"), "\n")
	var (
		cur     *para
		pending *direct // a directive waiting for its block
	)
	flush := func() {
		if cur != nil {
			pg.paras = append(pg.paras, *cur)
			cur = nil
		}
	}
	for i := 0; i < len(lines); i++ {
		ln := lines[i]
		if m := fenceRe.FindStringSubmatch(ln); m != nil && isFence(ln, m) {
			flush()
			indent, fence, lang := len(m[1]), m[2], m[3]
			b := block{line: i + 1, lang: lang, dir: pending}
			pending = nil
			var code []string
			closed := false
			for i++; i < len(lines); i++ {
				l := lines[i]
				trimmed := strings.TrimSpace(l)
				if strings.HasPrefix(trimmed, fence[:3]) && strings.Trim(trimmed, fence[:1]) == "" && len(trimmed) >= len(fence) {
					closed = true
					break
				}
				// Remove up to the fence's indentation.
				n := 0
				for n < indent && n < len(l) && l[n] == ' ' {
					n++
				}
				code = append(code, l[n:])
			}
			if !closed {
				problem(b.line, "a code block is never closed")
			}
			b.code = strings.Join(code, "\n")
			pg.blocks = append(pg.blocks, b)
			continue
		}
		if m := directiveRe.FindStringSubmatch(ln); m != nil {
			flush()
			if pending != nil {
				problem(pending.line, "a <!-- go: … --> directive with no ```go block under it")
			}
			d, err := parseDirective(m[1])
			if err != nil {
				problem(i+1, "%v", err)
			}
			d.line = i + 1
			pending = d
			continue
		}
		if strings.TrimSpace(ln) == "" {
			flush()
			continue
		}
		if pending != nil {
			problem(pending.line, "a <!-- go: … --> directive must stand right above its ```go block (only blank lines between)")
			pending = nil
		}
		if cur == nil {
			cur = &para{line: i + 1, text: ln}
		} else {
			cur.text += "\n" + ln
		}
	}
	flush()
	if pending != nil {
		problem(pending.line, "a <!-- go: … --> directive with no ```go block under it")
	}
	for _, b := range pg.blocks {
		if b.dir != nil && b.lang != "go" {
			problem(b.dir.line, "a <!-- go: … --> directive above a ```%s block, not a ```go one", b.lang)
		}
	}
	return pg
}

// isFence reports whether a line fenceRe matched opens or closes a fenced block: after a backtick
// fence, the rest of the line holds no backtick (CommonMark), or it is inline code.
func isFence(ln string, m []string) bool {
	rest := ln[len(m[1])+len(m[2]):]
	return m[2][0] != '`' || !strings.Contains(rest, "`")
}

// parseDirective reads "imports a/b, name c/d; given ctx, db".
func parseDirective(s string) (*direct, error) {
	d := &direct{}
	for clause := range strings.SplitSeq(s, ";") {
		clause = strings.TrimSpace(clause)
		if clause == "" {
			continue
		}
		word, rest, _ := strings.Cut(clause, " ")
		var items []string
		for it := range strings.SplitSeq(rest, ",") {
			if it = strings.TrimSpace(it); it != "" {
				items = append(items, it)
			}
		}
		switch word {
		case "imports":
			for _, it := range items {
				f := strings.Fields(it)
				switch len(f) {
				case 1:
					d.imports = append(d.imports, importSpec{path: f[0]})
				case 2:
					d.imports = append(d.imports, importSpec{name: f[0], path: f[1]})
				default:
					return d, fmt.Errorf("go: imports %q: want a path, or a name and a path", it)
				}
			}
		case "given":
			for _, it := range items {
				if _, ok := givens[it]; !ok {
					return d, fmt.Errorf("go: given %q: not one of %s (internal/doccheck's givens)", it, strings.Join(sortedKeys(givens), ", "))
				}
				d.given = append(d.given, it)
			}
		default:
			return d, fmt.Errorf("go: %q: the clauses are \"imports PATH, …\" and \"given NAME, …\", separated by ;", clause)
		}
	}
	return d, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// lineAt returns the line of p that holds offset off of its text.
func (p para) lineAt(off int) int { return p.line + strings.Count(p.text[:off], "\n") }

// codeSpans returns the inline code spans of text (CommonMark: a run of n backticks up to the
// next run of exactly n), as offsets of their content, and text with every span blanked out
// (newlines kept), so that nothing inside code is read as a link.
func codeSpans(text string) (spans [][2]int, prose string) {
	b := []byte(text)
	for i := 0; i < len(text); {
		if text[i] == '\\' {
			i += 2
			continue
		}
		if text[i] != '`' {
			i++
			continue
		}
		n := 0
		for i+n < len(text) && text[i+n] == '`' {
			n++
		}
		end := -1
		for j := i + n; j < len(text); {
			if text[j] != '`' {
				j++
				continue
			}
			m := 0
			for j+m < len(text) && text[j+m] == '`' {
				m++
			}
			if m == n {
				end = j
				break
			}
			j += m
		}
		if end < 0 {
			i += n
			continue
		}
		spans = append(spans, [2]int{i + n, end})
		for k := i; k < end+n; k++ {
			if b[k] != '\n' {
				b[k] = ' '
			}
		}
		i = end + n
	}
	return spans, string(b)
}

var (
	inlineLinkRe = regexp.MustCompile(`\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	refDefRe     = regexp.MustCompile(`(?m)^ {0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?`)
	htmlRefRe    = regexp.MustCompile(`(?i)\b(?:href|src)\s*=\s*"([^"]*)"`)
	schemeRe     = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
	headingRe    = regexp.MustCompile(`^ {0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$`)
	htmlAnchorRe = regexp.MustCompile(`(?i)<a\s+(?:id|name)\s*=\s*"([^"]+)"`)
	mdLinkRe     = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	htmlTagRe    = regexp.MustCompile(`<[^>]+>`)
)

// A link is one relative reference of a page.
type link struct {
	line   int
	target string
}

func (p *page) links() []link {
	var out []link
	for _, pa := range p.paras {
		_, prose := codeSpans(pa.text)
		for _, re := range []*regexp.Regexp{inlineLinkRe, refDefRe, htmlRefRe} {
			for _, m := range re.FindAllStringSubmatchIndex(prose, -1) {
				out = append(out, link{line: pa.lineAt(m[2]), target: prose[m[2]:m[3]]})
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].line < out[j].line })
	return out
}

// anchors returns the anchors GitHub gives the headings of a markdown file, and its <a id>s.
func anchors(data string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	inFence := ""
	for ln := range strings.SplitSeq(data, "\n") {
		if m := fenceRe.FindStringSubmatch(ln); m != nil && isFence(ln, m) {
			switch {
			case inFence == "":
				inFence = m[2][:1]
			case strings.HasPrefix(strings.TrimSpace(ln), inFence):
				inFence = ""
			}
			continue
		}
		if inFence != "" {
			continue
		}
		for _, m := range htmlAnchorRe.FindAllStringSubmatch(ln, -1) {
			out[m[1]] = true
		}
		m := headingRe.FindStringSubmatch(ln)
		if m == nil {
			continue
		}
		s := slug(m[1])
		if n := seen[s]; n > 0 {
			out[s+"-"+strconv.Itoa(n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// slug is GitHub's anchor for a heading: the rendered text in lower case, without punctuation
// (letters, digits, -, _ and spaces stay), spaces turned into hyphens.
func slug(heading string) string {
	text := mdLinkRe.ReplaceAllString(heading, "$1")
	text = htmlTagRe.ReplaceAllString(text, "")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestLinks(t *testing.T) {
	rootDir := root(t)
	anchorCache := map[string]map[string]bool{}
	anchorsOf := func(rel string) map[string]bool {
		if a, ok := anchorCache[rel]; ok {
			return a
		}
		data, err := os.ReadFile(filepath.Join(rootDir, filepath.FromSlash(rel)))
		if err != nil {
			t.Fatal(err)
		}
		a := anchors(string(data))
		anchorCache[rel] = a
		return a
	}
	checked := 0
	for _, rel := range pages(t, rootDir) {
		pg := readPage(t, rootDir, rel)
		for _, l := range pg.links() {
			where := fmt.Sprintf("%s:%d: link %q", rel, l.line, l.target)
			if l.target == "" {
				t.Errorf("%s: empty", where)
				continue
			}
			if schemeRe.MatchString(l.target) || strings.HasPrefix(l.target, "//") {
				continue // not in this repository: not fetched
			}
			checked++
			pathPart, frag, _ := strings.Cut(l.target, "#")
			pathPart, err := url.PathUnescape(pathPart)
			if err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			if strings.HasPrefix(pathPart, "/") {
				t.Errorf("%s: starts with /; write it relative to %s", where, rel)
				continue
			}
			target := rel
			if pathPart != "" {
				target = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(rel), pathPart)))
			}
			if target == ".." || strings.HasPrefix(target, "../") {
				t.Errorf("%s: points outside the repository", where)
				continue
			}
			info, err := os.Stat(filepath.Join(rootDir, filepath.FromSlash(target)))
			if err != nil {
				t.Errorf("%s: %s does not exist", where, target)
				continue
			}
			if frag == "" {
				continue
			}
			switch {
			case info.IsDir() || !strings.HasSuffix(target, ".md"):
				if !lineAnchor(t, rootDir, target, info.IsDir(), frag) {
					t.Errorf("%s: #%s: %s is not a markdown file, and #%s is not a line (#L12, #L12-L20) of it", where, frag, target, frag)
				}
			case !anchorsOf(target)[frag]:
				t.Errorf("%s: %s has no heading whose anchor is #%s (its anchors: %s)", where, target, frag, strings.Join(sortedKeys(anchorsOf(target)), " "))
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative link found: the page reader is broken")
	}
}

var lineAnchorRe = regexp.MustCompile(`^L(\d+)(?:-L(\d+))?$`)

// lineAnchor reports whether frag is a GitHub line anchor within the file's length.
func lineAnchor(t *testing.T, rootDir, target string, isDir bool, frag string) bool {
	m := lineAnchorRe.FindStringSubmatch(frag)
	if m == nil || isDir {
		return false
	}
	data, err := os.ReadFile(filepath.Join(rootDir, filepath.FromSlash(target)))
	if err != nil {
		t.Fatal(err)
	}
	n := strings.Count(string(data), "\n") + 1
	for _, s := range m[1:] {
		if s == "" {
			continue
		}
		if v, _ := strconv.Atoi(s); v < 1 || v > n {
			return false
		}
	}
	return true
}

// A snippet is a ```go block and the package it is compiled in.
type snippet struct {
	page string
	block
	pkg string // the generated package's directory, relative to the temporary module
}

func (s snippet) where() string { return fmt.Sprintf("%s:%d", s.page, s.line) }

func TestGoSnippets(t *testing.T) {
	rootDir := root(t)
	var snippets []snippet
	for _, rel := range pages(t, rootDir) {
		pg := readPage(t, rootDir, rel)
		for _, p := range pg.problems {
			t.Error(p)
		}
		for _, b := range pg.blocks {
			if b.lang == "go" {
				snippets = append(snippets, snippet{page: rel, block: b, pkg: fmt.Sprintf("s%03d", len(snippets))})
			}
		}
	}
	if len(snippets) == 0 {
		t.Fatal("no ```go block found: the page reader is broken")
	}

	modDir := t.TempDir()
	goVersion := "1.26.0"
	if mod, err := os.ReadFile(filepath.Join(rootDir, "go.mod")); err == nil {
		if m := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(mod); m != nil {
			goVersion = string(m[1])
		}
	}
	gomod := fmt.Sprintf("module doccheck.local\n\ngo %s\n\nrequire %s v0.0.0\n\nreplace %s => %s\n", goVersion, module, module, rootDir)
	write(t, filepath.Join(modDir, "go.mod"), gomod)
	sum, err := os.ReadFile(filepath.Join(rootDir, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(modDir, "go.sum"), string(sum))
	for _, s := range snippets {
		path := filepath.Join(modDir, s.pkg, "snippet.go")
		src, err := generate(rootDir, path, s)
		if err != nil {
			t.Errorf("%s: %v", s.where(), err)
			continue
		}
		write(t, path, src)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	for _, args := range [][]string{{"build", "./..."}, {"vet", "./..."}} {
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = modDir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOPROXY=off", "GOFLAGS=-mod=mod -buildvcs=false", "GOTOOLCHAIN=local")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("go %s of the docs' ```go blocks failed (%v); the convention is at the top of internal/doccheck/doccheck_test.go:\n%s",
				strings.Join(args, " "), err, explain(string(out), rootDir, modDir, snippets))
			return
		}
	}
}

// explain rewrites go's output for a reader of the markdown: "# doccheck.local/s007" becomes the
// block's file and line, and absolute paths become relative to the root.
func explain(out, rootDir, modDir string, snippets []snippet) string {
	byPkg := map[string]snippet{}
	for _, s := range snippets {
		byPkg["doccheck.local/"+s.pkg] = s
	}
	var b strings.Builder
	for ln := range strings.SplitSeq(strings.TrimRight(out, "\n"), "\n") {
		if pkg, ok := strings.CutPrefix(ln, "# "); ok {
			if s, ok := byPkg[pkg]; ok {
				fmt.Fprintf(&b, "the ```go block at %s:\n", s.where())
				continue
			}
		}
		ln = strings.ReplaceAll(ln, modDir+string(filepath.Separator), "(generated) ")
		ln = strings.ReplaceAll(ln, rootDir+string(filepath.Separator), "")
		b.WriteString("\t" + ln + "\n")
	}
	return b.String()
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A genFile writes a generated file, counting its lines, so that it can map lines to a page
// (//line page:N:1) and back to itself.
type genFile struct {
	b       strings.Builder
	lines   int // lines written so far
	rootDir string
	self    string // the generated file's absolute path
}

func (g *genFile) write(s string) {
	g.b.WriteString(s)
	g.lines += strings.Count(s, "\n")
}

// toPage maps the next line to line n of page (an absolute path, which //line takes as it is).
func (g *genFile) toPage(page string, n int) {
	g.write(fmt.Sprintf("//line %s:%d:1\n", filepath.Join(g.rootDir, filepath.FromSlash(page)), n))
}

// toSelf maps the next line back to the generated file's own.
func (g *genFile) toSelf() { g.write(fmt.Sprintf("//line %s:%d:1\n", g.self, g.lines+2)) }

// generate returns the Go file a snippet is compiled as, at path self.
func generate(rootDir, self string, s snippet) (string, error) {
	g := &genFile{rootDir: rootDir, self: self}
	g.write(fmt.Sprintf("// Code generated by internal/doccheck from %s. DO NOT EDIT.\n\n", s.where()))
	bodyLine := s.line + 1
	lines := strings.Split(s.code, "\n")

	// A file: the first line that is not a comment is its package clause.
	for _, l := range lines {
		trimmed := strings.TrimSpace(l)
		if trimmed == "" || strings.HasPrefix(trimmed, "//") {
			continue
		}
		if strings.HasPrefix(trimmed, "package ") {
			if s.dir != nil && (len(s.dir.imports) > 0 || len(s.dir.given) > 0) {
				return "", fmt.Errorf("a ```go block that is a whole file takes no imports or givens: write them into it")
			}
			g.toPage(s.page, bodyLine)
			g.write(s.code + "\n")
			return g.b.String(), nil
		}
		break
	}

	// A fragment: leading import declarations, then the body.
	type importDecl struct {
		line int
		text string
	}
	var own []importDecl
	i := 0
	for i < len(lines) {
		trimmed := strings.TrimSpace(lines[i])
		if trimmed == "" || strings.HasPrefix(trimmed, "//") {
			i++
			continue
		}
		if !strings.HasPrefix(trimmed, "import") {
			break
		}
		start := i
		if strings.HasPrefix(strings.TrimSpace(strings.TrimPrefix(trimmed, "import")), "(") {
			for i < len(lines) && strings.TrimSpace(lines[i]) != ")" {
				i++
			}
		}
		i++
		own = append(own, importDecl{bodyLine + start, strings.Join(lines[start:min(i, len(lines))], "\n")})
	}
	body := strings.Join(lines[i:], "\n")
	bodyLine += i

	have := map[string]bool{}  // import paths the file has
	names := map[string]bool{} // the names they are imported under
	note := func(spec importSpec) {
		have[spec.path] = true
		if spec.name != "" {
			names[spec.name] = true
		} else {
			names[spec.path[strings.LastIndex(spec.path, "/")+1:]] = true
		}
	}
	for _, d := range own {
		f, err := parser.ParseFile(token.NewFileSet(), "", "package p\n"+d.text, parser.ImportsOnly)
		if err != nil {
			return "", fmt.Errorf("its import declarations do not parse: %v", err)
		}
		for _, im := range f.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			spec := importSpec{path: p}
			if im.Name != nil {
				spec.name = im.Name.Name
			}
			note(spec)
		}
	}
	var directed []importSpec // the directive's imports, that the fragment does not show
	if s.dir != nil {
		for _, spec := range s.dir.imports {
			if !have[spec.path] {
				note(spec)
				directed = append(directed, spec)
			}
		}
	}

	// The givens, with what they need.
	var decls []string
	if s.dir != nil {
		done := map[string]bool{}
		var add func(name string)
		add = func(name string) {
			if done[name] {
				return
			}
			done[name] = true
			for _, n := range givens[name].needs {
				add(n)
			}
			decls = append(decls, givens[name].decl)
		}
		for _, name := range s.dir.given {
			add(name)
		}
	}
	prelude := strings.Join(decls, "\n")

	// Declarations or statements?
	isDecls := false
	if strings.TrimSpace(body) != "" {
		if f, err := parser.ParseFile(token.NewFileSet(), "", "package p\n"+body, parser.SkipObjectResolution); err == nil && len(f.Decls) > 0 {
			isDecls = true
		}
	}
	code := body
	if !isDecls {
		code = statements(body)
	}

	// The well-known packages the prelude and the code use without importing them.
	var auto []importSpec
	probe := "package p\n" + prelude + "\n"
	if isDecls {
		probe += code
	} else {
		probe += "func _() error {\n" + code + "\n}\n"
	}
	if f, err := parser.ParseFile(token.NewFileSet(), "", probe, 0); err == nil {
		for _, id := range f.Unresolved {
			if p, ok := wellKnown[id.Name]; ok && !names[id.Name] && !have[p] {
				note(importSpec{path: p})
				auto = append(auto, importSpec{path: p})
			}
		}
	}
	sort.Slice(auto, func(i, j int) bool { return auto[i].path < auto[j].path })

	writeSpecs := func(specs []importSpec) {
		g.write("import (\n")
		for _, im := range specs {
			if im.name != "" {
				g.write(fmt.Sprintf("\t%s %q\n", im.name, im.path))
			} else {
				g.write(fmt.Sprintf("\t%q\n", im.path))
			}
		}
		g.write(")\n")
	}
	g.write(fmt.Sprintf("package %s\n\n", s.pkg))
	if len(auto) > 0 {
		writeSpecs(auto)
	}
	if len(directed) > 0 {
		// Each on the directive's line: an import it names that the fragment does not use is
		// reported there.
		g.toPage(s.page, s.dir.line)
		g.write("import (")
		for _, im := range directed {
			g.write(fmt.Sprintf(" %s %q;", im.name, im.path))
		}
		g.write(")\n")
		g.toSelf()
	}
	for _, d := range own {
		g.toPage(s.page, d.line)
		g.write(d.text + "\n")
		g.toSelf()
	}
	if prelude != "" {
		g.write("\n" + prelude + "\n")
	}
	g.write("\n")
	if isDecls {
		g.toPage(s.page, bodyLine)
		g.write(code + "\n")
	} else {
		g.write("func _() error {\n")
		g.toPage(s.page, bodyLine)
		g.write(code + "\n}\n")
	}
	return g.b.String(), nil
}

// statements returns a statement fragment as a function body: the variables it declares at its top
// level used once (a fragment shows how a value is made, not always its every use), and a return at
// the end unless it ends with one.
func statements(body string) string {
	const pre = "package p\nfunc _() error {\n"
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "", pre+body+"\n}\n", parser.SkipObjectResolution)
	if err != nil {
		return body + "\nreturn nil" // the compiler says what is wrong, at the page's line
	}
	fn := f.Decls[0].(*ast.FuncDecl)
	var declared []string
	add := func(id *ast.Ident) {
		if id.Name != "_" && !slices.Contains(declared, id.Name) {
			declared = append(declared, id.Name)
		}
	}
	for _, st := range fn.Body.List {
		switch st := st.(type) {
		case *ast.AssignStmt:
			if st.Tok == token.DEFINE {
				for _, e := range st.Lhs {
					if id, ok := e.(*ast.Ident); ok {
						add(id)
					}
				}
			}
		case *ast.DeclStmt:
			if gd, ok := st.Decl.(*ast.GenDecl); ok && gd.Tok == token.VAR {
				for _, sp := range gd.Specs {
					for _, id := range sp.(*ast.ValueSpec).Names {
						add(id)
					}
				}
			}
		}
	}
	var uses strings.Builder
	for _, name := range declared {
		fmt.Fprintf(&uses, "_ = %s; ", name)
	}
	list := fn.Body.List
	if n := len(list); n > 0 {
		if ret, ok := list[n-1].(*ast.ReturnStmt); ok {
			// Use them on the return's own line, so that no line of the page moves.
			off := fset.Position(ret.Pos()).Offset - len(pre)
			return body[:off] + uses.String() + body[off:]
		}
	}
	return body + "\n" + uses.String() + "return nil"
}

// An api is what one package declares at its top level, read from its source (tests excluded).
type api struct {
	path  string // import path
	names map[string]bool
	types map[string]*typeInfo
}

type typeInfo struct {
	members  map[string]bool // fields, methods, an interface's methods
	embedded []ast.Expr      // embedded fields and interfaces, and the target of an alias
	file     *ast.File
}

// apis reads every package of the module (not its testdata, nor a module nested in it), by import
// path; named maps the package name a reader writes (pipeline, pglog) to the import path, for the
// packages a program may import (not internal/, cmd/ or integration/), leaving out a name two
// such packages share.
func apis(t *testing.T, rootDir string) (byPath map[string]*api, named map[string]string) {
	t.Helper()
	byPath = map[string]*api{}
	named = map[string]string{}
	shared := map[string]bool{}
	err := filepath.WalkDir(rootDir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(rootDir, p)
		rel = filepath.ToSlash(rel)
		base := d.Name()
		if rel != "." && (strings.HasPrefix(base, ".") || strings.HasPrefix(base, "_") || base == "testdata") {
			return filepath.SkipDir
		}
		if rel != "." {
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir // a module of its own
			}
		}
		path := module
		if rel != "." {
			path += "/" + rel
		}
		a, name := readAPI(t, p, path)
		if a == nil {
			return nil
		}
		byPath[path] = a
		public := true
		for _, elem := range strings.Split(rel, "/") {
			if elem == "internal" || elem == "cmd" || elem == "integration" {
				public = false
			}
		}
		if public {
			if _, dup := named[name]; dup {
				shared[name] = true
			}
			named[name] = path
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for name := range shared {
		delete(named, name)
	}
	return byPath, named
}

func readAPI(t *testing.T, dir, path string) (*api, string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	a := &api{path: path, names: map[string]bool{}, types: map[string]*typeInfo{}}
	pkgName := ""
	fset := token.NewFileSet()
	type method struct{ recv, name string }
	var methods []method
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		pkgName = f.Name.Name
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					a.names[d.Name.Name] = true
					continue
				}
				if id, ok := baseType(d.Recv.List[0].Type).(*ast.Ident); ok {
					methods = append(methods, method{id.Name, d.Name.Name})
				}
			case *ast.GenDecl:
				for _, sp := range d.Specs {
					switch sp := sp.(type) {
					case *ast.ValueSpec:
						for _, id := range sp.Names {
							a.names[id.Name] = true
						}
					case *ast.TypeSpec:
						a.names[sp.Name.Name] = true
						ti := &typeInfo{members: map[string]bool{}, file: f}
						if sp.Assign.IsValid() {
							ti.embedded = append(ti.embedded, sp.Type)
						}
						var fields *ast.FieldList
						switch tt := sp.Type.(type) {
						case *ast.StructType:
							fields = tt.Fields
						case *ast.InterfaceType:
							fields = tt.Methods
						}
						if fields != nil {
							for _, fl := range fields.List {
								if len(fl.Names) == 0 {
									ti.embedded = append(ti.embedded, fl.Type)
								}
								for _, id := range fl.Names {
									ti.members[id.Name] = true
								}
							}
						}
						a.types[sp.Name.Name] = ti
					}
				}
			}
		}
	}
	if pkgName == "" || pkgName == "main" {
		return nil, ""
	}
	for _, m := range methods {
		if ti := a.types[m.recv]; ti != nil {
			ti.members[m.name] = true
		}
	}
	return a, pkgName
}

// baseType strips a pointer and type arguments: *Store[TTx] → Store.
func baseType(e ast.Expr) ast.Expr {
	if st, ok := e.(*ast.StarExpr); ok {
		e = st.X
	}
	switch x := e.(type) {
	case *ast.IndexExpr:
		return x.X
	case *ast.IndexListExpr:
		return x.X
	}
	return e
}

// hasMember reports whether the type typ of the package at path has member name, through its
// embedded types and the alias it may be; ok is false when that cannot be told (an embedded type of
// another module).
func hasMember(all map[string]*api, path, typ, name string, depth int) (has, ok bool) {
	a := all[path]
	if a == nil || depth > 8 {
		return false, false
	}
	ti := a.types[typ]
	if ti == nil {
		return false, true
	}
	if ti.members[name] {
		return true, true
	}
	ok = true
	for _, e := range ti.embedded {
		var epath, etyp string
		switch x := baseType(e).(type) {
		case *ast.Ident:
			epath, etyp = path, x.Name
		case *ast.SelectorExpr:
			id, isIdent := x.X.(*ast.Ident)
			if !isIdent {
				return false, false
			}
			epath, etyp = importPath(ti.file, id.Name), x.Sel.Name
		default:
			return false, false
		}
		h, k := hasMember(all, epath, etyp, name, depth+1)
		if h {
			return true, true
		}
		ok = ok && k
	}
	return false, ok
}

// importPath returns the path file imports under name, or "" when it imports nothing of this
// module under it.
func importPath(f *ast.File, name string) string {
	for _, im := range f.Imports {
		p, _ := strconv.Unquote(im.Path.Value)
		if p != module && !strings.HasPrefix(p, module+"/") {
			continue
		}
		as := p[strings.LastIndex(p, "/")+1:]
		if im.Name != nil {
			as = im.Name.Name
		}
		if as == name {
			return p
		}
	}
	return ""
}

var apiRefRe = regexp.MustCompile(`(?:^|[^\w.])([a-z][a-z0-9]*)\.([A-Z]\w*)(?:\.([A-Z]\w*))?`)

func TestNamedAPI(t *testing.T) {
	rootDir := root(t)
	all, named := apis(t, rootDir)
	for _, name := range []string{"outboxkit", "store", "pipeline", "forwarder", "pglog", "middleware", "backends"} {
		if named[name] == "" {
			t.Fatalf("package %s not found among %s: the source reader is broken", name, strings.Join(sortedKeys(named), " "))
		}
	}
	checked := 0
	for _, rel := range pages(t, rootDir) {
		for _, pa := range readPage(t, rootDir, rel).paras {
			spans, _ := codeSpans(pa.text)
			for _, sp := range spans {
				code := pa.text[sp[0]:sp[1]]
				for _, m := range apiRefRe.FindAllStringSubmatchIndex(code, -1) {
					pkg, name := code[m[2]:m[3]], code[m[4]:m[5]]
					path := named[pkg]
					if path == "" {
						continue // not one of this module's packages
					}
					a := all[path]
					checked++
					where := fmt.Sprintf("%s:%d: `%s`", rel, pa.lineAt(sp[0]+m[2]), code)
					if !a.names[name] {
						t.Errorf("%s: package %s declares no %s", where, pkg, name)
						continue
					}
					if m[6] < 0 {
						continue
					}
					member := code[m[6]:m[7]]
					if _, isType := a.types[name]; !isType {
						continue // a member of a value: its type is not read here
					}
					if has, ok := hasMember(all, path, name, member, 0); ok && !has {
						t.Errorf("%s: %s.%s has no field or method %s", where, pkg, name, member)
					}
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no outboxkit identifier found in inline code: the page reader is broken")
	}
}
