// Package console is the web console of `pgfence ui`: pages over what the
// database records of leases, fences, idempotency keys, elections and (when
// the table exists) ordered tasks, served from the CLI binary with every
// template, style and script embedded.
//
// # Guarantees
//
//   - Read-only by default: the pages only read, with the role of the
//     connection they are given, so a role sees what row-level security and
//     its prefix grants let it see, and nothing more. No page writes, and no
//     page adds work to the protocol's hot paths.
//   - Every value from the database (keys, holder info, reasons) is
//     rendered as text by html/template; a Content-Security-Policy allows
//     only the console's own script and style.
//   - Operator actions (pause and resume grants, force release, fail
//     abandoned idempotency keys) exist only with [Config.AllowActions]:
//     without it no action route is registered. With it, each action is a
//     confirmation page and a POST that must carry the process's random
//     token in a form field and in a SameSite=Strict cookie, from a page of
//     the console's own origin; it calls the same library functions as the
//     CLI, so the database records who (the role), what, when and why
//     exactly as for the CLI.
//   - With an access token ([Config.AccessToken]) every request must
//     present it (a Bearer header, or once as ?access_token= which sets a
//     cookie); tokens are compared in constant time. [CheckAddr] refuses a
//     non-loopback address without a token; without a token the console
//     answers only requests whose Host is localhost or a loopback address,
//     so a site whose name was made to resolve to 127.0.0.1 (DNS
//     rebinding) cannot read it.
//
// # Failure handling
//
// A query that fails shows its error in place of its section: the other
// sections of the page still render. Bad input (a prefix or key no name can
// have) gets a 400 page saying why. The doctor runs in the background (its
// checks read every lease row): the overview shows the findings of its last
// run, and starts another when they are older than [Config.DoctorEvery]; no
// page waits for it.
package console
