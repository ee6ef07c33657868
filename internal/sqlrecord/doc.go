// Package sqlrecord holds what the stores on database/sql (sqlitestore,
// mysqlstore) share: the encoding of stored headers and of a record's steps
// (a log that one statement appends to), the reading of a record's row into
// a Claim or a Record, durations as the microseconds the tables keep, and
// the bookkeeping of the transactions of transactional mode.
package sqlrecord
