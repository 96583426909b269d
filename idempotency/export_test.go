package idempotency

import "crypto/sha256"

// Limits the tests compare with the SQL functions' and exceed, and the
// failure code of an abandoned key.
const (
	MaxFailureCodeBytes    = maxFailureCodeBytes
	MaxFailureMessageBytes = maxFailureMessageBytes
	MaxRecoveryPointBytes  = maxRecoveryPointBytes
	MaxRecoveryDataBytes   = maxRecoveryDataBytes
	MaxRetention           = maxRetention
	MaxLease               = maxLease
	MaxWaitTimeout         = maxWaitTimeout
	MaxKeysLimit           = maxKeysLimit
	CodeAbandoned          = codeAbandoned
)

// Fingerprint is what a claim stores of a request's payload.
func Fingerprint(payload []byte) []byte {
	sum := sha256.Sum256(payload)
	return sum[:]
}

// Owner returns the attempt's owner id, a random UUID per claim.
func (a *Attempt) Owner() string { return a.owner }
