package migrations

// SearchPathPin is searchPathPin, for the external tests.
const SearchPathPin = searchPathPin
