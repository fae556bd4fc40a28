package idempotency

// Problem codes: the "code" member of the application/problem+json answers
// the edge and its status resource write, one per reason, stable across
// versions (clients branch on them). Every one is declared here:
//
//	Code                      Status       Answers
//	CodeMissingKey            400          no Idempotency-Key on a route that requires one
//	CodeInvalidKey            400          a malformed key, or two Idempotency-Key headers
//	CodeBodyUnreadable        400          a body that could not be read
//	CodeBodyInvalid           400          a body Route.Command or Route.BusinessKey.Of refused
//	CodeInvalidHandle         400          a status resource addressed by anything but a key's digest
//	CodeRegionInvalid         400          an Idempotency-Forwarded-From that is not one region name
//	CodeScopeRejected         403 (or its) Route.Tenant refused the request, or found no scope
//	CodeKeyNotFound           404          the status resource of a key without a record
//	CodeInProgress            409          the key's request is still running
//	CodeOutcomeUnknown        409          the key's record is unknown: poll the status resource
//	CodeBusinessKeyReused     409          the operation was requested under another key
//	CodeBodyTooLarge          413          a body over Route.MaxBodyBytes
//	CodeWrongRegion           421          a request outside its scope's home region, not forwarded
//	CodeKeyReused             422          the key with another body
//	CodeKeyExpired            422          the key after its stored response expired
//	CodeResponseOutdated      422          Route.ResponseVersions.Upgrade refused a stored response
//	CodeKeyFlood              429          a new key past Route.NewKeysPerMinute
//	CodeHomeUnreachable       502          the home region could not be reached
//	CodeStoreUnavailable      503          PostgreSQL could not be reached
//	CodeHomeUnknown           503 (or its) Homing.Home could not name the home region
//
// "(or its)" is the status of the error, when it has a StatusCode method.
const (
	// CodeMissingKey answers a request without an Idempotency-Key header on
	// a route that requires one.
	CodeMissingKey = "MISSING_IDEMPOTENCY_KEY"
	// CodeInvalidKey answers a malformed key (ParseKey), or more than one
	// Idempotency-Key header.
	CodeInvalidKey = "INVALID_IDEMPOTENCY_KEY"
	// CodeKeyReused answers a key sent again with another body.
	CodeKeyReused = "IDEMPOTENCY_KEY_REUSED"
	// CodeInProgress answers a key whose request is still running.
	CodeInProgress = "IDEMPOTENCY_REQUEST_IN_PROGRESS"
	// CodeBodyTooLarge answers a body over Route.MaxBodyBytes.
	CodeBodyTooLarge = "REQUEST_BODY_TOO_LARGE"
	// CodeBodyUnreadable answers a body that could not be read.
	CodeBodyUnreadable = "REQUEST_BODY_UNREADABLE"
	// CodeScopeRejected answers a request whose scope Route.Tenant refused
	// or could not determine.
	CodeScopeRejected = "IDEMPOTENCY_SCOPE_REJECTED"
	// CodeStoreUnavailable answers a request the edge could not record or
	// look up because PostgreSQL could not be reached; a retry is safe.
	CodeStoreUnavailable = "IDEMPOTENCY_STORE_UNAVAILABLE"
	// CodeKeyExpired answers a key sent again after its stored response
	// expired: the operation ran, its answer is gone.
	CodeKeyExpired = "IDEMPOTENCY_KEY_EXPIRED"
	// CodeBodyInvalid answers a body Route.Command or Route.BusinessKey
	// refused.
	CodeBodyInvalid = "REQUEST_BODY_INVALID"
	// CodeBusinessKeyReused answers an operation already requested under
	// another Idempotency-Key (Route.BusinessKey).
	CodeBusinessKeyReused = "BUSINESS_KEY_REUSED"
	// CodeResponseOutdated answers a replay whose stored response
	// Route.ResponseVersions.Upgrade refused.
	CodeResponseOutdated = "IDEMPOTENCY_RESPONSE_OUTDATED"
	// CodeInvalidHandle answers a status resource addressed by anything
	// but a key's digest (StoredKey: 64 lower-case hex digits).
	CodeInvalidHandle = "IDEMPOTENCY_RECORD_HANDLE_INVALID"
	// CodeKeyNotFound is the status resource's answer for a key without a
	// record in the caller's scope.
	CodeKeyNotFound = "IDEMPOTENCY_KEY_NOT_FOUND"
	// CodeKeyFlood answers a request whose new key would exceed its scope's
	// Route.NewKeysPerMinute.
	CodeKeyFlood = "IDEMPOTENCY_KEY_RATE_LIMITED"
	// CodeOutcomeUnknown answers a request whose record is unknown: the
	// operation may have happened (a provider's answer was lost). The client
	// must not retry blindly: it polls the status resource (the answer's
	// Link, rel "monitor") until the record is settled, then retries with
	// the same key and gets its answer.
	CodeOutcomeUnknown = "IDEMPOTENCY_OUTCOME_UNKNOWN"
	// CodeWrongRegion answers (421 Misdirected Request) a request that
	// reached another region than its scope's home and was not forwarded:
	// nothing ran and nothing was stored; the HeaderHomeRegion header
	// names the home region.
	CodeWrongRegion = "IDEMPOTENCY_WRONG_REGION"
	// CodeRegionInvalid answers (400) a HeaderForwardedFrom header that is
	// not one region name.
	CodeRegionInvalid = "IDEMPOTENCY_REGION_INVALID"
	// CodeHomeUnknown answers (503, or a Homing.Home error's StatusCode)
	// a request whose scope's home region could not be found.
	CodeHomeUnknown = "IDEMPOTENCY_HOME_REGION_UNKNOWN"
	// CodeHomeUnreachable answers (502) a request the edge could not
	// forward to its home region, or whose answer it lost on the way: the
	// request may have run there, and a retry under the same key is safe.
	CodeHomeUnreachable = "IDEMPOTENCY_HOME_REGION_UNREACHABLE"
)

// problemTitles is the title of each code's problem.
var problemTitles = map[string]string{
	CodeMissingKey:        "Idempotency-Key header is required",
	CodeInvalidKey:        "Idempotency-Key header is malformed",
	CodeKeyReused:         "Idempotency-Key was used for a different request",
	CodeInProgress:        "A request with this Idempotency-Key is in progress",
	CodeBodyTooLarge:      "Request body too large",
	CodeBodyUnreadable:    "Request body could not be read",
	CodeScopeRejected:     "Request scope could not be determined",
	CodeStoreUnavailable:  "Idempotency store unavailable",
	CodeKeyNotFound:       "No record of this Idempotency-Key",
	CodeKeyFlood:          "Too many new Idempotency-Keys",
	CodeKeyExpired:        "Idempotency-Key expired",
	CodeOutcomeUnknown:    "The outcome of the request is unknown",
	CodeBodyInvalid:       "Request body is invalid",
	CodeBusinessKeyReused: "The operation was already requested under another Idempotency-Key",
	CodeResponseOutdated:  "The stored response is no longer served",
	CodeInvalidHandle:     "The record's handle is malformed",
	CodeWrongRegion:       "The request belongs to another region",
	CodeRegionInvalid:     "The region header is malformed",
	CodeHomeUnknown:       "The home region of the request is unknown",
	CodeHomeUnreachable:   "The home region could not be reached",
}
