package once

// MaxKeyLen is the longest key accepted.
const MaxKeyLen = maxKeyLen

// StatusInvalid is the status of a call refused before any claim.
const StatusInvalid = statusInvalid
