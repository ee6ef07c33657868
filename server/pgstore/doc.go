// Package pgstore is a server.Store in PostgreSQL.
package pgstore
