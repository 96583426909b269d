package pgfence

// MapErrorForTest exposes the SQLSTATE mapping to the external tests.
var MapErrorForTest = func(err error) error { return mapError(err, false) }
