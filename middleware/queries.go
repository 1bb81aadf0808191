package middleware

import "embed"

//go:embed sql/*.sql
var sqlFiles embed.FS

func querySQL(name string) string {
	b, err := sqlFiles.ReadFile("sql/" + name)
	if err != nil {
		panic("middleware: embedded query " + name + " missing: " + err.Error())
	}
	return string(b)
}
