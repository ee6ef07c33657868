package server

// CredentialHeaders are the headers CredentialScope hashes, for the tests.
var CredentialHeaders = credentialHeaders[:]
